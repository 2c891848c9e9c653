"""What a page can draw of one series across every rank, computed in SQL: bands and a heatmap.

A run of 256 ranks x 20,000 steps holds 5.12M values per key: no browser draws that, and no
server should send it. The run's steps are cut into at most ``HEATMAP_COLUMNS`` buckets of equal
width, and the store itself (SQLAlchemy Core, one ``GROUP BY rank, bucket`` on every backend)
returns each rank's mean, min and max per bucket and whether a NaN or an inf fell there: at most
ranks x buckets small rows, as Arrow. From that matrix, in NumPy:

- ``band``: per bucket, the ranks' spread: the quartiles and median of the ranks' means, and
  the envelope of every value (min of the mins, max of the maxes);
- ``scores``: the heatmap: each rank's departure from the ranks' median in that bucket, in units
  of the ranks' typical spread there (the median absolute deviation across ranks: the report's
  robust yardstick, applied per bucket; with one step per bucket it is the step's median);
- ``line(rank)``: one rank's mean per bucket (a click on a heatmap row).

A *series* is a metric key, or a StepTimer column (``timing:data_s``, ``timing:rss``, ...).
Measured on the 51.2M-row store (benchmarks/RESULTS.md, "ui"): one key costs one scan.

A long run's metric key is read from ``step_summaries`` instead (the partial aggregates the
write path keeps per 16 steps, ``store/step_summaries.py``): about 1/16 of the key's rows, its
bucket width rounded up to a multiple of ``SUMMARY_STEPS``. A run is long enough when its own
width is at least half of that (``SUMMARY_STEPS // 2`` steps a bucket: 8,000 steps and more at
the page's 2,000 buckets), so the page still gets at least half the buckets it asked for;
a shorter run's rows are few, and read as they are, at their finer width. By the same rule a
run whose width is at least ``COARSE_STEPS // 2`` (32,000 steps and more) is read from the
coarse level (``coarse_summaries``, per 64 steps): one or two summaries a bucket up to 128,000
steps, where the 16-step level took four at 100,000 steps.

Either way a step a rank logged twice (a resumed launch re-logging its predecessor's last
steps) holds its later call alone, as in ``per_rank``: the cells holding one are read again
(``query/relogged_steps.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import sqlalchemy as sa

from multirank_logger._util.arrow_numpy import column_numpy
from multirank_logger.errors import LookupFailed
from multirank_logger.judgement.non_finite import NEG_INF, POS_INF
from multirank_logger.query.relogged_steps import LatestWins
from multirank_logger.rows.schema import (
    BIGINT_MAX,
    COARSE_STEPS,
    SUMMARY_STEPS,
    coarse_summaries,
    metrics,
    step_summaries,
    step_timing,
)

__all__ = ["HEATMAP_COLUMNS", "TIMING_SERIES", "BucketBuilder", "BucketSummary", "bucket_width", "summarize"]

#: buckets (heatmap columns, band points) at most
HEATMAP_COLUMNS = 2000
#: StepTimer's columns a page draws, as series names
TIMING_SERIES = ("timing:data_s", "timing:forward_s", "timing:rest_s", "timing:rss", "timing:mem_allocated_peak")
#: a heatmap score is clipped to this many typical spreads
SCORE_CLIP = 12.0

#: runs a SELECT and returns a pyarrow Table (``StoreReader.fetch_arrow``)
FetchArrow = Callable[[sa.Select], Any]


#: the largest step; a run whose steps span more than this (from below 0 to far above) overflows `step - first`
_INT64_MAX = BIGINT_MAX


def _bucket_numbers(steps: np.ndarray, first: int, width: int, wide: bool) -> np.ndarray:
    """Each step's bucket, ``(steps - first) // width``; for a `wide` run in uint64, where the
    difference (never negative) is exact though past int64."""
    if not wide:
        return (steps - first) // width
    return ((steps.astype(np.uint64) - np.uint64(first % 2**64)) // np.uint64(width)).astype(np.int64)


def bucket_width(first: int, last: int, buckets: int) -> int:
    """The width (in steps) that cuts steps ``first..last`` into at most ``buckets`` buckets."""
    return max(1, -(-(last - first + 1) // max(1, buckets)))  # in integers: a float ceil drifts past 2**53


@dataclass
class BucketSummary:
    """One series of one run, per rank (rows, in ``ranks`` order) and bucket (columns, each named
    by its first step in ``steps``). NaN where a rank logged no finite value in a bucket.
    ``lo`` and ``hi`` are per bucket only: the envelope of every rank's values (the band's edges)."""

    series: str
    ranks: list[int]
    steps: list[int]
    width: int
    mean: np.ndarray
    lo: np.ndarray  # per bucket: the min of every rank's finite min
    hi: np.ndarray  # per bucket: the max of every rank's finite max
    non_finite: np.ndarray
    _scores: np.ndarray | None = field(default=None, repr=False)

    def band(self) -> dict[str, list[float | None]]:
        """Per bucket: lo (min of every value), q1, median, q3 (of the ranks' means), hi (max)."""
        q1, median, q3 = column_quantiles(self.mean, (0.25, 0.5, 0.75))
        pairs = (("lo", self.lo), ("q1", q1), ("median", median), ("q3", q3), ("hi", self.hi))
        return {name: _floats(v) for name, v in pairs}

    def scores(self) -> np.ndarray:
        """Each rank's departure from the ranks' median per bucket, in typical spreads (see the module doc)."""
        if self._scores is not None:
            return self._scores
        dev = self.mean - column_quantiles(self.mean, (0.5,))[0]
        spread = column_quantiles(np.abs(dev), (0.5,))[0]
        positive = spread[spread > 0]
        # a bucket where the ranks agree exactly: the run's typical spread, so one rank off still shows
        spread = np.where(spread > 0, spread, np.median(positive) if len(positive) else 1.0)
        self._scores = np.clip(dev / spread, -SCORE_CLIP, SCORE_CLIP)
        return self._scores

    def line(self, rank: int) -> list[float | None]:
        return _floats(self.mean[self.ranks.index(rank)])


class BucketBuilder:
    """One key's ``BucketSummary`` built from a pass over the run's rows, a window of whole buckets
    at a time (``query/run_scan.py``): the report's HTML page costs no scan per key.

    As ``summarize`` computes it, but from the pass's step x rank table, where a rank's later call
    at a step has replaced its earlier one (``per_rank``'s rule, as `summarize` mends its cells). Held as
    float32 (what the page draws): 5 bytes per rank and bucket, 2.6 MB for 256 ranks x 2,000.
    """

    def __init__(self, series: str, first: int, last: int, width: int, ranks: int = 8) -> None:
        self.series, self.first, self.width = series, first, width
        self.wide = last - first > _INT64_MAX
        self.columns = (last - first) // width + 1
        shape = (max(1, ranks), self.columns)
        self.mean = np.full(shape, np.nan, np.float32)
        self.lo, self.hi = np.full(self.columns, np.nan), np.full(self.columns, np.nan)
        self.bad = np.zeros(shape, bool)
        self.seen = np.zeros(shape[0], bool)
        self.last_column = -1

    @property
    def any(self) -> bool:
        return bool(self.seen.any())

    def add(self, steps: np.ndarray, ranks: np.ndarray, table: np.ndarray, logged: np.ndarray,
            non_finite: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        """One window: its `steps` (sorted) and `ranks`, the key's step x rank `table` (NaN where no
        finite value), where a row was `logged`, and its non-finite rows (rank, step, kind:
        judgement.non_finite's code)."""
        self._fit(int(ranks.max()) + 1)
        bucket = _bucket_numbers(steps, self.first, self.width, self.wide)
        cols, mean, lo, hi = _per_bucket(bucket, table, self.width)
        rank, step, kind = non_finite
        col = _bucket_numbers(step, self.first, self.width, self.wide)
        for sign, extreme in ((POS_INF, hi), (NEG_INF, lo)):  # SQL's mean, and max or min, are not finite there
            at = kind == sign
            where = np.searchsorted(cols, col[at]), np.searchsorted(ranks, rank[at])
            mean[where] = np.nan
            extreme[where] = np.nan
        self.mean[np.ix_(ranks, cols)] = mean.T
        self.lo[cols], self.hi[cols] = np.fmin.reduce(lo, axis=1), np.fmax.reduce(hi, axis=1)
        self.bad[rank, col] = True
        self.seen[ranks[logged.any(axis=0)]] = True
        rows_at = np.flatnonzero(logged.any(axis=1))
        if len(rows_at):
            self.last_column = max(self.last_column, int(bucket[rows_at[-1]]))

    def _fit(self, ranks: int) -> None:
        if ranks > len(self.seen):
            grow = ranks - len(self.seen)
            self.mean = np.pad(self.mean, ((0, grow), (0, 0)), constant_values=np.nan)
            self.bad = np.pad(self.bad, ((0, grow), (0, 0)))
            self.seen = np.pad(self.seen, (0, grow))

    def summary(self) -> BucketSummary:
        """The summary, as float32 (views of what was built where every rank logged the key)."""
        rows, n = np.flatnonzero(self.seen), self.last_column + 1
        which: Any = slice(None) if len(rows) == len(self.seen) else rows
        steps = [self.first + j * self.width for j in range(n)]
        return BucketSummary(self.series, rows.tolist(), steps, self.width, self.mean[which, :n], self.lo[:n],
                             self.hi[:n], self.bad[which, :n])


def _per_bucket(bucket: np.ndarray, table: np.ndarray, width: int) -> tuple[np.ndarray, ...]:
    """The buckets of `table`'s rows (`bucket`, sorted) and per bucket and column: the mean, min and
    max of the values that are not NaN (NaN where none)."""
    finite = ~np.isnan(table)
    values = np.where(finite, table, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        if len(bucket) % width == 0 and (bucket[::width] == bucket[width - 1 :: width]).all():
            # every bucket whole (each step present): a reshape, reduced along a contiguous axis
            shape = (len(bucket) // width, width, table.shape[1])
            cols, grouped = bucket[::width], table.reshape(shape)
            count = finite.reshape(shape).sum(axis=1)
            mean = values.reshape(shape).sum(axis=1) / count
            return cols, mean, np.fmin.reduce(grouped, axis=1), np.fmax.reduce(grouped, axis=1)
        starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
        count = np.add.reduceat(finite, starts, axis=0, dtype=np.int32)
        mean = np.add.reduceat(values, starts, axis=0) / count
        return bucket[starts], mean, np.fmin.reduceat(table, starts, axis=0), np.fmax.reduceat(table, starts, axis=0)


def column_quantiles(matrix: np.ndarray, qs: tuple[float, ...]) -> list[np.ndarray]:
    """Each column's quantiles over its non-NaN rows (linear, as NumPy's default); NaN for an
    empty column. One sort instead of ``np.nanquantile``'s per-column loop (30x faster here)."""
    ordered = np.sort(matrix, axis=0)  # NaN sorts last
    count = (~np.isnan(matrix)).sum(axis=0)
    out = []
    for q in qs:
        pos = q * np.maximum(count - 1, 0)
        below = np.floor(pos).astype(np.int64)
        above = np.minimum(below + 1, np.maximum(count - 1, 0))
        a = np.take_along_axis(ordered, below[None, :], axis=0)[0] if len(ordered) else np.full(count.shape, np.nan)
        b = np.take_along_axis(ordered, above[None, :], axis=0)[0] if len(ordered) else a
        out.append(np.where(count > 0, a + (b - a) * (pos - below), np.nan))
    return out


def _floats(values: Any) -> list[float | None]:
    """The page's numbers (NaN as None): each value as its shortest decimal at float32's precision,
    what the page draws and the pass holds. In JSON ~10 characters where float64's take ~20: a
    band of 2,000 buckets 0.2 -> 0.1 MB, 10 keys' HTML report ~1 MB less. Past float32's range, as is."""
    wide = np.asarray(values, dtype=float)
    with np.errstate(over="ignore"):
        narrow = wide.astype(np.float32)
    short = np.where(np.isinf(narrow) & np.isfinite(wide), wide, narrow.astype(str).astype(float))
    return [None if v != v else v for v in short.tolist()]


class _quiet(np.errstate):
    """All-NaN columns (a bucket no rank logged) are expected: no RuntimeWarning for them."""

    def __init__(self) -> None:
        super().__init__(all="ignore")

    def __enter__(self) -> None:
        super().__enter__()
        import warnings

        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc: Any) -> None:
        self._warnings.__exit__(*exc)
        super().__exit__(*exc)


def _series(run_id: int, series: str) -> tuple[sa.Table, Any, Any]:
    """(table, WHERE clause, value) of one series."""
    if series.startswith("timing:"):
        column = series.split(":", 1)[1]
        if f"timing:{column}" not in TIMING_SERIES:
            raise LookupFailed("series", series, TIMING_SERIES)
        timed: Any = sa.cast(step_timing.c[column], sa.Float(53))
        return step_timing, sa.and_(step_timing.c.run_id == run_id, step_timing.c[column].is_not(None)), timed
    return metrics, sa.and_(metrics.c.run_id == run_id, metrics.c.key == series), metrics.c.value


def summarize(fetch_arrow: FetchArrow, run_id: int, series: str, columns: int = HEATMAP_COLUMNS) -> BucketSummary:
    """The per-rank, per-bucket summary of ``series`` (a metric key or ``timing:COLUMN``).

    Two statements: the run's step range (DuckDB answers it from its statistics), then one
    ``GROUP BY rank, bucket``. The buckets are the run's, not the key's, so every key of a run
    lines up under the same steps.

    Non-finite values cost no expression per row: a NaN is stored as NULL (``count(*) -
    count(value)`` counts them) and an inf shows in the bucket's min or max; such a bucket's
    mean, min or max that is not finite is dropped (NaN) and the cell marked. Measured on the
    51.2M-row store: 25% less CPU than a CASE per value.
    """
    if not series.startswith("timing:") and (found := _from_summaries(fetch_arrow, run_id, series, columns)) is not None:
        return found
    table = _series(run_id, series)[0]
    span = fetch_arrow(sa.select(sa.func.min(table.c.step).label("a"), sa.func.max(table.c.step).label("b"))
                       .where(table.c.run_id == run_id)).to_pylist()[0]
    if span["a"] is None:
        empty = np.zeros((0, 0))
        return BucketSummary(series, [], [], 1, empty, np.zeros(0), np.zeros(0), empty.astype(bool))
    first, last = int(span["a"]), int(span["b"])
    return _rows_grid(fetch_arrow, run_id, series, first, last, bucket_width(first, last, columns))


def _rows_grid(fetch_arrow: FetchArrow, run_id: int, series: str, first: int, last: int, width: int) -> BucketSummary:
    """`summarize` from the rows, in buckets of `width` steps from `first` (steps up to `last`)."""
    table, where, value = _series(run_id, series)
    step = table.c.step
    wide = last - first > _INT64_MAX  # `step - first` overflows int64 (DuckDB refuses, SQLite goes REAL)
    if wide:
        # the bucket's number, in float: a bucket is then over 2**52 steps wide, and a step within
        # ~2**10 of an edge landing beside it changes no picture
        bucket: Any = sa.cast(sa.func.floor((sa.cast(step, sa.Float(53)) - float(first)) / width), sa.BigInteger)
    else:
        bucket = ((step - first) - (step - first) % width) if width > 1 else (step - first)  # integers only
    stmt = (
        sa.select(table.c.rank.label("rank"), bucket.label("b"), sa.func.avg(value).label("mean"),
                  sa.func.min(value).label("lo"), sa.func.max(value).label("hi"),
                  (sa.func.count() - sa.func.count(value)).label("nulls"))
        .where(where).group_by(table.c.rank, sa.literal_column("b"))
    )
    cells = fetch_arrow(stmt)
    rank, col = _column(cells, "rank", np.int64), _column(cells, "b", np.int64)
    # a wide run's float bucket can round up past the last bucket (its exact number: in Python's ints)
    col = np.minimum(col, (last - first) // width) if wide else col // width
    mean, lo, hi = (np.array(_column(cells, name, float)) for name in ("mean", "lo", "hi"))  # written below
    bad = _column(cells, "nulls", float) > 0
    for m in (mean, lo, hi):  # an inf among the bucket's values: its mean, min or max is not finite
        bad |= np.isinf(m)
        m[np.isinf(m)] = np.nan
    latest = None if wide or series.startswith("timing:") else LatestWins(fetch_arrow, run_id, series)
    return _matrix(series, first, width, rank, col, mean, lo, hi, bad, latest)


def _column(cells: Any, name: str, dtype: Any) -> np.ndarray:
    # not pyarrow's to_numpy, which imports pandas: a cost the page's first answer would pay
    return np.asarray(column_numpy(cells.column(name), null=np.nan), dtype=dtype)


def _from_summaries(fetch_arrow: FetchArrow, run_id: int, key: str, columns: int) -> BucketSummary | None:
    """`summarize` of a metric key from ``step_summaries``, or None where the run is too short
    for them (see the module docstring), has none, or spans past int64."""
    s = step_summaries.c
    span = fetch_arrow(sa.select(sa.func.min(s.step).label("a"), sa.func.max(s.step).label("b"))
                       .where(s.run_id == run_id)).to_pylist()[0]
    if span["a"] is None:
        return None
    first, last = int(span["a"]), int(span["b"]) + SUMMARY_STEPS - 1
    width = bucket_width(first, last, columns)
    if width < SUMMARY_STEPS // 2 or last - first > _INT64_MAX:
        return None
    # the coarse level where the page's buckets are half of one or wider (its width rounded up
    # to whole coarse buckets: still at least half the buckets asked for), from its first bucket
    level = COARSE_STEPS if width >= COARSE_STEPS // 2 else SUMMARY_STEPS
    first -= first % level
    width = bucket_width(first, last, columns)  # from that bucket: never more buckets than asked
    return _summaries_grid(fetch_arrow, run_id, key, first, -(-width // level) * level, level)


#: a key's summary rows are read one by one and merged in NumPy while a bucket of the page holds
#: at most this many of them (1,024 ranks x 100,000 steps: 4); past it DuckDB's GROUP BY merges them
_ROWS_PER_CELL = 4


def _summaries_grid(fetch_arrow: FetchArrow, run_id: int, key: str, first: int, width: int,
                    level: int = SUMMARY_STEPS) -> BucketSummary | None:
    """`summarize` of a metric key from its summaries of `level` steps (``SUMMARY_STEPS``:
    ``step_summaries``; ``COARSE_STEPS``: ``coarse_summaries``), in buckets of `width` steps from
    `first` (both multiples of `level`); None when the run holds no summary of the key."""
    s = (coarse_summaries if level == COARSE_STEPS else step_summaries).c
    mine = (s.run_id == run_id, s.key == key)
    latest = LatestWins(fetch_arrow, run_id, key)
    sums = ("n_finite", "total", "n_nan", "n_pos_inf", "n_neg_inf")
    if width <= _ROWS_PER_CELL * level:
        # a few summary rows a cell: a GROUP BY of as many groups as cells is DuckDB's slowest
        # hashing, where NumPy merges them in place. The non-finite counts, nearly always 0, are
        # read apart, for the summaries that have one: each column handed over costs at 1B rows
        # (benchmarks/RESULTS.md, "Figures the source cites")
        rows = fetch_arrow(sa.select(s.rank.label("rank"), (s.step - first).label("b"), s.n_finite, s.total, s.lo, s.hi)
                           .where(*mine))
        if not rows.num_rows:
            return None  # a key the run does not hold: the rows' path answers it as it always has
        odd = (sa.select(s.rank.label("rank"), (s.step - first).label("b"), s.n_pos_inf, s.n_neg_inf)
               .where(*mine, s.n_nan + s.n_pos_inf + s.n_neg_inf > 0))
        if (laid_out := _laid_out(key, first, width, rows, lambda: fetch_arrow(odd), latest)) is not None:
            return laid_out
    bucket = (s.step - first) - (s.step - first) % width
    stmt = (
        sa.select(s.rank.label("rank"), bucket.label("b"), *(sa.cast(sa.func.sum(s[n]), sa.Float(53)).label(n) for n in sums),
                  sa.func.min(s.lo).label("lo"), sa.func.max(s.hi).label("hi"))
        .where(*mine).group_by(s.rank, sa.literal_column("b"))
    )
    found = fetch_arrow(stmt)
    if not found.num_rows:
        return None
    cells = {name: _column(found, name, np.int64 if name in ("rank", "b") else float) for name in found.column_names}
    n, pos, neg = cells["n_finite"], cells["n_pos_inf"], cells["n_neg_inf"]
    mean, lo, hi, bad = _cell_values(n, cells["total"], cells["n_nan"], pos, neg, cells["lo"], cells["hi"])
    return _matrix(key, first, width, cells["rank"], cells["b"] // width, mean, lo, hi, bad, latest)


def _cell_values(n: np.ndarray, total: np.ndarray, nans: np.ndarray, pos: np.ndarray, neg: np.ndarray,
                 lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Merged summaries (finite count and sum, NaN, +inf and -inf counts, finite min and max) as
    the rows' path has them: mean, min, max (NaN where not finite) and whether a non-finite fell."""
    with np.errstate(invalid="ignore", divide="ignore"):  # SQL's avg: NaN where an inf was among the values
        mean = np.where((pos + neg == 0) & (n > 0), total / n, np.nan)
    lo = np.where(neg > 0, np.nan, lo)  # NULL (no finite value): NaN already
    hi = np.where(pos > 0, np.nan, hi)
    return mean, lo, hi, nans + pos + neg > 0


def _laid_out(key: str, first: int, width: int, rows: Any, read_odd: Callable[[], Any],
              latest: LatestWins | None = None) -> BucketSummary | None:
    """`rows` (rank, b, n_finite, total, lo, hi: one per summary) and, from `read_odd`, the
    summaries with a non-finite count (rank, b, n_pos_inf, n_neg_inf), merged per (rank,
    bucket of `width`) straight into the rank x bucket grid: SUM, MIN (NaN: none), MAX; None
    where the ranks and buckets are too sparse to lay out in place."""
    rank, col = _column(rows, "rank", np.int64), _column(rows, "b", np.int64) // width
    low, n_cols = int(rank.min()), int(col.max()) + 1
    n_ranks = int(rank.max()) - low + 1
    size = n_ranks * n_cols
    if size > 4 * len(rank) + 1024:
        return None
    cell = (rank - low) * n_cols + col
    count = np.bincount(cell, minlength=size)
    one_each = int(count.max()) == 1
    odd = read_odd()
    odd_cell = (_column(odd, "rank", np.int64) - low) * n_cols + _column(odd, "b", np.int64) // width

    def summed(name: str) -> np.ndarray:
        return np.bincount(cell, weights=_column(rows, name, float), minlength=size)

    def extreme(name: str, reduce: Any) -> np.ndarray:
        out, values = np.full(size, np.nan), _column(rows, name, float)
        if one_each:
            out[cell] = values  # a summary a cell (the common case): no merge
        else:
            reduce.at(out, cell, values)  # fmin/fmax: a NULL (NaN) loses to any value
        return out

    lo, hi, n = extreme("lo", np.fmin), extreme("hi", np.fmax), summed("n_finite")
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(n > 0, summed("total") / n, np.nan)
    # `_cell_values`'s rule at the few cells a summary with a NaN or an inf falls in, not over the
    # whole grid: four passes less (benchmarks/RESULTS.md, "one key's summaries side by side")
    bad = np.zeros(size, bool)
    bad[odd_cell] = True
    pos, neg = _column(odd, "n_pos_inf", np.int64) > 0, _column(odd, "n_neg_inf", np.int64) > 0
    mean[odd_cell[pos | neg]] = np.nan  # SQL's avg: NaN where an inf was among the values
    lo[odd_cell[neg]], hi[odd_cell[pos]] = np.nan, np.nan
    held = count.reshape(n_ranks, n_cols).any(axis=1)  # the ranks with a summary of the key
    grid = [m.reshape(n_ranks, n_cols)[held] for m in (mean, lo, hi, bad)]
    return _summary(key, first, width, (np.flatnonzero(held) + low).tolist(), *grid, latest=latest)


def _matrix(series: str, first: int, width: int, rank: np.ndarray, col: np.ndarray, mean: np.ndarray,
            lo: np.ndarray, hi: np.ndarray, bad: np.ndarray, latest: LatestWins | None = None) -> BucketSummary:
    """The summary of per-(rank, bucket) cells: each cell's rank, bucket number, mean, min, max
    (NaN where not finite) and whether a non-finite value fell there."""
    ranks = np.unique(rank)
    n_cols = int(col.max()) + 1 if len(col) else 0
    row = np.searchsorted(ranks, rank)
    shape = (len(ranks), n_cols)
    out = []
    for cell_values in (mean, lo, hi):
        m = np.full(shape, np.nan)
        m[row, col] = cell_values
        out.append(m)
    flags = np.zeros(shape, dtype=bool)
    flags[row, col] = bad
    return _summary(series, first, width, ranks.tolist(), out[0], out[1], out[2], flags, latest=latest)


def _summary(series: str, first: int, width: int, ranks: list[int], mean: np.ndarray, lo: np.ndarray,
             hi: np.ndarray, flags: np.ndarray, *, latest: LatestWins | None = None) -> BucketSummary:
    """The summary of rank x bucket grids (NaN where a rank has no finite value in a bucket),
    the cells holding a step logged twice first mended by `latest` (its later call alone)."""
    if latest is not None:
        latest.apply(first, width, ranks, mean, lo, hi, flags)
    n_cols = mean.shape[1]
    steps = [first + j * width for j in range(n_cols)]
    col_lo, col_hi = np.full(n_cols, np.nan), np.full(n_cols, np.nan)
    if ranks:
        with _quiet():  # a bucket no rank has a finite value in: NaN
            col_lo, col_hi = np.nanmin(lo, axis=0), np.nanmax(hi, axis=0)
    return BucketSummary(series, ranks, steps, width, mean, col_lo, col_hi, flags)
