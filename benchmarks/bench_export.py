"""The Parquet export (issue 41): bytes per row and write speed against DuckDB's own
``COPY ... TO`` of the same rows, each in a fresh process, at two store sizes (the export's
memory must not grow with the store).

The store: ``bench_query.build_scale_store`` (ranks x steps x 10 keys, values uniform in [0, 1):
8 bytes of a double each, the part no encoding removes). Cases, each a child of the worker:

- peer, ``DuckDB COPY``: ``COPY (SELECT key, step, rank, value, dtype, seq, time FROM metrics
  WHERE run_id = 1) TO DIR (FORMAT parquet, COMPRESSION zstd)``: DuckDB's own writer, in the
  store's order;
- ``DuckDB COPY sorted``: the same ``ORDER BY key, step, rank, seq`` (the order the export writes);
- ``export parquet``: ``multirank-logger export DB --format parquet -o DIR``.

Reported: wall seconds from start to exit (imports included), the child's peak RSS, and bytes
per row (the metric files' size over the rows; the export's side tables left out, a few KB).

Usage: python benchmarks/run.py --only export [--quick]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._harness import Case, Goal, Sizes

SECTION = "export"
ROOT = Path(__file__).resolve().parent.parent
#: (ranks, steps, keys) per mode: the store of the targets, and a quarter of it (memory vs size)
SIZES_BY_MODE = {
    "full": ((256, 20_000, 10), (64, 20_000, 10)),
    "quick": ((256, 2_000, 10), (64, 2_000, 10)),
    "tiny": ((16, 200, 3), (8, 200, 3)),
}
_COLUMNS = "key, step, rank, value, dtype, seq, time"
_COPY = ("import duckdb; c = duckdb.connect({db!r}, read_only=True); c.execute('SET enable_progress_bar = false'); "
         "c.execute(\"COPY (SELECT " + _COLUMNS + " FROM metrics WHERE run_id = 1{order}) TO '{out}' "
         "(FORMAT parquet, COMPRESSION zstd)\")")


def _timed(argv: list[str]) -> tuple[float, float]:
    """Run `argv` as a child; (seconds, the child's peak RSS in MiB)."""
    with tempfile.TemporaryFile() as stderr:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
        stderr.seek(0)
        err = stderr.read().decode(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{argv[1:4]} failed: {err[-2000:]}")
    return seconds, usage.ru_maxrss / 1024


def write(what: str, ranks: int, steps: int, keys: int) -> dict[str, Any]:
    """One writer of the run's rows to Parquet, in a fresh process: seconds, RSS, bytes per row."""
    from benchmarks.bench_query import build_scale_store

    db = str(build_scale_store(ranks, steps, keys))
    rows = ranks * steps * keys
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="bench-export-") as root:
        out = Path(root) / "out"
        argv = {
            "copy": [py, "-c", _COPY.format(db=db, order="", out=f"{out}.parquet")],
            "copy sorted": [py, "-c", _COPY.format(db=db, order=" ORDER BY key, step, rank, seq", out=f"{out}.parquet")],
            "export": [py, "-m", "multirank_logger.cli", "export", db, "--format", "parquet", "-o", str(out)],
        }[what]
        seconds, rss = _timed(argv)
        files = [out.with_suffix(".parquet")] if what != "export" else list((out / "metrics").rglob("*.parquet"))
        size = sum(p.stat().st_size for p in files)
    return {"value": seconds, "rss_mib": rss, "peak_MiB": rss, "B_per_row": size / rows, "rows_M": rows / 1e6}


def cases(sizes: Sizes) -> list[Case]:
    big, small = SIZES_BY_MODE[sizes.mode]
    rounds = 1 if sizes.mode == "tiny" else 3  # one sample moves by 2x on this shared host: the ratio per round is what holds
    out = []
    for shape in (big, small):
        kw = dict(zip(("ranks", "steps", "keys"), shape))
        label = f"{shape[0]}x{shape[1]:,}x{shape[2]} ({shape[0] * shape[1] * shape[2] / 1e6:g}M rows)"
        peer = f"DuckDB COPY {label}"
        goals = (Goal("extra:B_per_row", "<=", 8, "<= 8 B/row"), Goal("ratio", "<=", 1.0, "as fast as COPY")) \
            if shape == big and sizes.mode != "tiny" else ()
        for what, name in (("copy", peer), ("copy sorted", f"DuckDB COPY sorted {label}"),
                           ("export", f"export parquet {label}")):
            out.append(Case(SECTION, name, "benchmarks.bench_export:write", "s", {"what": what, **kw},
                            peer=None if what == "copy" else peer, goals=goals if what == "export" else (),
                            rounds=rounds, inner=1, timeout_s=900, note="a fresh process; RSS is its own"))
    return out


NOTES = [
    "export: each writer is a child of the worker; its time is wall seconds from start to exit (imports "
    "included), its RSS its own peak (os.wait4); B_per_row: the metric files over the rows. 2 cores shared.",
]


# --- The TensorBoard export on a run with StepTimer's rows (issue 49, session 25) ---------------
#
# The export reads StepTimer's rows of each window of steps beside the window's metric rows: without
# an index on step_timing's step (schema 0015), each window's read scanned all of the run's timing
# rows. The store: TB_SHAPE metric rows (uniform values) and one StepTimer row per (rank, step) with
# data_s, forward_s, rest_s, batch_size and rss, laid out in chunks of 1,024 steps, rank after rank,
# as a logger's flushes leave them.
#
#     python -m benchmarks.bench_export [--rounds 3] [--against /path/to/other/tree] [--shape R S K] [--reads]
#
# Each figure: ``multirank-logger export DB --format tensorboard -o DIR`` in a fresh process, wall
# seconds from start to exit. With ``--against`` (a tree at the schema before), each round runs both
# trees in turns, each on its own copy of the same rows: the store downgraded to the tree's schema.
# With ``--reads``, the export's reads of StepTimer's rows alone (what the index changes; the event
# writing, ~13 us a value, is the same in both and hides them below a few million rows).

#: (ranks, steps, keys) of the TensorBoard export's store
TB_SHAPE = (16, 20_000, 2)


def build_timed_store(backend: str, ranks: int, steps: int, keys: int) -> Path:
    """The TensorBoard case's store (cached in benchmarks/.cache/), at this tree's schema head."""
    import duckdb

    from benchmarks._harness import CACHE_DIR
    from multirank_logger.store.sql_store import Store, head_revision

    path = CACHE_DIR / f"timed-{ranks}x{steps}x{keys}-{head_revision()}-duckdb{duckdb.__version__}.{backend}"
    if path.is_file():
        return path
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.{backend}")
    tmp.unlink(missing_ok=True)
    store = Store(tmp)
    run = store.create_run("bench", world_size=ranks, transport="gather")
    for rank in range(ranks):
        store.register_rank(run.id, rank, local_rank=rank, node_rank=0, host="bench", pid=0, status="success")
    store.update_run(run.id, status="success", ended_at=time.time())
    store.close()
    gen = duckdb.connect()
    gen.execute("SET enable_progress_bar = false")
    gen.execute("SELECT setseed(0.5)")
    metric_sql = ("SELECT {run}::INTEGER AS run_id, r.range::INTEGER AS rank, s.range * {keys} + k.range AS seq, s.range AS step, "
                  "'metric_' || k.range AS key, random() AS value, 0::SMALLINT AS dtype, 1.7e9 + s.range * 0.01 AS time "
                  "FROM range({ranks}) r, range({first}, {last}) s, range({keys}) k ORDER BY r.range, s.range, k.range")
    timing_sql = ("SELECT {run}::INTEGER AS run_id, r.range::INTEGER AS rank, s.range AS seq, s.range AS step, "
                  "0.001 + random() * 0.01 AS data_s, 0.02 + random() * 0.01 AS forward_s, 0.05 + random() * 0.02 AS rest_s, "
                  "32::BIGINT AS batch_size, (2e9 + random() * 1e8)::BIGINT AS rss, 1.7e9 + s.range * 0.01 AS time "
                  "FROM range({ranks}) r, range({first}, {last}) s ORDER BY r.range, s.range")
    if backend == "duckdb":
        con = duckdb.connect(str(tmp))
        con.execute("SET enable_progress_bar = false")
        con.execute("SELECT setseed(0.5)")
    else:
        import sqlite3

        con = sqlite3.connect(tmp, isolation_level=None)
        con.execute("BEGIN")
    for first in range(0, steps, 1_024):
        fill = {"run": run.id, "ranks": ranks, "keys": keys, "first": first, "last": min(first + 1_024, steps)}
        for table, sql in (("metrics", metric_sql), ("step_timing", timing_sql)):
            if backend == "duckdb":
                con.execute(f"INSERT INTO {table} BY NAME {sql.format(**fill)}")
                continue
            batch = gen.execute(sql.format(**fill)).to_arrow_table()
            names = ", ".join(f'"{c}"' for c in batch.column_names)
            con.executemany(f"INSERT INTO {table} ({names}) VALUES ({', '.join('?' * batch.num_columns)})",
                            zip(*(c.to_pylist() for c in batch.columns)))
    if backend != "duckdb":
        con.execute("COMMIT")
    con.close()
    os.replace(tmp, path)
    return path


def _tensorboard(tree: Path, db: Path) -> float:
    """``export DB --format tensorboard`` by `tree`'s code in a fresh process: wall seconds."""
    with tempfile.TemporaryDirectory(prefix="bench-tb-") as out:
        argv = [sys.executable, "-m", "multirank_logger.cli", "export", str(db), "--format", "tensorboard", "-o", out]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        t0 = time.perf_counter()
        done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - t0
    if done.returncode:
        raise RuntimeError(f"the export in {tree} failed:\n{done.stderr[-2000:]}")
    return seconds


# the export's timing reads: the windows' bounds as metric_windows cuts them, then _timing_rows per window
_READS = """
import sys, time
import sqlalchemy as sa
from multirank_logger.export.tensorboard import WINDOW_ROWS, _timing_rows
from multirank_logger.rows.schema import metrics
from multirank_logger.query.reader import open_store
reader = open_store(sys.argv[1])
ref = reader.resolve_run(1)
m = metrics.c
low, high, count = reader.fetch_arrow(sa.select(sa.func.min(m.step), sa.func.max(m.step), sa.func.count())
                                       .where(m.run_id == ref.id)).to_pylist()[0].values()
span = max(1, (high - low + 1) * WINDOW_ROWS // count)
t0 = time.perf_counter()
done, rows = None, 0
for start in range(low, high + 1, span):
    rows += _timing_rows(reader, ref, done, min(start + span - 1, high)).num_rows
    done = min(start + span - 1, high)
rows += _timing_rows(reader, ref, done, None).num_rows
print(rows, time.perf_counter() - t0)
"""


def _reads(tree: Path, db: Path) -> float:
    """The export's reads of StepTimer's rows alone (`_timing_rows` of each window's steps, as the
    export asks them) by `tree`'s code in a fresh process: their seconds."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", _READS, str(db)], cwd=tree, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"the reads in {tree} failed:\n{done.stderr[-2000:]}")
    return float(done.stdout.split()[-1])


def _at_revision(db: Path, revision: str) -> Path:
    """A copy of `db` at `revision` (downgraded by this tree's migrations), cached beside it."""
    import shutil

    from multirank_logger.store.sql_store import Store

    copy = db.with_name(f"{db.stem}-at-{revision}{db.suffix}")
    if not copy.is_file():
        tmp = db.with_name(f".{db.stem}-at-{revision}.{os.getpid()}.tmp{db.suffix}")
        shutil.copyfile(db, tmp)
        store = Store(tmp)
        store.downgrade(revision)
        store.close()
        os.replace(tmp, copy)
    return copy


def tensorboard_before_after(rounds: int, shape: tuple[int, int, int], against: Path | None, reads: bool = False
                             ) -> dict[str, Any]:
    """Per backend and tree, the median seconds (and every sample) of `rounds` fresh exports (`reads`:
    of the export's reads of StepTimer's rows alone)."""
    import statistics

    from multirank_logger._version import SCHEMA_HEAD

    out: dict[str, Any] = {"shape": shape, "rounds": rounds}
    for backend in ("sqlite", "duckdb"):
        db = build_timed_store(backend, *shape)
        trees = {"this": (ROOT, db)}
        if against is not None:
            before = (against / "multirank_logger" / "_version.py").read_text()
            revision = before.split('SCHEMA_HEAD = "')[1].split('"')[0]
            trees["against"] = (against.resolve(), db if revision == SCHEMA_HEAD else _at_revision(db, revision))
        samples: dict[str, list[float]] = {name: [] for name in trees}
        for i in range(rounds):
            for name in (list(trees) if i % 2 == 0 else list(reversed(trees))):
                samples[name].append((_reads if reads else _tensorboard)(*trees[name]))
        out[backend] = {name: {"median_s": statistics.median(s), "samples": [round(x, 2) for x in s]}
                        for name, s in samples.items()}
        if against is not None:
            out[backend]["ratio"] = [round(a / b, 3) for a, b in zip(samples["this"], samples["against"])]
    return out


if __name__ == "__main__":
    import argparse
    import json

    parser = argparse.ArgumentParser(description="The TensorBoard export on a run with StepTimer's rows.")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against", type=Path, default=None)
    parser.add_argument("--shape", type=int, nargs=3, default=TB_SHAPE)
    parser.add_argument("--reads", action="store_true", help="time the export's reads of StepTimer's rows alone")
    args = parser.parse_args()
    print(json.dumps(tensorboard_before_after(args.rounds, tuple(args.shape), args.against, args.reads)))
