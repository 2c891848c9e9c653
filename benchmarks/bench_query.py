"""Query: rank-0 export and a per-rank table on a large DuckDB store.

The store (full mode: 8 ranks x 200k steps x 10 keys = 16M rows) is generated once
by a raw DuckDB bulk insert (``INSERT ... SELECT`` over ``range()``, random doubles)
into a file whose schema, run and ranks the project created, and cached under
benchmarks/.cache/ (keyed by size and schema revision). Rows are laid out in chunks of
1,024 steps, rank after rank, as a logger flushing every 1,024 steps would leave them.

- ``export_csv``: ``open_store(db).export_csv(path, rank=0)``, opening included;
- CSVLogger, one ``save()``: the same rows buffered in a CSVLogger, then the one
  ``save()`` that writes metrics.csv: the pure cost of writing the file (the peer);
- CSVLogger, per step: ``log_metrics`` + ``save`` per step as the Trainer calls them,
  the way CSVLogger really produces the file during training;
- ``per_rank``: ``open_store(db).per_rank(key)``, a step x rank DataFrame of one key;
- raw DuckDB PIVOT: the same table straight from DuckDB into pandas (the peer);
- the export and per_rank again on a SQLite copy of the same rows (the logger's finalize
  exports from whichever backend the run used).

Each export reports the SHA-256 of the file it wrote: equal hashes mean the
rebuilt metrics.csv is byte for byte CSVLogger's.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._harness import CACHE_DIR, Case, Goal, Sizes, Unavailable

SECTION = "query"
KEY = "metric_0"
_CHUNK_STEPS = 1_024  # whole buckets of both summary levels: the coarse backfill of a chunk reads its fine rows


#: the scale store of the "hundreds of ranks" figures: 256 ranks x 20,000 steps x 10 keys = 51.2M rows,
#: with one outlier rank (its KEY shifted up) and one NaN, as a real problem run would hold them
SCALE = {"ranks": 256, "steps": 20_000, "keys": 10}
SCALE_OUTLIER_RANK = 137
SCALE_NAN = (42, 12_345)  # (rank, step) whose KEY is NaN


def store_path(ranks: int, steps: int, keys: int, backend: str = "duckdb", *, faults: bool = False) -> Path:
    import duckdb

    from multirank_logger.store.sql_store import head_revision

    suffix = ".sqlite" if backend == "sqlite" else ".duckdb"
    kind = "scale" if faults else "query"
    # keyed by the DuckDB version too: a file written by a newer DuckDB cannot be read by an older one
    return CACHE_DIR / f"{kind}-{ranks}x{steps}x{keys}-{head_revision()}-duckdb{duckdb.__version__}{suffix}"


def build_scale_store(ranks: int = SCALE["ranks"], steps: int = SCALE["steps"], keys: int = SCALE["keys"]) -> Path:
    """The cached store with an outlier rank (SCALE_OUTLIER_RANK, or the last rank when there are fewer)
    and a NaN (SCALE_NAN, clipped to the size): what the report, per_rank and the ui are measured on."""
    outlier = SCALE_OUTLIER_RANK if SCALE_OUTLIER_RANK < ranks else ranks - 1
    nan_rank = SCALE_NAN[0] if SCALE_NAN[0] < ranks else ranks // 3  # never the outlier rank
    nan_step = min(SCALE_NAN[1], steps - 1)
    return build_store(ranks, steps, keys, faults=(outlier, nan_rank, nan_step))


def build_store(ranks: int, steps: int, keys: int, *, faults: tuple[int, int, int] | None = None) -> Path:
    """The cached store, generated if missing (raw DuckDB bulk insert, not the logger).

    ``faults``: (outlier rank, NaN rank, NaN step): the outlier rank's KEY is shifted by +3 from
    step steps // 2 on (the other ranks' values are uniform in [0, 1)), and KEY is NaN at one
    (rank, step).

    The rows go in one INSERT per ``_CHUNK_STEPS`` steps (every rank's, rank after rank), each
    with its summaries: the layout a logger flushing every 1,024 steps leaves, with no sort
    of the whole table, so a billion rows build in memory and time linear in the chunks."""
    import duckdb

    from multirank_logger.rows.schema import DTYPE_NAN, METRIC_COLUMNS
    from multirank_logger.store.sql_store import Store
    from multirank_logger.store.step_summaries import backfill, backfill_coarse

    path = store_path(ranks, steps, keys, faults=faults is not None)
    if path.is_file() and _same_schema(path):
        return path
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.duckdb")
    tmp.unlink(missing_ok=True)
    t0 = time.perf_counter()
    store = Store(tmp)
    run = store.create_run("bench", world_size=ranks, transport="gather")
    for rank in range(ranks):
        store.register_rank(run.id, rank, local_rank=rank, node_rank=0, host="bench", pid=0, status="success")
    store.update_run(run.id, status="success", ended_at=time.time())
    store.close()
    con = duckdb.connect(str(tmp))
    con.execute("SET enable_progress_bar = false")
    con.execute("SET memory_limit = '3GB'")  # a shared machine
    con.execute("SELECT setseed(0.5)")
    cols = ", ".join(f'"{c}"' for c in METRIC_COLUMNS)
    value, dtype = "random()", "0"
    if faults is not None:
        outlier, nan_rank, nan_step = faults
        key_no = int(KEY.removeprefix("metric_"))
        nan = f"r.range = {nan_rank} AND s.range = {nan_step} AND k.range = {key_no}"
        shifted = f"r.range = {outlier} AND k.range = {key_no} AND s.range >= {steps // 2}"
        value = f"CASE WHEN {nan} THEN NULL WHEN {shifted} THEN random() + 3 ELSE random() END"
        dtype = f"CASE WHEN {nan} THEN {DTYPE_NAN} ELSE 0 END"
    for first in range(0, steps, _CHUNK_STEPS):
        last = min(first + _CHUNK_STEPS, steps)
        con.execute("BEGIN")
        con.execute(
            f"""
            INSERT INTO metrics ({cols})
            SELECT {run.id}, r.range::INTEGER, s.range, s.range, 'metric_' || k.range, {value}, {dtype},
                   1.7e9 + s.range * 0.01
            FROM range({ranks}) r, range({first}, {last}) s, range({keys}) k
            ORDER BY r.range, s.range, k.range
            """
        )
        # what the store's own writes keep beside the rows (store/step_summaries.py): their summaries
        con.execute(backfill(where=f"WHERE step >= {first} AND step < {last}", bit_or=True))
        con.execute(backfill_coarse(where=f"WHERE step >= {first} AND step < {last}", bit_or=True))
        con.execute("COMMIT")
        if ranks * steps * keys >= 100_000_000 and first // _CHUNK_STEPS % 10 == 9:
            print(f"  {last:,} of {steps:,} steps in {time.perf_counter() - t0:.0f} s", flush=True)
    # what the store's own writes record (store/seq_spans.py): one seq span per rank
    con.execute("INSERT INTO metric_spans (run_id, rank, first_seq, last_seq) "
                "SELECT run_id, rank, MIN(seq), MAX(seq) FROM metrics GROUP BY run_id, rank")
    con.execute("CHECKPOINT")
    con.close()
    os.replace(tmp, path)
    print(f"  generated {path.name} ({ranks * steps * keys:,} rows) in {time.perf_counter() - t0:.1f} s", flush=True)
    return path


def _same_schema(path: Path) -> bool:
    """Whether a cached store has this project's schema (every table and column of
    ``rows/schema.py``): the cache is keyed by the schema's revision, but a revision rewritten
    during development keeps its name."""
    import duckdb

    from multirank_logger.rows.schema import metadata

    wanted = {(t.name, c.name) for t in metadata.sorted_tables for c in t.columns} | {("alembic_version", "version_num")}
    with duckdb.connect(str(path), read_only=True) as con:
        found = set(con.execute("SELECT table_name, column_name FROM information_schema.columns").fetchall())
    if found == wanted:
        return True
    print(f"  {path.name}: its schema is not this project's; generating it again", flush=True)
    path.unlink()
    return False


def build_sqlite_store(ranks: int, steps: int, keys: int, *, faults: tuple[int, int, int] | None = None) -> Path:
    """The same rows in a SQLite store: copied from the DuckDB one (`build_store`, with its
    `faults`), in the order of SQLite's primary key (run_id, key, rank, seq), so each row is an
    append to the table's B-tree, with its summaries copied beside them.

    Any secondary index the project's schema defines on SQLite is dropped for the copy and
    created again after it (the end state is the project's schema), which is much faster
    than maintaining it row by row.
    """
    import sqlite3

    import duckdb

    from multirank_logger.rows.schema import METRIC_COLUMNS
    from multirank_logger.store.sql_store import Store

    path = store_path(ranks, steps, keys, "sqlite", faults=faults is not None)
    if path.is_file():
        return path
    source = build_store(ranks, steps, keys, faults=faults)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.sqlite")
    tmp.unlink(missing_ok=True)
    t0 = time.perf_counter()
    src = duckdb.connect(str(source), read_only=True)
    src.execute("SET enable_progress_bar = false")
    store = Store(tmp)
    with store.begin() as conn:
        for table in ("runs", "ranks", "step_summaries", "coarse_summaries", "metric_spans"):
            cols = [d[0] for d in src.execute(f"SELECT * FROM {table} LIMIT 0").description]
            rows = src.execute(f"SELECT * FROM {table}").fetchall()
            names = ", ".join(f'"{c}"' for c in cols)
            conn.exec_driver_sql(f"INSERT INTO {table} ({names}) VALUES ({', '.join('?' * len(cols))})", rows)
    store.close()
    con = sqlite3.connect(tmp, isolation_level=None)
    indexes = [sql for (sql,) in con.execute("SELECT sql FROM sqlite_master WHERE type='index' AND tbl_name='metrics' "
                                             "AND sql IS NOT NULL")]
    for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type='index' AND tbl_name='metrics' "
                               "AND sql IS NOT NULL").fetchall():
        con.execute(f'DROP INDEX "{name}"')
    cols = ", ".join(f'"{c}"' for c in METRIC_COLUMNS)
    insert = f"INSERT INTO metrics ({cols}) VALUES ({', '.join('?' * len(METRIC_COLUMNS))})"
    reader = src.sql(f"SELECT {cols} FROM metrics ORDER BY run_id, key, rank, seq").to_arrow_reader(1_000_000)
    con.execute("BEGIN")
    for batch in reader:
        con.executemany(insert, zip(*(batch.column(i).to_pylist() for i in range(batch.num_columns))))
    con.execute("COMMIT")
    for sql in indexes:
        con.execute(sql)
    con.close()
    src.close()
    os.replace(tmp, path)
    print(f"  generated {path.name} in {time.perf_counter() - t0:.1f} s", flush=True)
    return path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def _open_store() -> Any:
    try:
        from multirank_logger.query.reader import open_store
    except ImportError as exc:
        raise Unavailable(f"multirank_logger.query.reader: {exc}") from exc
    return open_store


def export(ranks: int, steps: int, keys: int, backend: str = "duckdb") -> dict[str, Any]:
    """open_store(db).export_csv(path, rank=0), seconds."""
    open_store = _open_store()
    db = store_path(ranks, steps, keys, backend)
    with tempfile.TemporaryDirectory(prefix="bench-query-") as root:
        out = Path(root) / "metrics.csv"
        t0 = time.perf_counter()
        reader = open_store(db)
        rows = reader.export_csv(out, rank=0)
        reader.close()
        seconds = time.perf_counter() - t0
        return {"value": seconds, "rows": rows, "MiB": out.stat().st_size / 2**20, "sha256": _sha(out)}


def _rank0_rows(db: Path) -> tuple[list[str], list[int], list[tuple[float, ...]]]:
    """Rank 0's values, read back from the store (untimed): key names, steps, value rows."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    table = con.sql(
        "PIVOT (SELECT seq, key, value FROM metrics WHERE rank = 0) ON key USING first(value) "
        "GROUP BY seq ORDER BY seq"
    ).to_arrow_table()
    con.close()
    names = sorted(c for c in table.column_names if c != "seq")
    steps = table.column("seq").to_pylist()
    columns = [table.column(n).to_pylist() for n in names]
    return names, steps, list(zip(*columns))


def csvlogger(ranks: int, steps: int, keys: int, per_step: bool) -> dict[str, Any]:
    """CSVLogger writing rank 0's metrics.csv: per step as the Trainer calls it, or one save()."""
    from lightning.pytorch.loggers import CSVLogger

    names, step_ids, values = _rank0_rows(store_path(ranks, steps, keys))
    with tempfile.TemporaryDirectory(prefix="bench-query-") as root:
        logger = CSVLogger(root, name="bench", version=0)
        if per_step:
            t0 = time.perf_counter()
            for step, row in zip(step_ids, values):
                logger.log_metrics(dict(zip(names, row)), step)
                logger.save()
            logger.finalize("success")
        else:
            writer = logger.experiment
            for step, row in zip(step_ids, values):
                writer.log_metrics(dict(zip(names, row)), step)
            t0 = time.perf_counter()
            logger.save()
        seconds = time.perf_counter() - t0
        out = Path(logger.log_dir) / "metrics.csv"
        return {"value": seconds, "rows": len(step_ids), "MiB": out.stat().st_size / 2**20, "sha256": _sha(out)}


def per_rank(ranks: int, steps: int, keys: int, backend: str = "duckdb") -> dict[str, Any]:
    """open_store(db).per_rank(key): a step x rank DataFrame, seconds."""
    open_store = _open_store()
    db = store_path(ranks, steps, keys, backend)
    t0 = time.perf_counter()
    reader = open_store(db)
    table = reader.per_rank(KEY)
    reader.close()
    seconds = time.perf_counter() - t0
    return {"value": seconds, "shape": "x".join(str(n) for n in table.shape)}


def raw_pivot(ranks: int, steps: int, keys: int) -> dict[str, Any]:
    """The same table straight from DuckDB: PIVOT on rank, into pandas, seconds."""
    import duckdb

    db = store_path(ranks, steps, keys)
    t0 = time.perf_counter()
    con = duckdb.connect(str(db), read_only=True)
    df = con.execute(
        f"PIVOT (SELECT step, rank, value FROM metrics WHERE run_id = 1 AND key = '{KEY}') "
        "ON rank USING last(value) GROUP BY step ORDER BY step"
    ).df()
    con.close()
    seconds = time.perf_counter() - t0
    return {"value": seconds, "shape": f"{df.shape[0]}x{df.shape[1] - 1}"}


def cases(sizes: Sizes) -> list[Case]:
    kw = {"ranks": sizes.query_ranks, "steps": sizes.query_steps, "keys": sizes.query_keys}
    build_store(**kw)  # once, here in the parent, before any case is timed
    build_sqlite_store(**kw)
    shape = f"{sizes.query_ranks} ranks x {sizes.query_steps:,} steps x {sizes.query_keys} keys"
    peer_csv = "CSVLogger one save()"
    common = {"rounds": sizes.query_rounds, "inner": 1}
    return [
        Case(SECTION, peer_csv, "benchmarks.bench_query:csvlogger", "s", {**kw, "per_step": False},
             note=f"rank 0's {sizes.query_steps:,} rows buffered, then the one save() that writes the file", **common),
        Case(SECTION, "CSVLogger per step", "benchmarks.bench_query:csvlogger", "s", {**kw, "per_step": True},
             peer=peer_csv, note="log_metrics + save per step, as during training", **common),
        Case(SECTION, "export_csv rank 0 DuckDB", "benchmarks.bench_query:export", "s", kw, peer=peer_csv,
             goals=(Goal("ratio", "<=", 1.0, "<= CSVLogger writing the file"),),
             note=f"open_store + export_csv; store {shape}", **common),
        Case(SECTION, "raw DuckDB PIVOT", "benchmarks.bench_query:raw_pivot", "s", kw,
             note=f"one key, step x rank, into pandas; store {shape}", **common),
        Case(SECTION, "per_rank(key) DuckDB", "benchmarks.bench_query:per_rank", "s", kw, peer="raw DuckDB PIVOT",
             goals=(Goal("value", "<=", 1.0, "< 1 s"),), note=f"open_store + per_rank; store {shape}", **common),
        Case(SECTION, "export_csv rank 0 SQLite", "benchmarks.bench_query:export", "s", {**kw, "backend": "sqlite"},
             peer=peer_csv, goals=(Goal("ratio", "<=", 1.0, "<= CSVLogger writing the file"),),
             note=f"the same rows in a SQLite store (indexes as the schema defines); {shape}", **common),
        Case(SECTION, "per_rank(key) SQLite", "benchmarks.bench_query:per_rank", "s", {**kw, "backend": "sqlite"},
             peer="per_rank(key) DuckDB", note=f"the same rows in a SQLite store; {shape}", **common),
    ]


NOTES = [
    "query: the large store is generated by a raw DuckDB bulk insert (INSERT ... SELECT over range(), "
    "random doubles) into a store whose schema/run/ranks the project created; the SQLite store is a copy of "
    "its rows, inserted in the order of SQLite's primary key; both cached in benchmarks/.cache/. "
    "Equal sha256 in the export and CSVLogger rows mean byte-identical metrics.csv files.",
]
