"""What the page names under each chart against what the report finds, for the agreement tests
(tests/ui/test_page_agrees_with_report.py, and the DDP runs in tests/runs/test_report_ddp.py)."""

from __future__ import annotations

from typing import Any


def report_names(found: Any, series: str) -> list[int]:
    """The ranks the report's findings name under one of the page's series, read off the findings
    as their sections say: a key's outliers, a phase's stragglers, a measure's memory peak."""
    if series.startswith("timing:"):
        column = series.split(":", 1)[1]
        named = [s["rank"] for s in found.stragglers if f"{s['phase']}_s" == column]
        named += [m["rank"] for m in found.memory if m["measure"] == column]
    else:
        named = [o["rank"] for o in found.outliers if o["key"] == series]
    return sorted(set(named))


def page_and_report(db: Any, run: int | str | None = None) -> list[tuple[str, Any, Any]]:
    """Per series the page draws: (series, what the page names, what the report names), for the
    ranks departing (live page: its findings answer; HTML report: each series' answer) and, for
    a metric key, the ranks with NaN/inf (the chart's, from its buckets)."""
    from multirank_logger import open_store
    from multirank_logger.report.findings import find_with_buckets
    from multirank_logger.ui import views

    out = []
    with open_store(db) as reader:
        ref = reader.resolve_run(run)
        found, buckets = find_with_buckets(reader, ref.id, bucket_columns=2000)
        answer = views.findings_view(reader, ref.id)  # what the live page asks for
        page = views.run_view(reader, ref.id)
        for series in page["keys"] + page["timing"]:
            summary = views.summary(reader, ref.id, series)  # the live page's, one scan
            live = views.series_view(summary, page["nodes_of"])
            static = views.series_view(buckets.get(series) or summary, page["nodes_of"], departing=found.departing(series))
            named = report_names(found, series)
            out.append((series, answer["departing"].get(series, []), named))
            out.append((series + " (HTML report)", static["departing"], named))
            assert set(named) <= {int(r) for r in static["lines"]} or len(named) > views.MAX_FLAGGED, series
            if not series.startswith("timing:"):
                bad = sorted({n["rank"] for n in found.non_finite if n["key"] == series})
                out.append((series + " NaN/inf", live["non_finite"], bad))
                out.append((series + " NaN/inf (HTML report)", static["non_finite"], bad))
    return out
