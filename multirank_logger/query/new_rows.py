"""Each rank's rows stored since the last read: what rank 0's watch reads during a run.

For the ``direct`` and ``node`` transports, where every rank writes its own rows, the watch
(``watch/watch.py``) reads the store, read-only, a poll at a time: per rank the rows past the
last call counter (``seq``) it read, in few queries that the store's indexes serve (`NewRows`).
On SQLite (WAL: a reader never blocks a writer) and PostgreSQL; a DuckDB file is never held
while ranks write it (its writers open it per transaction: a reader would lock them out).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import sqlalchemy as sa

from multirank_logger.rows.schema import metrics, ranks, step_timing
from multirank_logger.store.sql_store import Store

__all__ = ["KEYS_S", "STALE_S", "NewRows"]

#: seconds between two reads of the run's keys
KEYS_S = 10.0
#: seconds without a new row after which a rank is read on its own (`NewRows._rank_groups`)
STALE_S = 30.0


class NewRows:
    """The rows of one run stored since the last `read`, per rank by its call counter.

    Args:
        url: the store (opened read-only at the first read).
        run_id: the run, and `world_size` its ranks.
    """

    def __init__(self, url: Any, run_id: int, world_size: int) -> None:
        self.url = url
        self.run_id = run_id
        self.world_size = world_size
        # per rank, the last (seq, step) read and when it last grew
        self._last_seq: dict[int, tuple[int, int, float]] = {}
        self._last_timing_seq: dict[int, tuple[int, int, float]] = {}
        self._keys: list[str] = []
        self._keys_at = 0.0
        self._store: Store | None = None

    def _open(self) -> Store:
        if self._store is None:
            self._store = Store(self.url, readonly=True)
        return self._store

    def close(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            store.close()

    def read(self, now: float) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None, list[dict[str, Any]]]:
        """The metric rows stored since the last read, as (keys, ranks, steps, values) each
        rank's in its call order (None when none), and the StepTimer rows (dicts)."""
        store = self._open()
        with store.engine.connect() as conn:
            if now - self._keys_at >= KEYS_S or not self._keys:
                self._keys = sorted(store.backend.run_keys(conn, self.run_id))
                self._keys_at = now
            new = None
            if self._keys:
                c = metrics.c
                cols = [c.key, c.rank, c.step, store.backend.value_or_nan(c.value), c.seq]
                rows: list[Any] = []
                for where in self._rank_groups(self._last_seq, c.rank, c.seq, c.step, now):
                    stmt = sa.select(*cols).where(c.run_id == self.run_id, c.key.in_(self._keys), where)
                    rows += conn.execute(stmt).all()
                if rows:
                    new = self._new_metric_rows(rows, now)
            t = step_timing.c
            timing = []
            for where in self._rank_groups(self._last_timing_seq, t.rank, t.seq, None, now):
                timing += [dict(m) for m in conn.execute(sa.select(step_timing).where(t.run_id == self.run_id, where)).mappings()]
        timing = [row for row in timing if row["seq"] > self._last_timing_seq.get(row["rank"], (-1, 0, 0.0))[0]]
        self._advance(self._last_timing_seq, [(row["rank"], row["seq"], row["step"]) for row in timing], now)
        return new, timing

    def wait_for_ends(self, deadline: float) -> None:
        """Until every rank but 0 has recorded its end in the store (its last rows are written
        before it), or `deadline` (monotonic)."""
        store = self._open()
        r = ranks.c
        ended = sa.select(sa.func.count()).where(r.run_id == self.run_id, r.rank != 0, r.ended_at.is_not(None))
        while True:
            with store.engine.connect() as conn:
                if (conn.execute(ended).scalar() or 0) >= self.world_size - 1 or time.monotonic() >= deadline:
                    return
            time.sleep(0.1)

    def _rank_groups(self, last: dict[int, tuple[int, int, float]], rank: Any, seq: Any, step: Any,
                     now: float) -> list[Any]:
        """WHERE clauses that read each rank's rows past its last ``seq`` (`last`: rank -> (seq,
        step, when it last grew)), in few queries that an index serves: the ranks that keep
        logging in one (past the lowest of their seqs; and steps, for PostgreSQL's (rank, step)
        index), a rank silent for a while or never seen in one each (a dead rank's old rows
        are not read again at every poll)."""
        live = [r for r in range(self.world_size) if r in last and now - last[r][2] < STALE_S]
        out = []
        if live:
            where = [rank.in_(live), seq > min(last[r][0] for r in live)]
            if step is not None:
                where.append(step >= min(last[r][1] for r in live))
            out.append(sa.and_(*where))
        out += [sa.and_(rank == r, seq > last.get(r, (-1, 0, 0.0))[0]) for r in range(self.world_size)
                if r not in live]
        return out

    @staticmethod
    def _advance(last: dict[int, tuple[int, int, float]], rows: list[tuple[int, int, int]], now: float) -> None:
        for r, seq, step in rows:
            if seq > last.get(r, (-1, 0, 0.0))[0]:
                last[r] = (int(seq), int(step), now)

    def _new_metric_rows(self, rows: list[Any], now: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        key, rank, step, value, seq = (np.asarray(col) for col in zip(*rows))
        rank, seq, step = rank.astype(np.int64), seq.astype(np.int64), step.astype(np.int64)
        order = np.lexsort((seq, rank))  # each rank's rows in its call order
        key, rank, step, value, seq = key[order], rank[order], step[order], value[order], seq[order]
        new = seq > np.array([self._last_seq.get(int(r), (-1, 0, 0.0))[0] for r in rank.tolist()])
        if not new.any():
            return None
        key, rank, step, value, seq = key[new], rank[new], step[new], value[new], seq[new]
        self._advance(self._last_seq, list(zip(rank.tolist(), seq.tolist(), step.tolist())), now)
        values = np.array([np.nan if v is None else v for v in value.tolist()], float)
        return key.astype(object), rank, step, values
