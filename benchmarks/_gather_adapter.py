"""Brings benchmarks/bench_gather.py (the 4-rank gather benchmark, ``run(quick) -> dict``) into the table.

Its dict's shape belongs to that module, so the row's figure is the wall time of one
``run()`` and every scalar it returns is shown in the notes as it came. It runs once
in a fresh process (it times and repeats inside itself).
"""

from __future__ import annotations

import math
import time
from typing import Any

from benchmarks._harness import Case, Sizes

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


def measure(quick: bool) -> dict[str, Any]:
    from benchmarks.bench_gather import run

    t0 = time.perf_counter()
    result = run(quick=quick)
    seconds = time.perf_counter() - t0
    extras = {k: v for k, v in _flatten(dict(result or {})).items()
              if not (isinstance(v, float) and not math.isfinite(v))}
    extras.pop("value", None)
    extras.pop("rss_mib", None)
    return {"value": seconds, **extras}


def cases(sizes: Sizes) -> list[Case]:
    return [
        Case(SECTION, "bench_gather.run (4 ranks)", "benchmarks._gather_adapter:measure", "s wall",
             {"quick": sizes.mode != "full"}, rounds=1, inner=1,
             note="the gather benchmark's own figures follow", timeout_s=600)
    ]
