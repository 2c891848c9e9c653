"""One key across ranks: the step x rank table (``StoreReader.per_rank``) and how far the ranks spread."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from multirank_logger.model.run_ref import RunRef
from multirank_logger.model.schema import DTYPE_NEG_ZERO

__all__ = ["RankSpread", "neg_zero", "pivot_step_rank"]


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

    @property
    def standout(self) -> int | None:
        return self.farthest if self.ratio >= self.STANDOUT_RATIO else None

    @classmethod
    def of(cls, key: str, run: RunRef, table: Any) -> RankSpread:
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
            farthest=farthest, ratio=ratio,
        )  # fmt: skip


def pivot_step_rank(rank: np.ndarray, seq: np.ndarray, step: np.ndarray, value: np.ndarray, dtype: np.ndarray) -> Any:
    """Long rows of one key -> a step x rank DataFrame; a rank's later call wins at a step."""
    import pandas as pd

    # in NumPy, not pandas: sort_values + drop_duplicates + pivot took several times as long (RESULTS.md, query: per_rank).
    # Rows mostly come sorted already (by rank then call order, steps rising): check first.
    if not _sorted_by(rank, step, seq):
        order = np.lexsort((seq, step, rank))
        rank, step, seq, value, dtype = rank[order], step[order], seq[order], value[order], dtype[order]
    value = neg_zero(value, dtype)
    last = np.r_[(rank[1:] != rank[:-1]) | (step[1:] != step[:-1]), True] if len(rank) else np.zeros(0, bool)
    steps, row = np.unique(step[last], return_inverse=True)
    ranks, col = np.unique(rank[last], return_inverse=True)
    grid = np.full((len(steps), len(ranks)), np.nan)
    grid[row, col] = value[last]
    return pd.DataFrame(grid, index=pd.Index(steps, name="step"), columns=pd.Index(ranks.tolist(), name="rank"))


def _sorted_by(*columns: np.ndarray) -> bool:
    """Whether the rows are in ascending order of ``columns`` (the first the most significant)."""
    if len(columns[0]) < 2:
        return True
    tied = np.ones(len(columns[0]) - 1, bool)  # rows equal to the next on every column so far
    for column in columns:
        ahead, behind = column[1:], column[:-1]
        if (tied & (ahead < behind)).any():
            return False
        tied &= ahead == behind
    return True


def neg_zero(value: np.ndarray, dtype: np.ndarray) -> np.ndarray:
    # SQLite drops the sign of -0.0; the dtype code keeps it
    return np.where(dtype == DTYPE_NEG_ZERO, -0.0, value)
