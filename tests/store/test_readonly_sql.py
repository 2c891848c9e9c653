"""`open_store(db).sql(...)` is read-only on every backend: each bypass we could think of, tried
on real DuckDB and SQLite files and on the real PostgreSQL server of conftest.py.

Each refused query must raise (ReadOnlyViolation, or QueryFailed where the engine itself
rejects it) and leave the store, and the world outside it, unchanged.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from multirank_logger import open_store
from multirank_logger.errors import QueryFailed, ReadOnlyViolation
from tests.helpers.built_stores import LOSS_ROWS, fill_loss_rows
from tests.helpers.stores import BACKEND_SUFFIXES, new_postgres_database

COUNT = "SELECT count(*) AS n FROM metrics"

# bypasses that every backend must refuse
COMMON = [
    "DELETE FROM metrics",
    "SELECT 1; DELETE FROM metrics",
    "SELECT 1 /* ; */ ; DELETE FROM metrics",
    "-- a comment\nDELETE FROM metrics",
    "/* SELECT */ DELETE FROM metrics",
    "UPDATE metrics SET value = 0",
    "DROP TABLE runs",
    "CREATE TABLE t AS SELECT 1 AS x",
    "CREATE TEMP TABLE t AS SELECT 1 AS x",
    "COMMIT; DELETE FROM metrics",
    "ROLLBACK; DELETE FROM metrics",
    "BEGIN; DELETE FROM metrics; COMMIT",
    "INSERT INTO runs (name, version) VALUES ('x', 99)",
]
POSTGRES = [
    "SET TRANSACTION READ WRITE; DELETE FROM metrics",  # the query of issue 13 item 4
    "SET TRANSACTION READ WRITE",
    "WITH gone AS (DELETE FROM metrics RETURNING *) SELECT count(*) FROM gone",
    "SELECT 1; SET ROLE postgres; DELETE FROM metrics",
    "COPY metrics TO PROGRAM 'touch {marker}'",
    "COPY (SELECT 1) TO '{marker}'",
    "SELECT pg_read_file('/etc/passwd')",
    "SELECT lo_import('/etc/passwd')",
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid()",
    "DO $$ BEGIN DELETE FROM metrics; END $$",
    "CALL nonexistent()",
    "CREATE EXTENSION dblink",
    "SELECT pg_sleep(0); DELETE FROM metrics",
]
DUCKDB = [
    "WITH gone AS (DELETE FROM metrics RETURNING *) SELECT count(*) FROM gone",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_text('/etc/passwd')",
    "SELECT * FROM glob('/etc/*')",
    "COPY metrics TO '{marker}'",
    "COPY (SELECT 1) TO '{marker}' (FORMAT csv)",
    "EXPORT DATABASE '{marker}'",
    "ATTACH '{marker}' AS other",
    "INSTALL httpfs",
    "LOAD httpfs",
    "PRAGMA enable_profiling",
    "CALL checkpoint()",
    "CHECKPOINT",
    "SET threads = 1",
    "SET enable_external_access = true",
    "SELECT 1; SET enable_external_access = true",
    "PIVOT metrics ON key USING sum(value)",
    "CREATE MACRO m() AS 1",
    "EXPLAIN ANALYZE DELETE FROM metrics",
]
SQLITE = [
    "ATTACH '{marker}' AS other",
    "SELECT load_extension('{marker}')",
    "PRAGMA writable_schema = 1",
    "PRAGMA journal_mode = delete",
    "VACUUM INTO '{marker}'",
    "WITH x AS (SELECT 1) DELETE FROM metrics",
]
BY_BACKEND = {"postgresql": POSTGRES, "duckdb": DUCKDB, "sqlite": SQLITE}


CASES = [(backend, q) for backend, own in BY_BACKEND.items() for q in COMMON + own]


def _new_store(request: pytest.FixtureRequest, tmp_path: Path, backend: str) -> str:
    if backend == "postgresql":
        db = new_postgres_database(request.getfixturevalue("postgres_server"))
    else:
        db = str(tmp_path / f"runs{BACKEND_SUFFIXES[backend]}")
    fill_loss_rows(db)
    return db


@pytest.fixture
def filled(any_db: str) -> str:
    fill_loss_rows(any_db)
    return any_db


@pytest.mark.parametrize(("backend", "query"), CASES)
def test_sql_bypass_is_refused_and_changes_nothing(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str, query: str
) -> None:
    """Each bypass raises, and afterwards the store holds every row and no file was written."""
    filled = _new_store(request, tmp_path, backend)
    marker = tmp_path / "marker"
    with pytest.raises((ReadOnlyViolation, QueryFailed)):
        open_store(filled).sql(query.format(marker=marker))
    assert open_store(filled).sql(COUNT)["n"].tolist() == [LOSS_ROWS]
    assert not marker.exists()


def test_the_issue_query_is_a_read_only_violation_on_postgres(postgres_url: str) -> None:
    """Issue 13 item 4: 'SET TRANSACTION READ WRITE; DELETE FROM metrics' deleted every row."""
    fill_loss_rows(postgres_url)
    with pytest.raises(ReadOnlyViolation):
        open_store(postgres_url).sql("SET TRANSACTION READ WRITE; DELETE FROM metrics")
    with pytest.raises(ReadOnlyViolation):
        open_store(postgres_url).sql("WITH gone AS (DELETE FROM metrics RETURNING *) SELECT count(*) FROM gone")
    assert open_store(postgres_url).sql(COUNT)["n"].tolist() == [LOSS_ROWS]


def test_postgres_settings_a_query_changes_do_not_outlive_it(postgres_url: str) -> None:
    """set_config(..., false) inside the query is rolled back with it: the next write on the same
    reader (the same pooled connection) is still refused."""
    fill_loss_rows(postgres_url)
    reader = open_store(postgres_url)
    reader.sql(
        "SELECT set_config('default_transaction_read_only', 'off', false), set_config('role', 'postgres', false)"
    )
    with pytest.raises(ReadOnlyViolation):
        reader.sql("WITH gone AS (DELETE FROM metrics RETURNING *) SELECT count(*) FROM gone")
    assert reader.sql(COUNT)["n"].tolist() == [LOSS_ROWS]


@pytest.mark.parametrize(
    "query",
    [
        "SELECT count(*) AS n FROM metrics",
        "-- rows\nSELECT count(*) AS n FROM metrics",
        "/* rows */ WITH m AS (SELECT * FROM metrics) SELECT count(*) AS n FROM m",
    ],
)
def test_sql_still_reads(filled: str, query: str) -> None:
    """Comments, CTEs and parentheses around a read are fine on every backend."""
    assert open_store(filled).sql(query)["n"].tolist() == [LOSS_ROWS]


def test_postgres_statement_timeout_bounds_a_query(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A query past the statement timeout is cancelled by the server, with its message."""
    from multirank_logger.store.backends import PostgreSQLBackend

    fill_loss_rows(postgres_url)
    monkeypatch.setattr(PostgreSQLBackend, "statement_timeout_s", 0.2)
    with pytest.raises(QueryFailed, match="statement timeout"):
        open_store(postgres_url).sql("SELECT pg_sleep(5)")
