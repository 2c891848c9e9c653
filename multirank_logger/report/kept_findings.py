"""``multirank-logger findings DB``: the verdicts kept at the runs' ends, as text or JSON.

Read from the ``findings`` table (``StoreReader.findings``), not recomputed: one run's, or every
run's (``--all-runs``), for a look across runs at which ranks and hosts keep coming back.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["kept_findings_text"]


def kept_findings_text(df: Any, labels: dict[int, str], fmt: str = "table") -> str:
    """`df` (``StoreReader.findings``' frame) by run, origins first; `labels`: each run's name/version."""
    if fmt == "json":
        rows = [{k: (None if v != v else v) for k, v in row.items()} for row in df.to_dict("records")]
        for row, run_id in zip(rows, df["run_id"].tolist()):
            detail = row.get("detail")
            row["detail"] = json.loads(detail) if isinstance(detail, str) and detail else None
            row["run"] = labels.get(int(run_id))
        return json.dumps({"findings": rows}, default=_plain, indent=1)
    if df.empty:
        return ("No findings kept: the watch found nothing at the runs' ends (or ran with watch=False, "
                "or the runs are still running); `multirank-logger report` judges a run from its rows.")
    lines: list[str] = []
    for run_id, group in df.groupby("run_id", sort=True):
        label = labels.get(int(run_id), "?")
        lines.append(f"{label} (run {int(run_id)}): {len(group)} finding(s)")
        said: set[str] = set()
        for r in group.itertuples():
            if r.sentence in said:  # the ranks one sentence says together (watch.keep_verdict): said once
                continue
            said.add(r.sentence)
            mark = "origin  " if r.origin else "followed"
            lines.append(f"  {r.kind:<10} {mark} {r.sentence}")
    return "\n".join(lines)


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else str(value)
