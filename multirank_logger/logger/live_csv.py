"""Rank 0's ``metrics.csv`` written as training goes, as CSVLogger writes it.

CSVLogger appends its unsaved rows every ``flush_logs_every_n_steps`` and rewrites the
file with a wider header when a new key appears; people tail the file, plot it from a
notebook while the run trains, and keep it after a crash. `LiveCsv` does the same from
the background writer thread: the writer hands it each batch of rank 0's own rows as it
drains them (`BackgroundWriter`'s ``tap``), before they go to the store.

It never reads the store: appending needs only the batch, and a new key rewrites the file
from the file itself (its rows are rank 0's rows so far, and a data field is a number or
empty, so a line is split on commas). So the file does not depend on the transport, on a
reader holding a DuckDB file, or on how far rank 0 is behind in storing the other ranks'
rows. Files go through fsspec (`get_filesystem`), as CSVLogger's do: ``save_dir`` may be
``memory://``, ``s3://``... The bytes come from model/csv_layout.py, the code that rebuilds the
file from the store, so the file at the end is CSVLogger's byte for byte.
"""

from __future__ import annotations

import contextlib
import csv
import logging
import os
import posixpath
from collections.abc import Callable
from operator import itemgetter
from typing import Any

import pyarrow as pa
from lightning.fabric.utilities.cloud_io import get_filesystem

from multirank_logger.model.csv_layout import LongRows, csv_columns, write_header, write_rows

__all__ = ["LiveCsv"]

log = logging.getLogger(__name__)
_LINE_END = "\r\n"
#: log calls kept for a file that cannot be written, at most: past it the file gives up for the
#: run (the store has the rows; the end writes the file from it), so memory stays bounded
MAX_PENDING_CALLS = 200_000


class LiveCsv:
    """One metrics.csv, extended by every batch of rank 0's rows the writer drains.

    Called from the writer's cycles only (one at a time): no lock of its own. A batch that
    cannot be written (a full disk, a remote store down) is kept and written with the next
    one; nothing is dropped while the process lives.

    Args:
        path: the file, local or any fsspec URL (``memory://...``, ``s3://...``).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._fs = get_filesystem(path)
        self._columns: list[str] = []  # the header in the file; empty until the first write
        self._pending: list[LongRows] = []
        self._warned = False
        #: False once a batch could not even be read (a bug): the file then misses rows for good
        self.complete = True
        #: data rows (log calls) in the file
        self.rows = 0
        #: True once the file could not be written for MAX_PENDING_CALLS calls: no more writes
        self.gave_up = False

    @property
    def pending(self) -> int:
        """Log calls kept for the next write (the last write failed)."""
        return sum(len(rows.call_starts()) for rows in self._pending)

    def add(self, batch: pa.RecordBatch) -> None:
        """Write one drained batch of rank 0's rows (called by the writer thread). Never raises."""
        if self.gave_up:
            return
        try:
            rows = LongRows.from_arrow(batch)
        except Exception as exc:  # noqa: BLE001 - the writer must go on storing rows
            self.complete = False
            log.error(
                "multirank_logger: %s misses rows that could not be read: %s: %s", self.path, type(exc).__name__, exc
            )
            return
        if len(rows):
            self._pending.append(rows)
        self.write_pending()

    def write_pending(self) -> bool:
        """Write what is kept; True when nothing is left. Never raises."""
        if not self._pending:
            return True
        rows = self._pending[0] if len(self._pending) == 1 else LongRows.concat(self._pending)
        columns = csv_columns([*self._columns, *rows.keys])
        try:
            if not self._columns:
                self._start(columns, rows)
            elif self._removed_under_us():
                self._start_again(columns, rows)
            else:
                if columns != self._columns:
                    # CSVLogger's rule: a new key (header) rewrites the file
                    self._rewrite(columns)
                self._append(columns, rows)
        except Exception as exc:  # noqa: BLE001 - kept for the next batch; the store has the rows anyway
            if not self._warned:
                self._warned = True
                log.warning(
                    "multirank_logger: cannot write %s (%s: %s); its rows are kept and written with the next ones",
                    self.path,
                    type(exc).__name__,
                    exc,
                )
            self._pending = [rows]
            if self.pending > MAX_PENDING_CALLS:
                log.error(
                    "multirank_logger: %s could not be written for %d log calls; it is no longer written as the run "
                    "goes (the store has the rows), and the end writes it from the store", self.path, self.pending,
                )  # fmt: skip
                self._pending, self.complete, self.gave_up = [], False, True
            return False
        self._pending = []
        self._warned = False
        return True

    def continue_from(self, write_earlier: Callable[[Any], int]) -> None:
        """Begin with the rows earlier launches of the run stored (a resume, a ddp_spawn test
        after fit): `write_earlier(fp)` writes them in CSVLogger's format and returns how many,
        so that the file holds the whole history, never this launch alone.

        Raises:
            whatever reading the store or writing the file raised (the caller then exports the
            whole file from the store at the end).
        """
        self._fs.makedirs(posixpath.dirname(self.path) or ".", exist_ok=True)
        with self._fs.open(self.path, "w", newline="") as fp:
            rows = write_earlier(fp)
        if rows:
            with self._fs.open(self.path, "r", newline="") as fp:
                self._columns = next(csv.reader(fp))
            self.rows = rows

    def _append(self, columns: list[str], rows: LongRows) -> None:
        """The batch's lines at the end of the file; all of them or none (a full disk).

        An append cut short leaves part of a line: that tail is cut off again, so the file
        keeps whole lines and the retry does not write the first lines twice."""
        local = self._local_path()
        size = None
        if local is not None:
            with contextlib.suppress(OSError):
                size = os.path.getsize(local)
        try:
            with self._fs.open(self.path, "a", newline="") as fp:
                written = write_rows(fp, columns, [rows])
        except BaseException:
            if local is not None and size is not None:
                with contextlib.suppress(OSError):
                    os.truncate(local, size)  # frees blocks: works on a full disk
            raise
        self.rows += written

    def _removed_under_us(self) -> bool:
        local = self._local_path()
        return local is not None and not os.path.lexists(local)

    def _start_again(self, columns: list[str], rows: LongRows) -> None:
        """The file was deleted under the run (by hand, a cleanup job): appending would make a
        file with no header and no earlier rows. It starts again from this batch, and the end
        writes the whole file from the store (the file no longer holds every row)."""
        if self.complete:  # once, not at each retry of a start that fails
            log.warning(
                "multirank_logger: %s was removed during the run; it starts again from here, and the whole file "
                "is written from the store at the end", self.path,
            )  # fmt: skip
        self.complete = False
        self._start(columns, rows)

    def _local_path(self) -> str | None:
        """The file's path on this machine, or None on a remote filesystem (appends there are
        uploads of the whole file: no torn tail to cut)."""
        protocol = self._fs.protocol
        protocols = (protocol,) if isinstance(protocol, str) else tuple(protocol)
        return self._fs._strip_protocol(self.path) if "file" in protocols else None

    def _start(self, columns: list[str], rows: LongRows) -> None:
        """The first write of this run: a fresh file, replacing one a former run left."""
        self._fs.makedirs(posixpath.dirname(self.path) or ".", exist_ok=True)
        try:
            with self._fs.open(self.path, "w", newline="") as fp:
                write_header(fp, columns)
                self.rows = write_rows(fp, columns, [rows])
        except BaseException:
            with contextlib.suppress(Exception):
                self._fs.rm(self.path)  # no header cut short left behind; the retry starts again
            raise
        self._columns = columns

    def _rewrite(self, columns: list[str]) -> None:
        """The file under the wider header `columns`: each line's fields moved to their new
        columns, empty in the new ones. Written aside and moved over the file, so that a
        reader sees the old file or the new one, never half of one."""
        old = self._columns
        where = {name: i for i, name in enumerate(old)}
        # one more field, always empty, for the columns the old lines do not have
        pick = itemgetter(*[where.get(name, len(old)) for name in columns])
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            with self._fs.open(self.path, "r", newline="") as src, self._fs.open(tmp, "w", newline="") as dst:
                src.readline()  # the old header: known, and it may hold quoted keys
                write_header(dst, columns)
                for line in src:
                    fields = line[: -len(_LINE_END)].split(",")
                    fields.append("")
                    dst.write(",".join(pick(fields)) + _LINE_END)
            self._fs.mv(tmp, self.path)
        except BaseException:
            with contextlib.suppress(Exception):
                self._fs.rm(tmp)  # a half copy on a full disk takes the room the retry needs
            raise
        self._columns = columns
