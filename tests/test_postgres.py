"""The store, its migrations and the query side on a real PostgreSQL server (pgserver).

The embedded backends' checks, run against a server: each test gets a new database on
one server started for the session (see conftest.py). The 2-rank DDP trainings on
PostgreSQL are in test_logger_ddp.py, beside SQLite's and DuckDB's.
"""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from multirank_logger.errors import SchemaOutdated
from multirank_logger.query import open_store
from multirank_logger.schema import metadata, runs
from multirank_logger.store import Store, head_revision
from tests import test_cli, test_migrations, test_query, test_store


def test_plain_postgresql_url_uses_the_installed_driver(postgres_url: str) -> None:
    """``postgresql://`` works with psycopg 3 (our ``postgres`` extra), not only psycopg2."""
    store = Store(postgres_url)
    assert store.url.get_backend_name() == "postgresql"
    assert store.engine.dialect.driver in ("psycopg", "psycopg2")
    store.close()


def test_values_round_trip_exactly(postgres_url: str) -> None:
    """NaN, +/-inf, ints up to 2^53, bools and -0.0 come back as the Python scalars logged."""
    test_store.test_values_round_trip_exactly(postgres_url)


def test_tricky_key_names_are_stored_verbatim(postgres_url: str) -> None:
    test_store.test_tricky_key_names_are_stored_verbatim(postgres_url)


def test_bulk_write_is_one_transaction(postgres_url: str) -> None:
    test_store.test_bulk_write_is_one_transaction(postgres_url)


def test_walk_every_revision_up_and_down(postgres_url: str) -> None:
    test_migrations.test_walk_every_revision_up_and_down(postgres_url)


def test_schema_at_head_equals_metadata(postgres_url: str) -> None:
    """Alembic's own comparison finds nothing between the migrated schema and schema.py."""
    store = Store(postgres_url)
    with store.begin() as conn:
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
    store.close()


def test_store_behind_head_is_refused_with_the_upgrade_command(postgres_url: str) -> None:
    revisions = test_migrations._revisions_base_first()
    old = Store.for_upgrade(postgres_url)
    old.upgrade(revisions[-2])
    old.close()
    with pytest.raises(SchemaOutdated, match="multirank-logger db upgrade"):
        Store(postgres_url)
    Store.for_upgrade(postgres_url).upgrade()
    assert Store(postgres_url).current_revision() == head_revision()


def test_concurrent_creation_and_runs_do_not_race(postgres_url: str) -> None:
    """Eight processes creating the schema and a run at once (the advisory lock) all succeed,
    with distinct versions."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(8), ctx.Queue()
    procs = [ctx.Process(target=test_store._open_and_create_run, args=(postgres_url, barrier, out)) for _ in range(8)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    assert [proc.exitcode for proc in procs] == [0] * 8
    versions = sorted(out.get(timeout=5)[1] for _ in procs)
    assert versions == list(range(8))
    store = Store(postgres_url)
    with store.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(runs)).scalar_one() == 8
    store.close()


def test_reader_refuses_writes(postgres_url: str) -> None:
    """The query side's connection is read-only on the server too, not only by its parser."""
    Store(postgres_url).create_run("lightning_logs")
    with open_store(postgres_url) as reader:
        assert list(reader.runs()["name"]) == ["lightning_logs"]
        with reader.store.engine.connect() as conn, pytest.raises(sa.exc.DBAPIError, match="read-only"):
            conn.execute(sa.text("DELETE FROM runs"))


@pytest.fixture
def cli_store(postgres_url: str) -> str:
    """test_cli's store (two ranks of test_query's calls, a finished run), on the server."""
    run_id = test_query._store_calls(postgres_url, {0: test_query._calls(0), 1: test_query._calls(1)})
    writer = Store(postgres_url)
    writer.update_run(run_id, status="success", started_at=test_cli.T0, ended_at=test_cli.T0 + 75)
    writer.close()
    return postgres_url


def test_cli_export_is_csvloggers_file(cli_store: str, tmp_path: Path) -> None:
    test_cli.test_export_writes_rank0_csv_to_stdout(cli_store, tmp_path)


def test_cli_sql_answers(cli_store: str) -> None:
    test_cli.test_sql_formats(cli_store, "csv", "rank,n\n0,3\n1,3\n")


def test_cli_sql_write_is_refused_and_changes_nothing(cli_store: str) -> None:
    test_cli.test_sql_write_is_refused_and_changes_nothing(cli_store)


@pytest.mark.parametrize("fetch_rows", [1, 5])
def test_export_streamed_a_few_rows_at_a_time_is_the_same_file(
    postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fetch_rows: int
) -> None:
    """A server's rows stream through its own cursor, re-cut at call edges."""
    test_query.test_export_streamed_a_few_rows_at_a_time_is_the_same_file(postgres_url, tmp_path, monkeypatch, fetch_rows)  # type: ignore[arg-type]


def test_export_reads_one_state_of_a_store_still_written(
    postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server's export reads the keys and the rows in one snapshot (REPEATABLE READ)."""
    test_query.test_export_reads_one_state_of_a_store_still_written(postgres_url, tmp_path, monkeypatch)  # type: ignore[arg-type]
