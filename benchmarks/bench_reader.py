"""A reader holding the DuckDB store for the whole run: what it costs the training loop.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_reader.py [--steps 20000] [--rounds 3]

One process runs a training-like loop (a little Python work per step, then `log_metrics` +
`save` with 10 keys, as the Trainer calls them) into a DuckDB store, with and without a
second process holding ``duckdb.connect(db, read_only=True)`` from before the loop until
after `finalize`. Rounds alternate the two cases; the figure is the loop's wall time per
step (median), and the ratio with a reader to without. `finalize` is reported apart: with a
reader it waits `timeout` for the file, then spills (where the rows went is printed).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

_HOLD = (
    "import duckdb, sys, time, pathlib; c = duckdb.connect(sys.argv[1], read_only=True); "
    "pathlib.Path(sys.argv[2]).touch(); time.sleep(3600)"
)


def _step_work() -> float:
    # ~50 us of Python, standing for a small training step's own host-side work
    total = 0.0
    for i in range(400):
        total += i * 0.5
    return total


def one_round(steps: int, reader: bool, timeout: float) -> dict[str, float]:
    from multirank_logger import MultiRankLogger
    from multirank_logger.store.sql_store import Store

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "runs.duckdb"
        logger = MultiRankLogger(db=str(db), spill_dir=str(Path(tmp) / "spill"), timeout=timeout, flush_interval=1.0)
        holder = None
        if reader:
            ready = Path(tmp) / "ready"
            holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(db), str(ready)])
            while not ready.exists():
                if holder.poll() is not None:  # never wait forever on a reader that could not open the file
                    raise RuntimeError(f"the reader process could not open {db} (exit code {holder.returncode})")
                time.sleep(0.01)
        keys = [f"metric_{k}" for k in range(10)]
        t0 = time.perf_counter()
        for step in range(steps):
            _step_work()
            logger.log_metrics({k: step * 0.001 for k in keys}, step=step)
            logger.save()
        loop = time.perf_counter() - t0
        t1 = time.perf_counter()
        logger.finalize("success")
        final = time.perf_counter() - t1
        if holder is not None:
            holder.kill()
            holder.wait()
        store = Store(db)
        with store.begin() as conn:
            stored = conn.exec_driver_sql("SELECT COUNT(*) FROM metrics").scalar_one()
            status = conn.exec_driver_sql("SELECT status FROM runs").scalar_one()
        store.close()
        spilled = logger._run.sink_holder.spiller.values_spilled if logger._run.sink_holder.spiller is not None else 0
        return {"loop_us": loop / steps * 1e6, "finalize_s": final, "stored": stored, "spilled": spilled,
                "status": status}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--timeout", type=float, default=5.0)
    args = p.parse_args()
    results: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for _ in range(args.rounds):
        for reader in (False, True):
            results[reader].append(one_round(args.steps, reader, args.timeout))
    base = statistics.median(r["loop_us"] for r in results[False])
    for reader in (False, True):
        rs = results[reader]
        loop = statistics.median(r["loop_us"] for r in rs)
        print(
            f"{'reader holds the file' if reader else 'no reader':>22}: loop {loop:.1f} us/step "
            f"[{min(r['loop_us'] for r in rs):.1f}, {max(r['loop_us'] for r in rs):.1f}], "
            f"{loop / base:.3f}x of no reader; finalize {statistics.median(r['finalize_s'] for r in rs):.2f} s; "
            f"stored {rs[-1]['stored']}, spilled {rs[-1]['spilled']}, status {rs[-1]['status']}"
        )


if __name__ == "__main__":
    main()
