"""What differs between SQLite, DuckDB and PostgreSQL: the one place backend-specific code lives.

One module per backend (`sqlite`, `duckdb`, `postgresql`), each a subclass of `base.Backend`;
`backend_for` picks one for a resolved URL.
"""

from __future__ import annotations

from sqlalchemy.engine import URL

from multirank_logger.store.backends.base import (
    BACKEND_NAMES,
    SUFFIXES,
    Backend,
    names_a_store,
    public_name,
    resolve_url,
    without_secrets,
)
from multirank_logger.store.backends.duckdb import DuckDBBackend, register_alembic_impl
from multirank_logger.store.backends.postgresql import PostgreSQLBackend
from multirank_logger.store.backends.sqlite import SQLITE_BUSY_TIMEOUT_MS, SQLiteBackend

__all__ = [
    "BACKEND_NAMES",
    "SQLITE_BUSY_TIMEOUT_MS",
    "SUFFIXES",
    "Backend",
    "DuckDBBackend",
    "PostgreSQLBackend",
    "SQLiteBackend",
    "backend_for",
    "names_a_store",
    "public_name",
    "without_secrets",
    "register_alembic_impl",
    "resolve_url",
]

_BACKENDS: dict[str, type[Backend]] = {b.name: b for b in (SQLiteBackend, DuckDBBackend, PostgreSQLBackend)}


def backend_for(url: URL) -> Backend:
    """The Backend object for a resolved URL."""
    return _BACKENDS[url.get_backend_name()](url)
