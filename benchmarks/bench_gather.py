"""Gather transport under load: 4 gloo ranks, each logging 10 metrics per call at ~1,000 calls/s.

Each rank runs the same loop of steps: a fixed slice of CPU work (the "training"), then,
with the logger, `log_metrics` + `save` as Lightning calls them. The baseline runs the same
loop with no logger (``logger=False``). Two loops:

- saturated (``period_us=0``): steps back to back, 250 us of busy CPU each. Four ranks then
  keep this 2-core machine's cores busy all the time, so every CPU cycle the logger spends
  anywhere (rank 0's writer and receiver threads too) shows as wall time: a worst case that a
  cluster, with cores per rank, does not have.
- paced (``period_us=1000``): each step is 250 us of busy CPU, then the rank waits out the
  rest of a 1 ms period (``time.sleep``), as a rank waits for its accelerator: ~1,000 calls/s
  per rank, the rate the issue names. The logger's work in the training thread still adds
  to every step; its background threads run while the rank waits.

Both build the step's metrics dict in the baseline too, and collect garbage before the timed
loop (see `_rank`). The logger runs with its default flush settings. Reported:

- ``overhead_pct``: median wall time of the logged loop against the baseline's;
- ``logged_wall_s_by_rank``: which rank sets the wall time (rank 0 also writes every row);
- ``calls_per_s``: each rank's achieved log-call rate;
- ``lag_s``: rank 0's writer lag at the end, from the last log call of every rank until
  every row of every rank is in the store (``finalize("success")`` on rank 0);
- ``rows``: rows in the store for the run (expected: 4 ranks x calls x 10).

Usage: python benchmarks/bench_gather.py [--quick] [--period-us 1000]
       (or `run(quick, period_us)` from benchmarks/run.py, one row per loop)
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the repository on the path, for the harness
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._harness import free_port  # noqa: E402

WORLD = 4
KEYS = [f"metric_{i}" for i in range(10)]


def _work(us: float) -> None:
    # busy CPU, like a (tiny) training step; sleeping would hide the logger's CPU cost
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        pass


def _rank(rank: int, port: int, db: str, calls: int, work_us: float, period_us: float, logged: bool, out: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=120))
    logger = None
    if logged:
        from multirank_logger import MultiRankLogger

        if rank != 0:
            dist.barrier()  # rank 0 allocates the run first
        # the logger's own flush settings, as a user gets them (flush_interval 5 s: rank 0 writes
        # the store every 5 s; the other ranks push every flush_logs_every_n_steps calls)
        logger = MultiRankLogger(db=db, name="bench", transport="gather", export_csv=False)
        if rank == 0:
            dist.barrier()
        _ = logger.experiment  # Lightning reads this on every rank at setup
    # the process's first full garbage collection (torch and lightning loaded: ~0.2 s with the
    # GIL held) falls wherever the gen-2 counter first crosses its threshold. A training loop
    # allocating tensors crosses it in its first steps; this loop, with no logger, never does,
    # so without this the logged run alone would pay that one-off inside the timed loop
    gc.collect()
    dist.barrier()
    start = time.perf_counter()
    idle_s = max(period_us - work_us, 0.0) / 1e6
    for step in range(calls):
        _work(work_us)
        if idle_s:
            time.sleep(idle_s)  # the rank waits for its accelerator
        # the step's metrics exist with or without a logger (Lightning collects self.log values
        # for callbacks and the progress bar either way): only handing them over is the logger's
        metrics = {k: float(step + i) for i, k in enumerate(KEYS)}
        if logger is not None:
            logger.log_metrics(metrics, step=step)
            logger.save()
    elapsed = time.perf_counter() - start
    dist.barrier()
    lag = None
    if logger is not None:
        t = time.perf_counter()
        logger.finalize("success")
        lag = time.perf_counter() - t if rank == 0 else None
    result: dict[str, Any] = {"rank": rank, "elapsed": elapsed, "lag": lag}
    if logger is not None and rank == 0:
        from multirank_logger.store.sql_store import Store

        store = Store(db, readonly=True)
        with store.begin() as conn:
            result["rows"] = conn.exec_driver_sql("SELECT count(*) FROM metrics").scalar_one()
        store.close()
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def _launch(calls: int, work_us: float, period_us: float, logged: bool, db: str) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    port = free_port()
    with tempfile.TemporaryDirectory() as out:
        procs = [ctx.Process(target=_rank, args=(r, port, db, calls, work_us, period_us, logged, out)) for r in range(WORLD)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(600)
            if p.exitcode != 0:
                for q in procs:
                    q.kill()
                raise RuntimeError(f"a benchmark rank failed (exit code {p.exitcode})")
        results = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(WORLD)]
    return {
        "wall_s": max(r["elapsed"] for r in results),
        "rank_wall_s": [round(r["elapsed"], 3) for r in results],
        "lag_s": results[0]["lag"],
        "rows": results[0].get("rows"),
    }


def _default_flush_interval() -> float:
    import inspect

    from multirank_logger import MultiRankLogger

    return inspect.signature(MultiRankLogger).parameters["flush_interval"].default


def run(quick: bool, period_us: float = 0.0) -> dict[str, Any]:
    """Baseline and logged runs interleaved; medians. quick: 1 round of 1,000 calls per rank.

    period_us: 0 for the saturated loop, else the paced loop's step period (see above).
    """
    # full: ~10 s per launch, so that rank 0 writes a few times during the loop, not only at the end
    calls, rounds = (1_000, 1) if quick else (10_000, 3)
    work_us = float(os.environ.get("BENCH_GATHER_WORK_US", "250"))
    base, logged, lags, rows, rank_walls = [], [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(rounds):
            base.append(_launch(calls, work_us, period_us, False, "")["wall_s"])
            res = _launch(calls, work_us, period_us, True, str(Path(tmp) / f"bench{i}.duckdb"))
            logged.append(res["wall_s"])
            rank_walls.append(res["rank_wall_s"])
            lags.append(res["lag_s"])
            rows.append(res["rows"])
    b, w = statistics.median(base), statistics.median(logged)
    return {
        "ranks": WORLD,
        "keys_per_call": len(KEYS),
        "calls_per_rank": calls,
        "work_us_per_step": work_us,
        "period_us": period_us,
        "flush_interval_s": _default_flush_interval(),
        "baseline_calls_per_s_per_rank": round(calls / b, 1),
        "baseline_wall_s": round(b, 4),
        "logged_wall_s": round(w, 4),
        "overhead_pct": round(100 * (w - b) / b, 2),
        "calls_per_s_per_rank": round(calls / w, 1),
        "rank0_lag_s": round(statistics.median(lags), 4),
        # which rank sets the wall time: rank 0 also receives and writes every rank's rows
        "logged_wall_s_by_rank": [round(statistics.median(r), 3) for r in zip(*rank_walls)],
        "rows_stored": rows,
        "rows_expected": WORLD * calls * len(KEYS),
        "rounds": rounds,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--period-us", type=float, default=0.0, help="0: saturated loop; 1000: paced at ~1,000 calls/s")
    args = parser.parse_args()
    print(json.dumps(run(args.quick, args.period_us), indent=2))
