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

import atexit
import logging
import os
import signal
import threading
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol

from multirank_logger.buffer import MetricBatch, RecordBuffer, concat_batches
from multirank_logger.exit_logging import quiet_logging_errors
from multirank_logger.side_records import SideRecords

__all__ = ["BackgroundWriter", "Sink", "Target"]

log = logging.getLogger(__name__)

#: how long SIGTERM and atexit may spend flushing each writer
EXIT_FLUSH_TIMEOUT = 20.0
#: seconds between cycles once SIGTERM arrived
_HURRY_INTERVAL = 0.1
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
        self._io_lock = threading.Lock()
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
        _register(self)

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
        _unregister(self)

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


# -- exit hooks: flush every live writer on SIGTERM and at interpreter exit ---------------

_WRITERS: weakref.WeakSet[BackgroundWriter] = weakref.WeakSet()
_HOOKS_INSTALLED = False
_UNSET: Any = object()
_previous_sigterm: Any = signal.SIG_DFL
_base_sigterm: Any = _UNSET
_SIGTERM_FLUSH = threading.Lock()  # taken once, by the first path that flushes for SIGTERM
_CHAINED = False  # the Python handler passed SIGTERM on already
#: set when this process received SIGTERM (the logger reports the run as interrupted)
sigterm_received = threading.Event()


def _register(writer: BackgroundWriter) -> None:
    _WRITERS.add(writer)
    _install_hooks()


def _unregister(writer: BackgroundWriter) -> None:
    _WRITERS.discard(writer)


def flush_all(timeout: float = EXIT_FLUSH_TIMEOUT) -> None:
    """Flush every live writer of this process (bounded per writer)."""
    for writer in list(_WRITERS):
        try:
            if not writer.flush(timeout):
                writer.report_unwritten()
        except Exception:  # noqa: BLE001 - exiting: flush what can be flushed
            log.exception("multirank_logger: flush at exit failed")


def _install_hooks() -> None:
    global _HOOKS_INSTALLED
    if _HOOKS_INSTALLED:
        return
    _HOOKS_INSTALLED = True
    atexit.register(quiet_logging_errors(flush_all))  # streams may be closed by then
    outermost_sigterm()
    _watch_signals()


def outermost_sigterm() -> None:
    """Make our SIGTERM handler the outermost one, chaining to whatever was there.

    Lightning's handler (installed when fit starts) broadcasts from inside the signal handler:
    ours must flush before that, and must pass one preemption on to it only once (see
    `_on_sigterm`). Call from the main thread; elsewhere this does nothing.
    """
    global _previous_sigterm, _base_sigterm
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread
    try:
        current = signal.getsignal(signal.SIGTERM)
        if current is _on_sigterm:
            return
        if _base_sigterm is _UNSET:
            _base_sigterm = current
        _previous_sigterm = current
        signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):  # embedded interpreters, restricted environments
        pass


def forget_chained_sigterm() -> None:
    """At the end of a fit: Lightning's handler is gone, chain to the one from before ours again."""
    global _previous_sigterm
    if _base_sigterm is not _UNSET:
        _previous_sigterm = _base_sigterm


def _flush_for_sigterm() -> None:
    """Once per process: flush every writer, then keep their threads draining."""
    sigterm_received.set()
    if not _SIGTERM_FLUSH.acquire(blocking=False):
        return  # done, or being done by the other path (watcher thread or handler)
    flush_all()
    for writer in list(_WRITERS):
        # the process may now hang in Lightning's handler (its broadcast races the other ranks'
        # collectives) until the scheduler's SIGKILL: keep the threads draining meanwhile (rank 0
        # takes in the rows the other ranks just shipped)
        writer.flush_interval = min(writer.flush_interval, _HURRY_INTERVAL)
        writer.wake()


def _watch_signals() -> None:
    """Install a wakeup fd: SIGTERM then flushes from a thread, even while the main thread is
    blocked in a collective (a Python handler only runs once the main thread leaves C code,
    and the peer it waits for may be waiting for us)."""
    if threading.current_thread() is not threading.main_thread():
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except (ValueError, OSError):
        os.close(read_fd)
        os.close(write_fd)
        return
    if previous != -1:  # someone else (an asyncio loop) owns the wakeup fd: leave it to them
        signal.set_wakeup_fd(previous)
        os.close(read_fd)
        os.close(write_fd)
        return

    def watch() -> None:
        while True:
            try:
                data = os.read(read_fd, 512)
            except OSError:
                return
            if not data:
                return
            if signal.SIGTERM in data:
                _flush_for_sigterm()

    threading.Thread(target=watch, name="multirank-sigterm-watch", daemon=True).start()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """Flush, then let SIGTERM do what it would have done without us: once per process.

    A scheduler signals every process of the job, and Lightning's launcher forwards the signal
    to its children, so one preemption arrives twice in ranks > 0. Lightning's handler runs a
    broadcast per signal: passing both on leaves that rank a broadcast ahead of rank 0 and the
    job hangs. One preemption, one flush, one broadcast.
    """
    global _CHAINED
    if _CHAINED:
        return
    _CHAINED = True
    _flush_for_sigterm()
    previous = _previous_sigterm
    if callable(previous):
        previous(signum, frame)
        return
    if previous == signal.SIG_IGN:
        return
    # default action: terminate, as if we had never been installed
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.raise_signal(signal.SIGTERM)
