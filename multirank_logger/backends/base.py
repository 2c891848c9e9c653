"""What the SQL backends share: URL resolution and the Backend defaults each backend overrides.

Everything else talks SQLAlchemy Core. Each backend (one module per backend, next to this one)
says how to build its engine, how to bulk-insert a batch of metric rows in one transaction, how
to serialize schema creation between processes, and how to turn its driver's errors into ours.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url

from multirank_logger.buffer import MetricBatch
from multirank_logger.errors import UnsupportedStore

__all__ = ["SUFFIXES", "Backend", "resolve_url"]

# filesystem suffix -> SQLAlchemy drivername
SUFFIXES = {".duckdb": "duckdb", ".db": "sqlite", ".sqlite": "sqlite", ".sqlite3": "sqlite"}


def resolve_url(db: str | os.PathLike[str] | URL) -> URL:
    """Turn a filesystem path or a SQLAlchemy URL into a URL, choosing the backend by suffix.

    Raises:
        UnsupportedStore: for a path whose suffix names no backend we write.
    """
    if isinstance(db, URL):
        return db
    text = os.fspath(db)
    if re.match(r"^[a-z][a-z0-9+]*://", text):
        url = make_url(text)
        if url.get_backend_name() not in ("sqlite", "duckdb", "postgresql"):
            raise UnsupportedStore(text, SUFFIXES)
        return _with_postgres_driver(url)
    suffix = Path(text).suffix.lower()
    if suffix not in SUFFIXES:
        raise UnsupportedStore(text, SUFFIXES)
    return URL.create(SUFFIXES[suffix], database=str(Path(text).expanduser().resolve()))


def _with_postgres_driver(url: URL) -> URL:
    """``postgresql://`` means psycopg2 to SQLAlchemy; our ``postgres`` extra installs psycopg 3.
    Take psycopg 3 when the URL names no driver and psycopg2 is not there."""
    if url.drivername == "postgresql" and importlib.util.find_spec("psycopg2") is None:
        if importlib.util.find_spec("psycopg") is not None:
            return url.set(drivername="postgresql+psycopg")
    return url


class Backend:
    """Defaults shared by the SQL backends; subclasses override what differs."""

    name = "generic"
    #: True when several processes may write the store at once.
    concurrent_writers = True
    #: True when every transaction opens and closes the database (so that readers get in
    #: between): a write costs ~20 ms whatever its size, and writers should write seldom.
    opens_per_transaction = False
    #: insert_metrics also takes a pyarrow.Table (DuckDB): rank 0 then keeps received rows as Arrow
    inserts_arrow = False

    def __init__(self, url: URL) -> None:
        self.url = url

    @property
    def path(self) -> Path | None:
        """The database file, or None for a server."""
        return None

    def create_engine(self, readonly: bool = False) -> sa.Engine:
        return sa.create_engine(self.url)

    def insert_metrics(self, conn: sa.Connection, table: sa.Table, batch: MetricBatch) -> None:
        """Insert one batch of metric rows on an open transaction (SQLAlchemy's executemany)."""
        columns = [c.name for c in table.columns]
        conn.execute(table.insert(), [dict(zip(columns, row)) for row in zip(*batch.columns(columns))])

    def insert_rows(self, conn: sa.Connection, table: sa.Table, rows: list[dict[str, Any]]) -> int:
        """Insert a few rows of any table given as dicts (the side tables); returns how many."""
        if rows:
            columns = [c.name for c in table.columns]
            conn.execute(table.insert(), [{c: row.get(c) for c in columns} for row in rows])
        return len(rows)

    def lock_for_migration(self, conn: sa.Connection) -> None:
        """Serialize schema creation between processes, on `conn`'s open transaction."""

    def translate_error(self, exc: Exception) -> Exception | None:
        """Our error for a driver error met while opening the store, or None."""
        return None


@contextlib.contextmanager
def _raised_as_sqlalchemy_would(conn: sa.Connection, sql: str) -> Iterator[None]:
    """A driver error met on the driver's own cursor, raised as SQLAlchemy's DBAPIError, as
    for every other statement (the store translates those: a locked file, not a database)."""
    dbapi_error = conn.dialect.loaded_dbapi.Error
    try:
        yield
    except dbapi_error as exc:
        raise sa.exc.DBAPIError.instance(sql, None, exc, dbapi_error) from exc
