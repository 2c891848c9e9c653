"""The page's buckets under ``per_rank``'s rule: where a rank logged a key twice at one step, its
later call wins (a resumed launch's value supersedes the one its preempted predecessor logged
after its last checkpoint).

`step_buckets` merges every value of a bucket in SQL (over the rows, or over the partial
aggregates of ``step_summaries``), so a step logged twice counts both values: a mean nobody
logged. The steps logged twice are found from the key's summaries, not its rows: a
``SUMMARY_STEPS`` bucket of a rank holds more values than distinct steps (the OR of its
summaries' masks) exactly where a step in it was logged more than once. The page cells holding
such a bucket are read again from their rows (with ``seq``) and recomputed, the later call
winning; every other cell keeps what the SQL answered.

Cost: nothing for a run of one launch (one read of its ``attempts`` rows); for a resumed run,
one read of the key's summaries (rank, step, mask, count: about 1/``SUMMARY_STEPS`` of its rows)
and the rows of the page cells that hold a step logged twice (the overlap of the launches,
rounded out to whole page cells), never the key's other rows. A single launch that logs a key
twice at one step (rare, and ``per_rank`` takes its later call too) is not looked for: that
would cost every page read of every run the summaries read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import sqlalchemy as sa

from multirank_logger._util.arrow_numpy import column_numpy
from multirank_logger.model.schema import SUMMARY_STEPS, attempts, metrics, step_summaries

__all__ = ["LatestWins"]

#: runs a SELECT and returns a pyarrow Table (``StoreReader._fetch_arrow``)
FetchArrow = Callable[[sa.Select], Any]
#: past this many step ranges to read again, one range per rank (from its first to its last)
_MAX_RANGES = 64


class LatestWins:
    """Mends a key's rank x bucket grids where a rank logged a step twice (see the module doc)."""

    def __init__(self, fetch_arrow: FetchArrow, run_id: int, key: str) -> None:
        self.fetch, self.run_id, self.key = fetch_arrow, run_id, key

    def apply(self, first: int, width: int, ranks: list[int], mean: np.ndarray, lo: np.ndarray,
              hi: np.ndarray, flags: np.ndarray) -> None:  # fmt: skip
        """Recompute, in place, the cells (rows: `ranks`; column j: steps ``first + j * width``
        onward) that hold a step logged twice: mean, min, max (NaN where not finite, as the SQL
        has them) and whether a NaN or inf fell there, of each step's latest value."""
        if not ranks or not self._resumed():
            return
        spans = self._spans(first, width)
        if not spans:
            return
        rank, step, value = self._latest_rows(spans)
        if not len(rank):
            return
        row = np.searchsorted(np.asarray(ranks), rank)
        col = (step - first) // width
        keep = (row < len(ranks)) & (col >= 0) & (col < mean.shape[1])
        row, col, value = row[keep], col[keep], value[keep]
        cell = row * mean.shape[1] + col
        cells, at = np.unique(cell, return_inverse=True)
        finite = np.isfinite(value)
        n = np.bincount(at, weights=finite, minlength=len(cells))
        total = np.bincount(at, weights=np.where(finite, value, 0.0), minlength=len(cells))
        pos = np.bincount(at, weights=value == np.inf, minlength=len(cells))
        neg = np.bincount(at, weights=value == -np.inf, minlength=len(cells))
        nan = np.bincount(at, weights=np.isnan(value), minlength=len(cells))
        low, high = np.full(len(cells), np.nan), np.full(len(cells), np.nan)
        np.fmin.at(low, at, np.where(finite, value, np.nan))
        np.fmax.at(high, at, np.where(finite, value, np.nan))
        with np.errstate(invalid="ignore", divide="ignore"):  # SQL's avg: NaN where an inf was among the values
            m = np.where((pos + neg == 0) & (n > 0), total / n, np.nan)
        r, c = np.divmod(cells, mean.shape[1])
        mean[r, c] = m
        lo[r, c] = np.where(neg > 0, np.nan, low)
        hi[r, c] = np.where(pos > 0, np.nan, high)
        flags[r, c] = nan + pos + neg > 0

    def _resumed(self) -> bool:
        """Whether the run has more than one launch (only then can a step be superseded)."""
        found = self.fetch(sa.select(sa.func.count().label("n")).where(attempts.c.run_id == self.run_id))
        return int(found.column("n")[0].as_py() or 0) > 1

    def _relogged(self) -> tuple[np.ndarray, np.ndarray]:
        """(rank, first step) of each summary bucket of the key that holds a step logged twice."""
        s = step_summaries.c
        count = s.n_finite + s.n_nan + s.n_pos_inf + s.n_neg_inf
        found = self.fetch(sa.select(s.rank.label("rank"), s.step.label("step"), s.steps_mask.label("mask"),
                                     count.label("n")).where(s.run_id == self.run_id, s.key == self.key))  # fmt: skip
        if not found.num_rows:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        rank, step = _ints(found, "rank"), _ints(found, "step")
        mask, n = _ints(found, "mask"), _ints(found, "n")
        order = np.lexsort((step, rank))
        rank, step, mask, n = rank[order], step[order], mask[order], n[order]
        starts = np.flatnonzero(np.r_[True, (rank[1:] != rank[:-1]) | (step[1:] != step[:-1])])
        merged = np.bitwise_or.reduceat(mask, starts)
        distinct = sum((merged >> i) & 1 for i in range(SUMMARY_STEPS))
        twice = np.add.reduceat(n, starts) > distinct
        return rank[starts][twice], step[starts][twice]

    def _spans(self, first: int, width: int) -> list[tuple[list[int], int, int]]:
        """The step ranges to read again, each with its ranks: the whole page cells that hold a
        summary bucket with a step logged twice, merged per rank, ranks of the same range together."""
        rank, step = self._relogged()
        if not len(rank):
            return []
        a = first + (np.maximum(step, first) - first) // width * width
        b = first + ((step + SUMMARY_STEPS - 1 - first) // width + 1) * width - 1
        per_rank: dict[int, list[list[int]]] = {}
        for r, lo, hi in sorted(zip(rank.tolist(), a.tolist(), b.tolist())):
            spans = per_rank.setdefault(r, [])
            if spans and lo <= spans[-1][1] + 1:
                spans[-1][1] = max(spans[-1][1], hi)
            else:
                spans.append([lo, hi])
        if sum(len(v) for v in per_rank.values()) > _MAX_RANGES:
            per_rank = {r: [[v[0][0], v[-1][1]]] for r, v in per_rank.items()}
        together: dict[tuple[int, int], list[int]] = {}
        for r, spans in per_rank.items():
            for lo, hi in spans:
                together.setdefault((lo, hi), []).append(r)
        if len(together) > _MAX_RANGES:  # every rank its own range: one range over them all
            ranks = sorted(per_rank)
            return [(ranks, min(lo for lo, _ in together), max(hi for _, hi in together))]
        return [(rs, lo, hi) for (lo, hi), rs in together.items()]

    def _latest_rows(self, spans: list[tuple[list[int], int, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rank, step, value: NaN for NaN) of the key's latest call per rank and step in `spans`."""
        m = metrics.c
        where = sa.or_(*(sa.and_(m.rank.in_(rs), m.step.between(lo, hi)) for rs, lo, hi in spans))
        found = self.fetch(sa.select(m.rank.label("rank"), m.seq.label("seq"), m.step.label("step"),
                                     m.value.label("value")).where(m.run_id == self.run_id, m.key == self.key, where))  # fmt: skip
        rank, seq, step = _ints(found, "rank"), _ints(found, "seq"), _ints(found, "step")
        value = np.asarray(column_numpy(found.column("value"), null=np.nan), dtype=float)
        order = np.lexsort((seq, step, rank))
        rank, step, value = rank[order], step[order], value[order]
        last = np.r_[(rank[1:] != rank[:-1]) | (step[1:] != step[:-1]), True] if len(rank) else np.zeros(0, bool)
        return rank[last], step[last], value[last]


def _ints(table: Any, name: str) -> np.ndarray:
    return np.asarray(column_numpy(table.column(name), null=0), dtype=np.int64)
