"""``multirank-logger alerts DB``: what the watch raised during a run, as text or JSON."""

from __future__ import annotations

import json
import time
from typing import Any

__all__ = ["alerts_text", "every_run_alerts_text"]


def alerts_text(label: str, run_id: int, df: Any, fmt: str = "table") -> str:
    """The alerts of one run (``StoreReader.alerts``' frame): one line each, oldest first, or JSON."""
    if fmt == "json":
        rows = [{k: (None if v != v else v) for k, v in row.items()} for row in df.to_dict("records")]
        for row in rows:
            detail = row.get("detail")
            row["detail"] = json.loads(detail) if isinstance(detail, str) and detail else None
        return json.dumps({"run": label, "run_id": run_id, "alerts": rows}, default=_plain, indent=1)
    if df.empty:
        return f"No alerts in {label} (run {run_id}): the watch raised none (or ran with watch=False)."
    lines = [f"{label} (run {run_id}): {len(df)} alert(s)"]
    for r in df.itertuples():
        seen = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(r.seen_at)))
        lines.append(f"  {seen}  {r.kind:<10} {r.message}")
    return "\n".join(lines)


def every_run_alerts_text(df: Any, labels: dict[int, str], fmt: str = "table") -> str:
    """Every run's alerts (``StoreReader.alerts(every_run=True)``, `labels`: run id -> its label):
    one line each with its run, by run then in the order raised; or JSON, a list of runs."""
    if fmt == "json":
        return json.dumps([json.loads(alerts_text(labels.get(int(run_id), str(run_id)), int(run_id),
                                                  group.drop(columns="run_id"), "json"))
                           for run_id, group in df.groupby("run_id", sort=True)], indent=1)
    if df.empty:
        return "No alerts in any run: the watch raised none (or ran with watch=False)."
    lines = [f"{len(df)} alert(s) in {df['run_id'].nunique()} run(s)"]
    for r in df.itertuples():
        seen = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(r.seen_at)))
        lines.append(f"  {seen}  {labels.get(int(r.run_id), str(r.run_id))} (run {int(r.run_id)})  {r.kind:<10} {r.message}")
    return "\n".join(lines)


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else str(value)
