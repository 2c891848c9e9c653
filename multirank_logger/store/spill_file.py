"""Spill files: rows a rank could not deliver to rank 0, kept on its local disk for a later import.

When rank 0 is gone (or stops taking rows), a sending rank appends the undelivered
batches to its own spill file; ``multirank-logger import DB FILE...`` merges them later.

File format: one line of JSON (the header: ``spill_id``, the run's ``run_id``, ``name`` and
``version``, ``rank``, the launch's ``attempt`` (absent or null in older files), ``host``,
``pid``, ``created_at``; since version 4 the run's identity, ``run_uuid``, and what an import
needs to recreate the run in a store that lost it: ``world_size``, ``version_name``, ``hparams``,
and ``store``, the file the run was logged to; since version 5 ``first_frame`` and
``values_before``, where this file's frames begin, and ``header_crc``, the CRC-32 of the header's
JSON without it), then frames. A frame is written, flushed and fsynced in one go. The frames are
ours, not an Arrow IPC file's: that file's footer indexes every batch, and a crash that tears the
footer loses them all.

Version 5 frames prove their bytes: ``MRF5 <u32 ordinal> <u32 values> <u64 values_before>
<u32 length> <u32 crc32(the head so far)> <payload> <u32 crc32(payload)>``. The head says which
frame this is (the writer numbers them), how many metric values it holds and how many the
writer put in earlier frames, so that bytes damaged anywhere cost only the frames they touch:
the reader finds the next intact head (its magic and checksum), and the numbers on both sides
say exactly which frames, and how many values, were lost (`SpillDamage`). A frame is at most
`MAX_FRAME_BYTES` (the writer splits a larger batch): a larger length is damage, never an
allocation. Versions 1 to 4 framed ``<u64 length><payload><u32 crc32(payload)>``: still read,
up to the first frame that does not check (after it, nothing says where the next frame starts).

Payload kinds:

- metric rows: one Arrow IPC stream (``rows.wire.encode_batch``, version 3); versions 1 and 2 hold
  the ``MRB1`` encoding (``rows.wire_v1``), still read (version 1 files hold nothing else);
- side-table rows (version 2): ``MRS1`` + ``rows.side_records.encode_side``'s JSON;
- the run's hyperparameters logged after the header was written (version 4): ``MRH1`` + their JSON;
- the rank's end (version 2): ``MRE1`` + JSON ``{"status", "values_spilled", "values_lost",
  "counted"}``, written at finalize, so that importing the file tells the store how a rank ended
  whose end rank 0 never heard (gather: the channel was down). Gather rank 0 that could not write
  its end (a reader held the store) adds ``"others"``: ``{rank: {"status", "host", "pid", ...}}``,
  the end it heard from each rank whose rows it wrote (``missing`` for one it did not hear), which
  the import records too (absent in older files: those ranks stayed ``running``). The counts are the values this
  rank did not deliver that the run's totals lacked when it wrote them: everything since the
  last end the run counted, earlier phases included. ``counted`` (absent in older files: false)
  says the run took them after all (rank 0 acknowledged the report).

Importing a file into a store is store/spill_import.py's.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import struct
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NamedTuple

import pyarrow as pa

from multirank_logger.errors import SpillCorrupt
from multirank_logger.rows.side_records import decode_side, encode_side
from multirank_logger.rows.wire import decode_batch, encode_batch
from multirank_logger.rows.wire_v1 import decode_batch_v1

__all__ = [
    "MAX_FRAME_BYTES", "SPILL_SUFFIX", "SpillContents", "SpillDamage", "SpillFrame", "SpillWriter", "open_spill",
    "read_spill", "read_spill_contents", "read_spill_header",
]

SPILL_SUFFIX = ".mrspill"
_FORMAT = "multirank-spill"
#: 5: frames with a checked head (ordinal, values, length), the header with its own checksum
_FORMAT_VERSION = 5
# the decoder of the metric rows' payload in each format version this code reads
_METRICS_DECODERS: dict[int, Callable[[bytes], pa.RecordBatch]] = {
    1: decode_batch_v1, 2: decode_batch_v1, 3: decode_batch, 4: decode_batch, 5: decode_batch,
}
#: the largest frame payload a writer puts in a file (it splits a batch that encodes larger)
MAX_FRAME_BYTES = 256 << 20
#: the longest header line read (hparams included); a longer "line" is not a spill file's
_MAX_HEADER_BYTES = 16 << 20
# payload prefixes of the frames that are not metric rows (rows/wire.py's batches start otherwise)
_SIDE = b"MRS1"
_END = b"MRE1"
_HPARAMS = b"MRH1"
_CRC = struct.Struct("<I")
# version 5's frame head: magic, ordinal, values, values_before, length, then the CRC of those
_MAGIC = b"MRF5"
_HEAD = struct.Struct("<4sIIQI")
_HEAD_SIZE = _HEAD.size + _CRC.size
# versions 1 to 4: the payload's length alone
_LENGTH = struct.Struct("<Q")
_SCAN_CHUNK = 1 << 20


class SpillWriter:
    """Appends undelivered batches to one spill file, created on the first write.

    Args:
        directory: where to put the file (created if missing); a disk local to this rank.
        run_id, name, version: the run the rows belong to, as rank 0 published it.
        rank: this process's global rank.
        attempt: the launch of the run (``attempts.attempt``).
        run_started_at: when rank 0 allocated the run: with run_id, what tells this run from
            another store's run of the same name, version and id (store.spill_import.import_earlier_launches).
        run_uuid: the run's unique id (``runs.run_uuid``): `import` puts the rows into this run only.
        world_size, version_name, hparams: the run as far as this rank knows it, for an import
            into a store that no longer has the run (it recreates it).
        store: the store file the run was logged to (never a server URL: it may hold a password);
            `import` creates it when it is gone, where it creates no other missing path.

    Example::

        spill = SpillWriter(Path("spill"), run_id=3, name="lightning_logs", version=0, rank=1)
        spill.write(exc.undelivered)   # after a ChannelError
    """

    def __init__(
        self, directory: str | os.PathLike[str], *, run_id: int, name: str, version: int, rank: int,
        attempt: int | None = None, run_started_at: float | None = None, run_uuid: str | None = None,
        world_size: int | None = None, version_name: str | None = None, hparams: dict[str, Any] | None = None,
        store: str | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.header: dict[str, Any] = {
            "format": _FORMAT,
            "format_version": _FORMAT_VERSION,
            "spill_id": uuid.uuid4().hex,
            "run_id": run_id,
            "name": name,
            "version": version,
            "rank": rank,
            "attempt": attempt,  # the launch (attempts.attempt); None in files written before it was kept
            "run_started_at": run_started_at,
            "run_uuid": run_uuid,
            "world_size": world_size,
            "version_name": version_name,
            "hparams": hparams,
            "store": store,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "created_at": time.time(),
        }
        self.path = self.directory / f"{name}-version_{version}-rank{rank}-{self.header['spill_id'][:12]}{SPILL_SUFFIX}"
        # finalize may spill while the writer thread, stuck in a store call, later spills too: one frame at a time
        self._lock = threading.Lock()
        # the next frame's ordinal and the metric values in frames before it: they advance for every
        # frame tried, written or not, so that a frame a failed write left out reads as missing
        self._ordinal = 0
        self._values = 0

    def write(self, batches: Iterable[pa.RecordBatch]) -> int:
        """Append `batches` (empty ones skipped) as durable frames.

        Returns:
            The number of rows written by this call.

        Raises:
            OSError: when the file cannot be written (the caller warns: the rows are lost).
        """
        frames = [b for b in batches if len(b)]
        if not frames:
            return 0
        self._append([(payload, len(part)) for batch in frames for part, payload in _encoded_parts(batch)])
        return sum(len(b) for b in frames)

    def write_side(self, tables: dict[str, list[dict[str, Any]]]) -> int:
        """Append side-table rows (decisions, logs, step timing) as one frame.

        Returns:
            The number of rows written. Raises OSError as `write` does.
        """
        rows = sum(map(len, tables.values()))
        if rows:
            self._append([(_SIDE + encode_side(tables), 0)])
        return rows

    def note_hparams(self, hparams: dict[str, Any]) -> None:
        """The run's hyperparameters (JSON-ready), logged after this writer was made: into the header
        while the file does not exist, else appended as a frame (never raises: the rows matter more).
        """
        try:
            with self._lock:
                if not self.path.exists():
                    self.header["hparams"] = hparams
                    return
            self._append([(_HPARAMS + json.dumps(hparams, default=str).encode(), 0)])
        except (OSError, TypeError, ValueError):
            pass  # an import recreating the run then takes the header's (older) hparams

    def write_end(
        self, status: str, values_spilled: int, values_lost: int, *, counted: bool = False,
        others: dict[int, dict[str, Any]] | None = None,
    ) -> None:
        """Append how this rank ended (only to a file that exists: a rank with nothing spilled needs none),
        with `others`: the ends this rank heard from the ranks whose rows it wrote (gather rank 0).

        Raises:
            OSError: as `write` does.
        """
        if self.path.exists():
            facts: dict[str, Any] = {
                "status": status, "values_spilled": values_spilled, "values_lost": values_lost, "counted": counted,
                "ended_at": time.time(),  # the import records it: the run's and the rank's ended_at
            }
            if others:
                facts["others"] = {str(rank): end for rank, end in others.items()}
            self._append([(_END + json.dumps(facts).encode(), 0)])

    def _append(self, payloads: list[tuple[bytes, int]]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        with self._lock, open(self.path, "ab") as fh:
            if fh.tell() == 0:
                # where this file's frames begin: a file made again (the first one deleted) starts mid-count
                header = {**self.header, "first_frame": self._ordinal, "values_before": self._values}
                fh.write(_header_line(header))
            chunks = []
            for payload, values in payloads:
                head = _HEAD.pack(_MAGIC, self._ordinal, values, self._values, len(payload))
                chunks.append(head + _CRC.pack(zlib.crc32(head)) + payload + _CRC.pack(zlib.crc32(payload)))
                self._ordinal += 1
                self._values += values
            fh.writelines(chunks)
            fh.flush()
            # these are the only copies of the rows: make them survive a node crash
            os.fsync(fh.fileno())


def _header_line(header: dict[str, Any]) -> bytes:
    """The header as its line, ending with ``"header_crc"``, the CRC-32 of the line's bytes without
    it: a bit changed in it (the run's UUID, the rank) would otherwise send every row to another
    run or rank."""
    text = json.dumps(header, sort_keys=True, default=str)
    return (text[:-1] + f', "header_crc": {zlib.crc32(text.encode())}}}').encode() + b"\n"


def _header_checks(header: dict[str, Any], line: bytes) -> bool:
    """Whether a header `line` is the one written, byte for byte (files before version 5 carry no checksum)."""
    if "header_crc" not in header and header.get("format_version", 1) < 5:
        return True
    crc = header.get("header_crc")
    suffix = f', "header_crc": {crc}}}\n'.encode()
    return type(crc) is int and line.endswith(suffix) and zlib.crc32(line[: -len(suffix)] + b"}") == crc


def _encoded_parts(batch: pa.RecordBatch) -> Iterator[tuple[pa.RecordBatch, bytes]]:
    """`batch` encoded, in halves (again and again) while a part encodes past `MAX_FRAME_BYTES`."""
    payload = encode_batch(batch)
    if len(payload) <= MAX_FRAME_BYTES or len(batch) < 2:
        yield batch, payload
        return
    half = len(batch) // 2
    yield from _encoded_parts(batch.slice(0, half))
    yield from _encoded_parts(batch.slice(half))


@dataclass(frozen=True)
class SpillDamage:
    """Bytes of a spill file that do not read as intact frames, and what they cost.

    Attributes:
        path: the file.
        start, end: the bytes (offsets) that did not read.
        first_frame: the first frame lost there (its ordinal).
        end_frame: the frame after the last one lost (exclusive); None when unknown (the damage
            reaches the file's end, or a file of version 4 or older, read no further).
        values: the metric values those frames held; None when unknown.
        torn: the file ends inside a frame whose head is intact: its last write was cut short
            (a crash, a full disk) or the file was copied before its rank finished it.
    """

    path: str
    start: int
    end: int
    first_frame: int
    end_frame: int | None
    values: int | None
    torn: bool = False

    @property
    def frames(self) -> str:
        """The frames lost, as a person reads them."""
        if self.end_frame is None:
            return f"frame {self.first_frame} onward"
        if self.end_frame - self.first_frame == 1:
            return f"frame {self.first_frame}"
        return f"frames {self.first_frame}-{self.end_frame - 1}"

    def __str__(self) -> str:
        held = "how many values they held is unknown" if self.values is None else f"{self.values} value(s) not imported"
        if self.torn:
            return (f"{self.path} ends inside {self.frames} (its write was cut short, or the file was copied before its "
                    f"rank finished it): {held}")
        return f"{self.path}: bytes {self.start}-{self.end - 1} are damaged ({self.frames}): {held}"


class SpillFrame(NamedTuple):
    """One frame as read: its ordinal in the writer's count, its kind, what it holds. Kind
    ``"damage"`` holds a `SpillDamage` (the bytes before the next intact frame)."""

    ordinal: int
    kind: str
    obj: Any


@dataclass
class SpillContents:
    """A spill file as read: its header, its intact frames in file order, by kind, and its damage.

    `frames` holds ("metrics", pa.RecordBatch), ("side", {table: rows}), ("hparams", dict) and
    ("end", facts) pairs.
    """

    header: dict[str, Any]
    frames: list[tuple[str, Any]]
    damage: list[SpillDamage]

    @property
    def batches(self) -> list[pa.RecordBatch]:
        return [obj for kind, obj in self.frames if kind == "metrics"]


def read_spill(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[pa.RecordBatch]]:
    """The header and the metric batches of the intact frames of a spill file.

    Raises:
        SpillCorrupt: when the file is not a regular file with a spill header.
    """
    contents = read_spill_contents(path)
    return contents.header, contents.batches


def read_spill_header(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The header of a spill file (its first line only), or None when it has none (or is no regular file)."""
    try:
        with _open_regular(path) as fp:
            return _read_header(fp)[0]
    except (OSError, SpillCorrupt):
        return None


def read_spill_contents(path: str | os.PathLike[str]) -> SpillContents:
    """Every intact frame of a spill file, of every kind, and its damaged bytes (`SpillDamage`).

    Raises:
        SpillCorrupt: when the file is not a regular file with a spill header.
    """
    with open_spill(path) as (header, frames):
        read = list(frames)
    return SpillContents(
        header, [(f.kind, f.obj) for f in read if f.kind != "damage"], [f.obj for f in read if f.kind == "damage"]
    )


@contextlib.contextmanager
def open_spill(path: str | os.PathLike[str]) -> Iterator[tuple[dict[str, Any], Iterator[SpillFrame]]]:
    """The header of a spill file, and its frames (`SpillFrame`), read one at a time: a file larger
    than the memory at hand (a long outage's) is never all in memory, and no read is larger than
    `MAX_FRAME_BYTES`, whatever a damaged length says.

    Raises:
        SpillCorrupt: when the file is not a regular file (a FIFO, a device: never read), has no
            spill header, or one of a newer format (at once). Damaged frames are yielded as
            ``"damage"`` frames, never raised.
    """
    with _open_regular(path) as fp:
        header, line = _read_header(fp)
        if header is None:
            raise SpillCorrupt(str(path), "no multirank-spill header line")
        version = header.get("format_version", 1)
        decode_metrics = _METRICS_DECODERS.get(version) if isinstance(version, int) else None
        if decode_metrics is None:
            raise SpillCorrupt(str(path), f"format version {version}: written by a newer multirank-logger; upgrade it")
        if not _header_checks(header, line):
            raise SpillCorrupt(str(path), "its header line fails its checksum")
        size = os.fstat(fp.fileno()).st_size  # what a rank still appending adds later is the next import's
        if version >= 5:
            yield header, _frames(fp, str(path), size, header, decode_metrics)
        else:
            yield header, _frames_before_v5(fp, str(path), size, decode_metrics)


@contextlib.contextmanager
def _open_regular(path: str | os.PathLike[str]) -> Iterator[IO[bytes]]:
    """`path` opened for reading, when it is a regular file: a FIFO would hang the reader, a device
    (/dev/zero) never end. Opened without blocking, then checked, so nothing is swapped in between."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise SpillCorrupt(str(path), "not a regular file: only spill files are imported")
        fp = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with fp:
        yield fp


def _read_header(fp: IO[bytes]) -> tuple[dict[str, Any] | None, bytes]:
    """The header (None when the first line is not a spill file's), and its line as read."""
    line = fp.readline(_MAX_HEADER_BYTES)
    try:
        header = json.loads(line) if line.endswith(b"\n") else None
    except ValueError:  # UnicodeDecodeError too
        return None, line
    return (header if isinstance(header, dict) and header.get("format") == _FORMAT else None), line


def _frames(
    fp: IO[bytes], path: str, size: int, header: dict[str, Any], decode_metrics: Callable[[bytes], pa.RecordBatch]
) -> Iterator[SpillFrame]:
    """Version 5: every intact frame, and a ``"damage"`` frame for the bytes between two intact ones
    (or before the file's end), whose cost the intact heads on both sides say."""
    at = fp.tell()
    expect, values_end = int(header.get("first_frame") or 0), int(header.get("values_before") or 0)
    bad_at: int | None = None  # where unreadable bytes began
    bad_head: _Head | None = None  # the intact head there, if any (its payload did not check)
    bad_torn = False  # the file ends inside the frame there
    while at < size:
        head, payload, torn = _frame_at(fp, at, size)
        item = _decoded(payload, decode_metrics)
        if item is not None and head is not None:
            if bad_at is not None:
                yield _damage(path, bad_at, at, expect, head.ordinal, head.values_before - values_end)
                bad_at = None
            yield SpillFrame(head.ordinal, *item)
            expect, values_end = head.ordinal + 1, head.values_before + head.values
            at += _HEAD_SIZE + head.length + _CRC.size
            continue
        if bad_at is None:
            # a head whose frame runs past the end is torn only if no intact frame follows (a write
            # cut short mid-file, by a full disk, and later ones that went through)
            bad_at, bad_head, bad_torn = at, head, torn
        found = _next_magic(fp, at + 1, size)
        if found is None:
            yield _last_damage(path, bad_at, bad_head, size, expect, values_end, torn=bad_torn)
            return
        at = found
    if bad_at is not None:  # pragma: no cover - the loop returns before
        yield _damage(path, bad_at, size, expect, None, None)


class _Head(NamedTuple):
    ordinal: int
    values: int
    values_before: int
    length: int


def _frame_at(fp: IO[bytes], at: int, size: int) -> tuple[_Head | None, bytes | None, bool]:
    """The frame at byte `at`: its head (None unless intact), its payload (None unless it checks),
    and whether the file ends inside it."""
    fp.seek(at)
    raw = fp.read(_HEAD_SIZE)
    if len(raw) < _HEAD_SIZE:
        return None, None, _MAGIC.startswith(raw[: len(_MAGIC)])
    magic, ordinal, values, before, length = _HEAD.unpack(raw[: _HEAD.size])
    if magic != _MAGIC or zlib.crc32(raw[: _HEAD.size]) != _CRC.unpack(raw[_HEAD.size :])[0] or length > MAX_FRAME_BYTES:
        return None, None, False
    head = _Head(ordinal, values, before, length)
    if at + _HEAD_SIZE + length + _CRC.size > size:
        return head, None, True
    payload = fp.read(length)
    crc = fp.read(_CRC.size)
    if len(crc) < _CRC.size or zlib.crc32(payload) != _CRC.unpack(crc)[0]:
        return head, None, False
    return head, payload, False


def _next_magic(fp: IO[bytes], start: int, size: int) -> int | None:
    """The offset of the next frame magic at or after `start`, read a bounded chunk at a time."""
    at = start
    while at < size:
        fp.seek(at)
        chunk = fp.read(min(_SCAN_CHUNK, size - at))
        found = chunk.find(_MAGIC)
        if found >= 0:
            return at + found
        if at + len(chunk) >= size:
            return None
        at += len(chunk) - (len(_MAGIC) - 1)  # a magic across two chunks
    return None


def _last_damage(
    path: str, start: int, head: _Head | None, size: int, expect: int, values_end: int, *, torn: bool
) -> SpillFrame:
    """Damage that reaches the file's end: exact when it is one frame whose intact head says it
    ends there or past it (its payload or checksum changed, or the file was cut inside it), else
    "this frame onward", values unknown."""
    ends = None if head is None else start + _HEAD_SIZE + head.length + _CRC.size
    if head is not None and ends is not None and ends >= size and (head.ordinal, head.values_before) == (expect, values_end):
        return _damage(path, start, size, expect, expect + 1, head.values, torn=ends > size)
    return _damage(path, start, size, expect, None, None, torn=torn)


def _damage(
    path: str, start: int, end: int, first: int, end_frame: int | None, values: int | None, *, torn: bool = False
) -> SpillFrame:
    # a head that checks but counts backwards is not this writer's: say what is sure, no count
    if end_frame is not None and (end_frame < first or values is None or values < 0):
        end_frame, values = None, None
    return SpillFrame(first, "damage", SpillDamage(path, start, end, first, end_frame, values, torn))


def _frames_before_v5(
    fp: IO[bytes], path: str, size: int, decode_metrics: Callable[[bytes], pa.RecordBatch]
) -> Iterator[SpillFrame]:
    """Versions 1 to 4: frames up to the first that does not read (reported as damage: nothing
    after it says where the next frame starts)."""
    index = 0
    while True:
        at = fp.tell()
        length = fp.read(_LENGTH.size)
        if not length:
            return
        (n,) = _LENGTH.unpack(length) if len(length) == _LENGTH.size else (size,)
        ok = n <= MAX_FRAME_BYTES and at + _LENGTH.size + n + _CRC.size <= size
        payload = fp.read(n) if ok else None
        crc = fp.read(_CRC.size) if ok else b""
        item = _decoded(payload, decode_metrics) if payload is not None and zlib.crc32(payload) == _CRC.unpack(crc)[0] else None
        if item is None:
            # a crash tears the last frame; a damaged length looks the same: either way the rest is unread
            yield _damage(path, at, size, index, None, None, torn=at + _LENGTH.size + n + _CRC.size > size)
            return
        yield SpillFrame(index, *item)
        index += 1


def _decoded(payload: bytes | None, decode_metrics: Callable[[bytes], pa.RecordBatch]) -> tuple[str, Any] | None:
    """A payload that checks, decoded; None for none, or one that does not decode (written wrong:
    as good as damaged)."""
    if payload is None:
        return None
    try:
        return _decode_frame(payload, decode_metrics)
    except ValueError:
        return None


def _decode_frame(payload: bytes, decode_metrics: Callable[[bytes], pa.RecordBatch]) -> tuple[str, Any]:
    if payload.startswith(_SIDE):
        return "side", decode_side(payload[len(_SIDE) :])
    if payload.startswith(_HPARAMS):
        hparams = json.loads(payload[len(_HPARAMS) :])
        if not isinstance(hparams, dict):
            raise ValueError("not a run's hyperparameters")
        return "hparams", hparams
    if payload.startswith(_END):
        facts = json.loads(payload[len(_END) :])
        if not isinstance(facts, dict) or not isinstance(facts.get("status"), str):
            raise ValueError("not a rank's end")
        return "end", facts
    return "metrics", decode_metrics(payload)
