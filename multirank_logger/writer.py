"""BackgroundWriter: the thread that moves this rank's buffered rows into a sink.

The training thread only appends to a `RecordBuffer`. This thread wakes every
``flush_interval`` seconds, or sooner when `wake()` says enough calls are pending,
drains the buffer into one `MetricBatch` and hands it to the sink. A sink that writes
seldom (each write opens a DuckDB file: ~20 ms of CPU the training competes for,
whatever the batch's size) is written once per ``flush_interval``, and sooner only
once `SELDOM_MAX_CALLS` calls are pending (memory stays bounded). A batch the sink
refuses (a DuckDB file a reader holds open, a busy SQLite file past its timeout) is
kept and retried on the next cycle: rows are never dropped.

One lock (``_io_lock``) serializes the cycles of the thread and of explicit flushes
(`flush` after `stop`, SIGTERM, atexit). The training thread never takes it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from multirank_logger import process_hooks
from multirank_logger.buffer import MetricBatch, RecordBuffer, concat_batches
from multirank_logger.side_records import SideRecords

__all__ = ["BackgroundWriter", "Sink", "Target"]

log = logging.getLogger(__name__)

#: pending calls that wake a writer whose sink writes seldom (~10 MiB of 10-key calls)
SELDOM_MAX_CALLS = 10_000
#: consecutive failed cycles before the writer warns (a reader holding a DuckDB file is normal)
_WARN_AFTER_FAILURES = 5


class Sink(Protocol):
    """Where drained batches go (see sinks.py)."""

    #: True when each write is costly whatever its size: write once per flush interval
    writes_seldom: bool
    #: True when `write` takes a pyarrow Table (RecordBuffer.drain_arrow), else a MetricBatch
    inserts_arrow: bool

    def write(self, batch: MetricBatch | Any) -> None:
        """Store or ship one batch; raise to have it retried later."""

    def write_side(self, tables: dict[str, list[dict[str, Any]]]) -> None:
        """Store or ship side-table rows (decisions, logs, step timing); raise to retry."""

    def poll(self) -> None:
        """Periodic work besides this rank's own batches (rank 0 draining other ranks)."""


#: what the writer needs before it can drain: (sink, run_id, global rank), or None while unknown
Target = Callable[[], "tuple[Sink, int, int] | None"]


class BackgroundWriter:
    """Drains a RecordBuffer into a sink from a daemon thread.

    Args:
        buffer: the rank's buffer; the writer only drains it.
        target: called on the writer's side; returns (sink, run_id, rank) once the run's
            identity is known, None before (rows then wait in the buffer).
        flush_interval: seconds between two cycles.
        flush_every: pending log calls that make `wake()` start a cycle early.
        tap: called with each batch as it is drained, and the rank (rank 0's live metrics.csv).
        name: the thread's name, for debugging.
    """

    def __init__(
        self,
        buffer: RecordBuffer,
        target: Target,
        *,
        flush_interval: float,
        flush_every: int,
        side: SideRecords | None = None,
        tap: Callable[[Any, int], None] | None = None,
        name: str = "multirank-writer",
    ) -> None:
        self._buffer = buffer
        self._tap = tap  # sees each drained batch once, with the rank (live_csv.LiveCsv)
        self._side = side if side is not None else SideRecords()
        self._side_retry: list[dict[str, list[dict[str, Any]]]] = []
        self._target = target
        self.flush_interval = flush_interval
        self.flush_every = max(1, int(flush_every))
        self._wake_at = self.flush_every  # pending calls at which save() wakes the thread
        self._name = name
        self._io_lock = threading.RLock()  # an RLock: process_hooks can tell whether this thread holds it
        self._wake = threading.Event()
        self._stop = False
        self._retry: list[MetricBatch] = []
        self._failures = 0
        self.last_error: BaseException | None = None
        self.rows_written = 0
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Start the thread (idempotent) and register the exit hooks."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()
        process_hooks.register(self)  # SIGTERM and exit flush this writer while it runs

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wake(self) -> None:
        """Ask for a cycle now. Cheap: sets an Event the thread waits on."""
        self._wake.set()

    def maybe_wake(self) -> None:
        """Hot path (`save()`): wake the thread only when enough calls are pending."""
        if self._buffer.calls_pending >= self._wake_at:
            self._wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the thread (waiting up to `timeout` for its cycle); rows stay for `flush`."""
        self._stop = True
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        self._thread = None
        process_hooks.unregister(self)

    # -- flushing ------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Log calls in the buffer plus rows waiting for a retry."""
        return self._buffer.calls_pending + sum(len(b) for b in self._retry)

    def flush(self, timeout: float = 30.0) -> bool:
        """Run one cycle in the calling thread, waiting at most `timeout` for a running one.

        Returns:
            True when nothing is left to write.
        """
        if not self._io_lock.acquire(timeout=max(timeout, 0.0)):
            log.warning("multirank_logger: a flush is still running after %.0f s; rows stay buffered", timeout)
            return False
        try:
            self._cycle()
        finally:
            self._io_lock.release()
        return self.pending == 0

    def report_unwritten(self) -> None:
        """Say, as the process exits, what is lost with it: nothing is worse than a silent gap."""
        calls, rows = self._buffer.calls_pending, sum(len(b) for b in self._retry)
        if not (calls or rows):
            return
        error = self.last_error
        why = f"{type(error).__name__}: {error}" if error is not None else (
            "this rank never learnt its run: the process group never started (log after "
            "torch.distributed is initialized, e.g. inside Trainer.fit)"
        )
        log.error(
            "multirank_logger: exiting with %d log call(s) and %d row(s) not written (%s); they are lost.",
            calls, rows, why,
        )

    def _run(self) -> None:
        while not self._stop:
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            if self._stop:
                break
            with self._io_lock:
                self._cycle()

    def _cycle(self) -> None:
        """Drain, write, poll. Never raises: a failure keeps the rows for the next cycle."""
        try:
            target = self._target()
        except BaseException as exc:  # noqa: BLE001 - the thread must survive to retry
            self._note_failure(exc)
            return
        if target is None:
            return  # identity not known yet: rows wait in the buffer
        sink, run_id, rank = target
        self._wake_at = max(self.flush_every, SELDOM_MAX_CALLS) if sink.writes_seldom else self.flush_every
        if self._buffer.calls_pending:
            drain = self._buffer.drain_arrow if sink.inserts_arrow else self._buffer.drain
            try:
                self._retry.append(drain(run_id, rank))
            except Exception as exc:  # noqa: BLE001 - the thread must live on for the next calls
                # unreachable for what append accepts; were it reached, say so now, not at exit
                log.error("multirank_logger: log calls could not be encoded and are dropped: %s: %s", type(exc).__name__, exc)
                self._note_failure(exc)
                return
            if self._tap is not None:
                self._tap(self._retry[-1], rank)  # never raises; before the store, which may refuse it
        if len(self._side):
            self._side_retry.append(self._side.drain(run_id, rank))
        try:
            while self._retry:
                batch = self._retry[0]
                if len(batch):
                    sink.write(batch)
                    self.rows_written += len(batch)
                self._retry.pop(0)
            while self._side_retry:
                sink.write_side(self._side_retry[0])
                self._side_retry.pop(0)
            sink.poll()
        except BaseException as exc:  # noqa: BLE001
            self._note_failure(exc)
            return
        if len(self._retry) > 1:  # merge what piled up so the next write is one transaction
            self._retry = [concat_batches(self._retry)]
        self._failures = 0

    def _note_failure(self, exc: BaseException) -> None:
        self.last_error = exc
        self._failures += 1
        if len(self._retry) > 1:
            self._retry = [concat_batches(self._retry)]
        if self._failures == _WARN_AFTER_FAILURES:
            log.warning(
                "multirank_logger: %d flushes in a row failed (%s: %s); %d rows are kept and retried.",
                self._failures,
                type(exc).__name__,
                exc,
                self.pending,
            )
