"""The store, its migrations and the query side on a real PostgreSQL server (pgserver).

What only a server has: its driver, its advisory lock, its read-only sessions. The checks
every backend shares run on PostgreSQL through the `any_db` fixture (conftest.py: a new
database on one server started for the session), in the modules that own them; the 2-rank
DDP trainings on PostgreSQL are in test_logger_ddp.py, beside SQLite's and DuckDB's.
"""

from __future__ import annotations

import multiprocessing as mp

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from multirank_logger.errors import SchemaOutdated
from multirank_logger.query import open_store
from multirank_logger.schema import metadata, runs
from multirank_logger.store import Store, head_revision
from tests import test_migrations, test_store


def test_plain_postgresql_url_uses_the_installed_driver(postgres_url: str) -> None:
    """``postgresql://`` works with psycopg 3 (our ``postgres`` extra), not only psycopg2."""
    store = Store(postgres_url)
    assert store.url.get_backend_name() == "postgresql"
    assert store.engine.dialect.driver in ("psycopg", "psycopg2")
    store.close()


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
