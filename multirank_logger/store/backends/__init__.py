"""What differs between SQLite, DuckDB and PostgreSQL: the one place backend-specific code lives.

One module per backend (`sqlite`, `duckdb`, `postgresql`), each a subclass of `base.Backend`;
`backend_for` picks one for a URL `store_urls.resolve_url` resolved. `store_files` reads an embedded store's file through
its own driver, without SQLAlchemy (a short command's cold start).

The names below are imported on first use (PEP 562): importing a module of this package (say
`store_files`) runs this file first, and SQLAlchemy is most of a cold command's start.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

    from multirank_logger.store.backends.base import Backend
    from multirank_logger.store.backends.duckdb import DuckDBBackend, register_alembic_impl
    from multirank_logger.store.backends.postgresql import PostgreSQLBackend
    from multirank_logger.store.backends.sqlite import SQLiteBackend
    from multirank_logger.store.backends.store_files import SQLITE_BUSY_TIMEOUT_MS, SUFFIXES
    from multirank_logger.store.backends.store_urls import (
        BACKEND_NAMES,
        names_a_store,
        public_name,
        resolve_url,
        without_secrets,
    )

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

_LAZY = {
    **dict.fromkeys(("BACKEND_NAMES", "names_a_store", "public_name", "resolve_url", "without_secrets"), "store_urls"),
    "Backend": "base",
    "DuckDBBackend": "duckdb", "register_alembic_impl": "duckdb", "PostgreSQLBackend": "postgresql",
    "SQLiteBackend": "sqlite", "SQLITE_BUSY_TIMEOUT_MS": "store_files", "SUFFIXES": "store_files",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def backend_for(url: URL) -> Backend:
    """The Backend object for a resolved URL."""
    from multirank_logger.store.backends.duckdb import DuckDBBackend
    from multirank_logger.store.backends.postgresql import PostgreSQLBackend
    from multirank_logger.store.backends.sqlite import SQLiteBackend

    backends: dict[str, type[Backend]] = {b.name: b for b in (SQLiteBackend, DuckDBBackend, PostgreSQLBackend)}
    return backends[url.get_backend_name()](url)
