"""Rank 0's ``metrics.csv`` written as training goes, as CSVLogger writes it.

CSVLogger writes its unsaved rows at every ``save()`` (which the Trainer calls after every
``log_metrics``) and rewrites the file with a wider header when a new key appears; people
tail the file, read it right after ``save()`` (a callback, a notebook, Lightning's own
tests), and keep it after a crash. `LiveCsv` does the same from rank 0's log calls as they
were recorded (csv_logger_files.Rank0Files hands them over at ``save()`` and at each of the
writer's cycles), before they go to the store.

It never reads the store: appending needs only the calls, and a new key rewrites the file
from the file itself (its rows are rank 0's rows so far, and a data field is a number or
empty, so a line is split on commas). So the file does not depend on the transport, on a
reader holding a DuckDB file, or on how far rank 0 is behind in storing the other ranks'
rows. Files go through fsspec (save_dir.filesystem), as CSVLogger's do: ``save_dir`` may be
``memory://``, ``s3://``... The bytes are those of rows/csv_layout.py, the code that rebuilds
the file from the store, so the file at the end is CSVLogger's byte for byte.

Speed (``save()`` runs on the training thread after every log call): a local file is kept
open between writes, and a call whose keys the header holds takes the fast path, `_lines`: one
``str.format`` per call, from a template kept per order of the call's keys (the fields placed in
the header's columns, empty ones and the step baked in), and one ``os.write`` for all of them;
whether the file was removed under the run is looked at every `LOOK_EVERY_S` there (an
``fstat``), at every explicit flush and at the end. What is left is Python's own float
formatting (``repr``, ~0.4 us a value here), which no other way matches byte for byte.
"""

from __future__ import annotations

import contextlib
import csv
import io
import logging
import os
import posixpath
import time
from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from typing import Any

from multirank_logger.logger.save_dir import filesystem
from multirank_logger.rows.csv_layout import csv_columns, format_calls, write_header

__all__ = ["Call", "LiveCsv"]

log = logging.getLogger(__name__)
_LINE_END = "\r\n"
#: log calls kept for a file that cannot be written, at most: past it the file gives up for the
#: run (the store has the rows; the end writes the file from it), so memory stays bounded
MAX_PENDING_CALLS = 200_000
#: after a failed write the next try waits this long, doubling up to RETRY_MAX_S: save() runs at
#: every log call, and retrying each time would format every kept call again (a full disk: O(n^2))
RETRY_FIRST_S = 0.25
RETRY_MAX_S = 10.0
#: seconds between two looks, on the fast path, for a file removed under the run
LOOK_EVERY_S = 1.0
#: line templates kept (one per order of a call's keys); past it they are made again
_MAX_TEMPLATES = 256
#: one log call as recorded: (step, values)
Call = tuple[int | float, Mapping[Any, Any]]  # a whole float step stays as given: CSVLogger writes "3.0"


class LiveCsv:
    """One metrics.csv, extended by rank 0's log calls as they are handed over.

    Not thread-safe: its owner (csv_logger_files.Rank0Files) calls it under one lock. Calls
    that cannot be written (a full disk, a remote store down) are kept and written with the
    next ones; nothing is dropped while the process lives.

    Args:
        path: the file, local or any fsspec URL (``memory://...``, ``s3://...``).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._fs = filesystem(path)
        self._local = self._local_path()
        self._fd: int | None = None  # the local file, open for appending between writes
        self._size = 0  # its size after our last write: a write cut short is cut back to it
        self._look_at = 0.0  # monotonic time of the fast path's next look for a removed file
        #: tuple of a call's keys (in its order) -> its line's str.format template under `_columns`
        self._templates: dict[tuple[Any, ...], str] = {}
        self._columns: list[str] = []  # the header in the file; empty until the first write
        self._known: set[str] = set()  # the same, as a set: most calls bring no new key
        self._pending: list[tuple[int | float, Mapping[str, Any]]] = []
        self._warned = False
        self._retry_wait = 0.0  # seconds between tries since the last failed write
        self._retry_at = 0.0  # monotonic time of the next try
        #: False once the file misses rows for good (it gave up, or was removed under the run)
        self.complete = True
        #: data rows (log calls) in the file
        self.rows = 0
        #: True once the file could not be written for MAX_PENDING_CALLS calls: no more writes
        self.gave_up = False

    @property
    def pending(self) -> int:
        """Log calls kept for the next write (the last write failed)."""
        return len(self._pending)

    def add_calls(self, calls: Sequence[Call]) -> bool:
        """Write these log calls (in call order) after the ones before. Never raises.

        Returns:
            True when nothing is left to write.
        """
        if self.gave_up:
            return True
        if self._fd is not None and not self._pending:  # the usual case: save() after each log call
            try:
                fast = self._fast_append(self._lines(calls))
            except Exception:  # noqa: BLE001 - whatever it was, the careful way below deals with it
                fast = False
            if fast:
                self.rows += len(calls)
                return True
        known = self._known
        for step, values in calls:
            if not known.issuperset(values):  # a new key, or one that is not a str (Fabric's log_dict)
                # a key is written as its str; of two keys that print alike the later wins, as in the store
                values = {str(key): value for key, value in values.items()}
            self._pending.append((step, values))
        if self._retry_wait and time.monotonic() < self._retry_at and self.pending <= MAX_PENDING_CALLS:
            return False  # the last write failed: kept until the next try
        return self.write_pending()

    def write_pending(self) -> bool:
        """Write what is kept; True when nothing is left. Never raises."""
        calls = self._pending
        if not calls:
            return True
        known = self._known
        new = [key for _, values in calls if not known.issuperset(values) for key in values if key not in known]
        columns = csv_columns([*self._columns, *new]) if new else self._columns
        try:
            if not self._columns:
                self._start(columns, calls)
            elif self._removed_under_us():
                self._start_again(columns, calls)
            else:
                if columns != self._columns:
                    # CSVLogger's rule: a new key (header) rewrites the file
                    self._rewrite(columns)
                self._append(format_calls(columns, calls))
        except Exception as exc:  # noqa: BLE001 - kept for the next calls; the store has the rows anyway
            self.close()  # reopened by the next write: the file may have been replaced meanwhile
            self._retry_wait = min(max(2 * self._retry_wait, RETRY_FIRST_S), RETRY_MAX_S)
            self._retry_at = time.monotonic() + self._retry_wait
            if not self._warned:
                self._warned = True
                log.warning(
                    "multirank_logger: cannot write %s (%s: %s); its rows are kept and written with the next ones",
                    self.path,
                    type(exc).__name__,
                    exc,
                )
            if self.pending > MAX_PENDING_CALLS:
                log.error(
                    "multirank_logger: %s could not be written for %d log calls; it is no longer written as the run "
                    "goes (the store has the rows), and the end writes it from the store", self.path, self.pending,
                )
                self._pending, self.complete, self.gave_up = [], False, True
            return False
        self.rows += len(calls)
        self._pending = []
        self._warned = False
        self._retry_wait = 0.0
        return True

    def _lines(self, calls: Sequence[Call]) -> str | None:
        """The calls' lines under the header, or None when one of them brings a key it lacks."""
        templates = self._templates
        lines = []
        for step, values in calls:
            template = templates.get(tuple(values))
            if template is None:
                template = self._template(values)
                if template is None:
                    return None
            lines.append(template.format(*values.values(), step))
        return "".join(lines)

    def _template(self, values: Mapping[Any, Any]) -> str | None:
        """The line of a call with these keys (in this order): each field ``{i}`` (``str()`` of the
        call's i-th value, as csv writes it), the step argument in ``step`` (over a key "step", as
        CSVLogger sets it last), empty where the call has no value. None for a key not in the header."""
        keys = tuple(values)
        if not self._known.issuperset(keys) or not all(type(key) is str for key in keys):
            return None  # a new key (the file is rewritten), or one that is not a str (Fabric's log_dict)
        where = {key: i for i, key in enumerate(keys)}
        where["step"] = len(keys)  # the step argument, after the values
        template = ",".join(f"{{{where[name]}}}" if name in where else "" for name in self._columns) + _LINE_END
        if len(self._templates) >= _MAX_TEMPLATES:
            self._templates.clear()
        self._templates[keys] = template
        return template

    def _fast_append(self, text: str | None) -> bool:
        """Append to the open file in one write; False (nothing written) when a call brings a new key
        (`text` None), the file may have been removed, or the write failed: the caller goes the
        careful way."""
        fd = self._fd
        if text is None or fd is None:
            return False
        now = time.monotonic()
        if now >= self._look_at:
            self._look_at = now + LOOK_EVERY_S
            try:
                if os.fstat(fd).st_nlink == 0:
                    return False
            except OSError:
                return False
        data = text.encode()
        try:
            written = os.write(fd, data)
            while written < len(data):
                written += os.write(fd, data[written:])
        except BaseException as exc:  # cut back to whole lines, then the careful way writes (or keeps) the calls
            with contextlib.suppress(OSError):
                os.ftruncate(fd, self._size)
            if not isinstance(exc, Exception):
                self.complete = False  # Ctrl-C: these calls miss the file, which the end rebuilds from the store
                raise
            return False
        self._size += len(data)
        return True

    def look_for_file(self) -> None:
        """An explicit flush: a file removed under the run starts again now (header first), not at
        the fast path's next look."""
        self._look_at = 0.0
        if self._columns and not self.gave_up and self._removed_under_us():
            self._start_again(self._columns, [])

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
                self._set_columns(next(csv.reader(fp)))
            self.rows = rows

    def close(self) -> None:
        """Close the local file kept open (the next write opens it again)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self) -> None:
        self.close()

    def _set_columns(self, columns: list[str]) -> None:
        self._columns = columns
        self._known = set(columns)
        self._templates = {}

    def _append(self, text: str) -> None:
        """The calls' lines at the end of the file; all of them or none (a full disk).

        An append cut short leaves part of a line: that tail is cut off again, so the file
        keeps whole lines and the retry does not write the first lines twice."""
        if self._local is None:  # a remote file: fsspec uploads the whole file at close
            with self._fs.open(self.path, "a", newline="") as fp:
                fp.write(text)
            return
        if self._fd is None:
            self._fd = os.open(self._local, os.O_WRONLY | os.O_APPEND)
            self._look_at = time.monotonic() + LOOK_EVERY_S  # just opened by its path
        data = text.encode()
        size = self._size = os.fstat(self._fd).st_size
        try:
            written = os.write(self._fd, data)
            while written < len(data):
                written += os.write(self._fd, data[written:])
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, size)  # frees blocks: works on a full disk
            raise
        self._size += len(data)

    def _removed_under_us(self) -> bool:
        """The file we write is no longer at its path (deleted, or moved away)."""
        local = self._local
        if local is None:
            return False
        if self._fd is not None:
            with contextlib.suppress(OSError):
                if os.fstat(self._fd).st_nlink > 0:
                    return False  # one fstat: no path lookup on every save()
            self.close()
        return not os.path.lexists(local)

    def _start_again(self, columns: list[str], calls: list[tuple[int | float, Mapping[str, Any]]]) -> None:
        """The file was deleted under the run (by hand, a cleanup job): appending would make a
        file with no header and no earlier rows. It starts again from these calls, and the end
        writes the whole file from the store (the file no longer holds every row)."""
        if self.complete:  # once, not at each retry of a start that fails
            log.warning(
                "multirank_logger: %s was removed during the run; it starts again from here, and the whole file "
                "is written from the store at the end", self.path,
            )
        self.complete = False
        self.rows = 0
        self._start(columns, calls)

    def _local_path(self) -> str | None:
        """The file's path on this machine, or None on a remote filesystem (appends there are
        uploads of the whole file: no torn tail to cut)."""
        protocol = self._fs.protocol
        protocols = (protocol,) if isinstance(protocol, str) else tuple(protocol)
        return self._fs._strip_protocol(self.path) if "file" in protocols else None

    def _start(self, columns: list[str], calls: list[tuple[int | float, Mapping[str, Any]]]) -> None:
        """The first write of this run: a fresh file, replacing one a former run left."""
        self.close()
        self._fs.makedirs(posixpath.dirname(self.path) or ".", exist_ok=True)
        header = io.StringIO()
        write_header(header, columns)
        try:
            with self._fs.open(self.path, "w", newline="") as fp:
                fp.write(header.getvalue() + format_calls(columns, calls))
        except BaseException:
            with contextlib.suppress(Exception):
                self._fs.rm(self.path)  # no header cut short left behind; the retry starts again
            raise
        self._set_columns(columns)

    def _rewrite(self, columns: list[str]) -> None:
        """The file under the wider header `columns`: each line's fields moved to their new
        columns, empty in the new ones. Written aside and moved over the file, so that a
        reader sees the old file or the new one, never half of one."""
        self.close()  # the file is replaced: the next append opens the new one
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
        self._set_columns(columns)
