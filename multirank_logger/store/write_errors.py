"""Rows the store did not take: which write errors pass, where the rows go, what the user is told.

The writer (writer.py) keeps a failing batch in memory and retries it while the error is
*transient* (a reader holding the DuckDB file, a busy SQLite file, a full disk that may
free up, a PostgreSQL server restarting). A *permanent* error (a row colliding with a stored
one on the unique key (run_id, rank, seq, key)) would fail the same way forever: those rows
go to the spill file at once, and the rows after them are written as usual.

`Spiller` puts rows in this rank's spill file (spill.py, read back by ``multirank-logger
import``) and says so once per failure episode, with the command that recovers them; when
even the spill file cannot be written, it counts the values lost, loudly.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import sqlalchemy as sa

from multirank_logger.errors import StoreGone, StoreLocked
from multirank_logger.store.spill_file import SpillWriter

__all__ = ["HELD_VALUES_LIMIT", "Spiller", "describe", "is_transient"]

#: values a writer keeps in memory while the store refuses them; past it they go to the spill
#: file. Its memory, as Arrow and as Python lists: benchmarks/RESULTS.md ("Figures the source cites")
HELD_VALUES_LIMIT = 500_000

# what a driver says when the failure is the store's state, not the rows: it may pass
_TRANSIENT_TEXT = (
    "locked", "busy", "disk is full", "no space left", "disk i/o error", "readonly database", "read-only",
    "unable to open", "could not connect", "connection", "server closed", "terminating", "shutting down",
    "could not write", "io error", "cannot open", "timeout", "timed out", "not accepting",
)


# a store whose tables vanished: its file was deleted and a fresh one opened at the same path
# (between the check in sinks.DirectSink and the open; the new file can even reuse the inode)
_MISSING_TABLE = re.compile(r"no such table|Table with name \w+ does not exist|relation \"\w+\" does not exist")


def is_transient(exc: BaseException) -> bool:
    """True when retrying the same rows later may succeed (the store, not the rows, is at fault)."""
    if isinstance(exc, (StoreLocked, StoreGone, OSError)):
        return True
    if _MISSING_TABLE.search(str(exc)):
        return True  # the store's file was replaced under us (an empty one at its path): not the rows' fault
    if isinstance(exc, sa.exc.IntegrityError):
        return False  # a key collision or a NOT NULL: these rows fail the same way every time
    if isinstance(exc, sa.exc.DBAPIError):
        if exc.connection_invalidated or isinstance(exc, (sa.exc.OperationalError, sa.exc.InterfaceError)):
            return True
        text = str(exc.orig).lower()
        return any(marker in text for marker in _TRANSIENT_TEXT)
    text = str(exc).lower()  # DuckDB raises its own classes (IOException, ...) through some paths
    return type(exc).__name__ in ("IOException", "ConnectionException") or any(m in text for m in _TRANSIENT_TEXT)


def describe(exc: BaseException) -> str:
    """One line for a message: the error's class and the first line of its text."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


class Spiller:
    """This rank's way out for rows the store (or rank 0) did not take.

    Args:
        spill: the rank's spill writer (its file is created on the first write).
        db: the store as the import command must name it.
        rank: this process's global rank, for the messages.
        say: where messages go (stderr: the only copy of the rows is now in that file).
    """

    def __init__(self, spill: SpillWriter, db: str, rank: int, say: Callable[[str], None] | None = None) -> None:
        self.spill = spill
        self.db = db
        self.rank = rank
        self._say = say or _to_stderr
        self.values_spilled = 0
        self.values_lost = 0
        #: side-table rows (decisions, logs, step timing): not metric values, counted apart
        self.side_rows_spilled = 0
        self.side_rows_lost = 0
        self._told_spilled = False  # per episode: reset by `episode_over`
        self._told_lost = False

    @property
    def path(self) -> Path:
        return self.spill.path

    def import_command(self) -> str:
        return f"multirank-logger import {shlex.quote(self.db)} {shlex.quote(str(self.path))}"

    def put(self, batches: list[pa.RecordBatch], why: str) -> int:
        """Append `batches` to the spill file; count them as lost if that fails too.

        Returns:
            The values spilled (0 when they were lost).
        """
        frames = [b for b in batches if len(b)]
        values = sum(map(len, frames))
        if not values:
            return 0
        try:
            self.spill.write(frames)
        except OSError as exc:
            self.values_lost += values
            if not self._told_lost:
                self._told_lost = True
                self._say(
                    f"multirank_logger: rank {self.rank}: {why}; the spill file {self.path} cannot be written either "
                    f"({exc.strerror or exc}). {values} value(s) are LOST (more are counted at the end of the run)."
                )
            return 0
        self.values_spilled += values
        if not self._told_spilled:
            self._told_spilled = True
            self._say(
                f"multirank_logger: rank {self.rank}: {why}.\n"
                f"multirank_logger: {values} value(s) are kept in {self.path}; values that fail later go to the "
                "same file.\nmultirank_logger: merge them into the store once it is writable with:\n"
                f"    {self.import_command()}"
            )
        return values

    def put_side(self, tables: dict[str, list[dict[str, Any]]], why: str) -> int:
        """Append side-table rows to the spill file; count them as lost if that fails too.

        Returns:
            The rows spilled (0 when they were lost).
        """
        rows = sum(map(len, tables.values()))
        if not rows:
            return 0
        try:
            self.spill.write_side(tables)
        except OSError as exc:
            self.side_rows_lost += rows
            self._say(f"multirank_logger: rank {self.rank}: {why}; {rows} side-table row(s) (decisions, logs, timing) "
                      f"are LOST: the spill file {self.path} cannot be written ({exc.strerror or exc}).")
            return 0
        self.side_rows_spilled += rows
        if not self._told_spilled:
            self._told_spilled = True
            self._say(
                f"multirank_logger: rank {self.rank}: {why}.\nmultirank_logger: {rows} side-table row(s) (decisions, "
                f"logs, timing) are kept in {self.path}; merge them into the store once it is writable with:\n"
                f"    {self.import_command()}"
            )
        return rows

    def end(self, status: str, values_spilled: int, values_lost: int, *, counted: bool = False) -> None:
        """Record in the spill file (when there is one) how this rank ended and the values it did
        not deliver that the run's totals lack (`counted`: the run has them already), for a store
        that never heard its end (spill_import.import_spill). Best effort."""
        try:
            self.spill.write_end(status, values_spilled, values_lost, counted=counted)
        except OSError:
            pass  # the file's rows are still importable; the run then stays "incomplete"

    def say(self, text: str) -> None:
        self._say(text)

    def episode_over(self) -> None:
        """The store took rows again: the next failure is a new episode, with its own message."""
        self._told_spilled = self._told_lost = False

    def summary(self) -> str | None:
        """The end-of-run line when anything was spilled or lost, else None."""
        if not (self.values_spilled or self.values_lost or self.side_rows_spilled or self.side_rows_lost):
            return None
        parts = []
        if self.values_spilled:
            parts.append(f"{self.values_spilled} value(s) are in {self.path} (run: {self.import_command()})")
        if self.side_rows_spilled:
            parts.append(f"{self.side_rows_spilled} side-table row(s) are in {self.path} (run: {self.import_command()})")
        if self.values_lost:
            parts.append(f"{self.values_lost} value(s) are LOST (neither the store nor the spill file took them)")
        if self.side_rows_lost:
            parts.append(f"{self.side_rows_lost} side-table row(s) are LOST")
        return f"multirank_logger: rank {self.rank}: the run is incomplete in the store: " + "; ".join(parts) + "."


def _to_stderr(text: str) -> None:
    # on the console whatever the logging set-up: the user must see where the rows are
    print(text, file=sys.stderr, flush=True)
