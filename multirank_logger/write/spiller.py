"""Spiller: where this rank's rows go when the store (or rank 0) does not take them, and what the user is told.

Every sink (sinks.py) has one. The writer thread (writer_thread.py) hands it what the store refuses for
good, or what it held past its bound; a gather sender what it cannot deliver to rank 0. The
rows go to this rank's spill file (store/spill_file.py), which ``multirank-logger import``
reads back (store/spill_import.py). The user is told once per failure episode, with the
command that recovers the rows; when even the spill file cannot be written, the values lost
are counted, loudly. Which store errors are worth a retry first: store/write_errors.py.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa

from multirank_logger.store.spill_file import SpillWriter

__all__ = ["Spiller"]


class Spiller:
    """This rank's way out for rows the store (or rank 0) did not take.

    Args:
        spill: the rank's spill writer (its file is created on the first write).
        db: the store as the import command must name it.
        rank: this process's global rank, for the messages.
    """

    def __init__(self, spill: SpillWriter, db: str, rank: int) -> None:
        self.spill = spill
        self.db = db
        self.rank = rank
        self.values_spilled = 0
        self.values_lost = 0
        #: side-table rows (decisions, logs, step timing): not metric values, counted apart
        self.side_rows_spilled = 0
        self.side_rows_lost = 0
        self._told_spilled = False  # once until the store takes rows again (`store_recovered`)
        self._told_lost = False
        self._told_side_lost = False

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
                _to_stderr(
                    f"multirank_logger: rank {self.rank}: {why}; the spill file {self.path} cannot be written either "
                    f"({exc.strerror or exc}). {values} value(s) are LOST (more are counted at the end of the run)."
                )
            return 0
        self.values_spilled += values
        if not self._told_spilled:
            self._told_spilled = True
            _to_stderr(
                f"multirank_logger: rank {self.rank}: {why}.\n"
                f"multirank_logger: {values} value(s) are kept in {self.path}; values that fail later go to the "
                "same file.\nmultirank_logger: merge them into the store once it is writable with:\n"
                f"    {self.import_command()}"
            )
        return values

    def count_lost(self, values: int, why: str) -> None:
        """Metric values lost before they could be written or spilled: counted (the run is then
        never `success`), said each time (it is a bug: a log call passed checks the writer failed)."""
        self.values_lost += values
        _to_stderr(f"multirank_logger: rank {self.rank}: {why}: {values} value(s) are LOST (the total is said "
                   "at the end of the run).")

    def count_side_lost(self, rows: int, why: str) -> None:
        """Side-table rows lost before they could be written or spilled: counted, said once."""
        self.side_rows_lost += rows
        if not self._told_side_lost:
            self._told_side_lost = True
            _to_stderr(f"multirank_logger: rank {self.rank}: {why}: {rows} side-table row(s) (decisions, logs, "
                       "timing) are LOST (the total is said at the end of the run).")

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
            _to_stderr(f"multirank_logger: rank {self.rank}: {why}; {rows} side-table row(s) (decisions, logs, timing) "
                      f"are LOST: the spill file {self.path} cannot be written ({exc.strerror or exc}).")
            return 0
        self.side_rows_spilled += rows
        if not self._told_spilled:
            self._told_spilled = True
            _to_stderr(
                f"multirank_logger: rank {self.rank}: {why}.\nmultirank_logger: {rows} side-table row(s) (decisions, "
                f"logs, timing) are kept in {self.path}; merge them into the store once it is writable with:\n"
                f"    {self.import_command()}"
            )
        return rows

    def end(
        self, status: str, values_spilled: int, values_lost: int, *, counted: bool = False,
        others: dict[int, dict[str, Any]] | None = None,
    ) -> None:
        """Record in the spill file (when there is one) how this rank ended and the values it did
        not deliver that the run's totals lack (`counted`: the run has them already), for a store
        that never heard its end (spill_import.import_spill); `others`: the ends gather rank 0
        heard from the ranks whose rows it wrote. Best effort."""
        try:
            self.spill.write_end(status, values_spilled, values_lost, counted=counted, others=others)
        except OSError:
            pass  # the file's rows are still importable; the run then stays "incomplete"

    def say(self, text: str) -> None:
        """Tell the user, on stderr whatever the logging set-up (the rows may be in the spill file only)."""
        _to_stderr(text)

    def store_recovered(self) -> None:
        """The store took rows again: the next failure gets a message of its own."""
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
