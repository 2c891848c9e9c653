"""Durations, times and names as a person reads them: one format for `runs`, `report`, `sql` and the page."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

__all__ = ["TIME_COLUMNS", "duration_text", "format_ranks", "natural_key", "number_text", "text_table", "times_as_times"]

#: the store's columns of Unix seconds (runs, ranks, metrics and the side tables)
TIME_COLUMNS = ("time", "started_at", "ended_at", "last_time")


def natural_key(name: str) -> tuple[tuple[str | int, ...], str]:
    """A sort key that orders the numbers inside names as numbers: ``node2`` before ``node10``,
    ``gpu-a9.x`` before ``gpu-a10.x`` (hosts in `hosts`, the page's host groups). Names that differ
    only in leading zeros (``node01``, ``node1``) are then ordered as text."""
    parts = re.split(r"(\d+)", name)  # text, digits, text, ...: a type for each position
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts)), name


def duration_text(seconds: float | None) -> str:
    """``4.2s``, ``21s``, ``1m30s``, ``2h05m00s``; "-" for none (a run not ended, nothing logged).
    The page's header writes the same (ui/static/page.js ``dur``)."""
    if seconds is None or seconds != seconds:
        return "-"
    if abs(seconds) < 10:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def format_ranks(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 5]`` as ``"ranks 0-3,5"``; one rank as ``"rank 2"``."""
    ordered = sorted({int(r) for r in ranks})
    if len(ordered) == 1:
        return f"rank {ordered[0]}"
    spans: list[str] = []
    start = prev = ordered[0]
    for r in [*ordered[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return "ranks " + ",".join(spans)


def number_text(value: Any, unit: str = "") -> str:
    """A number for a reader: seconds as ms, bytes as MiB, else 4 significant digits; "-" for none."""
    if value is None or value != value:
        return "-"
    if unit == "s":
        return f"{value * 1e3:.3g} ms"
    if unit == "B":
        return f"{value / 2**20:,.0f} MiB"
    return f"{value:.4g}"


def text_table(columns: dict[str, list[Any]]) -> str:
    """Columns (header: values) as a terminal table laid out as pandas' ``to_string(index=False)``
    lays one out: each column right-justified to its widest text (a column of integers: its
    header with a space before it), one space between columns. For a short table where importing pandas is most of the
    time (the CLI's ``runs``)."""
    laid = []
    for header, values in columns.items():
        numbers = all(isinstance(v, int) and not isinstance(v, bool) for v in values)
        texts = [str(v) for v in values]
        header = " " + header if numbers else header  # pandas' leading space of a numeric column
        width = max(len(header), *map(len, texts))
        laid.append([header.rjust(width), *(t.rjust(width) for t in texts)])
    return "\n".join(" ".join(row) for row in zip(*laid))


def times_as_times(df: Any) -> Any:
    """``df`` with its time columns (``TIME_COLUMNS``, any ``*_at``) of Unix seconds shown as UTC
    dates to the millisecond (``2026-11-26 22:56:40.470``) instead of ``1.795715e+09``."""
    import pandas as pd

    out = df
    for name in df.columns:
        column = df[name]
        if not (str(name) in TIME_COLUMNS or str(name).endswith("_at")) or not pd.api.types.is_numeric_dtype(column):
            continue
        seconds = pd.to_numeric(column, errors="coerce")
        if not seconds.dropna().between(1e8, 1e10).all():  # not Unix seconds of this era: leave it
            continue
        shown = pd.to_datetime(seconds, unit="s", utc=True).dt.strftime("%Y-%m-%d %H:%M:%S.%f").str[:-3]
        out = out.assign(**{str(name): shown.where(seconds.notna(), "-")})
    return out
