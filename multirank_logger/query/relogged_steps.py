"""The page's buckets under ``per_rank``'s rule: where a rank logged a key twice at one step, its
later call wins (a resumed launch's value supersedes the one its preempted predecessor logged
after its last checkpoint).

`step_buckets` merges every value of a bucket in SQL (over the rows, or over the partial
aggregates of ``step_summaries``), so a step logged twice counts both values: a mean nobody
logged. The steps logged twice are found by the store from the key's summaries, in one GROUP BY
that hands back only the buckets that hold one: a ``SUMMARY_STEPS`` bucket of a rank holds more
values than distinct steps exactly where a step in it was logged more than once (see
`_relogged_in_sql`). The page cells holding such a bucket are read again from their rows (with
``seq``) and recomputed, the later call winning; every other cell keeps what the SQL answered.

Cost: nothing for a run of one launch (one read of its ``attempts`` rows); for a resumed run, one
aggregate over the key's summaries in the page's steps (about 1/``SUMMARY_STEPS`` of its rows,
inside the store: only the relogged buckets cross to Python) and the rows of the page cells that
hold a step logged twice (the overlaps of the launches, rounded out to whole page cells), never
the key's other rows, in as many reads as it takes to keep each statement's ranges and ranks
bounded. A single launch that logs a key twice at one step (rare, and ``per_rank`` takes its
later call too) is not looked for: that would cost every page read of every run the aggregate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import sqlalchemy as sa

from multirank_logger._util.arrow_numpy import column_numpy
from multirank_logger.rows.schema import SUMMARY_STEPS, attempts, metrics, step_summaries

__all__ = ["LatestWins"]

#: runs a SELECT and returns a pyarrow Table (``StoreReader.fetch_arrow``)
FetchArrow = Callable[[sa.Select], Any]
#: a statement reading rows again holds at most this many step ranges, and (a range's list whole)
#: about this many ranks: SQLite binds at most 32,766 parameters
_MAX_RANGES, _MAX_RANKS = 64, 4096


class LatestWins:
    """Mends a key's rank x bucket grids where a rank logged a step twice (see the module doc)."""

    def __init__(self, fetch_arrow: FetchArrow, run_id: int, key: str) -> None:
        self.fetch, self.run_id, self.key = fetch_arrow, run_id, key

    def apply(self, first: int, width: int, ranks: list[int], mean: np.ndarray, lo: np.ndarray,
              hi: np.ndarray, flags: np.ndarray) -> None:
        """Recompute, in place, the cells (rows: `ranks`; column j: steps ``first + j * width``
        onward) that hold a step logged twice: mean, min, max (NaN where not finite, as the SQL
        has them) and whether a NaN or inf fell there, of each step's latest value."""
        if not ranks or not self._resumed():
            return
        spans = self._spans(first, width, mean.shape[1])
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

    def _relogged(self, first: int, last: int) -> tuple[np.ndarray, np.ndarray]:
        """(rank, first step) of each summary bucket of the key between steps `first` and `last`
        that holds a step logged twice."""
        s = step_summaries.c
        count = sa.func.sum(s.n_finite + s.n_nan + s.n_pos_inf + s.n_neg_inf)
        mask_sum = sa.cast(sa.func.sum(s.steps_mask), sa.BigInteger)
        per_bucket = (
            sa.select(s.rank.label("rank"), s.step.label("step"), count.label("n"), mask_sum.label("masks"))
            .where(s.run_id == self.run_id, s.key == self.key, s.step.between(first - SUMMARY_STEPS + 1, last))
            .group_by(s.rank, s.step)
            .subquery()
        )
        found = self.fetch(sa.select(per_bucket.c.rank, per_bucket.c.step)
                           .where(_relogged_in_sql(per_bucket.c.n, per_bucket.c.masks)))
        return _ints(found, "rank"), _ints(found, "step")

    def _spans(self, first: int, width: int, columns: int) -> list[tuple[list[int], int, int]]:
        """The step ranges to read again, each with its ranks: the whole page cells that hold a
        summary bucket with a step logged twice, merged per rank, ranks of the same range together."""
        rank, step = self._relogged(first, first + width * columns - 1)
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
        together: dict[tuple[int, int], list[int]] = {}
        for r, spans in per_rank.items():
            for lo, hi in spans:
                together.setdefault((lo, hi), []).append(r)
        return [(rs, lo, hi) for (lo, hi), rs in sorted(together.items())]

    def _latest_rows(self, spans: list[tuple[list[int], int, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rank, step, value: NaN for NaN) of the key's latest call per rank and step in `spans`,
        read in statements of at most ``_MAX_RANGES`` ranges and ``_MAX_RANKS`` ranks each (a
        statement's size stays bounded, and no range is widened: only the overlaps' rows are read)."""
        m = metrics.c
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        for chunk in _chunks(spans):
            where = sa.or_(*(sa.and_(m.rank.in_(rs), m.step.between(lo, hi)) for rs, lo, hi in chunk))
            found = self.fetch(sa.select(m.rank.label("rank"), m.seq.label("seq"), m.step.label("step"),
                                         m.value.label("value")).where(m.run_id == self.run_id, m.key == self.key, where))
            value = np.asarray(column_numpy(found.column("value"), null=np.nan), dtype=float)
            parts.append((_ints(found, "rank"), _ints(found, "seq"), _ints(found, "step"), value))
        rank, seq, step, value = (np.concatenate(column) for column in zip(*parts))
        order = np.lexsort((seq, step, rank))
        rank, step, value = rank[order], step[order], value[order]
        last = np.r_[(rank[1:] != rank[:-1]) | (step[1:] != step[:-1]), True] if len(rank) else np.zeros(0, bool)
        return rank[last], step[last], value[last]


def _relogged_in_sql(n: Any, masks: Any) -> Any:
    """Whether a bucket whose summaries hold `n` values and whose steps masks add up to `masks`
    holds a step logged twice, as a SQL condition every backend evaluates (none shares a bit OR
    aggregate or a popcount with SQLite). Each summary's mask is below 2**SUMMARY_STEPS and its
    count at least its bits. Masks that share no bit add without a carry, so their sum is their OR
    and its bits count the bucket's distinct steps: a step logged twice means more values than
    those bits. Masks that share a bit (one step in two summaries: logged twice) add with carries,
    each taking a bit away (one past the low SUMMARY_STEPS bits too, which alone are counted): the
    values outnumber the bits again."""

    def number(i: int) -> Any:  # written out: PostgreSQL has no bigint >> bigint for a bound int
        return sa.literal_column(str(i), sa.Integer)

    bits = sum(masks.op(">>")(number(i)).op("&")(number(1)) for i in range(SUMMARY_STEPS))
    return n > bits


def _chunks(spans: list[tuple[list[int], int, int]]) -> list[list[tuple[list[int], int, int]]]:
    """`spans` cut into groups of at most ``_MAX_RANGES`` ranges and about ``_MAX_RANKS`` ranks
    (a range's ranks are never split: one range's rank list is one IN)."""
    chunks: list[list[tuple[list[int], int, int]]] = [[]]
    held = 0
    for span in spans:
        if chunks[-1] and (len(chunks[-1]) == _MAX_RANGES or held + len(span[0]) > _MAX_RANKS):
            chunks.append([])
            held = 0
        chunks[-1].append(span)
        held += len(span[0])
    return chunks


def _ints(table: Any, name: str) -> np.ndarray:
    return np.asarray(column_numpy(table.column(name), null=0), dtype=np.int64)
