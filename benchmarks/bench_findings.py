"""The page's findings (``ui/views.findings_view``) on issue 49's store.

8 ranks x 10,000 steps x 40 keys = 3.2M rows, an outlier rank and a NaN
(``bench_query.build_store(8, 10_000, 40, faults=(5, 2, 7_000))``), in DuckDB and in a SQLite
copy with its step summaries, each with the verdict a watch keeps at the run's end: the rows fed
to the watch's judgement (``judgement/live.py``) 500 steps at a time, every rank's, as rank 0's
watch takes them, and its `Watch.keep_verdict` rows stored (`keep_watch_verdict`). Each figure
is one fresh process: ``open_store`` and the page's findings, timed from before the open (the
imports not counted). Cases: the kept verdict served (``findings_view``: query/kept_verdict.py),
and the report's pass over the rows (``find(..., from_rows=True)``), SQLite read through ADBC's
C driver (the ``[fast-sqlite]`` extra) where installed, and through Python's sqlite3
(``SQLiteBackend.arrow_reads = False``: as without the extra).

    python benchmarks/bench_findings.py [--rounds 3] [--against /path/to/other/tree]

With ``--against``, each case runs in each tree in turns (the machine's load hits both alike; a
tree that serves no kept verdict runs its pass). Every process prints the outliers and NaN it
found: the trees, the cases and the reads must agree.
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
CASES = ("sqlite kept", "sqlite rows adbc", "sqlite rows sqlite3", "duckdb kept", "duckdb rows")
#: steps of every rank the watch is fed at a time (`keep_watch_verdict`)
FEED_STEPS = 500


def stores() -> dict[str, Path]:
    """The two stores, built once and cached (benchmarks/.cache/)."""
    from benchmarks.bench_query import build_sqlite_store, build_store

    built = {"duckdb": build_store(RANKS, STEPS, KEYS, faults=FAULTS),
             "sqlite": build_sqlite_store(RANKS, STEPS, KEYS, faults=FAULTS)}
    for path in built.values():
        keep_watch_verdict(path)
    return built


def keep_watch_verdict(db: Path) -> None:
    """The verdict rank 0's watch keeps at the run's end, stored in `db` (once: kept already, nothing)."""
    import sqlalchemy as sa

    from multirank_logger.judgement.live import LiveJudgement
    from multirank_logger.query.reader import open_store
    from multirank_logger.rows.schema import metrics, verdicts
    from multirank_logger.rows.side_records import SideRecords
    from multirank_logger.store.sql_store import Store
    from multirank_logger.watch.alerts import AlertOutlets
    from multirank_logger.watch.watch import Watch

    with open_store(db) as reader:
        if reader.fetch_arrow(sa.select(verdicts.c.seq).where(verdicts.c.run_id == 1)).num_rows:
            return
        side = SideRecords()
        watch = Watch(1, RANKS, AlertOutlets(side.add, echo=False), close_after=1e9)
        live: LiveJudgement = watch.judgement
        m = metrics.c
        for first in range(0, STEPS, FEED_STEPS):
            rows = reader.fetch_arrow(sa.select(m.key, m.rank, m.step, m.value).where(
                m.run_id == 1, m.step >= first, m.step < first + FEED_STEPS).order_by(m.step, m.rank, m.seq))
            values = rows.column("value").to_numpy(zero_copy_only=False).astype(float)
            live.add_rows(rows.column("key").to_numpy(zero_copy_only=False), rows.column("rank").to_numpy(),
                          rows.column("step").to_numpy(), values, now=0.0)
            live.judge(now=0.0)
        for finding in live.judge(now=0.0, final=True):
            watch.outlets.raise_alert(finding, at_end=True)
        watch.keep_verdict()
    store = Store(db)
    try:
        store.write_side(side.drain(1, 0))
    finally:
        store.close()
    print(f"  {db.name}: the watch's verdict kept ({'complete' if live.complete else live.whole_reason})", flush=True)


def watch_cost(db: Path, whole_bytes: int) -> dict[str, Any]:
    """What judging the run's end whole costs rank 0's watch: `db`'s rows fed as `keep_watch_verdict`
    feeds them, CPU seconds of each part, the bytes set aside, the process's peak RSS."""
    import resource
    import time

    import sqlalchemy as sa

    from multirank_logger.judgement.live import LiveJudgement
    from multirank_logger.query.reader import open_store
    from multirank_logger.rows.schema import metrics

    live = LiveJudgement(RANKS, close_after=1e9, whole_bytes=whole_bytes)
    m = metrics.c
    feed = judge = 0.0
    with open_store(db) as reader:
        for first in range(0, STEPS, FEED_STEPS):
            rows = reader.fetch_arrow(sa.select(m.key, m.rank, m.step, m.value).where(
                m.run_id == 1, m.step >= first, m.step < first + FEED_STEPS).order_by(m.step, m.rank, m.seq))
            columns = (rows.column("key").to_numpy(zero_copy_only=False), rows.column("rank").to_numpy(),
                       rows.column("step").to_numpy(), rows.column("value").to_numpy(zero_copy_only=False).astype(float))
            t0 = time.process_time()
            live.add_rows(*columns, now=0.0)
            t1 = time.process_time()
            live.judge(now=0.0)
            feed, judge = feed + t1 - t0, judge + time.process_time() - t1
    t0 = time.process_time()
    live.judge(now=0.0, final=True)
    return {"whole_bytes": whole_bytes, "complete": live.complete, "feed_s": round(feed, 2), "judge_s": round(judge, 2),
            "last_judgement_s": round(time.process_time() - t0, 3),
            "set_aside_mib": round(sum(k.windows.trimmed_bytes for k in live.keys.values()) / 2**20, 1),
            "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def measure(db: str, arrow: bool, from_rows: bool = False) -> dict[str, Any]:
    """One case in this process: seconds, and what the findings name."""
    import time

    from multirank_logger.query.reader import open_store
    from multirank_logger.ui import views

    t0 = time.perf_counter()
    with open_store(db) as reader:
        if not arrow:
            reader.store.backend.arrow_reads = False
        if from_rows:
            from multirank_logger.report.findings import find

            out = views.findings_answer(find(reader, 1, from_rows=True))
        else:
            out = views.findings_view(reader, 1)
    seconds = time.perf_counter() - t0
    named = sorted((o["key"], o["rank"], o["first_step"], o["last_step"], o["steps"]) for o in out["outliers"])
    nan = sorted((n["key"], n["rank"], n["first_step"], n["count"]) for n in out["non_finite"])
    return {"s": seconds, "outliers": named, "non_finite": nan, "judged_from": out.get("judged_from", "rows")}


def _child(tree: Path, db: Path, arrow: bool, from_rows: bool) -> dict[str, Any]:
    here = Path(__file__).resolve()
    code = (f"import importlib.util as u, json; s = u.spec_from_file_location('bench_findings', {str(here)!r}); "
            f"m = u.module_from_spec(s); s.loader.exec_module(m); "
            f"print(json.dumps(m.measure({str(db)!r}, {arrow}, {from_rows})))")
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
        db, arrow, from_rows = built[case.split()[0]], not case.endswith("sqlite3"), "rows" in case
        samples: dict[str, list[float]] = {name: [] for name in trees}
        for _ in range(rounds):
            for name, tree in trees.items():  # in turns
                got = _child(tree, db, arrow, from_rows)
                if case.endswith("kept") and name == "this" and got["judged_from"] != "kept verdict":
                    raise RuntimeError(f"{case}: the kept verdict was not served")
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
    parser.add_argument("--watch-cost", action="store_true",
                        help="instead: what judging the run's end whole costs the watch (held whole, and not), one process each")
    args = parser.parse_args()
    if args.watch_cost:
        db = stores()["duckdb"]
        for whole in (64 * 2**20, 0):
            code = (f"import importlib.util as u, json; s = u.spec_from_file_location('b', {__file__!r}); m = u.module_from_spec(s); "
                    f"s.loader.exec_module(m); print(json.dumps(m.watch_cost(m.Path({str(db)!r}), {whole})))")
            print(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip())
    else:
        print(json.dumps(run(args.rounds, args.against), indent=2))
