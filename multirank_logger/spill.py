"""Spill files: rows a rank could not deliver to rank 0, kept on its local disk for a later import.

When rank 0 is gone (or stops taking rows), a sending rank appends the undelivered
batches to its own spill file; ``multirank-logger import DB FILE...`` merges them later.

File format (version 1): one line of JSON (the header: ``spill_id``, the run's ``run_id``,
``name`` and ``version``, ``rank``, ``host``, ``pid``, ``created_at``), then frames, each
``<u64 length><payload><u32 crc32(payload)>`` where the payload is
``wire.encode_batch``'s encoding. A frame is written, flushed and fsynced in one go,
so a crash can tear at most the last frame, which the reader drops.

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
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from multirank_logger.buffer import MetricBatch
from multirank_logger.errors import LookupFailed, MultiRankLoggerError
from multirank_logger.schema import imports, metrics, runs
from multirank_logger.wire import decode_batch, encode_batch

__all__ = ["SPILL_SUFFIX", "ImportReport", "SpillCorrupt", "SpillWriter", "import_spill", "read_spill"]

SPILL_SUFFIX = ".mrspill"
_FORMAT = "multirank-spill"
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

    def __init__(self, directory: str | os.PathLike[str], *, run_id: int, name: str, version: int, rank: int) -> None:
        self.directory = Path(directory)
        self.header: dict[str, Any] = {
            "format": _FORMAT,
            "format_version": 1,
            "spill_id": uuid.uuid4().hex,
            "run_id": run_id,
            "name": name,
            "version": version,
            "rank": rank,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "created_at": time.time(),
        }
        self.path = self.directory / f"{name}-version_{version}-rank{rank}-{self.header['spill_id'][:12]}{SPILL_SUFFIX}"
        self.rows_written = 0

    def write(self, batches: Iterable[MetricBatch]) -> int:
        """Append `batches` (empty ones skipped) as durable frames.

        Returns:
            The number of rows written by this call.

        Raises:
            OSError: when the file cannot be written (the caller warns: the rows are lost).
        """
        frames = [b for b in batches if len(b)]
        if not frames:
            return 0
        self.directory.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists()
        with open(self.path, "ab") as fh:
            if new:
                fh.write(json.dumps(self.header, sort_keys=True).encode() + b"\n")
            for batch in frames:
                payload = encode_batch(batch)
                fh.write(_LENGTH.pack(len(payload)) + payload + _CRC.pack(zlib.crc32(payload)))
            fh.flush()
            # these are the only copies of the rows: make them survive a node crash
            os.fsync(fh.fileno())
        rows = sum(len(b) for b in frames)
        self.rows_written += rows
        return rows


def read_spill(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[MetricBatch]]:
    """The header and the complete frames of a spill file (a torn last frame is dropped).

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
    batches: list[MetricBatch] = []
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
            raise SpillCorrupt(str(path), f"frame {len(batches)} fails its checksum")
        try:
            batches.append(decode_batch(bytes(payload)))
        except ValueError as exc:
            raise SpillCorrupt(str(path), f"frame {len(batches)}: {exc}") from exc
        pos = end
    return header, batches


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

    @property
    def already_imported(self) -> bool:
        return self.frames_read == 0


def import_spill(store: Any, path: str | os.PathLike[str]) -> ImportReport:
    """Merge a spill file into `store` (a writable Store), in one transaction. Idempotent.

    The run is found by its (name, version), so the file imports into any store that holds
    that run, whatever its id there.

    Raises:
        SpillCorrupt: when the file cannot be read as a spill file.
        LookupFailed: when the store holds no run with the file's name and version.
    """
    header, frames = read_spill(path)
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
        report = dict(path=str(path), spill_id=spill_id, run_id=run_id, name=name, version=version, rank=rank)
        if done >= len(frames):
            return ImportReport(**report, rows_added=0, rows_skipped=0, frames_read=0)
        batch = MetricBatch.concat(frames[done:])
        batch.run_id = [run_id] * len(batch)  # the store's id for the run, not the one the rank knew
        fresh = _without_stored_rows(conn, batch, run_id)
        if len(fresh):
            store.backend.insert_metrics(conn, metrics, fresh)
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
        **report, rows_added=len(fresh), rows_skipped=len(batch) - len(fresh), frames_read=len(frames) - done
    )


def _settle_run(conn: sa.Connection, run_id: int, values: int) -> None:
    """`values` spilled values are in the store now: count them off the run's ``values_spilled``;
    a run left "incomplete" only for want of them is a success again (spilled values counted
    nowhere, e.g. a gather sender's, leave the count at 0)."""
    row = conn.execute(sa.select(runs.c.status, runs.c.values_spilled, runs.c.values_lost).where(runs.c.id == run_id)).one()
    spilled = max((row.values_spilled or 0) - values, 0)
    status = row.status
    if status == "incomplete" and spilled == 0 and not row.values_lost:
        status = "success"  # only a run that ended in success is recorded as incomplete (run_end.py)
    if spilled != (row.values_spilled or 0) or status != row.status:
        conn.execute(runs.update().where(runs.c.id == run_id).values(values_spilled=spilled, status=status))


# at most this many keys are named in the query above (SQLite allows 32,766 parameters)
_KEYS_IN_QUERY = 1_000


def _without_stored_rows(conn: sa.Connection, batch: MetricBatch, run_id: int) -> MetricBatch:
    """`batch` minus the rows whose (rank, seq, key) the run already holds."""
    lo, hi = min(batch.seq), max(batch.seq)
    query = sa.select(metrics.c.rank, metrics.c.seq, metrics.c.key).where(
        metrics.c.run_id == run_id,
        metrics.c.rank.in_(sorted(set(batch.rank))),
        metrics.c.seq.between(lo, hi),
    )
    keys = set(batch.key)
    if len(keys) <= _KEYS_IN_QUERY:
        # SQLite's metrics is keyed (run_id, key, rank, seq): naming the keys makes this a few
        # range seeks instead of a scan of the whole run
        query = query.where(metrics.c.key.in_(sorted(keys)))
    stored = {tuple(row) for row in conn.execute(query)}
    if not stored:
        return batch
    keep = [i for i, row in enumerate(zip(batch.rank, batch.seq, batch.key)) if row not in stored]
    return MetricBatch(**{k: [col[i] for i in keep] for k, col in batch.__dict__.items()})
