"""Every backend through the one read interface (backends/base.py): the same store content,
the same answers, whichever strategy the backend takes (SQLite's key skips, DuckDB's Arrow
windows, a server's streamed cursor)."""

from __future__ import annotations

import math
import random
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa

from multirank_logger.errors import ReadOnlyViolation
from multirank_logger.rows.schema import encode_value, metrics
from multirank_logger.store.backends import Backend, DuckDBBackend, SQLiteBackend
from multirank_logger.store.sql_store import Store
from tests.helpers.stores import keep_summaries

# (rank, seq, step, key, value): three calls of rank 0, two of rank 1, seq per rank; "c" only
# rank 0 logged, "d" only rank 1; rank 2 is in the run (world_size 3) and logged nothing
ROWS: list[tuple[int, int, int, str, Any]] = [
    (0, 0, 0, "a", 1.5), (0, 0, 0, "b", 7), (0, 0, 0, "c", True),
    (0, 1, 0, "a", math.nan), (0, 1, 0, "b", 8),
    (0, 2, 5, "a", math.inf), (0, 2, 5, "b", -0.0), (0, 2, 5, "c", False),
    (1, 0, 0, "a", 2.5), (1, 0, 0, "d", -math.inf),
    (1, 1, 3, "a", 3.5), (1, 1, 3, "b", 9), (1, 1, 3, "d", 0.25),
]
# another run's rows, which no read of the first run may return
OTHER_RUN_ROWS = [(0, 0, 0, "z", 1.0), (0, 1, 1, "a", 99.0)]


def _insert(store: Store, run_id: int, rows: list[tuple[int, int, int, str, Any]]) -> None:
    params = []
    for rank, seq, step, key, logged in rows:
        value, dtype = encode_value(logged)
        params.append({"run_id": run_id, "rank": rank, "seq": seq, "step": step, "key": key, "value": value,
                       "dtype": dtype, "time": 0.0})
    with store.begin() as conn:
        conn.execute(sa.insert(metrics), params)
        keep_summaries(conn, run_id)


@pytest.fixture
def filled(any_db: str) -> tuple[str, int]:
    """A store of each backend holding ROWS (inserted out of call order) and another run."""
    store = Store(any_db)
    run = store.create_run("reads", world_size=3)
    other = store.create_run("other", world_size=1)
    shuffled = ROWS[:]
    random.Random(0).shuffle(shuffled)
    _insert(store, run.id, shuffled)
    _insert(store, other.id, OTHER_RUN_ROWS)
    store.close()
    return any_db, run.id


@pytest.fixture
def reader(filled: tuple[str, int]) -> Iterator[tuple[Backend, sa.Connection, int]]:
    """The backend of a read-only store, a connection to it, and the run id."""
    db, run_id = filled
    store = Store(db, readonly=True)
    with store.engine.connect() as conn:
        yield store.backend, conn, run_id
    store.close()


def _same(actual: np.ndarray, expected: list[Any]) -> bool:
    return np.array_equal(np.asarray(actual, dtype=float), np.asarray(expected, dtype=float), equal_nan=True)


def test_run_keys_are_the_runs_own(reader: tuple[Backend, sa.Connection, int]) -> None:
    """run_keys: every key any rank of the run logged, once; not another run's."""
    backend, conn, run_id = reader
    keys = backend.run_keys(conn, run_id)
    assert sorted(keys) == ["a", "b", "c", "d"] and len(keys) == 4


def test_per_rank_columns_hold_every_rank_and_call(reader: tuple[Backend, sa.Connection, int]) -> None:
    """per_rank_columns: one key's rows of every rank (in any order), NaN, inf and -0.0 kept apart."""
    backend, conn, run_id = reader
    columns = backend.per_rank_columns(conn, run_id, "a")
    order = np.lexsort((columns[1], columns[0]))  # by rank, then seq
    rank, seq, step, value, dtype = (column[order] for column in columns)
    expected = sorted((r, s, st, v) for r, s, st, k, v in ROWS if k == "a")
    assert rank.tolist() == [r for r, *_ in expected]
    assert seq.tolist() == [s for _, s, _, _ in expected]
    assert step.tolist() == [st for _, _, st, _ in expected]
    assert _same(value, [encode_value(v)[0] if not math.isnan(v) else math.nan for *_, v in expected])
    assert dtype.tolist() == [encode_value(v)[1] for *_, v in expected]


def test_per_rank_columns_of_a_key_no_rank_logged_are_empty(reader: tuple[Backend, sa.Connection, int]) -> None:
    """A key the run does not hold: five empty columns, not an error (query/reader.py names the keys)."""
    backend, conn, run_id = reader
    columns = backend.per_rank_columns(conn, run_id, "z")  # the other run's key
    assert len(columns) == 5 and all(len(c) == 0 for c in columns)


@pytest.mark.parametrize("fetch_rows", [1, 2, 64])
def test_rank_calls_streams_whole_calls_in_call_order(
    reader: tuple[Backend, sa.Connection, int], monkeypatch: pytest.MonkeyPatch, fetch_rows: int
) -> None:
    """rank_calls: the keys one rank logged, and its rows in call order, every call whole in
    one piece, however few rows each fetch brings."""
    monkeypatch.setattr(Backend, "fetch_rows", fetch_rows)
    monkeypatch.setattr(SQLiteBackend, "min_key_fetch_rows", fetch_rows)
    monkeypatch.setattr(DuckDBBackend, "sort_window_rows", fetch_rows)
    backend, conn, run_id = reader
    for rank in (0, 1):
        keys, pieces = backend.rank_calls(conn, run_id, rank)
        pieces = list(pieces)
        assert sorted(keys) == sorted({k for r, _, _, k, _ in ROWS if r == rank})
        got = [(int(s), int(st), p.keys[c]) for p in pieces for s, st, c in zip(p.seq, p.step, p.code)]
        assert sorted(got) == sorted((s, st, k) for r, s, st, k, _ in ROWS if r == rank)
        assert [s for s, _, _ in got] == sorted(s for s, _, _ in got)  # call order
        seqs_per_piece = [set(p.seq.tolist()) for p in pieces]
        assert sum(map(len, seqs_per_piece)) == len(set().union(*seqs_per_piece))  # no call split in two
        if fetch_rows == 1:
            assert len(pieces) > 1  # it did stream


def test_rank_calls_of_a_rank_that_logged_nothing(reader: tuple[Backend, sa.Connection, int]) -> None:
    """A rank of the run with no rows: no keys and no pieces."""
    backend, conn, run_id = reader
    keys, pieces = backend.rank_calls(conn, run_id, 2)
    assert keys == [] and list(pieces) == []


def test_hold_snapshot_hides_rows_committed_after_it(filled: tuple[str, int]) -> None:
    """hold_snapshot, then a read: a key a writer commits afterwards stays out of later reads
    on that connection (an export's header and rows agree)."""
    db, run_id = filled
    if db.endswith(".duckdb"):
        pytest.skip("no one can write a DuckDB file while a reader holds it")
    store = Store(db, readonly=True)
    writer = Store(db)
    try:
        with store.engine.connect() as conn:
            store.backend.hold_snapshot(conn)
            assert sorted(store.backend.run_keys(conn, run_id)) == ["a", "b", "c", "d"]
            _insert(writer, run_id, [(0, 3, 6, "e", 1.0)])
            assert sorted(store.backend.run_keys(conn, run_id)) == ["a", "b", "c", "d"]
            assert not any(k == "e" for k in store.backend.per_rank_columns(conn, run_id, "e")[0])
        with store.engine.connect() as conn:  # a new read sees the write
            assert "e" in store.backend.run_keys(conn, run_id)
    finally:
        writer.close()
        store.close()


def test_fetch_arrow_returns_the_selected_rows(reader: tuple[Backend, sa.Connection, int]) -> None:
    """fetch_arrow: a SELECT as a pyarrow Table of its columns."""
    backend, conn, run_id = reader
    stmt = (
        sa.select(metrics.c.rank, metrics.c.key)
        .where(metrics.c.run_id == run_id)
        .order_by(metrics.c.rank, metrics.c.seq, metrics.c.key)
    )
    table = backend.fetch_arrow(conn, stmt)
    assert table.column_names == ["rank", "key"]
    assert list(zip(table.column("rank").to_pylist(), table.column("key").to_pylist())) == [
        (r, k) for r, s, _, k, _ in sorted(ROWS, key=lambda row: (row[0], row[1], row[3]))
    ]


def test_run_readonly_reads_and_refuses_a_write(reader: tuple[Backend, sa.Connection, int]) -> None:
    """run_readonly: a SELECT's frame; a DELETE refused with ReadOnlyViolation, the rows still there."""
    backend, conn, run_id = reader
    count = f"SELECT COUNT(*) AS n FROM metrics WHERE run_id = {run_id}"
    assert int(backend.run_readonly(conn, count)["n"][0]) == len(ROWS)
    with pytest.raises(ReadOnlyViolation):
        backend.run_readonly(conn, "DELETE FROM metrics")
    assert int(backend.run_readonly(conn, count)["n"][0]) == len(ROWS)



def test_duckdb_draws_no_progress_bar(tmp_path: Any) -> None:
    """DuckDB draws a progress bar on stderr for any query past 2 s (a report or per_rank over a
    large store): in the user's terminal, or a training's log when the writer's query is slow.
    In a fresh interpreter: under pytest DuckDB starts with the bar off."""
    db = tmp_path / "quiet.duckdb"
    Store(db).close()
    script = (
        "import sys; from multirank_logger.store.sql_store import Store\n"
        "for readonly in (True, False):\n"
        "    store = Store(sys.argv[1], readonly=readonly)\n"
        "    with store.engine.connect() as conn:\n"  # the driver's own connection: the reads' (Arrow)
        "        q = \"SELECT current_setting('enable_progress_bar')\"\n"
        "        print(conn.connection.driver_connection.execute(q).fetchone()[0])\n"
        "    store.close()\n"
    )
    out = subprocess.run([sys.executable, "-c", script, str(db)], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr


def _wide_store(db: Any, ranks: int = 256, calls: int = 300, keys: int = 10) -> int:
    """A DuckDB store of one run, `calls` calls of `keys` keys on each of `ranks` ranks; its run id."""
    import pyarrow as pa

    store = Store(db)
    run = store.create_run("wide", world_size=ranks)
    n = ranks * calls * keys
    seq = np.tile(np.repeat(np.arange(calls), keys), ranks)
    batch = pa.RecordBatch.from_pydict({
        "run_id": np.full(n, run.id, np.int32), "rank": np.repeat(np.arange(ranks, dtype=np.int32), calls * keys),
        "seq": seq, "step": seq, "key": np.tile([f"k{i}" for i in range(keys)], ranks * calls),
        "value": np.random.default_rng(0).random(n), "dtype": np.zeros(n, np.int16), "time": np.zeros(n),
    })
    with store.begin() as conn:
        store.backend.insert_metrics(conn, metrics, batch)
    store.close()
    return run.id


PER_RANK_COUNTS = "SELECT rank, count(*), count(DISTINCT (seq, key)), count(DISTINCT seq), min(seq), max(seq) FROM metrics"


def test_a_duckdb_reader_on_many_cores_has_memory_for_its_threads(tmp_path: Any, monkeypatch: Any) -> None:
    """A reader runs a DuckDB thread per CPU it may use, and its memory limit grows with them: at
    a fixed 64MB, a per-rank COUNT(DISTINCT ...) over 768k rows (the 256-sender benchmark's check,
    on the lent 16-core machine) failed with DuckDB's "Out of Memory Error" at 16 threads."""
    ranks, calls, keys = 256, 300, 10
    run_id = _wide_store(tmp_path / "wide.duckdb", ranks, calls, keys)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)))  # as on a 16-core machine
    reader = Store(tmp_path / "wide.duckdb", readonly=True)
    with reader.begin() as conn:
        settings = conn.exec_driver_sql(
            "SELECT current_setting('threads'), current_setting('memory_limit')").fetchone()
        per_rank = conn.exec_driver_sql(f"{PER_RANK_COUNTS} WHERE run_id = {run_id} GROUP BY rank").fetchall()
    reader.close()
    assert settings is not None and settings[0] == 16, settings
    assert sorted(per_rank) == [(r, calls * keys, calls * keys, calls, 0, calls - 1) for r in range(ranks)]


def test_a_users_query_is_not_held_to_the_readers_small_memory_limit(tmp_path: Any, monkeypatch: Any) -> None:
    """`sql` (a user's query) runs under DuckDB's own memory limit, and the reader's is back after
    it: under the reader's, a per-rank COUNT(DISTINCT ...) over 12.8M rows failed with DuckDB's
    "Out of Memory Error" (`multirank-logger sql`). Here the reader's limit is made 4 MB, so that a
    small store shows it."""
    from multirank_logger import open_store
    from multirank_logger.store.backends import store_files  # reader_config's place (no SQLAlchemy there)

    ranks, calls, keys = 16, 2_000, 10
    _wide_store(tmp_path / "wide.duckdb", ranks, calls, keys)
    monkeypatch.setattr(store_files, "READER_MEMORY_MB", 4)
    monkeypatch.setattr(store_files, "READER_MEMORY_MB_PER_THREAD", 1)
    counts = f"{PER_RANK_COUNTS} GROUP BY rank ORDER BY rank"
    with open_store(tmp_path / "wide.duckdb") as reader:
        with reader._connect() as conn, pytest.raises(sa.exc.OperationalError, match="Out of Memory"):
            conn.exec_driver_sql(counts).fetchall()  # the package's own reads' limit, in force
        got = reader.sql(counts)
        with reader._connect() as conn:
            limit = reader.store.backend.run_readonly(conn, "SELECT current_setting('memory_limit') AS m")
            after = conn.exec_driver_sql("SELECT current_setting('memory_limit')").scalar()
    assert got.values.tolist() == [[r, calls * keys, calls * keys, calls, 0, calls - 1] for r in range(ranks)]
    assert limit["m"][0] != after and after.endswith("MiB") and float(after.split()[0]) < 5, (limit, after)


def test_a_duckdb_reader_runs_on_the_cpus_the_job_was_given() -> None:
    """DuckDB's own default is a thread per core of the machine; a reader under `taskset -c 0` (as
    in a SLURM allocation or a container's cpuset) runs one, and the report's pass one key thread."""
    script = (
        "from multirank_logger.query.run_scan import KEY_THREADS\n"
        "from multirank_logger.store.backends.duckdb import reader_config\n"
        "print(reader_config()['threads'], reader_config()['memory_limit'], KEY_THREADS)\n"
    )
    out = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", script], capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == ["1", "64MB", "1"], out.stdout + out.stderr
