"""Spill files: rows a rank could not deliver to rank 0, kept on its local disk for a later import.

When rank 0 is gone (or stops taking rows), a sending rank appends the undelivered
batches to its own spill file; ``multirank-logger import DB FILE...`` merges them later.

File format: one line of JSON (the header: ``spill_id``, the run's ``run_id``, ``name`` and
``version``, ``rank``, the launch's ``attempt`` (absent or null in older files), ``host``,
``pid``, ``created_at``; since version 4 the run's identity, ``run_uuid``, and what an import
needs to recreate the run in a store that lost it: ``world_size``, ``version_name``, ``hparams``,
and ``store``, the file the run was logged to), then frames, each
``<u64 length><payload><u32 crc32(payload)>``. A frame is written, flushed and fsynced in one
go, so a crash can tear at most the last frame, which the reader drops. The frames are ours,
not an Arrow IPC file's: that file's footer indexes every batch, and a crash that tears the
footer loses them all. Payload kinds:

- metric rows: one Arrow IPC stream (``model.wire.encode_batch``, version 3); versions 1 and 2 hold
  the ``MRB1`` encoding (``model.wire_v1``), still read (version 1 files hold nothing else);
- side-table rows (version 2): ``MRS1`` + ``model.side_records.encode_side``'s JSON;
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
import struct
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from multirank_logger.errors import SpillCorrupt
from multirank_logger.model.side_records import decode_side, encode_side
from multirank_logger.model.wire import decode_batch, encode_batch
from multirank_logger.model.wire_v1 import decode_batch_v1

__all__ = [
    "SPILL_SUFFIX", "SpillContents", "SpillWriter", "open_spill", "read_spill", "read_spill_contents",
    "read_spill_header",
]

SPILL_SUFFIX = ".mrspill"
_FORMAT = "multirank-spill"
#: 4: the header names the run by its UUID (what an older import would ignore, merging the file
#: into another run of the same name and version: it refuses the file instead)
_FORMAT_VERSION = 4
# the decoder of the metric rows' payload in each format version this code reads
_METRICS_DECODERS: dict[int, Callable[[bytes], pa.RecordBatch]] = {
    1: decode_batch_v1, 2: decode_batch_v1, 3: decode_batch, 4: decode_batch,
}
# payload prefixes of the frames that are not metric rows (model/wire.py's batches start otherwise)
_SIDE = b"MRS1"
_END = b"MRE1"
_HPARAMS = b"MRH1"
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")


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
        self._append([encode_batch(batch) for batch in frames])
        return sum(len(b) for b in frames)

    def write_side(self, tables: dict[str, list[dict[str, Any]]]) -> int:
        """Append side-table rows (decisions, logs, step timing) as one frame.

        Returns:
            The number of rows written. Raises OSError as `write` does.
        """
        rows = sum(map(len, tables.values()))
        if rows:
            self._append([_SIDE + encode_side(tables)])
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
            self._append([_HPARAMS + json.dumps(hparams, default=str).encode()])
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
            }
            if others:
                facts["others"] = {str(rank): end for rank, end in others.items()}
            self._append([_END + json.dumps(facts).encode()])

    def _append(self, payloads: list[bytes]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        with self._lock, open(self.path, "ab") as fh:
            new = fh.tell() == 0
            if new:
                fh.write(json.dumps(self.header, sort_keys=True, default=str).encode() + b"\n")
            fh.writelines(_LENGTH.pack(len(payload)) + payload + _CRC.pack(zlib.crc32(payload)) for payload in payloads)
            fh.flush()
            # these are the only copies of the rows: make them survive a node crash
            os.fsync(fh.fileno())


@dataclass
class SpillContents:
    """A spill file as read: its header and its frames in file order, by kind.

    `frames` holds ("metrics", pa.RecordBatch), ("side", {table: rows}), ("hparams", dict) and
    ("end", facts) pairs.
    """

    header: dict[str, Any]
    frames: list[tuple[str, Any]]

    @property
    def batches(self) -> list[pa.RecordBatch]:
        return [obj for kind, obj in self.frames if kind == "metrics"]


def read_spill(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[pa.RecordBatch]]:
    """The header and the metric batches of a spill file (a torn last frame is dropped).

    Raises:
        SpillCorrupt: when the file has no spill header, or a frame in the middle is damaged.
    """
    contents = read_spill_contents(path)
    return contents.header, contents.batches


def read_spill_header(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The header of a spill file (its first line only), or None when it has none."""
    with open(path, "rb") as fp:
        line = fp.readline(1 << 16)
    try:
        header = json.loads(line)
    except ValueError:
        return None
    return header if isinstance(header, dict) and header.get("format") == _FORMAT else None


def read_spill_contents(path: str | os.PathLike[str]) -> SpillContents:
    """Every complete frame of a spill file, of every kind (a torn last frame is dropped).

    Raises:
        SpillCorrupt: when the file has no spill header, or a frame in the middle is damaged.
    """
    with open_spill(path) as (header, frames):
        return SpillContents(header, list(frames))


@contextlib.contextmanager
def open_spill(path: str | os.PathLike[str]) -> Iterator[tuple[dict[str, Any], Iterator[tuple[str, Any]]]]:
    """The header of a spill file, and its frames as `read_spill_contents` gives them, read one at
    a time: a file larger than the memory at hand (a long outage's) is never all in memory.

    Raises:
        SpillCorrupt: when the file has no spill header (at once), or a frame in the middle is
            damaged (when the iteration reaches it).
    """
    with open(path, "rb") as fp:
        line = fp.readline()
        try:
            header = json.loads(line) if line.endswith(b"\n") else None
        except ValueError:
            header = None
        if not isinstance(header, dict) or header.get("format") != _FORMAT:
            raise SpillCorrupt(str(path), "no multirank-spill header line")
        decode_metrics = _METRICS_DECODERS.get(header.get("format_version", 1))
        if decode_metrics is None:
            raise SpillCorrupt(
                str(path), f"format version {header.get('format_version')}: written by a newer multirank-logger; upgrade it"
            )
        yield header, _frames(fp, str(path), decode_metrics)


def _frames(fp: Any, path: str, decode_metrics: Callable[[bytes], pa.RecordBatch]) -> Iterator[tuple[str, Any]]:
    index = 0
    while True:
        length = fp.read(_LENGTH.size)
        if len(length) < _LENGTH.size:
            return  # the end, or a torn length: the writer died mid-frame
        (size,) = _LENGTH.unpack(length)
        payload = fp.read(size)
        crc = fp.read(_CRC.size)
        if len(payload) < size or len(crc) < _CRC.size:
            return  # torn frame
        if zlib.crc32(payload) != _CRC.unpack(crc)[0]:
            raise SpillCorrupt(path, f"frame {index} fails its checksum")
        try:
            yield _decode_frame(payload, decode_metrics)
        except ValueError as exc:
            raise SpillCorrupt(path, f"frame {index}: {exc}") from exc
        index += 1


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
