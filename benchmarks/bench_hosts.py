"""The hosts ledger on a store of 10,000 runs: what `multirank-logger hosts` costs (issue 51).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_hosts.py [--runs 10000] [--ranks 8] [--hosts 500] [--rounds 5]
        [--baseline DIR]

Builds a store of `runs` runs of `ranks` ranks each, 4 ranks a host, drawn from a pool of
`hosts` hosts, with a kept verdict (``findings`` rows) in every 3rd run naming one rank, and in
every run where one of the 5 lowest-numbered hosts took part a rank on it (the chronic ones); no
metric row: the ledger reads ``ranks`` and ``findings`` alone. Times ``StoreReader.hosts``
(open_store included), and the whole command in
a fresh process (``multirank-logger hosts DB --format slurm``: Python's start and imports too),
each the median of `rounds`, on SQLite and DuckDB. Target: <= 1 s. ``--baseline DIR``: also the
command from another copy of the package (e.g. ``git archive OLD multirank_logger | tar -x -C DIR``),
its rounds interleaved with this tree's, so that before and after meet the same load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def build(db: str, runs: int, ranks: int, hosts: int) -> None:
    import random

    import sqlalchemy as sa

    from multirank_logger.rows.schema import findings
    from multirank_logger.rows.schema import ranks as ranks_table
    from multirank_logger.rows.schema import runs as runs_table
    from multirank_logger.store.sql_store import Store

    rng = random.Random(51)
    t0 = 1.77e9
    run_rows, rank_rows, finding_rows = [], [], []
    for i in range(runs):
        run_rows.append({"id": i + 1, "name": "bench", "version": i, "status": "success", "world_size": ranks,
                         "started_at": t0 + i * 600})
        placed = rng.sample(range(hosts), (ranks + 3) // 4)
        for r in range(ranks):
            host = f"node{placed[r // 4]:04d}"  # every rank in a Slurm job: its node's name recorded (the most to read)
            rank_rows.append({"run_id": i + 1, "rank": r, "host": f"{host}.cluster", "slurm_node": host,
                              "node_rank": r // 4, "local_rank": r % 4, "status": "success",
                              "started_at": t0 + i * 600})
        # a rank on one of the 5 lowest-numbered hosts whenever one took part (chronic), else in
        # every 3rd run any rank (one-offs)
        low = [r for r in range(ranks) if placed[r // 4] < 5]
        if low or i % 3 == 0:
            rank = low[0] if low else rng.randrange(ranks)
            finding_rows.append({"run_id": i + 1, "rank": rank, "seq": 0, "kind": rng.choice(["straggler", "non_finite"]),
                                 "series": "timing:data_s", "first_step": 10, "origin": True, "origin_step": 10,
                                 "value": 0.1, "detail": "{}", "sentence": "-", "found_at": t0 + i * 600 + 60})
    store = Store(db)
    try:
        with store.begin() as conn:
            for table, rows in ((runs_table, run_rows), (ranks_table, rank_rows), (findings, finding_rows)):
                for start in range(0, len(rows), 20_000):
                    conn.execute(sa.insert(table), rows[start : start + 20_000])
    finally:
        store.close()


def _command(db: str, tree: str) -> tuple[float, str]:
    """`multirank-logger hosts DB --format slurm` in a fresh process with `tree`'s package: seconds, output."""
    env = {**os.environ, "PYTHONPATH": tree}
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "multirank_logger.cli", "hosts", db, "--format", "slurm"],
                         capture_output=True, text=True, check=True, env=env, cwd=tree).stdout
    return time.perf_counter() - t, out


def measure(db: str, rounds: int, baseline: str | None = None) -> dict[str, float]:
    from multirank_logger import open_store
    from multirank_logger.report.host_list import read_hosts

    reads, drivers, commands, before, chronic = [], [], [], [], 0
    here = str(Path(__file__).resolve().parent.parent)
    for _ in range(rounds):
        t = time.perf_counter()
        with open_store(db) as reader:
            rows = reader.hosts()
        reads.append(time.perf_counter() - t)
        t = time.perf_counter()
        assert read_hosts(db) == rows  # the command's way: the engine's own driver, no SQLAlchemy
        drivers.append(time.perf_counter() - t)
        chronic = sum(r["status"] == "chronic" for r in rows)
        took, out = _command(db, here)
        commands.append(took)
        if baseline is not None:
            took, old = _command(db, baseline)
            assert old == out, "the baseline's exclude list differs"
            before.append(took)
    return {"before_s": statistics.median(before) if before else None, "before_min_s": min(before, default=None),
            "before_max_s": max(before, default=None),"read_s": statistics.median(reads), "driver_s": statistics.median(drivers), "read_min_s": min(reads), "read_max_s": max(reads),
            "command_s": statistics.median(commands), "command_min_s": min(commands), "command_max_s": max(commands),
            "hosts": len(rows), "chronic": chronic, "exclude_chars": len(out.strip())}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=10_000)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--hosts", type=int, default=500)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--backends", default="sqlite,duckdb")
    p.add_argument("--baseline", default=None, help="another tree holding multirank_logger/: its command timed too")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends.split(","):
            db = str(Path(tmp) / f"runs.{backend}")
            t = time.perf_counter()
            build(db, args.runs, args.ranks, args.hosts)
            built = time.perf_counter() - t
            m = measure(db, args.rounds, args.baseline)
            print(f"{backend}: {args.runs:,} runs x {args.ranks} ranks, {m['hosts']} hosts ({m['chronic']} chronic); "
                  f"built in {built:.1f} s; StoreReader.hosts {m['read_s']:.3f} s [{m['read_min_s']:.3f}, "
                  f"{m['read_max_s']:.3f}]; read_hosts (driver) {m['driver_s']:.3f} s; `hosts --format slurm` in a fresh process {m['command_s']:.2f} s "
                  f"[{m['command_min_s']:.2f}, {m['command_max_s']:.2f}]", flush=True)
            if m["before_s"] is not None:
                print(f"  baseline {args.baseline}: the command {m['before_s']:.2f} s [{m['before_min_s']:.2f}, "
                      f"{m['before_max_s']:.2f}]", flush=True)


if __name__ == "__main__":
    main()
