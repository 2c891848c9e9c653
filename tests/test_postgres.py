"""The store, its migrations and the query side on a real PostgreSQL server (pgserver).

What only a server has: its driver, its advisory lock, its read-only sessions. The checks
every backend shares run on PostgreSQL through the `any_db` fixture (conftest.py: a new
database on one server started for the session), in the modules that own them; the 2-rank
DDP trainings on PostgreSQL are in test_logger_ddp.py, beside SQLite's and DuckDB's.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from multirank_logger.model.schema import metadata
from multirank_logger.query.reader import open_store
from multirank_logger.store.sql_store import Store


def test_plain_postgresql_url_uses_psycopg_3(postgres_url: str) -> None:
    """``postgresql://`` takes psycopg 3 (our ``postgres`` extra) even with psycopg2 installed
    beside it (the test extras install both); ``postgresql+psycopg2://`` still takes psycopg2."""
    import psycopg2  # noqa: F401 - installed: it must not take psycopg 3's place

    store = Store(postgres_url)
    assert store.url.get_backend_name() == "postgresql"
    assert store.engine.dialect.driver == "psycopg"
    store.close()
    store = Store(postgres_url.replace("postgresql://", "postgresql+psycopg2://", 1))
    assert store.engine.dialect.driver == "psycopg2"
    store.close()


def test_schema_at_head_equals_metadata(postgres_url: str) -> None:
    """Alembic's own comparison finds nothing between the migrated schema and schema.py."""
    store = Store(postgres_url)
    with store.begin() as conn:
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
    store.close()


def test_reader_refuses_writes(postgres_url: str) -> None:
    """The query side's connection is read-only on the server too, not only by its parser."""
    Store(postgres_url).create_run("lightning_logs")
    with open_store(postgres_url) as reader:
        assert list(reader.runs()["name"]) == ["lightning_logs"]
        with reader.store.engine.connect() as conn, pytest.raises(sa.exc.DBAPIError, match="read-only"):
            conn.execute(sa.text("DELETE FROM runs"))


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://trainer:s3cret@db-host/runs",
        "postgresql://trainer@db-host/runs?password=s3cret&sslmode=require",
        "postgresql+psycopg://trainer@db-host/runs?sslpassword=s3cret",
    ],
)
def test_the_name_shown_and_shared_holds_no_password(url: str) -> None:
    """What messages show and ranks exchange (`public_name`) drops a password wherever libpq
    takes it: in the userinfo and as a query parameter; the rest of the URL stays."""
    from multirank_logger.store.backends import public_name

    shown = public_name(url)
    assert "s3cret" not in shown and "trainer@db-host/runs" in shown
    assert ("sslmode=require" in shown) == ("sslmode=require" in url)
