"""What the page asks for, as JSON-ready dicts: shared by the live server and the HTML report.

Each view reads through one ``StoreReader`` and returns plain data the page draws as it is:
never the rows of a run, only per-bucket summaries (``query/step_buckets.py``). The heatmap
travels as one byte per cell (base64): a 1,024 x 2,000 heatmap is 2 MB, not 2M JSON numbers.

Which ranks depart is not decided here: the page names the ranks the report's findings name
(``findings_answer``'s ``departing``, per series; the one judgement, ``judgement/ranks.py``). A
series' answer comes before them (the report's pass over the rows takes seconds on a large run,
a series' summary far less), so the live page adds the departing ranks' lines when the findings
arrive; the HTML report, which has its findings first, embeds them in each series' answer.
"""

from __future__ import annotations

import base64
import json
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from multirank_logger._util.readable import natural_key
from multirank_logger.judgement.places import mesh_label, rank_places
from multirank_logger.judgement.ranks import non_finite_ranks
from multirank_logger.query.reader import StoreReader
from multirank_logger.query.run_list import read_step_clock
from multirank_logger.query.step_buckets import SCORE_CLIP, TIMING_SERIES, BucketSummary
from multirank_logger.rows.param_path import flat_params
from multirank_logger.rows.run_ref import RunRef
from multirank_logger.rows.schema import SUMMARY_STEPS

if TYPE_CHECKING:
    from multirank_logger.report.findings import Findings

__all__ = ["CELL_EMPTY", "CELL_NON_FINITE", "clock_view", "findings_answer", "findings_view", "logs_view", "run_view", "runs_view",
           "series_view"]

#: heatmap cell codes besides a score x 10 in -120..120
CELL_NON_FINITE, CELL_EMPTY = 127, -128
#: flagged ranks drawn on a band chart at most
MAX_FLAGGED = 8
#: log records and decisions sent at most (the newest)
MAX_RECORDS = 5000


def clean(obj: Any) -> Any:
    """``obj`` with NaN/inf as None and NumPy scalars as Python ones (strict JSON)."""
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [clean(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def runs_view(reader: StoreReader, only: int | None = None) -> list[dict[str, Any]]:
    """One row per run, newest first (``only``: that run's row): what the landing page lists.

    A run's last step and time are read per run from its summaries (``StoreReader.run_headers``):
    the page asks every 2 s, and no backend reads a run's last step from its rows without a pass.
    ``stopped_by``: why a run ended early (StopOnAlert), as ``StoreReader.runs`` says it;
    ``params``: its hyperparameters (the page shows them and filters by them: static/run_filter.js).
    """
    out = []
    for r in reader.run_headers(only):
        end = r["ended_at"] if r["ended_at"] is not None else r["last_time"]
        label = f"{r['name']}/{r['version_name']}" if r["version_name"] else f"{r['name']}/version_{r['version']}"
        out.append({"id": r["id"], "run": label, "status": r["status"], "ranks": r["world_size"], "nodes": r["n_nodes"],
                    "transport": r["transport"], "started": r["started_at"],
                    "duration_s": None if end is None else end - r["started_at"],
                    "last_step": r["last_step"], "last_time": r["last_time"], "uuid": r["run_uuid"],
                    "stopped_by": r["stopped_by"], "params": _params(r["hparams"])})
    return out


def _params(stored: str | None) -> dict[str, Any]:
    """A run's stored hyperparameters (``runs.hparams``, JSON text) as the list shows and filters them; {} where none."""
    try:
        found = json.loads(stored) if stored else {}
    except ValueError:
        return {}
    return flat_params(clean(found)) if isinstance(found, dict) else {}  # each leaf by its path: optimizer.lr


def run_status(reader: StoreReader, run_id: int) -> str | None:
    return reader.run_status(run_id)


def run_view(reader: StoreReader, run: int | str) -> dict[str, Any]:
    """A run's header, its ranks grouped by node, and its series (keys first, then StepTimer's)."""
    ref = reader.resolve_run(run)
    row = runs_view(reader, only=ref.id)[0]
    keys = sorted(reader.keys(ref.id), key=lambda k: ("loss" not in k.lower(), k))
    timing = reader.timing_series(ref.id, TIMING_SERIES)
    nodes_of, gpus_of = _places(reader, ref.id)
    return {**row, "keys": keys, "timing": timing, "nodes_of": nodes_of, "gpus_of": gpus_of}


def _places(reader: StoreReader, run_id: int) -> tuple[dict[str, str], dict[str, str]]:
    """({rank: its node's label}, {rank: its place beyond the host, "GPU 3 (NVIDIA H200), dp 1, tp 0"})
    from the ranks table: its GPU where its process had started CUDA (transport/rank_facts.gpu_facts),
    its device-mesh coordinates where it recorded them; no entry where neither."""
    nodes, gpus = {}, {}
    for r in reader.rank_nodes(run_id):
        node = r["host"] or (f"node {r['node_rank']}" if r["node_rank"] is not None else "?")
        if r["node_rank"] is not None and r["host"]:
            node = f"{r['host']} (node {r['node_rank']})"
        nodes[str(r["rank"])] = node
        gpu = f"GPU {r['gpu_index']}" + (f" ({r['gpu_name']})" if r.get("gpu_name") else "") if r.get("gpu_index") is not None else ""
        if where := ", ".join(part for part in (gpu, mesh_label(rank_places([r])[r["rank"]]["mesh"])) if part):
            gpus[str(r["rank"])] = where
    return nodes, gpus


def summary(reader: StoreReader, run_id: int, series: str) -> BucketSummary:
    return reader.bucket_summary(run_id, series)


def series_view(s: BucketSummary, nodes_of: dict[str, str], all_lines: bool = False,
                departing: list[int] | None = None, gpus_of: dict[str, str] | None = None) -> dict[str, Any]:
    """A series' band, its flagged ranks' lines and its heatmap, ranks grouped by node.

    ``departing``: the ranks the report's findings name under this series (``Findings.departing``),
    whose lines are sent too; None where the findings come later (the live page asks for them).
    ``all_lines``: every rank's line too (the self-contained HTML report, which has no server
    to ask when a heatmap row is clicked).
    ``gpus_of``: each rank's GPU and mesh coordinates ("GPU 3 (NVIDIA H200), dp 1, tp 0"), shown with its host on hover of its row.
    """
    # hosts in natural order (node2 before node10), each host's ranks in order
    order = sorted(range(len(s.ranks)), key=lambda i: (natural_key(nodes_of.get(str(s.ranks[i]), "?")), s.ranks[i]))
    shown = [s.ranks[i] for i in order]
    groups: list[list[Any]] = []
    for rank in shown:
        node = nodes_of.get(str(rank), "?")
        if groups and groups[-1][0] == node:
            groups[-1][1] += 1
        else:
            groups.append([node, 1])
    scores = s.scores()[order] if s.ranks else np.zeros((0, 0))
    codes = np.where(np.isnan(scores), CELL_EMPTY, np.round(scores * (120 / SCORE_CLIP))).astype(np.int8)
    codes[s.non_finite[order] if s.ranks else np.zeros((0, 0), dtype=bool)] = CELL_NON_FINITE
    bad = non_finite_ranks(s.ranks, s.non_finite)
    named = [r for r in departing or [] if r in s.ranks]
    flagged = list(dict.fromkeys(named + bad))[:MAX_FLAGGED]
    out = {
        "series": s.series, "steps": s.steps, "width": s.width, "band": s.band(), "ranks": shown, "nodes": groups,
        "heatmap": base64.b64encode(codes.tobytes()).decode(), "clip": SCORE_CLIP,
        "non_finite": bad, "lines": {str(r): s.line(r) for r in flagged},
    }
    if gpus_of:
        out["gpus"] = [gpus_of.get(str(r)) for r in shown]  # the rows' order, as "ranks"
    if departing is not None:
        out["departing"] = departing
    folded = constant_key(s)
    if folded:
        out["folded"] = folded
    if all_lines:
        out["all_lines"] = base64.b64encode(s.mean[order].astype(np.float32).tobytes()).decode()
    return clean(out)


def constant_key(s: BucketSummary) -> dict[str, Any] | None:
    """A key the page folds into one line (docs/ui.md): every rank's mean the same in every bucket
    it was logged, no NaN/inf, and the envelope never turning back (each logged bucket's lo at or
    above the previous one's hi, or its hi at or below the previous lo): one value (a flag), or
    one counting alike on every rank (epoch, an lr schedule). From the summaries only, no rows."""
    if not s.ranks or s.non_finite.any():
        return None
    logged = ~np.isnan(s.mean).all(axis=0)
    mean = s.mean[:, logged]
    if mean.shape[1] == 0 or np.isnan(mean).any() or (mean.max(axis=0) != mean.min(axis=0)).any():
        return None
    lo, hi = s.lo[logged], s.hi[logged]
    if not (np.all(lo[1:] >= hi[:-1]) or np.all(hi[1:] <= lo[:-1])):
        return None
    steps = np.asarray(s.steps)[logged]
    return {
        "first": float(lo[0] if hi[-1] >= lo[0] else hi[0]),
        "last": float(hi[-1] if hi[-1] >= lo[0] else lo[-1]),
        "from": int(steps[0]),
        "to": int(steps[-1]) + s.width - 1,
    }


def clock_view(reader: StoreReader, ref: RunRef) -> dict[str, Any]:
    """The run's clock for the compare page's wall-time axis: per bucket of ``width`` steps (its
    first step), the seconds from the run's start to the last value logged in it."""
    steps, times = read_step_clock(reader.fetch_arrow, ref.id)
    return clean({"steps": steps, "seconds": [t - ref.started_at for t in times], "width": SUMMARY_STEPS})


def line_view(s: BucketSummary, rank: int) -> dict[str, Any]:
    return clean({"series": s.series, "rank": rank, "steps": s.steps, "values": s.line(rank)})


def findings_view(reader: StoreReader, run: int | str) -> dict[str, Any]:
    """The report's findings (``multirank_logger.report.find``) as the page takes them (`findings_answer`)."""
    from multirank_logger.report.findings import find

    return findings_answer(find(reader, run))


def findings_answer(found: Findings) -> dict[str, Any]:
    """The findings, their text lines per section, and ``departing``: per series (a key, or
    ``timing:COLUMN``), the ranks the findings name there, which the page names under its chart."""
    from multirank_logger.report.render import findings_text

    return clean({**found.to_dict(), "problems": found.problems, "text": findings_text(found),
                  "departing": found.departing_by_series(), "origins": found.origins_by_series()})


def logs_view(reader: StoreReader, run: int | str) -> dict[str, Any]:
    """The run's decisions and log records (the newest ``MAX_RECORDS``); the page filters them."""
    decided = reader.decisions(run)
    logged = reader.logs(run)
    if len(logged) > MAX_RECORDS:
        logged = logged.sort_values("time").tail(MAX_RECORDS)
    return clean({"decisions": decided.astype(object).where(decided.notna(), None).to_dict("records"),
                  "logs": logged.astype(object).where(logged.notna(), None).to_dict("records")})


def alerts_view(reader: StoreReader, run_id: int) -> list[dict[str, Any]]:
    """What the watch raised during the run, oldest first: the block at the top of the run's page
    (``static/alerts.js``), polled while the run goes."""
    rows = reader.alerts(run_id)
    keep = ["seq", "kind", "rank", "key", "first_step", "step_seen", "seen_at", "message"]
    return [clean(row) for row in rows[keep].to_dict("records")]
