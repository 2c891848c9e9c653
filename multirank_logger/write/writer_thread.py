"""BackgroundWriter: the thread that moves this rank's buffered rows into a sink.

The training thread only appends to a `RecordBuffer`. This thread wakes every ``flush_interval``
seconds, or sooner when `wake()` says enough calls are pending, drains the buffer into one batch
and hands it to the sink. A sink that writes seldom (each write opens a DuckDB file: CPU the
training competes for) is written once per ``flush_interval``, sooner at `SELDOM_MAX_CALLS` calls.

When the store refuses a batch (store/write_errors.py tells the errors apart):
- transient (a reader holding the DuckDB file, a busy SQLite file, a full disk, a server
  restarting): the rows stay in memory and are retried with backoff, up to
  `HELD_VALUES_LIMIT` values; past that bound they go to this rank's spill file (spiller.py);
- permanent (a row colliding with a stored one): the batch is cut in halves until the rows
  that fail are isolated; those go to the spill file, the others are written. Later batches
  are never merged into a failing one.
At the end (`spill_held`, from finalize) the rest goes to the spill file (its message names the import).

One lock (``_io_lock``) serializes the cycles of the thread and of explicit flushes (`flush`
after `stop`, SIGTERM, atexit). The training thread never takes it nor waits on the store: a
flush on the main thread runs in a helper thread it waits for, bounded (a stopped server never
answers; Ctrl-C reaches the caller). `spill_held` waits for the lock bounded too, and spills
without it when a write is stuck (rows may land twice: the import skips those stored). A cycle
may take the set-up lock inside it (``SinkHolder.setup``): never wait for this lock holding that one.

The writer knows the run above it only through `WriterOwner`: one call at the start of each cycle
(`WriterOwner.destination`) says where rows go and who watches them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import pyarrow as pa

from multirank_logger._util.best_effort import bounded
from multirank_logger.rows.batch import concat_batches, halves
from multirank_logger.rows.side_records import MAX_PENDING as SIDE_MAX_PENDING
from multirank_logger.rows.side_records import SideRecords
from multirank_logger.store.write_errors import describe, is_transient
from multirank_logger.write import process_hooks
from multirank_logger.write.buffer import RecordBuffer
from multirank_logger.write.sink_protocol import SinkWrites
from multirank_logger.write.spiller import Spiller

__all__ = ["HELD_VALUES_LIMIT", "BackgroundWriter", "Destination", "Observer", "ToSink", "WriterOwner"]

log = logging.getLogger(__name__)

#: values a writer keeps in memory while the store refuses them; past it they go to the spill
#: file. Its memory, as Arrow and as Python lists: benchmarks/RESULTS.md ("Figures the source cites")
HELD_VALUES_LIMIT = 500_000

#: pending calls that wake a writer whose sink writes seldom (bounds the buffer's memory between flushes)
SELDOM_MAX_CALLS = 10_000
#: consecutive failed cycles before the writer warns (a reader holding a DuckDB file is normal)
_WARN_AFTER_FAILURES = 5
#: the longest wait between two attempts on a failing store (backoff doubles up to it)
MAX_BACKOFF_S = 30.0
#: writes spent cutting a permanently refused batch in halves (down to single rows) before the
#: pieces still failing are spilled whole: a batch where every row collides costs ~64 writes, not 2n
_ISOLATE_ATTEMPTS = 64
#: the longest `spill_held` waits for another thread's spill (a local file write) to end
_SPILL_WAIT_S = 30.0


#: rank 0's watch (watch/watch.py): each cycle's new metric batches and side rows, taken without waiting
Observer = Callable[[list[pa.RecordBatch], list[dict[str, list[dict[str, Any]]]]], None]


class Destination(NamedTuple):
    """Where one cycle's rows go: the owner's answer to `WriterOwner.destination`."""

    sink: SinkWrites
    run_id: int
    rank: int  # the global rank the rows are filed under
    observe: Observer | None = None  # rank 0's watch, handed each cycle's new rows (None: no watch)


class WriterOwner(Protocol):
    """What the writer thread asks of the run above it (logger/rank_run.RankRun): one call per cycle."""

    def destination(self, explicit: bool) -> Destination | None:
        """Where this cycle's rows go; None while the run or its sink is not known (rows wait in the
        buffer; a raise is noted as a failed cycle and retried with backoff). Before answering, the
        owner does what must precede the store and never raises for it: rank 0's metrics.csv takes
        the calls no ``save()`` wrote (`explicit`: the cycle is an explicit flush, which writes them).
        Called from the writer's thread, or from the thread of an explicit flush."""


class ToSink:
    """A `WriterOwner` whose rows always go to one sink, with no run above (benchmarks, tests)."""

    def __init__(self, sink: SinkWrites, run_id: int, rank: int) -> None:
        self._destination = Destination(sink, run_id, rank)

    def destination(self, explicit: bool) -> Destination:
        return self._destination


class BackgroundWriter:
    """Drains a RecordBuffer into a sink from a daemon thread.

    Args:
        buffer: the rank's buffer; the writer only drains it.
        owner: the run above, asked at each cycle where rows go (`WriterOwner`).
        flush_interval: seconds between two cycles.
        flush_every: pending log calls that make `wake()` start a cycle early.
        side: the rank's side-table rows (decisions, logs, step timing); none when not given.
    """

    def __init__(
        self,
        buffer: RecordBuffer,
        owner: WriterOwner,
        *,
        flush_interval: float,
        flush_every: int,
        side: SideRecords | None = None,
    ) -> None:
        self._buffer = buffer
        self._side = side if side is not None else SideRecords()
        self._side_retry: list[dict[str, list[dict[str, Any]]]] = []
        self._owner = owner
        self.flush_interval = flush_interval
        self.flush_every = max(1, int(flush_every))
        #: values kept in memory while the store refuses them; past it they are spilled
        self.max_held_values = HELD_VALUES_LIMIT
        self._wake_at = self.flush_every  # pending calls at which save() wakes the thread
        self._io_lock = threading.RLock()  # an RLock: process_hooks can tell whether this thread holds it
        self._spill_lock = threading.Lock()  # `spill_held`'s, which may run without the I/O lock
        self._wake = threading.Event()
        self._stop = False
        self._finish = False  # one last cycle, then the thread ends (`finish_soon`)
        self._held: list[pa.RecordBatch] = []  # batches the store has not taken yet, oldest first
        self._sink: SinkWrites | None = None  # the last sink the owner gave: its spiller takes the rest
        self._last_ids: tuple[int, int] | None = None  # (run_id, rank) of that sink
        self._failures = 0
        self._failing_since = 0.0
        self._next_try = 0.0  # monotonic time before which a failing store is left alone
        self.last_error: BaseException | None = None
        self.rows_written = 0
        self._thread: threading.Thread | None = None
        self._observer_failed: Observer | None = None  # a watch that raised: not handed rows again

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Start the thread (idempotent) and register the exit hooks."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop = self._finish = False
        self._thread = _WriterThread(self)
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
        # is_set: an attribute read; set() takes the Event's lock and notifies, at every save() while
        # the thread has not drained yet (a cycle in progress, or waiting for the GIL)
        if self._buffer.calls_pending >= self._wake_at and not self._wake.is_set():
            self._wake.set()

    def finish_soon(self) -> None:
        """Ask the thread for one last cycle, then to end; returns at once (called when the logger
        is collected, from whatever thread the collector runs in)."""
        self._finish = True
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
        """Log calls in the buffer plus rows held for a retry."""
        return self._buffer.calls_pending + self.held_values

    @property
    def held_values(self) -> int:
        return sum(len(b) for b in self._held)

    @property
    def spiller(self) -> Spiller | None:
        return None if self._sink is None else self._sink.spiller

    def flush(self, timeout: float = 30.0, now: bool = True) -> bool:
        """Run one cycle in the calling thread (`now`: ignoring the backoff of a failing store),
        waiting at most `timeout` for a running one.

        Returns:
            True when nothing is left to write.
        """
        try:
            if threading.current_thread() is threading.main_thread():
                return bounded(lambda: self._flush(timeout, now), timeout, "the flush")
            return self._flush(timeout, now)
        except TimeoutError:  # the lock not had, or the cycle stuck: a flush is still running
            log.warning("multirank_logger: a flush is still running after %.0f s; rows stay buffered", timeout)
            return False

    def _flush(self, timeout: float, now: bool) -> bool:
        if not self._io_lock.acquire(timeout=max(timeout, 0.0)):
            raise TimeoutError
        try:
            self._cycle(now=now)
        finally:
            self._io_lock.release()
        return self.pending == 0 and not self._side_retry

    def flush_until(self, deadline: float) -> bool:
        """Flush, retrying a store that refuses rows (short backoff) until `deadline` (monotonic).

        Returns:
            True when nothing is left to write.
        """
        delay = 0.02
        while True:
            done = self.flush(max(deadline - time.monotonic(), 0.0))
            if done or self._failures == 0 or time.monotonic() + delay > deadline:
                return done
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def spill_held(self, why: str, timeout: float = 5.0) -> None:
        """Put every row still unwritten (metrics, side tables) into the spill file (the run's end).
        Waits at most `timeout` for a cycle in progress: the rows of a store call stuck longer (a server
        stopped mid-write) are spilled without it (stored too should it return: the import skips those)."""
        locked = self._io_lock.acquire(timeout=max(timeout, 0.0))
        if not locked:
            why = f"{why}; a write stuck for over {timeout:g} s may store some of them too (the import skips those)"
        # one spill at a time: a caller that gave up on another thread's waits for its file write
        spilling = self._spill_lock.acquire(timeout=_SPILL_WAIT_S)
        try:
            if self._buffer.calls_pending and self._sink is not None and self._last_ids is not None:
                self._drain(*self._last_ids)
            self._spill_all(why)
            side, self._side_retry = self._side_retry, []
            for tables in side:
                self._spill_side(tables, why)
            self._count_dropped_side()
        finally:
            if spilling:
                self._spill_lock.release()
            if locked:
                self._io_lock.release()

    def report_unwritten(self, at_exit: bool = True) -> None:
        """As the process exits, or at SIGTERM (a preemption: the scheduler's SIGKILL may follow
        at any time): spill what the store never took, or say what is lost with it."""
        when = "the process is exiting" if at_exit else "SIGTERM came (a preemption)"
        if self.held_values and self.spiller is not None:
            error = f" ({describe(self.last_error)})" if self.last_error is not None else ""
            self.spill_held(f"{when} and the store has not taken these rows{error}")
        calls, rows = self._buffer.calls_pending, self.held_values
        if not (calls or rows):
            return
        last = self.last_error
        why = describe(last) if last is not None else (
            "this rank never learnt its run: the process group never started (log after "
            "torch.distributed is initialized, e.g. inside Trainer.fit)"
        )
        log.error(
            "multirank_logger: %s with %d log call(s) and %d row(s) not written (%s); they are lost%s.",
            "exiting" if at_exit else "SIGTERM came", calls, rows, why,
            "" if at_exit else " unless they are written before the process ends",
        )

    def _run(self) -> None:
        while not self._stop:
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            if self._stop:
                break
            with self._io_lock:
                self._cycle()
            if self._finish:
                if not self.pending:  # else the exit flush (or SIGTERM's) still has rows to write
                    process_hooks.unregister(self)
                break

    def _cycle(self, now: bool = False) -> None:
        """Drain, receive, write. Never raises: what the store refuses is held, retried or spilled."""
        try:
            destination = self._owner.destination(now)  # also rank 0's metrics.csv, before the store may refuse rows
        except Exception as exc:  # noqa: BLE001 - the thread must survive to retry (Ctrl-C goes on to the caller)
            self._note_failure(exc)
            return
        if destination is None:
            return  # identity not known yet: rows wait in the buffer
        sink, run_id, rank, observe = destination
        self._sink, self._last_ids = sink, (run_id, rank)
        self._wake_at = max(self.flush_every, SELDOM_MAX_CALLS) if sink.opens_store_per_write else self.flush_every
        held, side_held = len(self._held), len(self._side_retry)
        if self._buffer.calls_pending:
            self._drain(run_id, rank)
        if len(self._side):
            self._side_retry.append(self._side.drain(run_id, rank))
        self._count_dropped_side()
        try:
            batches, side = sink.receive()  # rank 0 of a gather run: these rows are ours to store now
            self._held.extend(b for b in batches if len(b))
            self._side_retry.extend(side)
        except Exception as exc:  # noqa: BLE001
            self._note_failure(exc)
        if observe is not None and observe != self._observer_failed and (
                len(self._held) > held or len(self._side_retry) > side_held):
            try:  # the new rows only (a batch held for a retry is not handed over again)
                observe(self._held[held:], self._side_retry[side_held:])
            except Exception as exc:  # noqa: BLE001 - the watch never costs a row
                log.warning("multirank_logger: the watch could not take rows: %s", exc)
                self._observer_failed = observe
        if (now or time.monotonic() >= self._next_try) and self._write_all(sink):
            self._recovered(sink)
        if self.held_values > self.max_held_values:
            self._spill_all(
                f"the store has refused rows for {time.monotonic() - self._failing_since:.0f} s "
                f"({describe(self.last_error) if self.last_error else 'unknown error'}) and the "
                f"{self.max_held_values} values this rank keeps in memory meanwhile are used up"
            )

    def _drain(self, run_id: int, rank: int) -> None:
        """The buffer's calls into one held batch. Never raises: were a call append accepted still
        one the encoder fails on (a bug), the calls are encoded in halves until it is cut out and
        counted lost; the calls around it are kept (`_isolate`'s way for store refusals)."""
        calls = self._buffer.take()
        pieces = [calls]
        while pieces:
            piece = pieces.pop(0)
            try:
                self._held.append(self._buffer.encode(piece, run_id, rank))
            except Exception as exc:  # noqa: BLE001 - the thread must live on for the next calls
                if len(piece) > 1:
                    half = len(piece) // 2
                    pieces[0:0] = [piece[:half], piece[half:]]
                    continue
                _, step, _, values = piece[0]
                why = f"a log call (step {step!r}, keys {list(values)!r}) could not be encoded ({describe(exc)})"
                if self.spiller is not None:
                    self.spiller.count_lost(len(values), why)
                else:
                    log.error("multirank_logger: %s: %d value(s) are lost", why, len(values))

    def _write_all(self, sink: SinkWrites) -> bool:
        """Held rows, side rows and run updates, on one connection. False on a transient failure."""
        if not (self._held or self._side_retry):
            return self._write_rest(sink)  # no connection opened for nothing (a DuckDB open costs CPU)
        try:
            with sink.writing():
                return self._write_held(sink) and self._write_rest(sink)
        except Exception as exc:  # noqa: BLE001 - the connection could not be opened
            self._note_failure(exc)
            return False

    def _write_held(self, sink: SinkWrites) -> bool:
        """Write the held batches, oldest first, as one transaction. False on a transient failure."""
        if len(self._held) > 1:  # one transaction for all of it
            self._held = [concat_batches(self._held)]
        held = self._held  # this cycle's list: `spill_held` swaps in another when it gives up on us
        while held:
            batch = held[0]
            try:
                sink.write(batch)
            except Exception as exc:  # not Ctrl-C: no verdict on the rows (they stay held, unsplit)
                if is_transient(exc):
                    self._note_failure(exc)
                    return False
                held.pop(0)
                if not self._isolate(sink, batch, exc):
                    return False
                continue
            self.rows_written += len(batch)
            held.pop(0)
        return True

    def _isolate(self, sink: SinkWrites, batch: pa.RecordBatch, exc: BaseException) -> bool:
        """`batch` failed for good: write it in halves until the failing rows are cut out and
        spilled; the others get stored. False when a transient failure interrupts (rest held)."""
        why = f"the store refused {{n}} value(s) for good ({describe(exc)}); the rows after them are written as usual"
        pieces, attempts = [batch], 0
        while pieces:
            piece = pieces.pop(0)
            if len(piece) == 1 or attempts >= _ISOLATE_ATTEMPTS:
                self._spill([piece], why.format(n=len(piece)))
                continue
            parts = halves(piece)
            for i, half in enumerate(parts):
                attempts += 1
                try:
                    sink.write(half)
                except Exception as err:
                    if is_transient(err):
                        self._held[0:0] = [*parts[i:], *pieces]
                        self._note_failure(err)
                        return False
                    pieces.append(half)
                    continue
                self.rows_written += len(half)
        return True

    def _write_rest(self, sink: SinkWrites) -> bool:
        """Side rows and run updates. False on a transient failure."""
        try:
            while self._side_retry:
                try:
                    sink.write_side(self._side_retry[0])
                except Exception as exc:
                    if is_transient(exc):
                        raise
                    self._spill_side(self._side_retry[0], f"the store refused side-table rows for good ({describe(exc)})")
                self._side_retry.pop(0)
            sink.write_run()
        except Exception as exc:  # noqa: BLE001
            self._note_failure(exc)
            return False
        return True

    def _recovered(self, sink: SinkWrites) -> None:
        if self._failures >= _WARN_AFTER_FAILURES:
            log.warning("multirank_logger: the store takes rows again after %d failed flushes", self._failures)
        self._failures = 0
        self._next_try = 0.0
        if sink.spiller is not None:
            sink.spiller.store_recovered()

    def _spill(self, batches: list[pa.RecordBatch], why: str) -> None:
        spiller = self.spiller
        if spiller is None:
            self._held.extend(batches)  # nowhere to put them: keep them, say so at exit
            return
        spiller.put(batches, why)

    def _spill_side(self, tables: dict[str, list[dict[str, Any]]], why: str) -> None:
        if self.spiller is not None:
            self.spiller.put_side(tables, why)
        else:
            self._side_lost(sum(map(len, tables.values())), why)

    def _count_dropped_side(self) -> None:
        if dropped := self._side.take_dropped():  # past its bound (the run or the store unknown for long)
            self._side_lost(dropped, f"more than {SIDE_MAX_PENDING} side-table rows waited for the store; the oldest were dropped")

    def _side_lost(self, rows: int, why: str) -> None:
        if self.spiller is not None:
            self.spiller.count_side_lost(rows, why)
        else:
            log.error("multirank_logger: %d side-table row(s) (decisions, logs, timing) are lost: %s", rows, why)

    def _spill_all(self, why: str) -> None:
        held, self._held = self._held, []
        if held:
            self._spill(held, why)

    def _note_failure(self, exc: BaseException) -> None:
        self.last_error = exc
        if self._failures == 0:
            self._failing_since = time.monotonic()
        self._failures += 1
        backoff = min(self.flush_interval * 2 ** (self._failures - 1), MAX_BACKOFF_S)
        self._next_try = time.monotonic() + backoff
        if self._failures == _WARN_AFTER_FAILURES:
            log.warning(
                "multirank_logger: %d flushes in a row failed (%s); %d values are kept in memory and retried "
                "(up to %d, then they go to the spill file).",
                self._failures, describe(exc), self.held_values, self.max_held_values,
            )


class _WriterThread(threading.Thread):
    """The writer's daemon thread, with the ``stop()`` that test harnesses call on the daemon
    threads a test leaves (Lightning's conftest, and the many copied from it)."""

    def __init__(self, writer: BackgroundWriter) -> None:
        super().__init__(target=writer._run, name="multirank-writer", daemon=True)
        self._writer = writer

    def stop(self, timeout: float = 30.0) -> None:
        """Flush what this rank logged, then end the thread (waiting up to `timeout` for each)."""
        writer = self._writer
        if writer._thread is self:
            writer.stop(timeout)
            if not writer.flush(timeout):
                process_hooks.flush_at_exit(writer)  # the store refused rows: the exit flush tries again
        else:  # a thread the writer already left (stopped, then started again)
            self.join(timeout)

