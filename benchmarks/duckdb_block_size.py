"""The block size of a new DuckDB store (``store/backends/duckdb.py``'s ``BLOCK_SIZE``): the
measurement behind it (issue 40 point 18: a store of 20 values was 5.3 MB, SQLite's 96 KB).

At each block size, in turn, round after round:

1. a store of 20 values (2 ranks x 10 steps, through ``Store``, as a run leaves it): its bytes;
2. ingest: ``--batches`` x ``--rows`` rows written as the logger's flush does (``Store(db).write``
   per batch, the file opened and closed each time): seconds;
3. a large store: 64 ranks x 20,000 steps x 4 keys (5.12M rows) inserted in one statement, then
   a key's page summary (``ui.views.summary``) and ``per_rank``: seconds, and the file's bytes.

    .venv/bin/python benchmarks/duckdb_block_size.py [--rounds 2] [--sizes 262144,65536,16384]

Numbers go to stdout; the figures are in benchmarks/RESULTS.md ("DuckDB block size").
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb

import multirank_logger.store.backends.duckdb as duckdb_backend
from benchmarks.bench_ingest import make_batches
from multirank_logger.query.reader import open_store
from multirank_logger.rows.schema import METRIC_COLUMNS
from multirank_logger.store.sql_store import Store
from multirank_logger.ui import views
from multirank_logger.write.buffer import RecordBuffer

RANKS, STEPS, KEYS = 64, 20_000, 4


def small_store(db: Path) -> int:
    store = Store(db)
    run = store.create_run("tiny", world_size=2)
    for rank in range(2):
        store.register_rank(run.id, rank, status="success")
        buffer = RecordBuffer()
        for step in range(10):
            buffer.append(step, {"loss": 1.0 / (step + 1)})
        store.write(buffer.drain(run.id, rank))
    store.update_run(run.id, status="success")
    store.close()
    return db.stat().st_size


def ingest(db: Path, batches: int, rows: int) -> float:
    store = Store(db)
    run = store.create_run("ingest", world_size=1)
    store.close()
    made = make_batches(batches, rows, run_id=run.id)
    t0 = time.perf_counter()
    for batch in made:
        store = Store(db)
        store.write(batch)
        store.close()
    return time.perf_counter() - t0


def large_store(db: Path) -> tuple[float, float, int]:
    store = Store(db)
    run = store.create_run("large", world_size=RANKS)
    store.close()
    cols = ", ".join(f'"{c}"' for c in METRIC_COLUMNS)
    con = duckdb.connect(str(db), config={"threads": 1})
    con.execute(f"""INSERT INTO metrics ({cols}) SELECT {run.id}, r.range::INTEGER, s.range * {KEYS} + k.range, s.range,
        'k' || k.range, random(), 0, 1.7e9 + s.range FROM range({RANKS}) r, range({STEPS}) s, range({KEYS}) k""")
    con.execute("CHECKPOINT")
    con.close()
    t0 = time.perf_counter()
    with open_store(db) as reader:
        views.summary(reader, run.id, "k1")
    summary = time.perf_counter() - t0
    t0 = time.perf_counter()
    with open_store(db) as reader:
        reader.per_rank("k2", run.id)
    return summary, time.perf_counter() - t0, db.stat().st_size


def _each(rounds: list[dict[str, Any]], key: str, fmt: str) -> str:
    return " / ".join(format(r[key], fmt) for r in rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sizes", default="262144,65536,16384")
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--rows", type=int, default=20_000)
    args = parser.parse_args()
    found: dict[int, list[dict[str, Any]]] = {}
    for _ in range(args.rounds):
        for size in (int(s) for s in args.sizes.split(",")):
            duckdb_backend.BLOCK_SIZE = size
            with tempfile.TemporaryDirectory(prefix="block-size-") as root:
                summary, per_rank, large = large_store(Path(root, "large.duckdb"))
                found.setdefault(size, []).append({
                    "small": small_store(Path(root, "small.duckdb")),
                    "ingest": ingest(Path(root, "ingest.duckdb"), args.batches, args.rows),
                    "summary": summary, "per_rank": per_rank, "large": large,
                })
    print(f"| block | 20-value store | ingest {args.batches} x {args.rows:,} rows (s) | 5.12M-row store | summary (s) | per_rank (s) |")
    print("|---|---|---|---|---|---|")
    for size, rounds in found.items():
        print(f"| {size // 1024} KiB | {rounds[0]['small'] / 1e3:,.0f} kB | {_each(rounds, 'ingest', '.2f')} | "
              f"{rounds[0]['large'] / 1e6:.1f} MB | {_each(rounds, 'summary', '.3f')} | {_each(rounds, 'per_rank', '.3f')} |")


if __name__ == "__main__":
    main()
