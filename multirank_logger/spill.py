"""Spill files: rows a rank could not deliver to rank 0, kept on its local disk for a later import.

When rank 0 is gone (or stops taking rows), a sending rank appends the undelivered
batches to its own spill file; ``multirank-logger import DB FILE...`` merges them later.

File format: one line of JSON (the header: ``spill_id``, the run's ``run_id``, ``name`` and
``version``, ``rank``, the launch's ``attempt`` (absent or null in older files), ``host``,
``pid``, ``created_at``), then frames, each
``<u64 length><payload><u32 crc32(payload)>``. A frame is written, flushed and fsynced in one
go, so a crash can tear at most the last frame, which the reader drops. The frames are ours,
not an Arrow IPC file's: that file's footer indexes every batch, and a crash that tears the
footer loses them all. Payload kinds:

- metric rows: one Arrow IPC stream (``wire.encode_batch``, version 3); versions 1 and 2 hold
  the ``MRB1`` encoding (wire_mrb1.py), still read (version 1 files hold nothing else);
- side-table rows (version 2): ``MRS1`` + ``side_records.encode_side``'s JSON;
- the rank's end (version 2): ``MRE1`` + JSON ``{"status", "values_spilled", "values_lost",
  "counted"}``, written at finalize, so that importing the file tells the store how a rank ended
  whose end rank 0 never heard (gather: the channel was down). The counts are the values this
  rank did not deliver that the run's totals lacked when it wrote them: everything since the
  last end the run counted, earlier phases included. ``counted`` (absent in older files: false)
  says the run took them after all (rank 0 acknowledged the report).

Importing is idempotent: the `imports` table remembers, per spill id, how many frames were
read, and rows the store already holds (same run, rank, seq and key: rank 0 may have
stored a batch that its sender never saw acknowledged) are skipped.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import time
import uuid
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import sqlalchemy as sa

from multirank_logger.batch import column_lists, concat_batches, take_rows, with_run_id
from multirank_logger.errors import LookupFailed, MultiRankLoggerError
from multirank_logger.schema import SIDE_TABLES, attempts, imports, metrics, ranks, runs, unheard_ends
from multirank_logger.side_records import decode_side, encode_side
from multirank_logger.store import unseen_side_rows
from multirank_logger.wire import decode_batch, encode_batch
from multirank_logger.wire_mrb1 import decode_mrb1

__all__ = [
    "SPILL_SUFFIX", "ImportReport", "SpillContents", "SpillCorrupt", "SpillWriter", "import_spill", "read_spill",
    "read_spill_contents",
]

SPILL_SUFFIX = ".mrspill"
_FORMAT = "multirank-spill"
_FORMAT_VERSION = 3
# the decoder of the metric rows' payload in each format version this code reads
_METRICS_DECODERS: dict[int, Callable[[bytes], pa.RecordBatch]] = {1: decode_mrb1, 2: decode_mrb1, 3: decode_batch}
# payload prefixes of the frames that are not metric rows (wire.py's batches start otherwise)
_SIDE = b"MRS1"
_END = b"MRE1"
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")


class SpillCorrupt(MultiRankLoggerError):
    def __init__(self, path: str, detail: str) -> None:
        self.path = path
        super().__init__(f"{path} is not a readable spill file ({detail}). It was left untouched; nothing was imported.")


class SpillWriter:
    """Appends undelivered batches to one spill file, created on the first write.

    Args:
        directory: where to put the file (created if missing); a disk local to this rank.
        run_id, name, version: the run the rows belong to, as rank 0 published it.
        rank: this process's global rank.

    Example::

        spill = SpillWriter(Path("spill"), run_id=3, name="lightning_logs", version=0, rank=1)
        spill.write(exc.undelivered)   # after a ChannelError
    """

    def __init__(
        self, directory: str | os.PathLike[str], *, run_id: int, name: str, version: int, rank: int,
        attempt: int | None = None,
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
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "created_at": time.time(),
        }
        self.path = self.directory / f"{name}-version_{version}-rank{rank}-{self.header['spill_id'][:12]}{SPILL_SUFFIX}"
        self.rows_written = 0

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
        rows = sum(len(b) for b in frames)
        self.rows_written += rows
        return rows

    def write_side(self, tables: dict[str, list[dict[str, Any]]]) -> int:
        """Append side-table rows (decisions, logs, step timing) as one frame.

        Returns:
            The number of rows written. Raises OSError as `write` does.
        """
        rows = sum(map(len, tables.values()))
        if rows:
            self._append([_SIDE + encode_side(tables)])
        return rows

    def write_end(self, status: str, values_spilled: int, values_lost: int, *, counted: bool = False) -> None:
        """Append how this rank ended (only to a file that exists: a rank with nothing spilled needs none).

        Raises:
            OSError: as `write` does.
        """
        if self.path.exists():
            facts = {"status": status, "values_spilled": values_spilled, "values_lost": values_lost, "counted": counted}
            self._append([_END + json.dumps(facts).encode()])

    def _append(self, payloads: list[bytes]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists()
        with open(self.path, "ab") as fh:
            if new:
                fh.write(json.dumps(self.header, sort_keys=True).encode() + b"\n")
            fh.writelines(_LENGTH.pack(len(payload)) + payload + _CRC.pack(zlib.crc32(payload)) for payload in payloads)
            fh.flush()
            # these are the only copies of the rows: make them survive a node crash
            os.fsync(fh.fileno())


@dataclass
class SpillContents:
    """A spill file as read: its header and its frames in file order, by kind.

    `frames` holds ("metrics", pa.RecordBatch), ("side", {table: rows}) and ("end", facts) pairs.
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


def read_spill_contents(path: str | os.PathLike[str]) -> SpillContents:
    """Every complete frame of a spill file, of every kind (a torn last frame is dropped).

    Raises:
        SpillCorrupt: when the file has no spill header, or a frame in the middle is damaged.
    """
    data = Path(path).read_bytes()
    line, sep, rest = data.partition(b"\n")
    try:
        header = json.loads(line) if sep else None
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("format") != _FORMAT:
        raise SpillCorrupt(str(path), "no multirank-spill header line")
    decode_metrics = _METRICS_DECODERS.get(header.get("format_version", 1))
    if decode_metrics is None:
        raise SpillCorrupt(
            str(path), f"format version {header.get('format_version')}: written by a newer multirank-logger; upgrade it"
        )
    frames: list[tuple[str, Any]] = []
    view, pos = memoryview(rest), 0
    while pos < len(view):
        if pos + _LENGTH.size > len(view):
            break  # torn length: the writer died mid-frame
        (size,) = _LENGTH.unpack_from(view, pos)
        end = pos + _LENGTH.size + size + _CRC.size
        if end > len(view):
            break  # torn frame
        payload = view[pos + _LENGTH.size : end - _CRC.size]
        (crc,) = _CRC.unpack_from(view, end - _CRC.size)
        if zlib.crc32(payload) != crc:
            raise SpillCorrupt(str(path), f"frame {len(frames)} fails its checksum")
        try:
            # a copy: aligned for Arrow, and apart from the whole file's bytes
            frames.append(_decode_frame(bytes(payload), decode_metrics))
        except ValueError as exc:
            raise SpillCorrupt(str(path), f"frame {len(frames)}: {exc}") from exc
        pos = end
    return SpillContents(header, frames)


def _decode_frame(payload: bytes, decode_metrics: Callable[[bytes], pa.RecordBatch]) -> tuple[str, Any]:
    if payload.startswith(_SIDE):
        return "side", decode_side(payload[len(_SIDE) :])
    if payload.startswith(_END):
        facts = json.loads(payload[len(_END) :])
        if not isinstance(facts, dict) or not isinstance(facts.get("status"), str):
            raise ValueError("not a rank's end")
        return "end", facts
    return "metrics", decode_metrics(payload)


@dataclass(frozen=True)
class ImportReport:
    """What `import_spill` did with one file."""

    path: str
    spill_id: str
    run_id: int
    name: str
    version: int
    rank: int
    rows_added: int
    rows_skipped: int
    frames_read: int
    side_rows_added: int = 0
    #: how the rank ended, when the file says so and the store had it as "missing"
    rank_status: str | None = None

    @property
    def already_imported(self) -> bool:
        return self.frames_read == 0


def import_spill(store: Any, path: str | os.PathLike[str]) -> ImportReport:
    """Merge a spill file into `store` (a writable Store), in one transaction. Idempotent.

    The run is found by its (name, version), so the file imports into any store that holds
    that run, whatever its id there. Metric rows and side-table rows the store holds already
    are skipped. A rank the store has as "missing" (rank 0 never heard its end) takes the end
    the file records, and the values it spilled or lost count in the run's totals.

    Raises:
        SpillCorrupt: when the file cannot be read as a spill file.
        LookupFailed: when the store holds no run with the file's name and version.
    """
    contents = read_spill_contents(path)
    header, frames = contents.header, contents.frames
    spill_id = str(header["spill_id"])
    name, version, rank = str(header["name"]), int(header["version"]), int(header["rank"])
    with store.begin() as conn:
        done = conn.execute(
            sa.select(sa.func.coalesce(sa.func.max(imports.c.end_frame), 0)).where(imports.c.spill_id == spill_id)
        ).scalar_one()
        run_id = conn.execute(sa.select(runs.c.id).where(runs.c.name == name, runs.c.version == version)).scalar()
        if run_id is None:
            labels = conn.execute(sa.select(runs.c.name, runs.c.version)).all()
            raise LookupFailed("run", f"{name}/version_{version}", [f"{n}/version_{v}" for n, v in labels])
        report = {"path": str(path), "spill_id": spill_id, "run_id": run_id, "name": name, "version": version}
        report["rank"] = rank
        if done >= len(frames):
            return ImportReport(**report, rows_added=0, rows_skipped=0, frames_read=0)
        new = frames[done:]
        # the store's id for the run, not the one the rank knew
        batch = with_run_id(concat_batches([obj for kind, obj in new if kind == "metrics"]), run_id)
        fresh = _without_stored_rows(conn, batch, run_id) if len(batch) else batch
        if len(fresh):
            store.backend.insert_metrics(conn, metrics, fresh)
        side_added = sum(_insert_side(store, conn, obj, run_id) for kind, obj in new if kind == "side")
        ends = [obj for kind, obj in new if kind == "end"]
        rank_status = _settle_rank(conn, run_id, rank, ends[-1], header.get("attempt")) if ends else None
        conn.execute(
            imports.insert().values(
                spill_id=spill_id,
                first_frame=done,
                end_frame=len(frames),
                run_id=run_id,
                rank=rank,
                rows=len(fresh),
                source=str(Path(path).resolve()),
                imported_at=time.time(),
            )
        )
        _settle_run(conn, run_id, len(batch))
    return ImportReport(
        **report, rows_added=len(fresh), rows_skipped=len(batch) - len(fresh), frames_read=len(frames) - done,
        side_rows_added=side_added, rank_status=rank_status,
    )


def _insert_side(store: Any, conn: sa.Connection, tables: dict[str, list[dict[str, Any]]], run_id: int) -> int:
    added = 0
    for table, rows in tables.items():
        for row in rows:
            row["run_id"] = run_id
        if rows:
            added += store.backend.insert_rows(conn, SIDE_TABLES[table],
                unseen_side_rows(conn, SIDE_TABLES[table], rows))
    return added


def _settle_rank(conn: sa.Connection, run_id: int, rank: int, end: dict[str, Any], attempt: int | None) -> str | None:
    """A rank whose end the store never heard ("missing": gather rank 0 did not; "running": the rank
    could not write the store at its end; or in ``unheard_ends`` for the file's launch, which a later
    launch registered again): record the last end its spill file holds, and count the values it
    spilled (this file's, taken off again below) and lost in the run. That end's counts cover
    every earlier phase whose counts the run lacks (spill.py's header).

    Returns:
        The rank's status, when its end was unknown; None when the store knew its end already.
    """
    latest = conn.execute(sa.select(sa.func.max(attempts.c.attempt)).where(attempts.c.run_id == run_id)).scalar()
    # the ranks row is the file's launch's unless a later launch registered the rank again
    current = attempt is None or latest is None or int(attempt) == int(latest)
    status = conn.execute(sa.select(ranks.c.status).where(ranks.c.run_id == run_id, ranks.c.rank == rank)).scalar()
    row_unended = current and status in ("missing", "running")
    this_launch = sa.and_(unheard_ends.c.run_id == run_id, unheard_ends.c.rank == rank, unheard_ends.c.attempt == attempt)
    unheard = attempt is not None and conn.execute(sa.select(sa.exists().where(this_launch))).scalar()
    if not (row_unended or unheard):
        return None  # the store heard its end, and counted its values then (run_end.record_end)
    if unheard:
        conn.execute(unheard_ends.delete().where(this_launch))
    if row_unended:
        conn.execute(ranks.update().where(ranks.c.run_id == run_id, ranks.c.rank == rank).values(status=end["status"]))
    if end.get("counted"):
        end = {**end, "values_spilled": 0, "values_lost": 0}  # in the run's totals already
    if not current:  # a later launch owns the run's status now: only the counts are this file's
        run_status: Any = runs.c.status
    elif end["status"] in ("failed", "interrupted"):  # a rank that failed, as rank 0 would have recorded had it heard
        run_status = sa.case((runs.c.status.in_(("incomplete", "running")), end["status"]), else_=runs.c.status)
    elif rank == 0:  # rank 0 could not record the run's end: it is over, whole or not (_settle_run)
        run_status = sa.case((runs.c.status == "running", "incomplete"), else_=runs.c.status)
    else:
        run_status = runs.c.status
    conn.execute(
        runs.update()
        .where(runs.c.id == run_id)
        .values(
            values_spilled=sa.func.coalesce(runs.c.values_spilled, 0) + int(end.get("values_spilled", 0)),
            values_lost=sa.func.coalesce(runs.c.values_lost, 0) + int(end.get("values_lost", 0)),
            status=run_status,
        )
    )
    return str(end["status"])


def _settle_run(conn: sa.Connection, run_id: int, values: int) -> None:
    """`values` spilled values are in the store now: count them off the run's ``values_spilled``;
    a run left "incomplete" only for want of them (no value lost, no rank whose end is unknown)
    is a success again."""
    row = conn.execute(sa.select(runs.c.status, runs.c.values_spilled, runs.c.values_lost).where(runs.c.id == run_id)).one()
    spilled = max((row.values_spilled or 0) - values, 0)
    status = row.status
    if status == "incomplete" and spilled == 0 and not row.values_lost and not _unended_ranks(conn, run_id):
        status = "success"  # only a run that ended in success is recorded as incomplete (run_end.py)
    if spilled != (row.values_spilled or 0) or status != row.status:
        conn.execute(runs.update().where(runs.c.id == run_id).values(values_spilled=spilled, status=status))
    if status == "success" and row.status == "incomplete":  # its launches were recorded as it stood then
        conn.execute(
            attempts.update().where(attempts.c.run_id == run_id, attempts.c.status == "incomplete").values(status="success")
        )


def _unended_ranks(conn: sa.Connection, run_id: int) -> int:
    """Ranks whose end the store does not know, in the latest launch or (``unheard_ends``) an earlier one."""
    query = sa.select(sa.func.count()).where(ranks.c.run_id == run_id, ranks.c.status.in_(("missing", "running")))
    unheard = sa.select(sa.func.count()).where(unheard_ends.c.run_id == run_id)
    return int(conn.execute(query).scalar_one()) + int(conn.execute(unheard).scalar_one())


# at most this many keys are named in the query above (SQLite allows 32,766 parameters)
_KEYS_IN_QUERY = 1_000


def _without_stored_rows(conn: sa.Connection, batch: pa.RecordBatch, run_id: int) -> pa.RecordBatch:
    """`batch` minus the rows whose (rank, seq, key) the run already holds."""
    rank, seq, key = column_lists(batch, ("rank", "seq", "key"))
    query = sa.select(metrics.c.rank, metrics.c.seq, metrics.c.key).where(
        metrics.c.run_id == run_id,
        metrics.c.rank.in_(sorted(set(rank))),
        metrics.c.seq.between(min(seq), max(seq)),
    )
    keys = set(key)
    if len(keys) <= _KEYS_IN_QUERY:
        # SQLite's metrics is keyed (run_id, key, rank, seq): naming the keys makes this a few
        # range seeks instead of a scan of the whole run
        query = query.where(metrics.c.key.in_(sorted(keys)))
    stored = {tuple(row) for row in conn.execute(query)}
    if not stored:
        return batch
    keep = np.fromiter((row not in stored for row in zip(rank, seq, key)), bool, len(batch))
    return take_rows(batch, keep)
