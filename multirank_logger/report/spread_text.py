"""``multirank-logger ranks DB KEY`` as text: a key per rank (step x rank), how far the ranks spread,
and the one that stands out (query/rank_spread.py reads it)."""

from __future__ import annotations

from typing import Any

from multirank_logger.query.rank_spread import RankSpread

__all__ = ["spread_text"]


def spread_text(s: RankSpread, max_rows: int | None) -> str:
    """`multirank-logger ranks KEY`: the step x rank table (`max_rows` of it: the first and last half;
    None: every step), each rank's distance from the median, and which rank stands out, if one does."""
    table = s.table.rename(columns=lambda r: f"rank {r}")
    lines = [
        f"{s.key} in {s.run.label} (run {s.run.id}): {table.shape[1]} ranks, {table.shape[0]} steps",
        "",
        _frame(table, max_rows=max_rows),
        "",
        _frame(s.summary.rename(columns={"from_median": "|x - median|"})),
        "",
    ]
    if s.spread_max_step is not None and table.shape[1] > 1:
        lines.append(
            f"Spread across ranks (max - min at a step): mean {s.spread_mean:.6g}, "
            f"largest {s.spread_max:.6g} at step {s.spread_max_step}."
        )
    if s.non_finite:  # the spread skips NaN: "no rank stands out" would hide where they began
        from multirank_logger.report.findings import non_finite_lines

        lines += non_finite_lines(s.non_finite)
    elif table.shape[1] == 2 and s.farthest is not None:  # the median of two is their middle: 1x, always
        lines.append("Which of the 2 ranks is off cannot be told from two (each is as far from their median as "
                     "the other): a third rank tells.")
    elif s.standout is not None:
        dist = s.summary["from_median"]
        others = dist.drop(s.standout).median()
        than = f"{s.ratio:.3g}x the other ranks' ({others:.6g})" if others > 0 else "where the other ranks sit on it (0)"
        lines.append(f"Rank {s.standout} stands out: {dist[s.standout]:.6g} from the per-step median of the ranks "
                     f"on average, {than}.")
    elif s.farthest is not None:
        lines.append(
            f"No rank stands out: the farthest from the per-step median, rank {s.farthest}, is "
            f"{s.ratio:.3g}x the other ranks' distance (a rank stands out at {s.STANDOUT_RATIO:g}x)."
        )
    elif table.shape[1] > 1:
        lines.append("No rank stands out: the ranks agree at every step.")
    return "\n".join(lines)


def _frame(df: Any, index: bool = True, max_rows: int | None = None) -> str:
    """A DataFrame as a terminal table (pandas' own layout, wide enough not to wrap)."""
    return df.to_string(index=index, max_rows=max_rows, line_width=None)
