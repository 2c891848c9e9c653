"""Plots of one key against step, per rank (matplotlib: the optional ``[plot]`` extra).

Up to ``MAX_LINES`` ranks: one line per rank. More: the band of the ranks' range (min to max at
each step) and their median, with the given outlier ranks drawn on top; outlier ranks are
labelled either way. Past ``MAX_POINTS`` steps, the steps are cut into at most that many buckets
of equal width: the band is each bucket's min, median (of the steps' medians) and max, a rank's
line its mean per bucket. A figure's size does not grow with the steps or the ranks. Figures are built with ``matplotlib.figure.Figure`` directly (no pyplot,
no global backend state), so this works in any process, headless.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Iterable
from typing import Any

from multirank_logger.errors import MissingExtra

__all__ = ["MAX_LINES", "MAX_POINTS", "SIZE_PX", "figure_png", "not_logged_cells", "plot_key"]

#: ranks drawn one line each; past this, a band with the outliers on top
MAX_LINES = 8
#: points drawn per line at most (more steps are bucketed): the figure is 960 pixels wide
MAX_POINTS = 1000
#: the image's size in pixels (width, height), at DPI dots per inch
SIZE_PX = (960, 480)
DPI = 100


def _figure_class() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise MissingExtra("Plots", "matplotlib", "plot") from None
    return Figure


def plot_key(
    table: Any,
    key: str,
    outliers: Iterable[int] = (),
    title: str | None = None,
    non_finite: dict[int, int] | None = None,
    not_logged: Any = None,
) -> Any:
    """A figure of ``table`` (step x rank, as ``StoreReader.per_rank`` returns) against step.

    Args:
        table: one key per rank: index step, one column per rank.
        key: the key's name (the y label).
        outliers: ranks to draw on top and label (with many ranks, the only ranks drawn as lines).
        title: the figure's title (default: the key).
        non_finite: rank -> its first step with NaN/inf, marked with an x where its line ends.
        not_logged: step x rank booleans in ``table``'s shape, True where the rank did not log the
            key at that step: a rank's line goes on through these (a key logged every N steps, or
            by ranks at different steps), while a NaN/inf it logged stays a break in the line.
            None: every empty cell is taken as not logged (``table`` holds no NaN/inf the rank logged).

    Raises:
        MissingExtra: when matplotlib is not installed.
    """
    import numpy as np

    figure = _figure_class()(figsize=(SIZE_PX[0] / DPI, SIZE_PX[1] / DPI), dpi=DPI)
    ax = figure.add_subplot()
    steps = table.index.to_numpy()
    outliers = [r for r in outliers if r in table.columns]
    values = table.to_numpy(dtype=float, copy=True)
    skipped = np.isnan(values) if not_logged is None else np.asarray(not_logged, dtype=bool)
    values[~np.isfinite(values)] = np.nan  # NaN/inf have no place on the axis: a gap
    width = max(1, -(-len(steps) // MAX_POINTS))
    xs = steps[::width]

    def rank_line(col: int) -> tuple[Any, Any]:
        """The rank's points, its buckets without a value it logged left out: a line across them."""
        ys = _per_bucket(values[:, col], width, np.nanmean)
        logged = _per_bucket((~skipped[:, col]).astype(float), width, np.nanmax) > 0
        return xs[logged], ys[logged]

    if len(table.columns) <= MAX_LINES:
        for col, rank in enumerate(table.columns):
            is_out = rank in outliers
            ax.plot(*rank_line(col), zorder=3 if is_out else 2,
                    label=f"rank {rank}" + (" (outlier)" if is_out else ""), linewidth=2.2 if is_out else 1.2)
    else:
        others = [col for col, rank in enumerate(table.columns) if rank not in outliers]
        with np.errstate(all="ignore"):
            low, high = np.nanmin(values[:, others], axis=1), np.nanmax(values[:, others], axis=1)
            middle = np.nanmedian(values[:, others], axis=1)
        low, high = _per_bucket(low, width, np.nanmin), _per_bucket(high, width, np.nanmax)
        middle = _per_bucket(middle, width, np.nanmedian)
        # the buckets where one of them logged the key: the band goes on across the others
        some = _per_bucket((~skipped[:, others]).any(axis=1).astype(float), width, np.nanmax) > 0
        ax.fill_between(xs[some], low[some], high[some], color="tab:blue", alpha=0.25, label=f"range of {len(others)} ranks")
        ax.plot(xs[some], middle[some], color="tab:blue", linewidth=1.2, label="their median")
        for rank in outliers:
            ax.plot(*rank_line(list(table.columns).index(rank)), linewidth=2.2, label=f"rank {rank} (outlier)")
    for line in ax.lines:  # label the outliers at their last point, not only in the legend
        label = str(line.get_label())
        if label.endswith("(outlier)"):
            xs, ys = line.get_xdata(), line.get_ydata()
            finite = np.flatnonzero(np.isfinite(ys))
            if len(finite):
                ax.annotate(label.removesuffix(" (outlier)"), (xs[finite[-1]], ys[finite[-1]]), xytext=(4, 0),
                            textcoords="offset points", color=line.get_color(), fontweight="bold")
    for rank, step in (non_finite or {}).items():
        before = table.index < step
        ends: np.ndarray = values[before, list(table.columns).index(rank)] if rank in table.columns else np.zeros(0)
        finite = ends[np.isfinite(ends)]
        y = finite[-1] if len(finite) else float(np.nanmedian(values)) if np.isfinite(values).any() else 0.0
        ax.scatter([step], [y], marker="x", s=80, color="red", zorder=4)
        ax.annotate(f"rank {rank}: NaN/inf from step {step}", (step, y), xytext=(6, -12), textcoords="offset points",
                    color="red")
    ax.set_xlabel("step")
    ax.set_ylabel(key)
    # one line hides the others when every rank logged the same values (sync_dist=True): say so
    with np.errstate(invalid="ignore"):
        same = values.shape[1] > 1 and bool(np.all((values == values[:, :1]) | np.isnan(values)))
    ax.set_title((title or key) + (": every rank logged the same values" if same else ""))
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    figure.tight_layout()
    return figure


def _per_bucket(series: Any, width: int, reduce: Any) -> Any:
    """`series` reduced over buckets of `width` consecutive steps (NaN where a bucket has no value)."""
    import numpy as np

    if width == 1:
        return series
    padded = np.full(-(-len(series) // width) * width, np.nan)
    padded[: len(series)] = series
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an empty bucket: NaN, a gap in the line
        return reduce(padded.reshape(-1, width), axis=1)


def figure_png(figure: Any) -> bytes:
    """The figure as PNG bytes, ``SIZE_PX`` pixels."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def not_logged_cells(reader: Any, run_id: int, key: str, table: Any) -> Any:
    """Where in `table` (step x rank) a rank did not log `key`: its empty cells less the NaN/inf it
    logged (read from the rows only when there are empty cells), which the plot keeps as breaks."""
    import numpy as np

    empty = table.isna().to_numpy(copy=True)
    if not empty.any() or key.startswith("timing:"):
        return empty
    rows = reader.metrics(run_id, keys=[key])
    bad = rows[~np.isfinite(rows["value"].to_numpy(dtype=float))]
    steps, ranks = table.index.get_indexer(bad["step"]), table.columns.get_indexer(bad["rank"])
    found = (steps >= 0) & (ranks >= 0)
    empty[steps[found], ranks[found]] = False
    return empty
