"""Where the writer thread puts a drained batch: straight into the store, or to rank 0.

- `DirectSink`: this rank writes its own rows into the store (SQLite, PostgreSQL: backends
  that take several writing processes).
- `GatherSink`: DuckDB admits one writing process per file, so rank 0 writes its own rows
  and whatever the other ranks ship through the `RowChannel`; the other ranks only send.

Both also carry run-level updates (hparams, status) that must survive a busy store:
queued here and applied by the writer thread with its retries, never by the training thread.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from multirank_logger.buffer import MetricBatch
from multirank_logger.store import Store
from multirank_logger.transport import ChannelError, RowChannel

__all__ = ["DirectSink", "GatherSink"]

log = logging.getLogger(__name__)
_POLL_S = 0.05


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

    def update_run(self, **values: Any) -> None:
        """Queue column updates for the run row; applied by the next `poll`."""
        self._run_updates.update(values)

    def write(self, batch: MetricBatch) -> None:
        self.store.write(batch)

    def poll(self) -> None:
        if self._run_updates:
            updates = dict(self._run_updates)
            self.store.update_run(self.run_id, **updates)
            for key, value in updates.items():
                if self._run_updates.get(key) is value:
                    del self._run_updates[key]

    def finish(self, status: str, timeout: float) -> dict[int, str]:
        """Nothing to wait for: every rank wrote its own rows. Returns no other rank's status."""
        return {}


class GatherSink(DirectSink):
    """Rank 0 writes its own rows and drains the other ranks' rows from the channel.

    On ranks other than 0, `store` is None and batches are sent through the channel.

    Args:
        store: the open Store on rank 0, None elsewhere.
        run_id: the run's id.
        channel: the RowChannel of this logger's launch.
    """

    transport = "gather"

    def __init__(self, store: Store | None, run_id: int, channel: RowChannel) -> None:
        super().__init__(store, run_id)  # type: ignore[arg-type]
        self.channel = channel
        self.undelivered: list[MetricBatch] = []
        # rank 0: batches taken from the channel and not written yet (kept across failures)
        self._inbox: list[MetricBatch] = []

    @property
    def is_receiver(self) -> bool:
        return self.channel.rank == 0

    def write(self, batch: MetricBatch) -> None:
        if self.is_receiver:
            self.store.write(batch)
            return
        try:
            self.channel.send(batch)
        except ChannelError as exc:
            # rank 0 is gone: the writer must not retry into a dead channel forever; keep the
            # rows for the spill file (see `undelivered`), and say so once
            self.undelivered.extend(exc.undelivered)
            log.error("multirank_logger: %s (%d rows kept in memory)", exc, sum(len(b) for b in exc.undelivered))

    def poll(self) -> None:
        if not self.is_receiver:
            return
        super().poll()
        if not self._inbox:
            # receive() acknowledges the previous call's batches: they are written by now
            self._inbox = self.channel.receive()
        while self._inbox:
            self.store.write(self._inbox[0])
            self._inbox.pop(0)

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
                self.undelivered.extend(exc.undelivered)
                return {}
            self.undelivered.extend(self.channel.wait_delivered(timeout))
            return {}
        deadline = time.monotonic() + timeout
        expected = set(range(1, self.channel.world_size))
        done: dict[int, str] = {}
        while True:
            self.poll()
            done = self.channel.done_ranks()
            if expected <= done.keys():
                # one more receive acknowledges the last batches, so the senders stop waiting
                self._inbox.extend(self.channel.receive())
                self.poll()
                return done
            if time.monotonic() >= deadline:
                missing = sorted(expected - done.keys())
                log.warning(
                    "multirank_logger: ranks %s did not finish sending within %.0f s; their rows may be incomplete.",
                    missing,
                    timeout,
                )
                return done
            time.sleep(_POLL_S)
