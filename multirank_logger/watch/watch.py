"""The watch: rank 0 judges the run's new steps as they arrive, and says each new finding once.

On by default (``MultiRankLogger(watch=False)`` turns it off). It runs on a thread of its own on
rank 0, never on the training thread and never in the writer's way:

- ``gather``: rank 0's writer already holds every rank's rows; each cycle hands the new ones
  (its own and those received, metrics and StepTimer's rows) to the watch's bounded queue
  (the writer's `Destination.observe`), without waiting. A watch that falls behind drops what the
  queue cannot take (never a row of the store: only the watch skips ahead) and says so once.
  The other ranks' metric rows it also looks at as they arrive, every ``PEEK_S``
  (``GatherReceiver.peek``: nothing acknowledged, nothing taken from the writer, which
  receives, stores and acknowledges them at its cycle as ever), so an alert waits for the
  sender's flush only, not for rank 0's next cycle too; a batch seen so is not judged again
  when the writer hands it over.
- ``direct`` and ``node``: the watch reads the rows the ranks wrote from the store, read-only,
  every ``POLL_S`` (``query/new_rows.py``): on SQLite (WAL: a reader never blocks a writer) and PostgreSQL. A DuckDB
  file is never held (its writers open it per transaction, `Backend.opens_per_transaction`: a
  reader would lock them out), so on DuckDB with ``direct`` the watch sees rank 0's own rows
  only, and says so (``gather``, DuckDB's default, gives it every rank's).

What is judged, and how, is `judgement.live.LiveJudgement`: the report's one judgement, fed
windows. Each new finding becomes an `Alert` (alerts.py): a line on rank 0's console, a row of
the ``alerts`` table (through rank 0's own side rows: the road a decision row takes), the user's
``on_alert`` and ``alert_url``.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from multirank_logger._util.arrow_numpy import column_numpy
from multirank_logger.judgement.finding import Finding
from multirank_logger.judgement.live import LiveJudgement
from multirank_logger.judgement.sentences import followers_sentence, sentence_groups
from multirank_logger.query.new_rows import NewRows
from multirank_logger.rows.schema import findings, step_timing, verdicts
from multirank_logger.watch.alerts import Alert, AlertOutlets

__all__ = ["Watch"]

log = logging.getLogger(__name__)

#: batches the writer may hand over before the watch is behind (and skips ahead)
QUEUE_BATCHES = 256
#: seconds between two judgements (closing steps, departures)
JUDGE_S = 1.0
#: seconds between two looks at the rows the other ranks sent rank 0 (gather); None: never (the
#: writer's cycles alone feed the watch: up to two flush intervals from a log call to its alert)
PEEK_S: float | None = 0.5
#: batches looked at early whose writer's hand-over is still awaited, at most (then the oldest go)
PEEKED_MAX = 65_536
#: seconds between two reads of the store (direct and node transports)
POLL_S = 1.0


class Watch:
    """Rank 0's watch over one run (see the module docstring).

    Args:
        run_id: the run.
        world_size: its ranks.
        outlets: where each alert goes.
        close_after: seconds a step waits for its missing ranks (`LiveJudgement`).
        writers: ranks that write the others' rows (memory judged as the report does).
        read_store: for direct and node: the store's URL to read the ranks' rows from (None:
            fed by the writer).
        peek: for gather: the batches rank 0 received that its writer has not taken yet
            (``GatherReceiver.peek``), called every ``PEEK_S``.
    """

    def __init__(self, run_id: int, world_size: int, outlets: AlertOutlets, *, close_after: float,
                 writers: frozenset[int] = frozenset(), read_store: Any = None,
                 peek: Callable[[], list[pa.RecordBatch]] | None = None) -> None:
        self.run_id = run_id
        self.world_size = world_size
        self.outlets = outlets
        self.judgement = LiveJudgement(world_size, close_after=close_after, writers=writers)
        self._queue: queue.Queue[tuple[list[pa.RecordBatch], list[dict[str, list[dict[str, Any]]]]]] = \
            queue.Queue(QUEUE_BATCHES)
        self._read_store = read_store
        self._peek = peek if PEEK_S is not None else None
        #: batches judged from a peek, awaited from the writer (not to be judged twice), oldest first
        self._peeked: dict[tuple[int, int, int, int], None] = {}
        self._stop = threading.Event()
        self._final = False  # the last judgement closes every step (`stop`)
        self._ends_wait = 0.0  # how long the last poll waits for the other ranks' ends (`stop`)
        self._deliveries: queue.SimpleQueue[Alert] = queue.SimpleQueue()  # `deliver_soon`'s
        self._thread: threading.Thread | None = None
        self.skipped = 0  # batches the watch dropped, behind
        self.rank0_only = False  # it sees rank 0's rows only (`watch_for`)
        self._said_behind = False
        self._reader: NewRows | None = None  # direct/node: each rank's new rows in the store

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = _WatchThread(self)
            self._thread.start()

    def stop_soon(self) -> None:
        """Ask the thread to judge what arrived, then end; returns at once (the logger was
        collected: called from whatever thread the collector runs in)."""
        self._stop.set()
        try:
            self._queue.put_nowait(([], []))  # wakes the thread now (a finalize must not wait out its poll)
        except queue.Full:
            pass  # it has batches to take: it is not waiting

    def stop(self, timeout: float = 2.0, final: bool = False, ends_wait: float = 0.0) -> None:
        """Judge what arrived so far (within `timeout`), then end the thread. `final`: the run's
        every row has arrived (finalize, after the last rows of every rank): every step is
        closed and judged, and what is found only now is said so (``at the run's end``).
        `ends_wait` (direct and node, where each rank writes its own rows): first wait up to that
        long for the other ranks' ends in the store, so their last rows are read too."""
        self._final = final
        self._ends_wait = ends_wait
        self.stop_soon()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            if self._thread.is_alive():  # a blocking on_alert, a store that does not answer: never wait on
                log.warning("multirank_logger: the watch had not finished its last judgement %g s after the run "
                            "ended (an on_alert that does not return?); the run ends without it, and what it "
                            "raises from now on is not stored.", timeout)
        if self._reader is not None:
            reader, self._reader = self._reader, None
            try:
                reader.close()
            except Exception:  # noqa: BLE001 - a reader's close never fails the run's end
                pass

    @property
    def alerts(self) -> list[Alert]:
        return self.outlets.raised

    @property
    def ended(self) -> bool:
        """Whether the thread has ended (its judgement is no longer changing)."""
        return self._thread is None or not self._thread.is_alive()

    def keep_verdict(self) -> int:
        """The run's findings (`LiveJudgement.verdict`) into the ``findings`` table, through rank 0's
        side rows like its alerts: called at the run's end, after the last judgement. Returns how many."""
        if not self.ended:
            return 0  # its last judgement still running (said by `stop`): a verdict read now would be torn
        now = time.time()
        kept = self.judgement.verdict()
        verdict = [Finding.from_item(kind, item) for kind, item in kept]
        # the ranks one sentence says together (the origins of one problem at one step: every rank
        # of a host; the followers at one step) keep that sentence, as the report's text says it
        said: dict[int, str] = {}
        for kind in dict.fromkeys(kind for kind, _ in kept):
            items = [item for k, item in kept if k == kind]
            for group in sentence_groups(kind, items):
                for item in group:
                    said[id(item)] = followers_sentence(kind, group)
        for (_, item), f in zip(kept, verdict):
            row = {"rank": f.rank, "kind": f.kind, "series": f.series, "first_step": f.first_step, "origin": f.origin,
                   "origin_step": f.origin_step,
                   "value": f.value if f.value is not None and math.isfinite(f.value) else None,
                   "detail": json.dumps(_plain({**f.detail, "spread": f.spread})),
                   "sentence": said[id(item)], "found_at": now}
            self.outlets.record(findings.name, row)
        # after its findings (the writer keeps the order): whether they are the whole run's, and of which rows
        reason = self.whole_reason()
        judged = self.judgement.judged_rows() if reason is None else None
        steps = self.judgement.rank_steps() if judged is not None else None
        self.outlets.record(verdicts.name, {"complete": judged is not None, "findings": len(verdict), "judged_at": now,
                                            "rows_by_rank": None if judged is None else json.dumps(judged),
                                            "steps_by_rank": None if steps is None else json.dumps(steps),
                                            "reason": reason})
        return len(verdict)

    def whole_reason(self) -> str | None:
        """Why the kept verdict is not the whole run's as the report judges it; None where it is."""
        if self.skipped:
            return f"the watch fell behind and skipped {self.skipped:,} batch(es) of rows"
        if self.rank0_only:
            return "the watch saw rank 0's rows only (a DuckDB file with transport='direct')"
        if not self.judgement.complete:
            return self.judgement.whole_reason or "the run's last judgement did not run"
        return None

    def deliver_soon(self, alert: Alert) -> None:
        """`alert` delivered on the watch's thread (StopOnAlert's stop, from the training thread):
        `on_alert` and the webhook never run on the training thread, and alerts go out in the
        order they were raised. Returns at once."""
        self._deliveries.put(alert)
        try:
            self._queue.put_nowait(([], []))  # wakes the thread now
        except queue.Full:
            pass  # it has batches to take: it is not waiting

    # -- feeding (the writer thread: never waits) ----------------------------------------

    def observe(self, batches: list[pa.RecordBatch], side: list[dict[str, list[dict[str, Any]]]]) -> None:
        """The writer's new rows (gather's rank 0): into the queue, or dropped when it is full."""
        try:
            self._queue.put_nowait((batches, side))
        except queue.Full:
            self.skipped += 1

    # -- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        next_judge = next_poll = next_peek = time.monotonic()
        while True:
            stopping = self._stop.is_set()
            try:
                wait = 0.0 if stopping else min(JUDGE_S, POLL_S) / 2
                if self._peek is not None:
                    wait = min(wait, max(next_peek - time.monotonic(), 0.0))
                self._take(wait)
                self._deliver()
                now = time.monotonic()
                if self._peek is not None and not stopping and now >= next_peek:
                    next_peek = now + (PEEK_S or 0.0)
                    self._take_peeked(now)
                if self._read_store is not None and (now >= next_poll or stopping):
                    if stopping and self._final:
                        self._wait_for_ends(now + self._ends_wait)
                    self._poll()
                    next_poll = now + POLL_S
                if now >= next_judge or stopping:
                    self._judge()
                    next_judge = now + JUDGE_S
            except Exception as exc:  # noqa: BLE001 - the watch never takes the run down
                log.warning("multirank_logger: the watch failed (%s: %s); it goes on with the next rows.",
                            type(exc).__name__, exc)
                time.sleep(JUDGE_S)
            if stopping:
                return

    def _deliver(self) -> None:
        while True:
            try:
                alert = self._deliveries.get_nowait()
            except queue.Empty:
                return
            self.outlets.deliver(alert)

    def _take(self, wait: float) -> None:
        """Take the queued batches (waiting up to `wait` seconds for the first)."""
        while True:
            try:
                batches, side = self._queue.get(timeout=wait) if wait else self._queue.get_nowait()
            except queue.Empty:
                break
            wait = 0.0
            now = time.monotonic()
            for batch in batches:
                if self._peeked and len(batch) and self._peeked.pop(_batch_id(batch), 0) is None:
                    continue  # judged already, when a peek saw it
                self._add_batch(batch, now)
            timing = [row for tables in side for row in tables.get(step_timing.name, ())]
            self.judgement.add_timing(timing, now)
        if self.skipped and not self._said_behind:
            self._said_behind = True
            log.warning("multirank_logger: the watch fell behind the rows and skipped %d batch(es) (only the watch: "
                        "every row is stored); it goes on with the newest.", self.skipped)

    def _take_peeked(self, now: float) -> None:
        """The batches the other ranks sent rank 0 since the last look (gather), judged now."""
        assert self._peek is not None
        try:
            batches = self._peek()
        except Exception as exc:  # noqa: BLE001 - the watch never takes the run down
            self._peek = None
            log.warning("multirank_logger: the watch cannot look at the rows rank 0 receives (%s: %s); it judges "
                        "them when rank 0's writer takes them (an alert up to one flush_interval later).",
                        type(exc).__name__, exc)
            return
        for batch in batches:
            if len(batch):
                self._peeked[_batch_id(batch)] = None
                self._add_batch(batch, now)
        while len(self._peeked) > PEEKED_MAX:  # hand-overs the watch never got (its queue was full)
            del self._peeked[next(iter(self._peeked))]

    def _add_batch(self, batch: pa.RecordBatch, now: float) -> None:
        if not len(batch):
            return
        keys = batch.column("key")
        if pa.types.is_dictionary(keys.type):
            names = np.asarray(keys.dictionary.to_pylist(), dtype=object)
            keys = names[column_numpy(keys.indices)]
        else:
            keys = np.asarray(keys.to_pylist(), dtype=object)
        # column_numpy, not pyarrow's to_numpy: that imports pandas (0.4 s of CPU on rank 0)
        values = np.asarray(column_numpy(batch.column("value"), null=np.nan), float)  # NULL (a NaN) -> NaN
        self.judgement.add_rows(keys, column_numpy(batch.column("rank")), column_numpy(batch.column("step")), values, now)

    def _judge(self) -> None:
        final = self._final and self._stop.is_set()
        self._found(self.judgement.judge(time.monotonic(), final=final), at_end=final)

    def _found(self, findings: list[Any], at_end: bool = False) -> None:
        for finding in findings:
            self.outlets.raise_alert(finding, at_end=at_end)

    # -- direct and node: the store, read-only (query/new_rows.py) ------------------------------

    def _poll(self) -> None:
        """The rows the ranks stored since the last read."""
        if self._reader is None:
            self._reader = NewRows(self._read_store, self.run_id, self.world_size)
        now = time.monotonic()
        rows, timing = self._reader.read(now)
        if rows is not None:
            keys, ranks, steps, values = rows
            self.judgement.add_rows(keys, ranks, steps, values, now)
        self.judgement.add_timing(timing, now)

    def _wait_for_ends(self, deadline: float) -> None:
        if self._reader is None:
            self._reader = NewRows(self._read_store, self.run_id, self.world_size)
        self._reader.wait_for_ends(deadline)


def _plain(value: Any) -> Any:
    """`value` as strict JSON takes it: NaN and inf as None, NumPy numbers as Python's."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (bool, str)) or value is None:
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    number = float(value)
    return number if math.isfinite(number) else None


def _batch_id(batch: pa.RecordBatch) -> tuple[int, int, int, int]:
    """A received batch's identity, the same when looked at early and when the writer hands it over:
    its sender, first and last ``seq`` (a rank's call counter) and rows (a batch never empty)."""
    seq = batch.column("seq")
    return int(batch.column("rank")[0].as_py()), int(seq[0].as_py()), int(seq[-1].as_py()), len(batch)


def watch_for(run_id: int, world_size: int, transport: str, url: Any, opens_per_transaction: bool,
              outlets: AlertOutlets, close_after: float,
              peek: Callable[[], list[pa.RecordBatch]] | None = None) -> tuple[Watch, bool]:
    """The watch for rank 0 of a run, and whether the writer feeds it (gather) rather than the store;
    `peek` (gather): the received batches the writer has not taken yet (`Watch`'s argument)."""
    fed = transport == "gather" or world_size == 1
    read = None if fed or opens_per_transaction else url
    if not fed and read is None:
        log.info("multirank_logger: the watch sees rank 0's own rows only: with transport=%r a DuckDB file "
                    "cannot be read while the ranks write it (a reader would lock them out). transport='gather' "
                    "(DuckDB's default) gives the watch every rank's rows.", transport)
        fed = True
    watch = Watch(run_id, world_size, outlets, close_after=close_after,
                  writers=frozenset({0}) if transport == "gather" else frozenset(), read_store=read,
                  peek=peek if transport == "gather" else None)
    watch.rank0_only = fed and transport != "gather" and world_size > 1
    return watch, fed


class _WatchThread(threading.Thread):
    """The watch's daemon thread, with the ``stop()`` that test harnesses call on the daemon
    threads a test leaves (Lightning's conftest, and the many copied from it), as the writer's."""

    def __init__(self, watch: Watch) -> None:
        super().__init__(target=watch._run, name="multirank-logger-watch", daemon=True)
        self._watch = watch

    def stop(self, timeout: float = 2.0) -> None:
        """Judge what arrived, then end the thread (waiting up to `timeout`)."""
        self._watch.stop(timeout)
