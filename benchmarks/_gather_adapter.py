"""Brings benchmarks/bench_gather.py (the 4-rank gather benchmark, ``run(quick, period_us) -> dict``)
into the table: one row per loop (paced, saturated).

Its dict belongs to that module: the row's figure is its ``logged_wall_s`` (the 4-rank
run with the logger; the wall time of the whole ``run()`` if that key is missing), and
every scalar it returns, its no-logger baseline and overhead among them, is shown in the
notes as it came. It runs once in a fresh process (it repeats and takes medians itself).
"""

from __future__ import annotations

import math
import resource
import time
from typing import Any

from benchmarks._harness import Case, Goal, Sizes, peak_rss_mib

SECTION = "gather"


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, f"{name}."))
        elif isinstance(value, (int, float, str, bool)) or value is None:
            out[name] = value
        else:
            out[name] = str(value)
    return out


def measure(quick: bool, period_us: float = 0.0) -> dict[str, Any]:
    from benchmarks.bench_gather import run

    t0 = time.perf_counter()
    result = run(quick=quick, period_us=period_us)
    seconds = time.perf_counter() - t0
    extras = {k: v for k, v in _flatten(dict(result or {})).items()
              if not (isinstance(v, float) and not math.isfinite(v))}
    extras.pop("value", None)
    extras.pop("rss_mib", None)
    value = extras.pop("logged_wall_s", None)
    if not isinstance(value, (int, float)):
        value, extras["note"] = seconds, "figure is run()'s wall time"
    # its ranks are this process's children: the largest one's peak, as for the DDP rows
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"value": value, "run_s": seconds, "rss_mib": max(children, peak_rss_mib()), **extras}


# name -> (step period in us, note, goals): see bench_gather's docstring
_LOOPS = {
    "MultiRankLogger gather, 4 ranks, paced 1,000 calls/s (bench_gather)": (
        1000.0, "each step 250 us of CPU, then the rank waits out a 1 ms period as for its accelerator",
        # issue 4: 4 ranks logging 10 metrics at 1,000 calls/s each, <= 3% wall time over logger=False
        (Goal("extra:overhead_pct", "<=", 3.0, "<= 3% over logger=False"),)),
    "MultiRankLogger gather, 4 ranks, saturated (bench_gather)": (
        0.0, "steps back to back: 4 ranks keep both cores busy, so the logger's every cycle shows (worst case)", ()),
}


def cases(sizes: Sizes) -> list[Case]:
    return [
        Case(SECTION, name, "benchmarks._gather_adapter:measure", "s",
             {"quick": sizes.mode != "full", "period_us": period_us}, rounds=1, inner=1,
             note=f"wall time with the logger; {note}; bench_gather's own figures (baseline, overhead) follow",
             goals=goals, timeout_s=600)
        for name, (period_us, note, goals) in _LOOPS.items()
    ]
