"""Ingest: rows/s into the store through the project's write path, against the raw driver.

Every case inserts the same `batches` x `rows` long rows (run, rank, seq, step, key,
value, dtype, time; 10 keys, random floats) into a fresh store file whose schema the
project created (SQLite: its clustered primary key; DuckDB: the unique index on (run_id, rank,
seq, key)), one transaction per batch:

- ``Store.write``: ``Store(db).write(batch)`` per Arrow record batch, as the logger's flush does
  (for DuckDB this opens and closes the file per batch: the engine uses NullPool), and
  inside ``Store.writing()``, which holds one connection across the batches;
- raw SQLite: ``sqlite3`` ``executemany`` of prebuilt tuples, WAL + synchronous=NORMAL;
- raw DuckDB: one open ``duckdb`` connection, ``INSERT ... SELECT`` from a prebuilt Arrow table;
  also with the unique index dropped first, which prices the index (the row's identity, kept
  so that a row stored twice is an error: schema.py).

The raw cases are the backend's limit: the rows are already in the driver's format.
Every case first writes one untimed 1,000-row batch of another rank (first-use imports
and caches), so the figures are throughput, not start-up.
``RecordBuffer.drain`` measures the step before the write: turning buffered log calls into
an Arrow record batch (batch.py).
"""

from __future__ import annotations

import contextlib
import random
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._harness import Case, Goal, Sizes

SECTION = "ingest"
KEYS = 10


def make_batches(batches: int, rows: int, rank: int = 0, run_id: int = 1) -> list[Any]:
    """`batches` Arrow record batches of `rows` rows, seq/step continuing across batches."""
    from multirank_logger.write.buffer import RecordBuffer

    rng = random.Random(rank)
    names = [f"metric_{i}" for i in range(KEYS)]
    buffer = RecordBuffer()
    out = []
    for _ in range(batches):
        for _ in range(rows // KEYS):
            buffer.append(buffer.calls_recorded, {k: rng.random() for k in names})
        out.append(buffer.drain(run_id=run_id, rank=rank))
    return out


def _new_store(root: str, suffix: str) -> tuple[Any, int]:
    from multirank_logger.store.sql_store import Store

    store = Store(Path(root) / f"ingest{suffix}")
    run = store.create_run("bench", world_size=1)
    return store, run.id


def _result(rows: int, seconds: float, **extra: Any) -> dict[str, Any]:
    return {"value": rows / seconds, "seconds": seconds, **extra}


def _timed(write: Callable[[], Any], busy: bool) -> float:
    """Seconds `write` takes; with `busy`, in a thread while this one spins in Python, as the
    logger's writer thread runs beside a training loop busy in Python."""
    if not busy:
        t0 = time.perf_counter()
        write()
        return time.perf_counter() - t0
    took: list[float] = []

    def timed() -> None:
        t0 = time.perf_counter()
        write()
        took.append(time.perf_counter() - t0)

    thread = threading.Thread(target=timed)
    thread.start()
    spins = 0
    while thread.is_alive():
        spins += 1  # pure Python: gives the GIL up only when the interpreter makes it
    thread.join()
    return took[0]


def store_write(backend: str, batches: int, rows: int, held: bool = False, busy: bool = False,
                summaries: bool = True) -> dict[str, Any]:
    """The project's write path: Store.write(batch), one call per batch.

    With `held`, inside ``Store.writing()`` (one connection across the batches); with `busy`,
    beside a thread busy in Python (`_timed`); without `summaries`, the write path less its
    step summaries (store/step_summaries.py): what keeping them costs.
    """
    from multirank_logger.store import seq_spans

    keep = seq_spans.insert_summaries
    if not summaries:  # put back below: `--in-process` runs the next cases in this process
        seq_spans.insert_summaries = lambda *_: None  # type: ignore[assignment]
    try:
        return _store_write(backend, batches, rows, held, busy)
    finally:
        seq_spans.insert_summaries = keep  # type: ignore[assignment]


def _store_write(backend: str, batches: int, rows: int, held: bool, busy: bool) -> dict[str, Any]:
    data = make_batches(batches, rows)
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as root:
        store, _ = _new_store(root, ".sqlite" if backend == "sqlite" else ".duckdb")
        held_ctx = store.writing() if held else contextlib.nullcontext()
        store.write(make_batches(1, 1_000, rank=1)[0])  # warm-up: first-use imports and caches
        written = 0

        def write() -> None:
            nonlocal written
            with held_ctx:
                written = sum(store.write(b) for b in data)

        seconds = _timed(write, busy)
        store.close()
    return _result(written, seconds)


def raw_sqlite(batches: int, rows: int, busy: bool = False) -> dict[str, Any]:
    """sqlite3 executemany of prebuilt tuples, one transaction per batch (with `busy`: `_timed`)."""
    from multirank_logger.rows.batch import column_lists
    from multirank_logger.rows.schema import METRIC_COLUMNS

    data = [list(zip(*column_lists(b, METRIC_COLUMNS))) for b in make_batches(batches, rows)]
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as root:
        store, _ = _new_store(root, ".sqlite")
        path = store.backend.path
        store.close()
        con = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        con.execute("PRAGMA journal_mode = WAL")
        con.execute("PRAGMA synchronous = NORMAL")
        cols = ", ".join(f'"{c}"' for c in METRIC_COLUMNS)
        sql = f"INSERT INTO metrics ({cols}) VALUES ({', '.join('?' * len(METRIC_COLUMNS))})"
        con.executemany(sql, list(zip(*column_lists(make_batches(1, 1_000, rank=1)[0], METRIC_COLUMNS))))  # warm-up

        def write() -> None:
            for tuples in data:
                con.execute("BEGIN IMMEDIATE")
                con.executemany(sql, tuples)
                con.execute("COMMIT")

        seconds = _timed(write, busy)
        con.close()
    return _result(batches * len(data[0]), seconds)


def raw_duckdb(batches: int, rows: int) -> dict[str, Any]:
    """One open duckdb connection, INSERT ... SELECT from a prebuilt Arrow table per batch
    (the store's table: no index since schema 0006)."""
    import duckdb

    from multirank_logger.rows.schema import METRIC_COLUMNS

    tables = make_batches(batches, rows)
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as root:
        store, _ = _new_store(root, ".duckdb")
        path = store.backend.path
        store.close()
        con = duckdb.connect(str(path))
        cols = ", ".join(f'"{c}"' for c in METRIC_COLUMNS)
        con.register("_warm", make_batches(1, 1_000, rank=1)[0])
        con.execute(f"INSERT INTO metrics ({cols}) SELECT {cols} FROM _warm")  # warm-up
        con.unregister("_warm")
        t0 = time.perf_counter()
        for table in tables:
            con.begin()
            con.register("_batch", table)
            con.execute(f"INSERT INTO metrics ({cols}) SELECT {cols} FROM _batch")
            con.unregister("_batch")
            con.commit()
        seconds = time.perf_counter() - t0
        con.close()
    return _result(sum(t.num_rows for t in tables), seconds)


def buffer_drain(batches: int, rows: int) -> dict[str, Any]:
    """RecordBuffer.drain: buffered log calls of 10 keys -> one Arrow record batch, rows/s."""
    from multirank_logger.write.buffer import RecordBuffer

    rng = random.Random(0)
    names = [f"metric_{i}" for i in range(KEYS)]
    total = 0
    seconds = 0.0
    for _ in range(batches):
        buf = RecordBuffer()
        for step in range(rows // KEYS):
            buf.append(step, {k: rng.random() for k in names})
        t0 = time.perf_counter()
        total += len(buf.drain(run_id=1, rank=0))
        seconds += time.perf_counter() - t0
    return _result(total, seconds)


def cases(sizes: Sizes) -> list[Case]:
    kw = {"batches": sizes.ingest_batches, "rows": sizes.ingest_rows}
    shape = f"{sizes.ingest_batches} x {sizes.ingest_rows:,}-row batches"
    half = (Goal("ratio", ">=", 0.5, ">= 0.5x raw"),)
    out = [
        Case(SECTION, "raw sqlite3 executemany", "benchmarks.bench_ingest:raw_sqlite", "rows/s", kw,
             note=f"{shape}; prebuilt tuples, WAL"),
        Case(SECTION, "Store.write SQLite", "benchmarks.bench_ingest:store_write", "rows/s",
             {"backend": "sqlite", **kw}, peer="raw sqlite3 executemany", goals=half, note=shape),
        Case(SECTION, "raw DuckDB from Arrow", "benchmarks.bench_ingest:raw_duckdb", "rows/s", kw,
             note=f"{shape}; prebuilt Arrow, connection kept open"),
        Case(SECTION, "Store.write DuckDB", "benchmarks.bench_ingest:store_write", "rows/s",
             {"backend": "duckdb", **kw}, peer="raw DuckDB from Arrow", goals=half,
             note=f"{shape}; includes opening the file per batch (the logger's flush)"),
        Case(SECTION, "Store.write DuckDB in Store.writing()", "benchmarks.bench_ingest:store_write", "rows/s",
             {"backend": "duckdb", "held": True, **kw}, peer="raw DuckDB from Arrow", goals=half,
             note=f"{shape}; one connection held across the batches"),
    ]
    small = {"batches": sizes.ingest_small_batches, "rows": 1_000}
    small_shape = f"{sizes.ingest_small_batches} x 1,000-row batches (one logger flush: 100 calls x 10 keys)"
    out += [
        Case(SECTION, "raw sqlite3 executemany, 1k-row batches", "benchmarks.bench_ingest:raw_sqlite", "rows/s",
             small, note=small_shape),
        Case(SECTION, "Store.write SQLite, 1k-row batches", "benchmarks.bench_ingest:store_write", "rows/s",
             {"backend": "sqlite", **small}, peer="raw sqlite3 executemany, 1k-row batches", note=small_shape),
        Case(SECTION, "raw DuckDB from Arrow, 1k-row batches", "benchmarks.bench_ingest:raw_duckdb", "rows/s",
             small, note=small_shape),
        Case(SECTION, "Store.write DuckDB, 1k-row batches", "benchmarks.bench_ingest:store_write", "rows/s",
             {"backend": "duckdb", **small}, peer="raw DuckDB from Arrow, 1k-row batches",
             note=f"{small_shape}; the file opened per batch, as the logger's flush does"),
        Case(SECTION, "Store.write SQLite, 1k-row batches, without summaries", "benchmarks.bench_ingest:store_write",
             "rows/s", {"backend": "sqlite", "summaries": False, **small}, peer="Store.write SQLite, 1k-row batches",
             note=f"{small_shape}; less step_summaries: the peer's ratio is what keeping them costs"),
        Case(SECTION, "Store.write DuckDB in Store.writing(), without summaries", "benchmarks.bench_ingest:store_write",
             "rows/s", {"backend": "duckdb", "held": True, "summaries": False, **kw},
             peer="Store.write DuckDB in Store.writing()",
             note=f"{shape}; less step_summaries: the peer's ratio is what keeping them costs"),
        Case(SECTION, "RecordBuffer.drain (component)", "benchmarks.bench_ingest:buffer_drain", "rows/s", kw,
             note="log calls -> Arrow record batch, before any write"),
    ]
    # the writer thread beside a training loop busy in Python: a driver that gives the GIL up
    # per row waits a switch interval (5 ms) for each; small, as executemany takes minutes (a tenth
    # of the batch: 10,000 rows in full and quick mode; 200 in tiny mode, where 2,000 took 32 s)
    busy = {"batches": 2, "rows": min(sizes.ingest_rows // 10, 10_000), "busy": True}
    busy_shape = f"2 x {busy['rows']:,}-row batches, written by a thread while the main thread spins in Python"
    out += [
        Case(SECTION, "raw sqlite3 executemany, beside a busy thread", "benchmarks.bench_ingest:raw_sqlite",
             "rows/s", busy, note=f"{busy_shape}; one statement per row"),
        Case(SECTION, "Store.write SQLite, beside a busy thread", "benchmarks.bench_ingest:store_write", "rows/s",
             {"backend": "sqlite", **busy}, peer="raw sqlite3 executemany, beside a busy thread",
             note=f"{busy_shape}; up to 1,024 rows per statement"),
    ]
    return out
