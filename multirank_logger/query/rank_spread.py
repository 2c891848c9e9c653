"""One key across ranks: the step x rank table (``StoreReader.per_rank``) and how far the ranks spread."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import sqlalchemy as sa

from multirank_logger.rows.run_ref import RunRef
from multirank_logger.rows.schema import DTYPE_NEG_ZERO, step_summaries

__all__ = ["RankSpread", "key_extent", "non_finite_firsts", "neg_zero", "pivot_step_rank", "pivot_streamed", "positions", "step_rank_cells"]


@dataclass
class RankSpread:
    """A key across ranks: the step x rank table and a summary of its spread.

    The *farthest* rank has the largest mean absolute distance from the per-step median
    of all ranks (``from_median``); ``ratio`` compares it with the median of the other
    ranks' distances. It *stands out* when that ratio is at least ``STANDOUT_RATIO``: with
    one rank, ranks that agree everywhere, or ranks all equally noisy, none does.
    """

    STANDOUT_RATIO = 2.0

    key: str
    run: RunRef
    table: Any  # pandas DataFrame, index step, one column per rank
    summary: Any  # pandas DataFrame, one row per rank: steps, mean, min, max, last, from_median
    spread_mean: float  # mean over steps of (max - min across ranks)
    spread_max: float
    spread_max_step: int | None
    farthest: int | None
    ratio: float
    #: rank -> (first step, values) of the NaN and inf it logged (the spread skips NaN)
    non_finite: dict[int, tuple[int, int]] = field(default_factory=dict)

    @property
    def standout(self) -> int | None:
        return self.farthest if self.ratio >= self.STANDOUT_RATIO else None

    @classmethod
    def read(cls, conn: sa.Connection, key: str, run: RunRef, table: Any) -> RankSpread:
        """`of` with the NaN and inf each rank logged, read from the key's summaries."""
        return cls.of(key, run, table, non_finite_firsts(conn, run.id, key, table))

    @classmethod
    def of(cls, key: str, run: RunRef, table: Any, non_finite: dict[int, tuple[int, int]] | None = None) -> RankSpread:
        import pandas as pd

        median = table.median(axis=1)
        spread = table.max(axis=1) - table.min(axis=1)
        summary = pd.DataFrame(
            {
                "steps": table.count(),
                "mean": table.mean(),
                "min": table.min(),
                "max": table.max(),
                "last": table.apply(lambda col: col.dropna().iloc[-1] if col.notna().any() else np.nan),
                "from_median": table.sub(median, axis=0).abs().mean(),
            }
        )
        summary.index.name = "rank"
        farthest, ratio = None, float("nan")
        dist = summary["from_median"].dropna()
        if len(dist) > 1 and dist.max() > 0:
            farthest = int(dist.idxmax())
            others = float(dist.drop(farthest).median())
            ratio = float(dist.max()) / others if others > 0 else float("inf")
        has_spread = spread.notna().any()
        return cls(
            key, run, table, summary,
            spread_mean=float(spread.mean()) if has_spread else float("nan"),
            spread_max=float(spread.max()) if has_spread else float("nan"),
            spread_max_step=int(spread.idxmax()) if has_spread else None,
            farthest=farthest, ratio=ratio, non_finite=non_finite or {},
        )


def pivot_step_rank(rank: np.ndarray, seq: np.ndarray | None, step: np.ndarray, value: np.ndarray,
                    dtype: np.ndarray, frame: str = "pandas") -> Any:
    """Long rows of one key (in any order) -> a step x rank DataFrame; a rank's later call wins at a
    step. ``seq`` None: the caller found no (rank, step) twice (and it is not counted again).
    ``frame="arrow"``: a pyarrow Table of a ``step`` column and one column per rank (named by its
    number), from the NumPy grid without pandas (``StoreReader.per_rank``)."""
    return _step_rank_frame(*_grid(rank, seq, step, value, dtype), frame)


def _step_rank_frame(steps: np.ndarray, ranks: np.ndarray, table: np.ndarray, frame: str) -> Any:
    """The step x rank `table` as a pandas DataFrame (steps its index, ranks its columns), or for
    ``frame="arrow"`` a pyarrow Table of a ``step`` column and one column per rank (named by its number)."""
    if frame != "pandas":
        import pyarrow as pa

        return pa.table({"step": steps, **{str(r): table[:, j] for j, r in enumerate(ranks.tolist())}})
    import pandas as pd

    # copy=False: pandas 3 copies an array by default (41 MB and 0.03-0.09 s for 20,000 x 256)
    return pd.DataFrame(table, index=pd.Index(steps, name="step"), columns=pd.Index(ranks.tolist(), name="rank"),
                        copy=False)


def _grid(rank: np.ndarray, seq: np.ndarray | None, step: np.ndarray, value: np.ndarray, dtype: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`pivot_step_rank`'s steps, ranks and step x rank values."""
    # by counting, not sorting: a sort of a large key's rows (in SQL or here) cost more than the rest
    # (RESULTS.md, scale); only repeated cells are sorted, by seq
    value = neg_zero(value, dtype)
    if not len(rank):
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, 0))
    steps, ranks, cell = step_rank_cells(step, rank)
    grid = np.full(len(steps) * len(ranks), np.nan)
    logged = np.zeros(len(grid), bool)
    logged[cell] = True
    if seq is not None and np.count_nonzero(logged) < len(cell):  # a rank logged twice at a step
        order = np.lexsort((seq, cell))
        last = order[np.r_[cell[order][1:] != cell[order][:-1], True]]
        grid[cell[last]] = value[last]
    else:
        grid[cell] = value
    table, in_cell = grid.reshape(len(steps), len(ranks)), logged.reshape(len(steps), len(ranks))
    step_in, rank_in = in_cell.any(axis=1), in_cell.any(axis=0)  # dense cells: a step or rank may have no row
    if not (step_in.all() and rank_in.all()):
        steps, ranks, table = steps[step_in], ranks[rank_in], table[step_in][:, rank_in]
    return steps, ranks, table


def key_extent(conn: sa.Connection, run_id: int, key: str) -> tuple[int, int, int, int, int] | None:
    """(first step, last step, lowest rank, highest rank, rows) of one key, from its summaries
    (store/step_summaries.py: 1/16 of its rows, and the masks of the first and last bucket give
    the exact steps); None when the run holds no summary of it."""
    s = step_summaries.c
    mine = (s.run_id == run_id, s.key == key)
    rows = s.n_finite + s.n_nan + s.n_pos_inf + s.n_neg_inf
    low, high, rank_lo, rank_hi, count = conn.execute(
        sa.select(sa.func.min(s.step), sa.func.max(s.step), sa.func.min(s.rank), sa.func.max(s.rank),
                  sa.cast(sa.func.sum(rows), sa.BigInteger)).where(*mine)
    ).one()
    if low is None:
        return None
    masks = {int(low): 0, int(high): 0}
    for step, mask in conn.execute(sa.select(s.step, s.steps_mask).where(*mine, s.step.in_(list(masks)))):
        masks[int(step)] |= int(mask)
    first = int(low) + (masks[int(low)] & -masks[int(low)]).bit_length() - 1
    last = int(high) + masks[int(high)].bit_length() - 1
    return first, last, int(rank_lo), int(rank_hi), int(count)


def non_finite_firsts(conn: sa.Connection, run_id: int, key: str, table: Any) -> dict[int, tuple[int, int]]:
    """rank -> (first step, values) of the NaN and inf each rank logged of `key`, from its summaries
    (a bucket's counts, only the buckets that hold one); the step is exact: the first step of the
    first such bucket where the rank logged a row (its mask) and `table` (`per_rank`'s) is not finite.
    A NaN cell of the table alone could be a step the rank did not log."""
    s = step_summaries.c
    bad = s.n_nan + s.n_pos_inf + s.n_neg_inf
    firsts: dict[int, tuple[int, int]] = {}
    rows = conn.execute(sa.select(s.rank, s.step, s.steps_mask, bad).where(s.run_id == run_id, s.key == key, bad > 0)
                        .order_by(s.rank, s.step))
    for rank, bucket, mask, count in rows:
        rank, bucket = int(rank), int(bucket)
        if rank in firsts:
            firsts[rank] = (firsts[rank][0], firsts[rank][1] + int(count))
            continue
        column = table[rank] if rank in table.columns else None
        first = next((bucket + i for i in range(int(mask).bit_length()) if int(mask) >> i & 1 and column is not None
                      and bucket + i in column.index and not np.isfinite(column.loc[bucket + i])), bucket)
        firsts[rank] = (first, int(count))
    return firsts


def pivot_streamed(extent: tuple[int, int, int, int, int], chunks: Iterable[list[np.ndarray]], frame: str = "pandas") -> Any:
    """`pivot_step_rank` of one key's rows arriving in chunks (rank, step, value, dtype), each placed
    in the step x rank table as it comes and let go: the peak is the table (8 bytes a cell) and
    a byte a cell of where a row was, not every row's columns at once. None where the cells are
    sparse (the counting pivot's case), a row falls outside `extent`, or a rank logged a step
    twice (its later call wins: the caller reads seq then). `frame` as `pivot_step_rank`'s."""
    first, last, rank_lo, rank_hi, count = extent
    n_steps, n_ranks = last - first + 1, rank_hi - rank_lo + 1
    if n_steps * n_ranks > 4 * count + 1024 or n_steps * n_ranks >= 2**62:
        return None
    grid = np.full(n_steps * n_ranks, np.nan)
    logged = np.zeros(len(grid), bool)
    rows = 0
    for rank, step, value, dtype in chunks:
        cell = step - first
        cell *= n_ranks
        cell += rank - rank_lo
        if len(cell) and (cell.min() < 0 or cell.max() >= len(grid)):
            return None
        grid[cell] = neg_zero(value, dtype)
        logged[cell] = True
        rows += len(cell)
        del rank, step, value, dtype, cell
    if np.count_nonzero(logged) != rows:
        return None
    table, in_cell = grid.reshape(n_steps, n_ranks), logged.reshape(n_steps, n_ranks)
    steps, ranks = np.arange(first, last + 1), np.arange(rank_lo, rank_hi + 1)
    step_in, rank_in = in_cell.any(axis=1), in_cell.any(axis=0)
    if not (step_in.all() and rank_in.all()):
        steps, ranks, table = steps[step_in], ranks[rank_in], table[step_in][:, rank_in]
    return _step_rank_frame(steps, ranks, table, frame)


def step_rank_cells(step: np.ndarray, rank: np.ndarray, layers: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The steps and ranks of a step x rank table of these rows, and each row's cell in it
    (`layers` such tables hold the rows: the report's window has one per key).

    Where every step from the first to the last and every rank from the lowest to the highest
    fit in a few times the rows (a training's steps), a cell is the row's step and rank less the
    first: no counting pass over either column; a step or rank without a row then has its empty
    place. Else only the steps and ranks present (``positions``).
    """
    low_step, low_rank = int(step.min()), int(rank.min())
    n_steps, n_ranks = int(step.max()) - low_step + 1, int(rank.max()) - low_rank + 1
    # int32 positions and cells where they fit: each int64 copy of a large key's rows is 41 MB
    if layers * n_steps * n_ranks <= 4 * len(step) + 1024:
        narrow = n_steps * n_ranks < 2**31 and -(2**31) <= low_step and low_step + n_steps < 2**31
        cell = step.astype(np.int32 if narrow else np.int64)
        cell -= low_step
        cell *= n_ranks
        cell -= low_rank  # before adding the rank: no step of the sum leaves the cells' range
        cell += rank
        return np.arange(low_step, low_step + n_steps), np.arange(low_rank, low_rank + n_ranks), cell
    steps, step_pos = positions(step)
    ranks, rank_pos = positions(rank)
    wide = len(steps) * len(ranks) >= 2**31
    return steps, ranks, (step_pos.astype(np.int64) if wide else step_pos) * len(ranks) + rank_pos


def positions(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct `values` (sorted) and each value's index among them, as np.unique's
    return_inverse, by counting instead of sorting where the values are dense (steps, ranks)."""
    low = int(values.min())
    span = int(values.max()) - low + 1
    if span > 4 * len(values) + 1024:
        return np.unique(values, return_inverse=True)
    offset = values - low
    present = np.bincount(offset, minlength=span) > 0  # not a scatter of True: slower on runs of one value
    if present.all():  # every value in low..high occurs (a window's steps, its ranks): no lookup
        return np.arange(low, low + span), offset
    index = (np.cumsum(present) - 1).astype(np.int32 if span < 2**31 else np.int64)
    return np.flatnonzero(present) + low, index[offset]


def neg_zero(value: np.ndarray, dtype: np.ndarray) -> np.ndarray:
    # SQLite drops the sign of -0.0; the dtype code keeps it. `value` itself where none is -0.0:
    # no copy of a large key's values (per_rank of 5.1M rows)
    negative = dtype == DTYPE_NEG_ZERO
    return np.where(negative, -0.0, value) if negative.any() else value
