"""End to end: wall time of a 2-rank DDP training on CPU logging 5 metrics every step.

Each sample is one launch of ``_e2e_train.py`` (Lightning's own DDP launcher, gloo, one
thread per rank): a 5-step warm-up fit with no logger (it starts rank 1 and the process
group), then the measured fit. The figure is rank 0's wall time of the measured
``trainer.fit``: logger set-up, every step (``log_every_n_steps=1``), ``finalize``.
Peak RSS is the larger of the two ranks'. Overheads are ratios to ``logger=False``
measured in the same round, for the wall time and for the CPU seconds both ranks
spent in the fit (``cpu_s``, less disturbed by other load on a shared machine), and
for the steady part of the loop (``steady_s``: after step 10, past a logger's one-time
start in the first step).

``E2E_PIN=1`` pins each rank to one core of its own (``os.sched_setaffinity``): a check
that an effect is not two ranks competing for cores. The committed figures are unpinned,
as ``devices=2`` runs by default.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._harness import BENCH_DIR, CACHE_DIR, Case, Goal, Sizes, Unavailable, launch_env, run_launch

SECTION = "e2e"
SCRIPT = BENCH_DIR / "_e2e_train.py"
VARIANTS = {
    "logger=False": "no logger: the peer",
    "no-op Logger (Lightning's floor)": (
        "a logger whose methods do nothing: what Lightning itself spends per step once any logger is "
        "attached (it gathers and converts the logged values for it)"
    ),
    "control: rank 0 busy 0.2 ms/step": (
        "a logger that stores nothing and spins 0.2 ms per call on rank 0, as a rank-0-only logger works: "
        "here a slower rank 0 makes the fit faster (an all-reduce both ranks reach together costs more than "
        "one rank 1 waits in; the same with one core pinned per rank), so a ratio below 1 is that effect"
    ),
    "control: every rank busy 0.2 ms/step": (
        "the same spin on every rank, as MultiRankLogger works (every rank records): no such gain"
    ),
    "CSVLogger": "rank 0 writes metrics.csv",
    "TensorBoardLogger": "rank 0 writes events",
    "MultiRankLogger direct": "SQLite store, every rank writes it",
    "MultiRankLogger gather": "DuckDB store, rank 0 writes every rank's rows",
}


def launch(variants: list[str], steps: int, metrics: int, timeout_s: float = 600) -> dict[str, dict[str, Any]]:
    """One DDP launch running `variants` in order; per variant, rank 0's times and the max RSS."""
    # find_spec, not import: importing the logger pulls in lightning (~4 s) in this parent process
    if any(v.startswith("MultiRankLogger") for v in variants) and importlib.util.find_spec(
        "multirank_logger.logger.multi_rank_logger"
    ) is None:
        raise Unavailable("multirank_logger.logger.multi_rank_logger is not there yet")
    with tempfile.TemporaryDirectory(prefix="bench-e2e-") as root:
        cmd = [sys.executable, str(SCRIPT), "--variants", ",".join(variants), "--steps", str(steps),
               "--metrics", str(metrics), "--out", root]
        returncode, output = run_launch(cmd, launch_env(), timeout_s, f"DDP launch of {variants}")
        reports = []
        for rank in (0, 1):
            path = Path(root) / f"rank{rank}.json"
            if not path.is_file():
                tail = " | ".join(output.strip().splitlines()[-12:])
                raise RuntimeError(f"rank {rank} wrote no report (exit {returncode}): {tail}")
            reports.append(json.loads(path.read_text()))
    out = {}
    for r0, r1 in zip(*reports):
        out[r0["variant"]] = {
            "value": r0["fit_s"],
            "loop_s": r0["loop_s"],
            # the loop after its first steps, where a logger starts: the per-step cost alone
            "steady_s": r0["steady_s"],
            # set-up (store, identity) and finalize (flush, export): fit time outside the loop
            "outside_loop_s": r0["fit_s"] - r0["loop_s"],
            # CPU seconds of both ranks in the fit: steadier than wall time on a shared machine
            "cpu_s": r0["cpu_s"] + r1["cpu_s"],
            "steps": r0["steps"],
            "rss_mib": max(r0["rss_mib"], r1["rss_mib"]),
        }
    return out


def measure(variant: str, steps: int, metrics: int, together: list[str] | None = None,
            token: str = "") -> dict[str, Any]:
    """One sample of `variant`, from its own launch.

    With `together` (quick and tiny modes), the first case launches all the variants at
    once and leaves their results in CACHE_DIR/e2e-<token>.json for the others: one
    launch instead of five, at the price of RSS figures that grow along the launch.
    """
    if together is None:
        return launch([variant], steps, metrics)[variant]
    shared = CACHE_DIR / f"e2e-{token}.json"
    if not shared.is_file():
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        shared.write_text(json.dumps(launch(together, steps, metrics)))
    results = json.loads(shared.read_text())
    if variant == together[-1]:
        shared.unlink()
    return results[variant]


def cases(sizes: Sizes) -> list[Case]:
    together = list(VARIANTS) if sizes.mode in ("quick", "tiny") else None
    token = f"{os.getpid()}-{time.time_ns()}"
    out = []
    for variant, note in VARIANTS.items():
        goals: tuple[Goal, ...] = ()
        if variant.startswith("MultiRankLogger"):
            goals = (
                Goal("ratio", "<=", 1.03, "<= 1.03x logger=False"),
                Goal("vs:CSVLogger", "<=", 1.0, "<= CSVLogger"),
            )
        out.append(
            Case(
                SECTION,
                variant,
                "benchmarks.bench_e2e:measure",
                "s",
                kwargs={"variant": variant, "steps": sizes.e2e_steps, "metrics": sizes.e2e_metrics,
                        "together": together, "token": token},
                peer=None if variant == "logger=False" else "logger=False",
                goals=goals,
                note=f"{note}; {sizes.e2e_steps:,} steps x {sizes.e2e_metrics} metrics, 2 ranks"
                + ("; all variants in one launch" if together else ""),
                rounds=sizes.e2e_rounds,
                inner=1,
                extra_ratios=("cpu_s", "steady_s"),
            )
        )
    return out
