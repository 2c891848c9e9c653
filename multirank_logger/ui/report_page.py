"""``multirank-logger report DB -o FILE.html``: a run's page of the ui, in one self-contained file.

The same views as the live page (findings, every key's band and heatmap, StepTimer's series,
decisions and logs), with the answers the page would ask the server for written into the file:
it opens from disk, offline, with hover and zoom; a click on a heatmap row draws that rank's line
from lines embedded for runs of up to ``LINES_UP_TO_RANKS`` ranks. The PNG plots remain for
``multirank-logger plot``.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import quote

from multirank_logger.query.reader import StoreReader
from multirank_logger.query.step_buckets import BucketSummary
from multirank_logger.report.findings import Findings
from multirank_logger.ui import views
from multirank_logger.ui.page import write_static_page

__all__ = ["write_report"]

#: every rank's line is embedded (for a click on its heatmap row) up to this many ranks
LINES_UP_TO_RANKS = 64
_UNESCAPED = "!~*'()"


def write_report(reader: StoreReader, found: Findings, path: str | os.PathLike[str],
                 buckets: dict[str, BucketSummary] | None = None) -> list[str]:
    """Write ``found``'s run as one HTML file at ``path``; returns the series drawn.

    ``buckets``: summaries already at hand (``find_with_buckets``, from the report's own pass);
    the other series are summarized here, one scan each."""
    run_id = found.run_id
    run = views.run_view(reader, run_id)
    answers: dict[str, Any] = {
        f"run/{run_id}": run,
        f"run/{run_id}/findings": views.findings_answer(found),
        f"run/{run_id}/logs": views.logs_view(reader, run_id),
        f"run/{run_id}/alerts": views.alerts_view(reader, run_id),
    }
    drawn = []
    departing = found.departing_by_series()  # once: every finding typed per call (1,024 ranks x 40 keys)
    for name in run["keys"] + run["timing"]:
        summary = (buckets or {}).get(name) or views.summary(reader, run_id, name)
        if summary.ranks:
            all_lines = len(summary.ranks) <= LINES_UP_TO_RANKS
            # the path as the page's encodeURIComponent writes it
            answers[f"run/{run_id}/series?name={quote(name, safe=_UNESCAPED)}"] = views.series_view(
                summary, run["nodes_of"], all_lines, departing=departing.get(name, []), gpus_of=run["gpus_of"])
            drawn.append(name)
    write_static_page(path, f"{found.run}: multirank-logger report", answers, f"/run/{run_id}", found.run_uuid)
    return drawn
