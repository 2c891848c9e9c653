"""The watch: rank 0 judges the run's new steps as they arrive, and says each new finding once.

On by default (``MultiRankLogger(watch=False)`` turns it off). It runs on a thread of its own on
rank 0, never on the training thread and never in the writer's way:

- ``gather``: rank 0's writer already holds every rank's rows; each cycle hands the new ones
  (its own and those received, metrics and StepTimer's rows) to the watch's bounded queue
  (``BackgroundWriter.observe``), without waiting. A watch that falls behind drops what the
  queue cannot take (never a row of the store: only the watch skips ahead) and says so once.
- ``direct`` and ``node``: the watch reads the rows the ranks wrote from the store, read-only,
  every ``POLL_S``: on SQLite (WAL: a reader never blocks a writer) and PostgreSQL. A DuckDB
  file is never held (its writers open it per transaction, `Backend.opens_per_transaction`: a
  reader would lock them out), so on DuckDB with ``direct`` the watch sees rank 0's own rows
  only, and says so (``gather``, DuckDB's default, gives it every rank's).

What is judged, and how, is `judgement.live.LiveJudgement`: the report's one judgement, fed
windows. Each new finding becomes an `Alert` (alerts.py): a line on rank 0's console, a row of
the ``alerts`` table (through rank 0's own side rows: the road a decision row takes), the user's
``on_alert`` and ``alert_url``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

import numpy as np
import pyarrow as pa
import sqlalchemy as sa

from multirank_logger.judgement.live import LiveJudgement
from multirank_logger.logger.alerts import Alert, AlertOutlets
from multirank_logger.model.schema import metrics, step_timing
from multirank_logger.store.sql_store import Store

__all__ = ["Watch"]

log = logging.getLogger(__name__)

#: batches the writer may hand over before the watch is behind (and skips ahead)
QUEUE_BATCHES = 256
#: seconds between two judgements (closing steps, departures)
JUDGE_S = 1.0
#: seconds between two reads of the store (direct and node transports)
POLL_S = 1.0
#: seconds between two reads of the run's keys (direct and node)
KEYS_S = 10.0


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
    """

    def __init__(self, run_id: int, world_size: int, outlets: AlertOutlets, *, close_after: float,
                 writers: frozenset[int] = frozenset(), read_store: Any = None) -> None:  # fmt: skip
        self.run_id = run_id
        self.world_size = world_size
        self.outlets = outlets
        self.judgement = LiveJudgement(world_size, close_after=close_after, writers=writers)
        self._queue: queue.Queue[tuple[list[pa.RecordBatch], list[dict[str, list[dict[str, Any]]]]]] = \
            queue.Queue(QUEUE_BATCHES)  # fmt: skip
        self._read_store = read_store
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.skipped = 0  # batches the watch dropped, behind
        self._said_behind = False
        self._last_seq: dict[int, int] = {}  # direct/node: per rank, the last metric seq read
        self._last_timing_seq: dict[int, int] = {}
        self._keys: list[str] = []
        self._keys_at = 0.0
        self._reader: Store | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="multirank-logger-watch", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Judge what arrived so far (within `timeout`), then end the thread; the alerts raised are
        recorded before the writer's last cycle."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._reader is not None:
            reader, self._reader = self._reader, None
            try:
                reader.close()
            except Exception:  # noqa: BLE001 - a reader's close never fails the run's end
                pass

    @property
    def alerts(self) -> list[Alert]:
        return self.outlets.raised

    # -- feeding (the writer thread: never waits) ----------------------------------------

    def observe(self, batches: list[pa.RecordBatch], side: list[dict[str, list[dict[str, Any]]]]) -> None:
        """The writer's new rows (gather's rank 0): into the queue, or dropped when it is full."""
        try:
            self._queue.put_nowait((batches, side))
        except queue.Full:
            self.skipped += 1

    # -- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        next_judge = next_poll = time.monotonic()
        while True:
            stopping = self._stop.is_set()
            try:
                self._take(stopping)
                now = time.monotonic()
                if self._read_store is not None and (now >= next_poll or stopping):
                    self._poll()
                    next_poll = now + POLL_S
                if now >= next_judge or stopping:
                    self._judge()
                    next_judge = now + JUDGE_S
            except Exception as exc:  # noqa: BLE001 - the watch never takes the run down
                log.warning("multirank_logger: the watch failed (%s: %s); it goes on with the next rows.",
                            type(exc).__name__, exc)  # fmt: skip
                time.sleep(JUDGE_S)
            if stopping:
                return

    def _take(self, stopping: bool) -> None:
        """Take the queued batches (waiting for the first a moment while running)."""
        wait = 0.0 if stopping else min(JUDGE_S, POLL_S) / 2
        while True:
            try:
                batches, side = self._queue.get(timeout=wait) if wait else self._queue.get_nowait()
            except queue.Empty:
                break
            wait = 0.0
            now = time.monotonic()
            for batch in batches:
                self._add_batch(batch, now)
            timing = [row for tables in side for row in tables.get(step_timing.name, ())]
            self.judgement.add_timing(timing, now)
        if self.skipped and not self._said_behind:
            self._said_behind = True
            log.warning("multirank_logger: the watch fell behind the rows and skipped %d batch(es) (only the watch: "
                        "every row is stored); it goes on with the newest.", self.skipped)  # fmt: skip

    def _add_batch(self, batch: pa.RecordBatch, now: float) -> None:
        if not len(batch):
            return
        keys = batch.column("key")
        if pa.types.is_dictionary(keys.type):
            names = np.asarray(keys.dictionary.to_pylist(), dtype=object)
            keys = names[keys.indices.to_numpy(zero_copy_only=False)]
        else:
            keys = np.asarray(keys.to_pylist(), dtype=object)
        values = batch.column("value").to_numpy(zero_copy_only=False).astype(float)  # NULL (a NaN) -> NaN
        self._found(self.judgement.add_rows(keys, batch.column("rank").to_numpy(), batch.column("step").to_numpy(),
                                            values, now))  # fmt: skip

    def _judge(self) -> None:
        self._found(self.judgement.judge(time.monotonic()))

    def _found(self, findings: list[Any]) -> None:
        for finding in findings:
            self.outlets.raise_alert(finding)

    # -- direct and node: the store, read-only -----------------------------------------------

    def _poll(self) -> None:
        if self._reader is None:
            self._reader = Store(self._read_store, readonly=True)
        store = self._reader
        now = time.monotonic()
        with store.engine.connect() as conn:
            if now - self._keys_at >= KEYS_S or not self._keys:
                self._keys = sorted(store.backend.run_keys(conn, self.run_id))
                self._keys_at = now
            ranks = list(range(self.world_size))
            if self._keys:
                low = min(self._last_seq.get(r, -1) for r in ranks)
                stmt = sa.select(metrics.c.key, metrics.c.rank, metrics.c.step, store.backend.value_or_nan(metrics.c.value),
                                 metrics.c.seq).where(
                    metrics.c.run_id == self.run_id, metrics.c.key.in_(self._keys), metrics.c.rank.in_(ranks),
                    metrics.c.seq > low).order_by(metrics.c.rank, metrics.c.seq)  # fmt: skip
                rows = conn.execute(stmt).all()
                if rows:
                    key, rank, step, value, seq = (np.asarray(c) for c in zip(*rows))
                    rank, seq = rank.astype(np.int64), seq.astype(np.int64)
                    last = np.array([self._last_seq.get(int(r), -1) for r in rank])
                    new = seq > last
                    for r in np.unique(rank).tolist():
                        self._last_seq[r] = max(self._last_seq.get(r, -1), int(seq[rank == r].max()))
                    values = np.array([np.nan if v is None else v for v in value[new].tolist()], float)
                    self._found(self.judgement.add_rows(key[new].astype(object), rank[new], step[new].astype(np.int64),
                                                        values, now))  # fmt: skip
            low = min(self._last_timing_seq.get(r, -1) for r in ranks)
            stmt = sa.select(step_timing).where(step_timing.c.run_id == self.run_id, step_timing.c.rank.in_(ranks),
                                                step_timing.c.seq > low)  # fmt: skip
            timing = [dict(m) for m in conn.execute(stmt).mappings()
                      if m["seq"] > self._last_timing_seq.get(m["rank"], -1)]  # fmt: skip
            for row in timing:
                self._last_timing_seq[row["rank"]] = max(self._last_timing_seq.get(row["rank"], -1), row["seq"])
            self.judgement.add_timing(timing, now)


def watch_for(run_id: int, world_size: int, transport: str, url: Any, opens_per_transaction: bool,
              outlets: AlertOutlets, close_after: float) -> tuple[Watch, bool]:  # fmt: skip
    """The watch for rank 0 of a run, and whether the writer feeds it (gather) rather than the store."""
    fed = transport == "gather" or world_size == 1
    read = None if fed or opens_per_transaction else url
    if not fed and read is None:
        log.warning("multirank_logger: the watch sees rank 0's own rows only: with transport=%r a DuckDB file "
                    "cannot be read while the ranks write it (a reader would lock them out). transport='gather' "
                    "(DuckDB's default) gives the watch every rank's rows.", transport)  # fmt: skip
        fed = True
    watch = Watch(run_id, world_size, outlets, close_after=close_after,
                  writers=frozenset({0}) if transport == "gather" else frozenset(), read_store=read)  # fmt: skip
    return watch, fed

