"""The training thread's side of the write path: a log call into memory, and the writer behind it.

`LoggedRows.record_call` is what ``log_metrics`` costs: an append to this rank's `RecordBuffer`
(buffer.py) and CSVLogger's count of unsaved calls; no I/O, no SQL, no collective, no lock.
The first call of a phase starts the `BackgroundWriter` (writer_thread.py) and puts the
SIGTERM hook on top (process_hooks.py). The writer asks its owner (the run above, through
writer_thread.WriterOwner) where rows go; the run answers with `ready_sink`: the sink that
sink_holder.py builds once the process group is up.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from multirank_logger.rows.side_records import SideRecords
from multirank_logger.write import process_hooks
from multirank_logger.write.buffer import RecordBuffer
from multirank_logger.write.sink_holder import SinkHolder
from multirank_logger.write.sink_protocol import Sink
from multirank_logger.write.writer_thread import BackgroundWriter, WriterOwner

__all__ = ["LoggedRows"]


class LoggedRows:
    """This rank's log calls in memory, and the writer thread that moves them to its sink.

    Args:
        sink_holder: where the writer's rows go, once set up.
        owner: the run above, which the writer asks at each cycle where rows go.
        flush_every: CSVLogger's ``flush_logs_every_n_steps``: calls between two saves.
        flush_interval: seconds between two of the writer's flushes.
        csv_calls: rank 0's queue of each call for metrics.csv (None: no queue).
    """

    def __init__(
        self,
        sink_holder: SinkHolder,
        owner: WriterOwner,
        *,
        flush_every: int,
        flush_interval: float,
        csv_calls: deque[tuple[int | float, Mapping[Any, Any]]] | None,
    ) -> None:
        self.sink_holder = sink_holder
        self.flush_every = flush_every
        self.buffer = RecordBuffer()
        self.buffer.csv_calls = csv_calls
        self.side = SideRecords()
        self.unsaved = 0  # CSVLogger's unsaved-row count: the step when none is given
        self.live = False  # a log call of this phase started the writer and the SIGTERM hook
        self.save_set_up = False  # save() tried the set-up once (rank 0, before the writer did)
        self.writer = BackgroundWriter(
            self.buffer, owner, flush_interval=flush_interval, flush_every=flush_every, side=self.side,
        )

    def record_call(self, metrics: Mapping[str, Any], step: int | None) -> bool:
        """Hot path: one log call into the buffer; True where CSVLogger's `log_metrics` saves.

        Raises:
            InvalidMetric: for a call the store cannot hold (a value, key or step); nothing of it is kept.
        """
        if step is None:
            step = self.unsaved
        step = self.buffer.append(step, metrics)  # checked whole: refused here, never dropped by the writer
        self.unsaved += 1
        if not self.live:
            self.start()
        if (step + 1) % self.flush_every:
            return False
        self.unsaved = 0  # where CSVLogger saves (every flush_logs_every_n_steps), and so restarts its count
        return True

    def record_side(self, table: str, values: dict[str, Any]) -> None:
        """One side-table row (decisions, logs, step timing) into memory."""
        self.side.add(table, values)
        if not self.live:
            self.start()

    def flush_now(self, timeout: float) -> None:
        """The experiment's ``save()``: what was logged goes to the store and metrics.csv now."""
        if self.buffer.calls_pending and self.sink_holder.sink is None:
            self.sink_holder.setup()
        self.unsaved = 0  # as CSVLogger's save empties its unsaved rows
        self.writer.flush(timeout)

    def flush(self, timeout: float) -> bool:
        """Every call logged so far to the sink, retrying a store that refuses them until `timeout`
        (``MultiRankLogger.flush``). True when nothing is left; what is not written stays held."""
        return self.writer.flush_until(time.monotonic() + max(timeout, 0.0))

    def start(self) -> None:
        """The first log call of a phase (and construction): writer thread up, SIGTERM hook on top."""
        if not self.writer.running:
            self.writer.start()
        # by the first log call Lightning has installed its SIGTERM handler: wrap it, so that a
        # preemption flushes before Lightning's handler runs its broadcast
        process_hooks.outermost_sigterm()
        self.live = True

    def ready_sink(self) -> Sink | None:
        """For the writer's cycle: the sink, set up now where rows wait for it; None while it
        cannot be (the process group not up) or need not be (nothing logged yet)."""
        if self.sink_holder.sink is None and self.buffer.calls_pending == 0:
            return None  # nothing to write: leave the set-up to `experiment`, in the main thread
        return self.sink_holder.setup()
