"""The page's first key at the 1B shape, from a store of what the page reads (issue 49).

The page's first answer for a key reads no metric row: the run's span, its launches, the key's
coarse summaries and those counting a NaN or inf. So its time at 1,024 ranks x 100,000 steps x 10
keys is measured on a store holding exactly that: both summary levels of that run (64.0M 16-step,
16.0M 64-step summaries), inserted per 1,024-step chunk as ``bench_query.build_store`` inserts them,
random values, one NaN cell in ``metric_0``, and no metric rows (2.4-3.0 GB and ~5 minutes, against
the full store's 12.7 GB and 20-40 minutes). ``--order``: ``key`` (each insert's summaries by key,
rank, step: what the store writes since session 25) or ``rank`` (by rank, step, key: the keys
interleaved, as before). Each figure is ``bench_read_scale.served``: a fresh ``multirank-logger ui``,
the run's header asked, then the seconds of ``/api/run/1/series?name=metric_0``.

    python benchmarks/bench_first_key.py [--order key] [--rounds 8] [--against /other/tree]

With ``--against``, the rounds alternate between this tree's code and that tree's on the same store.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RANKS, STEPS, KEYS = 1024, 100_000, 10
CHUNK_STEPS = 1024
ORDERS = {"key": "k.range, r.range, s.range", "rank": "r.range, s.range, k.range"}


def build(order: str) -> Path:
    """The cached store of the 1B shape's summaries in `order` (see the module docstring)."""
    import duckdb

    from benchmarks._harness import CACHE_DIR
    from multirank_logger.store.sql_store import Store, head_revision

    path = CACHE_DIR / f"first-key-{RANKS}x{STEPS}x{KEYS}-by-{order}-{head_revision()}-duckdb{duckdb.__version__}.duckdb"
    if path.is_file():
        return path
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.duckdb")
    tmp.unlink(missing_ok=True)
    t0 = time.perf_counter()
    store = Store(tmp)
    run = store.create_run("bench", world_size=RANKS, transport="gather")
    for rank in range(RANKS):
        store.register_rank(run.id, rank, local_rank=rank % 8, node_rank=rank // 8, host=f"node{rank // 8}", pid=0,
                            status="success")
    store.update_run(run.id, status="success", ended_at=time.time())
    store.close()
    con = duckdb.connect(str(tmp))
    con.execute("SET memory_limit = '3GB'")
    con.execute("SET enable_progress_bar = false")
    con.execute("SELECT setseed(0.5)")
    con.execute(f"INSERT INTO metric_spans SELECT {run.id}, range::INTEGER, 0, {STEPS * KEYS - 1} FROM range({RANKS})")
    cols = "run_id, rank, key, step, steps_mask, n_finite, total, lo, hi, n_nan, n_pos_inf, n_neg_inf, last_time"
    for first in range(0, STEPS, CHUNK_STEPS):
        last = min(first + CHUNK_STEPS, STEPS)
        con.execute("BEGIN")
        for table, width, mask in (("step_summaries", 16, 2**16 - 1), ("coarse_summaries", 64, 15)):
            nan = f"(r.range = 341 AND k.range = 0 AND s.range = {(STEPS // 2 // width) * width})"
            shifted = f"(r.range = 7 AND k.range = 0 AND s.range >= {STEPS // 2})"
            con.execute(
                f"""INSERT INTO {table} ({cols})
                SELECT {run.id}, r.range::INTEGER, 'metric_' || k.range, s.range, {mask},
                       CASE WHEN {nan} THEN {width - 1} ELSE {width} END, random() * {width}, random(),
                       random() + CASE WHEN {shifted} THEN 3 ELSE 0 END, CASE WHEN {nan} THEN 1 ELSE 0 END, 0, 0,
                       1.7e9 + s.range * 0.01
                FROM range({RANKS}) r, range({first}, {last}, {width}) s, range({KEYS}) k ORDER BY {ORDERS[order]}"""
            )
        con.execute("COMMIT")
    con.execute("CHECKPOINT")
    con.close()
    os.replace(tmp, path)
    print(f"  built {path.name} in {time.perf_counter() - t0:.0f} s", flush=True)
    return path


def _served(tree: Path, db: Path) -> float:
    code = ("import json; from pathlib import Path; from benchmarks import bench_read_scale as r; "
            f"print(json.dumps(r.served({RANKS}, {STEPS}, {KEYS}, Path({str(db)!r}))))")
    env = {**os.environ, "PYTHONPATH": f"{tree}:{Path(__file__).resolve().parent.parent}"}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tree, capture_output=True, text=True, check=True, timeout=900)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["value"])


def run(order: str, rounds: int, against: Path | None) -> dict[str, Any]:
    db = build(order)
    trees = {"this": Path(__file__).resolve().parent.parent, **({"against": against.resolve()} if against else {})}
    samples: dict[str, list[float]] = {name: [] for name in trees}
    for _ in range(rounds):
        for name, tree in trees.items():
            samples[name].append(_served(tree, db))
    out: dict[str, Any] = {"store": db.name, "rounds": rounds}
    out.update({name: [round(statistics.median(v), 2), round(min(v), 2), round(max(v), 2)] for name, v in samples.items()})
    out["load average"] = os.getloadavg()
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--order", choices=sorted(ORDERS), default="key")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--against", type=Path, help="another source tree (its multirank_logger serves the same store)")
    args = parser.parse_args()
    print(json.dumps(run(args.order, args.rounds, args.against), indent=2))
