"""Alembic environment for multirank_logger stores (SQLite, DuckDB, PostgreSQL).

The package runs migrations through `multirank_logger.store.sql_store.Store`, which passes an
open connection in `config.attributes["connection"]`, already inside a transaction
that holds the backend's migration lock.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from multirank_logger.rows.schema import metadata
from multirank_logger.store.backends import register_alembic_impl

register_alembic_impl()  # Alembic's DuckDB dialect (for `alembic` run on its own, too)


def _run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=True,  # SQLite can only ALTER by copying the table
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(context.config.get_main_option("sqlalchemy.url"))
    with engine.begin() as conn:
        _run(conn)


if context.is_offline_mode():
    context.configure(url=context.config.get_main_option("sqlalchemy.url"), target_metadata=metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
