"""``multirank-logger decisions DB``: every checkpoint and early-stopping decision with each rank's
own value and vote, the decisions the ranks split on marked (query/side_tables.py's one rule)."""

from __future__ import annotations

from typing import Any

from multirank_logger.query.side_tables import disagreements
from multirank_logger.report.render import DECIDED

__all__ = ["decisions_text"]


def decisions_text(label: str, run_id: int, df: Any) -> str:
    """The decisions of one run (``StoreReader.decisions``' frame) as a terminal table."""
    if df.empty:
        return f"No decisions in {label}: add multirank_logger.DecisionAudit() to the Trainer's callbacks."
    import pandas as pd

    split = set(disagreements(df))
    rows = []
    for seq, d in df.groupby("seq", sort=True):
        first = d.iloc[0]
        done, not_done = DECIDED.get(first["callback"], ("yes", "no"))
        row = {"": "!" if seq in split else "", "step": first["step"], "epoch": first["epoch"],
               "callback": f"{first['callback']}({first['monitor']}, {first['mode']})",
               "decision": done if first["decision"] else not_done}
        for r in d.itertuples():  # a vote is NULL only in rows written by hand
            value = "-" if pd.isna(r.value) else f"{r.value:g}"  # NaN: SQLite keeps it as NULL
            row[f"rank {r.rank}"] = f"{value} {'-' if pd.isna(r.vote) else 'yes' if r.vote else 'no'}"
        row["best"] = "-" if pd.isna(first["best"]) else f"{first['best']:g}"
        row["path"] = first["path"] or ""
        rows.append(row)
    differ = f"{len(split)} where the ranks voted differently (marked !)" if split else "the ranks voted alike in each"
    return "\n".join([
        f"{label} (run {run_id}): {len(rows)} decisions, {differ}",
        pd.DataFrame(rows).fillna("-").to_string(index=False, line_width=None),  # wide enough not to wrap
        "rank K: that rank's own value and vote (yes: it alone would save / stop); best and path: rank 0's.",
    ])
