"""What differs between SQLite, DuckDB and PostgreSQL: the one place backend-specific code lives.

Everything else talks SQLAlchemy Core. Each backend says how to build its engine,
how to bulk-insert a batch of metric rows in one transaction, how to serialize
schema creation between processes, and how to turn its driver's errors into ours.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import itertools
import os
import re
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic.ddl.impl import DefaultImpl
from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.pool import NullPool

from multirank_logger.buffer import MetricBatch, as_arrow
from multirank_logger.errors import NotADatabase, StoreError, StoreLocked, UnsupportedStore

__all__ = ["SUFFIXES", "Backend", "backend_for", "resolve_url"]

# filesystem suffix -> SQLAlchemy drivername
SUFFIXES = {".duckdb": "duckdb", ".db": "sqlite", ".sqlite": "sqlite", ".sqlite3": "sqlite"}
SQLITE_BUSY_TIMEOUT_MS = 20_000
# rows per INSERT statement on SQLite, at most (see SQLiteBackend.insert_metrics)
_MAX_ROWS_PER_INSERT = 1_024


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


class SQLiteBackend(Backend):
    name = "sqlite"

    @property
    def path(self) -> Path | None:
        db = self.url.database
        return None if db in (None, "", ":memory:") else Path(db)

    def create_engine(self, readonly: bool = False) -> sa.Engine:
        url = self.url
        if readonly and self.path is not None:
            # mode=ro: the query side can never take a write lock that would block training
            url = url.set(database=f"file:{self.path}?mode=ro", query={"uri": "true"})
        engine = sa.create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            # take transaction control from pysqlite so BEGIN is ours (below)
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
            if not readonly:
                # WAL lets readers run beside the writers; NORMAL is safe with WAL
                _switch_to_wal(cur)
                cur.execute("PRAGMA synchronous = NORMAL")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: sa.Connection) -> None:
            # IMMEDIATE takes the write lock up front, so waiting writers queue on
            # busy_timeout instead of failing to upgrade a read lock (SQLITE_BUSY)
            conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")

        return engine

    def insert_metrics(self, conn: sa.Connection, table: sa.Table, batch: MetricBatch) -> None:
        # The driver's own cursor on positional tuples, fed lazily: a list of a big flush's
        # row tuples, all alive at once, kept the cyclic collector running full passes over
        # the process's heap. Many rows per statement: pysqlite gives the GIL up around each
        # statement's step, and a training thread busy in Python hands it back only every
        # switch interval (5 ms). One row per statement (executemany), a 20k-row flush took
        # 9.7 s beside such a thread (31 ms alone), and each hand-over stalled the training
        # thread; 1,024 rows per statement: 0.18 s (28 ms alone).
        columns = [c.name for c in table.columns]
        sql = str(table.insert().compile(dialect=conn.dialect, column_keys=columns))
        driver = conn.connection.driver_connection
        rows = zip(*batch.columns(columns))
        with _raised_as_sqlalchemy_would(conn, sql):
            for size, count in _statement_sizes(len(batch), _rows_per_insert(driver, len(columns))):
                groups = (tuple(itertools.chain.from_iterable(itertools.islice(rows, size))) for _ in range(count))
                driver.executemany(_multi_row(sql, size), groups)

    def translate_error(self, exc: Exception) -> Exception | None:
        text = str(getattr(exc, "orig", exc))
        if "file is not a database" in text or "database disk image is malformed" in text:
            return NotADatabase(str(self.path), "SQLite", text)
        if "database is locked" in text:
            hint = "It stayed locked past the busy timeout: look for a process stuck in a write."
            return StoreLocked(str(self.path), f"still locked after {SQLITE_BUSY_TIMEOUT_MS // 1000} s", hint)
        return None


def _rows_per_insert(driver: Any, columns: int) -> int:
    """The most rows one INSERT statement takes here (a power of two, at most 1,024): the
    SQLite library bounds the ``?`` of a statement (999 before 3.32, 32,766 since)."""
    if hasattr(driver, "getlimit"):  # Python 3.11+
        limit = driver.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    else:
        limit = 32_766 if sqlite3.sqlite_version_info >= (3, 32, 0) else 999
    most = 1
    while most * 2 <= min(_MAX_ROWS_PER_INSERT, limit // columns):
        most *= 2
    return most


def _statement_sizes(rows: int, most: int) -> list[tuple[int, int]]:
    """(rows per statement, statements) covering `rows`: as many of `most` as fit, then one
    statement per set bit of the rest, so that a few statement texts serve every batch (the
    driver keeps them prepared)."""
    out = [(most, rows // most)] if rows >= most else []
    size = most // 2
    while size:
        if rows % most & size:
            out.append((size, 1))
        size //= 2
    return out


@functools.lru_cache(maxsize=64)
def _multi_row(sql: str, rows: int) -> str:
    """A one-row ``INSERT ... VALUES (?, ...)`` as one of `rows` rows."""
    head, values = sql.rsplit(" VALUES ", 1)
    return f"{head} VALUES {', '.join([values] * rows)}"


@contextlib.contextmanager
def _raised_as_sqlalchemy_would(conn: sa.Connection, sql: str) -> Iterator[None]:
    """A driver error met on the driver's own cursor, raised as SQLAlchemy's DBAPIError, as
    for every other statement (the store translates those: a locked file, not a database)."""
    dbapi_error = conn.dialect.loaded_dbapi.Error
    try:
        yield
    except dbapi_error as exc:
        raise sa.exc.DBAPIError.instance(sql, None, exc, dbapi_error) from exc


def _switch_to_wal(cursor: Any) -> None:
    """Put a SQLite file in WAL mode, waiting while another process does the same.

    SQLite does not call its busy handler for a journal-mode change, so two processes
    opening a new file at once can get "database is locked" at once: retry, bounded.
    """
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


class DuckDBBackend(Backend):
    name = "duckdb"
    concurrent_writers = False
    opens_per_transaction = True  # see create_engine
    inserts_arrow = True

    @property
    def path(self) -> Path | None:
        db = self.url.database
        return None if db in (None, "", ":memory:") else Path(db)

    def create_engine(self, readonly: bool = False) -> sa.Engine:
        # Rows come and go as Arrow tables: load pyarrow with the store (~0.15 s of CPU), not
        # in the writer thread's first flush, where it competes with the training for a core.
        import pyarrow  # noqa: F401

        # NullPool: the file is open only inside a transaction, so that between two
        # flushes another process (a reader, `multirank-logger sql`) can open it.
        connect_args: dict[str, Any] = {"read_only": readonly}
        if readonly:
            # a reader sees the store and nothing else: no read_csv('/etc/passwd'), COPY TO, ATTACH, INSTALL
            connect_args["config"] = {"enable_external_access": False}
        else:
            # one thread: DuckDB's default is one per core, and a writer inserting a few thousand
            # rows then checkpointing gains nothing from them but CPU taken from the training
            # (measured: -30% CPU per 20k-row flush, wall time the same)
            connect_args["config"] = {"threads": 1}
        return sa.create_engine(self.url, poolclass=NullPool, connect_args=connect_args)

    def insert_metrics(self, conn: sa.Connection, table: sa.Table, batch: MetricBatch) -> None:
        # DuckDB's executemany runs row by row (~1,400 rows/s); from Arrow it takes millions.
        # duckdb_engine turns the "register" statement into DuckDBPyConnection.register.
        view = "_multirank_batch"
        # a MetricBatch, or already a pyarrow.Table (`inserts_arrow`)
        conn.exec_driver_sql("register", (view, as_arrow(batch)))
        cols = ", ".join(f'"{c.name}"' for c in table.columns)
        conn.exec_driver_sql(f'INSERT INTO "{table.name}" ({cols}) SELECT {cols} FROM {view}')
        conn.connection.driver_connection.unregister(view)

    def insert_rows(self, conn: sa.Connection, table: sa.Table, rows: list[dict[str, Any]]) -> int:
        # executemany runs row by row here (~1,400 rows/s): go through Arrow as the metrics do
        import pyarrow as pa

        if not rows:
            return 0
        columns = [c.name for c in table.columns]
        view = f"_multirank_{table.name}"
        data = pa.Table.from_pylist([{c: row.get(c) for c in columns} for row in rows])
        conn.exec_driver_sql("register", (view, data))
        cols = ", ".join(f'"{c}"' for c in columns)
        conn.exec_driver_sql(f'INSERT INTO "{table.name}" ({cols}) SELECT {cols} FROM {view}')
        conn.connection.driver_connection.unregister(view)
        return len(rows)

    def translate_error(self, exc: Exception) -> Exception | None:
        text = str(getattr(exc, "orig", exc))
        if "Could not set lock on file" in text:
            holder = re.search(r"Conflicting lock is held in (.*?)(?: See also|$)", text)
            return StoreLocked(str(self.path), holder.group(1).strip().rstrip(".") if holder else text)
        if "not a valid DuckDB database file" in text:
            return NotADatabase(str(self.path), "DuckDB", "no DuckDB header")
        if "Corrupt database file" in text:
            return NotADatabase(str(self.path), "DuckDB", "its header checksum does not match")
        if "created with a newer version of DuckDB" in text:
            import duckdb

            found = re.search(r"version number (\d+)", text)
            detail = f"storage version {found.group(1)}" if found else "a newer storage format"
            return StoreError(
                f"{self.path} was written by a newer DuckDB ({detail}) than the duckdb {duckdb.__version__} "
                "installed here, which cannot read it. It was left untouched; open it where that newer "
                "DuckDB is installed, or log to another file."
            )
        return None


class PostgreSQLBackend(Backend):
    name = "postgresql"

    def create_engine(self, readonly: bool = False) -> sa.Engine:
        options = "-c default_transaction_read_only=on" if readonly else ""
        return sa.create_engine(self.url, connect_args={"options": options} if options else {})

    def insert_metrics(self, conn: sa.Connection, table: sa.Table, batch: MetricBatch) -> None:
        cursor = conn.connection.driver_connection.cursor()
        if not hasattr(cursor, "copy"):  # psycopg2: SQLAlchemy's executemany
            super().insert_metrics(conn, table, batch)
            return
        # psycopg 3: COPY streams the rows in one statement, the server's own bulk path
        columns = [c.name for c in table.columns]
        sql = f"COPY {table.name} ({', '.join(columns)}) FROM STDIN"
        with _raised_as_sqlalchemy_would(conn, sql), cursor.copy(sql) as copy:
            for row in zip(*batch.columns(columns)):
                copy.write_row(row)

    def lock_for_migration(self, conn: sa.Connection) -> None:
        # a transaction-scoped advisory lock: released at commit, even if the process dies
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": 0x6D726C67})


class AlembicDuckDBImpl(DefaultImpl):
    """Lets Alembic accept the duckdb dialect (duckdb_engine's documented recipe)."""

    __dialect__ = "duckdb"
    transactional_ddl = True


_BACKENDS: dict[str, type[Backend]] = {
    "sqlite": SQLiteBackend,
    "duckdb": DuckDBBackend,
    "postgresql": PostgreSQLBackend,
}


def backend_for(url: URL) -> Backend:
    """The Backend object for a resolved URL."""
    return _BACKENDS[url.get_backend_name()](url)
