"""SQLite: a file that several processes write at once (WAL, busy timeout, BEGIN IMMEDIATE)."""

from __future__ import annotations

import functools
import itertools
import sqlite3
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

from multirank_logger.backends.base import Backend, _raised_as_sqlalchemy_would
from multirank_logger.buffer import MetricBatch
from multirank_logger.errors import NotADatabase, StoreLocked

__all__ = ["SQLITE_BUSY_TIMEOUT_MS", "SQLiteBackend"]

SQLITE_BUSY_TIMEOUT_MS = 20_000
# rows per INSERT statement on SQLite, at most (see SQLiteBackend.insert_metrics)
_MAX_ROWS_PER_INSERT = 1_024


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
