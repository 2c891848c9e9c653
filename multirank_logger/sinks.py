"""Where the writer thread puts a drained batch: straight into the store, or to rank 0.

- `DirectSink`: this rank writes its own rows into the store (SQLite, PostgreSQL: backends
  that take several writing processes).
- `GatherSink`: DuckDB admits one writing process per file, so rank 0 writes its own rows
  and whatever the other ranks ship through the `RowChannel`; the other ranks only send.

Both also carry run-level updates (hparams, status) that must survive a busy store:
queued here and applied by the writer thread with its retries, never by the training thread.

A sending rank whose rows cannot reach rank 0 (rank 0 died, or stopped taking rows) writes
them to a spill file on its own disk (spill.py) and says once, on its console, how to merge it.
"""

from __future__ import annotations

import logging
import shlex
import sys
import time
from typing import Any

from multirank_logger.buffer import MetricBatch, concat_batches, stamp_run_id
from multirank_logger.spill import SpillWriter
from multirank_logger.errors import StoreLocked
from multirank_logger.store import Store, retry_while_locked
from multirank_logger.transport import ChannelError, RowChannel
from multirank_logger.side_records import decode_side, encode_side
from multirank_logger.wire import decode_batch, decode_table

__all__ = ["DirectSink", "GatherSink"]

log = logging.getLogger(__name__)
_POLL_S = 0.01


class DirectSink:
    """This rank's batches go straight into the store (one transaction per batch).

    Args:
        store: an open Store (writing).
        run_id: the run that run-level updates apply to.
    """

    transport = "direct"

    def __init__(self, store: Store, run_id: int) -> None:
        self.store = store
        self.run_id = run_id
        self._run_updates: dict[str, Any] = {}

    @property
    def writes_seldom(self) -> bool:
        """True when each write opens the store (DuckDB): the writer then writes once per
        flush interval instead of every N calls (see writer.BackgroundWriter)."""
        return self.store.backend.opens_per_transaction

    @property
    def inserts_arrow(self) -> bool:
        """True when `write` takes pyarrow Tables (DuckDB): the writer then drains to Arrow."""
        return self.store.backend.inserts_arrow

    def update_run(self, **values: Any) -> None:
        """Queue column updates for the run row; applied by the next `poll`."""
        self._run_updates.update(values)

    def write(self, batch: MetricBatch | Any) -> None:
        self.store.write(batch)

    def write_side(self, tables: dict[str, list[dict[str, Any]]]) -> None:
        """Side-table rows (decisions, logs, step timing); raise to have them retried."""
        self.store.write_side(tables)

    def poll(self) -> None:
        if self._run_updates:
            updates = dict(self._run_updates)
            self.store.update_run(self.run_id, **updates)
            for key, value in updates.items():
                if self._run_updates.get(key) is value:
                    del self._run_updates[key]

    def close(self) -> None:
        """End of the phase: release what the sink holds besides the store."""

    def finish(self, status: str, timeout: float) -> dict[int, str]:
        """Nothing to wait for: every rank wrote its own rows. Returns no other rank's status."""
        return {}


class GatherSink(DirectSink):
    """Rank 0 writes its own rows and drains the other ranks' rows from the channel.

    On ranks other than 0, `store` is None and batches are sent through the channel; what
    cannot be delivered goes to a spill file (`spill`).

    On rank 0, `write` only keeps the batch: `poll` writes it together with everything the
    other ranks sent since the last poll, as one batch in one transaction. Writing each
    received batch in its own transaction made rank 0 fall seconds behind (a DuckDB file is
    opened and closed around each one).

    Args:
        store: the open Store on rank 0, None elsewhere.
        run_id: the run's id.
        channel: the RowChannel of this logger's launch.
        spill: where a sending rank puts rows it cannot deliver (None: keep them in memory).
        db: the store as the user named it, for the import command shown with a spill.
    """

    transport = "gather"

    def __init__(
        self,
        store: Store | None,
        run_id: int,
        channel: RowChannel,
        *,
        spill: SpillWriter | None = None,
        db: str = "DB",
    ) -> None:
        super().__init__(store, run_id)  # type: ignore[arg-type]
        self.channel = channel
        self.spill = spill
        self.db = db
        #: batches neither delivered nor spilled (no spill writer, or the spill file failed)
        self.undelivered: list[MetricBatch] = []
        self._announced = False
        # rank 0: batches owned by the sink and not written yet (kept across failures); the
        # other ranks' rows stay Arrow tables where the store inserts from Arrow (DuckDB): no
        # Python object per row on rank 0, whose training thread waits on the GIL for those
        self._own: list[Any] = []  # MetricBatch objects, or Arrow tables (`inserts_arrow`)
        self._inbox: list[Any] = []
        self._side: list[dict[str, list[dict[str, Any]]]] = []  # rank 0: side rows not written yet
        #: side rows a sender could not deliver (rank 0 gone): counted in its final message
        self.side_undelivered = 0

    @property
    def is_receiver(self) -> bool:
        return self.channel.rank == 0

    @property
    def writes_seldom(self) -> bool:
        # a sender's write is a push to the TCPStore: cheap, and it keeps rank 0's lag short
        return self.is_receiver and super().writes_seldom

    @property
    def inserts_arrow(self) -> bool:
        # a sender encodes MetricBatch objects for the wire
        return self.is_receiver and super().inserts_arrow

    def write(self, batch: MetricBatch | Any) -> None:
        if self.is_receiver:
            self._own.append(batch)  # written by the poll that follows, with the others' rows
            return
        try:
            self.channel.send(batch)
        except ChannelError as exc:
            # rank 0 is gone: the writer must not retry into a dead channel forever
            self._spill(exc, exc.undelivered)

    def write_side(self, tables: dict[str, list[dict[str, Any]]]) -> None:
        if self.is_receiver:
            self._side.append(tables)  # written by the poll that follows
            return
        try:
            self.channel.send_side(encode_side(tables))
        except ChannelError as exc:
            rows = sum(map(len, tables.values()))
            self.side_undelivered += rows
            log.error("multirank_logger: rank %d lost %d side-table row(s) (decisions, logs, timing): %s",
                      self.channel.rank, rows, exc)

    def poll(self) -> None:
        if not self.is_receiver:
            return
        if not self._inbox:
            # receive() acknowledges the previous call's batches: they are written by now
            self._inbox = self._receive()
        self._side.extend(_stamp_side(decode_side(payload), self.run_id) for payload in self.channel.receive_side())
        if not (self._own or self._inbox or self._run_updates or self._side):
            return
        with self.store.writing():  # one connection for the run update and the rows
            super().poll()
            if self._own or self._inbox:
                self.store.write(concat_batches(self._own + self._inbox))  # one transaction
            self._own, self._inbox = [], []
            while self._side:
                self.store.write_side(self._side[0])
                self._side.pop(0)

    def _receive(self) -> list[Any]:
        decode = decode_table if self.inserts_arrow else decode_batch
        return [stamp_run_id(batch, self.run_id) for batch in self.channel.receive(decode)]

    def finish(self, status: str, timeout: float) -> dict[int, str]:
        """End of the run for this rank.

        Ranks other than 0 wait (bounded) for rank 0 to take their last rows, then say they are
        done. Rank 0 keeps draining until every other rank is done or `timeout` runs out.

        Returns:
            On rank 0, the status each other rank reported (missing ranks are absent).
        """
        if not self.is_receiver:
            try:
                self.channel.mark_done(status)
            except ChannelError as exc:
                self._spill(exc, exc.undelivered)
                return {}
            left = self.channel.wait_delivered(timeout)
            if left:
                self._spill(f"rank 0 did not acknowledge rank {self.channel.rank}'s last rows in {timeout:g} s", left)
            return {}
        deadline = time.monotonic() + timeout
        expected = set(range(1, self.channel.world_size))
        done: dict[int, str] = {}
        while not expected <= done.keys():
            self._poll_until(deadline)
            done = self.channel.done_ranks()
            if time.monotonic() >= deadline:
                missing = sorted(expected - done.keys())
                log.warning(
                    "multirank_logger: ranks %s did not finish sending within %.0f s; their rows may be incomplete.",
                    missing,
                    timeout,
                )
                return done
            time.sleep(_POLL_S)
        # one more receive acknowledges the last batches, so the senders stop waiting
        self._poll_until(deadline)
        self._inbox.extend(self._receive())
        if not self._poll_until(deadline):
            log.error("multirank_logger: %d received rows are not stored: the store stayed busy", self._held_rows())
        return done

    def _poll_until(self, deadline: float) -> bool:
        """`poll`, retried while a reader holds the DuckDB file, up to `deadline`."""
        try:
            retry_while_locked(self.poll, max(deadline - time.monotonic(), 0.0))
            return True
        except StoreLocked as exc:
            log.warning("multirank_logger: the store stayed busy until the deadline (%s)", exc)
            return False

    def _held_rows(self) -> int:
        return sum(len(b) for b in self._own + self._inbox)

    def close(self) -> None:
        """Drop the channel's connection; on rank 0 this sends the last acknowledgements."""
        self.channel.close()

    # -- spilling (ranks other than 0) ------------------------------------------------------

    def _spill(self, why: object, batches: list[MetricBatch]) -> None:
        """Put `batches` in this run's spill file; say once where it is and how to merge it."""
        rows = sum(len(b) for b in batches)
        if self.spill is None or not rows:
            self.undelivered.extend(b for b in batches if len(b))
            if rows:
                log.error("multirank_logger: %s (%d rows kept in memory only)", why, rows)
            return
        try:
            self.spill.write(batches)
        except OSError as exc:
            self.undelivered.extend(batches)
            log.error(
                "multirank_logger: %s; the spill file %s cannot be written (%s): %d rows kept in memory only",
                why, self.spill.path, exc, rows,
            )
            return
        if not self._announced:
            self._announced = True
            # on the console whatever the logging set-up: this file holds the only copy of the rows
            print(
                f"multirank_logger: rank {self.channel.rank} could not deliver its rows to rank 0 ({why}).\n"
                f"multirank_logger: they are kept in {self.spill.path}; rows that fail later go to the same file.\n"
                f"multirank_logger: merge them into the store (once rank 0's store is reachable) with:\n"
                f"    multirank-logger import {shlex.quote(self.db)} {shlex.quote(str(self.spill.path))}",
                file=sys.stderr,
                flush=True,
            )



def _stamp_side(tables: dict[str, list[dict[str, Any]]], run_id: int) -> dict[str, list[dict[str, Any]]]:
    """Received side rows under rank 0's run, as `stamp_run_id` does for metric rows."""
    for rows in tables.values():
        for row in rows:
            row["run_id"] = run_id
    return tables
