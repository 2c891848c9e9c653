"""The page's findings (``ui/views.findings_view``: the report's whole pass) on issue 49's store.

8 ranks x 10,000 steps x 40 keys = 3.2M rows, an outlier rank and a NaN
(``bench_query.build_store(8, 10_000, 40, faults=(5, 2, 7_000))``), in DuckDB and in a SQLite
copy with its step summaries. Each figure is one fresh process: ``open_store`` and
``findings_view(reader, 1)``, timed from before the open (the imports not counted). SQLite is read
through ADBC's C driver (the ``[fast-sqlite]`` extra) and through Python's sqlite3
(``SQLiteBackend.arrow_reads = False``: as without the extra).

    python benchmarks/bench_findings.py [--rounds 3] [--against /path/to/other/tree]

With ``--against``, each case runs in each tree in turns (the machine's load hits both alike;
a tree without ``arrow_reads`` reads as it does). Every process prints the outliers and NaN it
found: the trees and the reads must agree.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

RANKS, STEPS, KEYS = 8, 10_000, 40
FAULTS = (5, 2, 7_000)  # (outlier rank, NaN rank, NaN step)
CASES = ("sqlite adbc", "sqlite sqlite3", "duckdb")


def stores() -> dict[str, Path]:
    """The two stores, built once and cached (benchmarks/.cache/)."""
    from benchmarks.bench_query import build_sqlite_store, build_store

    return {"duckdb": build_store(RANKS, STEPS, KEYS, faults=FAULTS),
            "sqlite": build_sqlite_store(RANKS, STEPS, KEYS, faults=FAULTS)}  # fmt: skip


def measure(db: str, arrow: bool) -> dict[str, Any]:
    """One case in this process: seconds, and what the findings name."""
    import time

    from multirank_logger.query.reader import open_store
    from multirank_logger.ui.views import findings_view

    t0 = time.perf_counter()
    with open_store(db) as reader:
        if not arrow:
            reader.store.backend.arrow_reads = False
        out = findings_view(reader, 1)
    seconds = time.perf_counter() - t0
    named = sorted((o["key"], o["rank"], o["first_step"], o["last_step"], o["steps"]) for o in out["outliers"])
    nan = sorted((n["key"], n["rank"], n["first_step"], n["count"]) for n in out["non_finite"])
    return {"s": seconds, "outliers": named, "non_finite": nan}


def _child(tree: Path, db: Path, arrow: bool) -> dict[str, Any]:
    here = Path(__file__).resolve()
    code = (f"import importlib.util as u, json; s = u.spec_from_file_location('bench_findings', {str(here)!r}); "
            f"m = u.module_from_spec(s); s.loader.exec_module(m); print(json.dumps(m.measure({str(db)!r}, {arrow})))")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900, cwd=tree, check=False)
    if out.returncode:
        raise RuntimeError(f"findings in {tree} failed:\n{out.stderr}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def run(rounds: int, against: Path | None = None) -> dict[str, Any]:
    """Per case and tree, the median seconds (and min, max) of `rounds` fresh processes."""
    built = stores()
    here = Path(__file__).resolve().parent.parent
    trees = {"this": here} if against is None else {"this": here, "against": against.resolve()}
    out: dict[str, Any] = {"store": f"{RANKS} ranks x {STEPS:,} steps x {KEYS} keys, faults {FAULTS}", "rounds": rounds}
    found = set()
    for case in CASES:
        db, arrow = built[case.split()[0]], case != "sqlite sqlite3"
        samples: dict[str, list[float]] = {name: [] for name in trees}
        for _ in range(rounds):
            for name, tree in trees.items():  # in turns
                got = _child(tree, db, arrow)
                samples[name].append(got["s"])
                found.add(json.dumps([got["outliers"], got["non_finite"]]))
        out[case] = {name: [round(statistics.median(v), 2), round(min(v), 2), round(max(v), 2)] for name, v in samples.items()}
    out["one verdict"] = len(found) == 1  # every tree and read named the same ranks, steps and NaN
    out["found"] = sorted(found)
    try:
        out["load average"] = os.getloadavg()
    except OSError:
        pass
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against", type=Path, help="another source tree (its multirank_logger is compared)")
    args = parser.parse_args()
    print(json.dumps(run(args.rounds, args.against), indent=2))
