"""SQLite: a file that several processes write at once (WAL, busy timeout, BEGIN IMMEDIATE).

Reads follow the primary key (run_id, key, rank, seq): a run's keys, and one key's ranks,
by skipping along it; a rank's rows as one range read per key, merged into call order.
"""

from __future__ import annotations

import functools
import itertools
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy import event

from multirank_logger.errors import DamagedStore, NotADatabase, QueryFailed, StoreLocked
from multirank_logger.rows.csv_layout import LongRows, in_call_order, row_columns
from multirank_logger.rows.schema import DTYPE_NAN, DTYPE_NEG_ZERO, DTYPE_OF_TYPE, metrics
from multirank_logger.store.backends.base import (
    FULL_CHECK_BYTES,
    Backend,
    StoreFileFacts,
    _chunks,
    _raised_as_sqlalchemy_would,
    driver_connection,
    per_rank_columns,
)
from multirank_logger.store.backends.readonly_sql import refusal_or_failure
from multirank_logger.store.backends.sqlite_arrow import arrow_chunks, file_uri
from multirank_logger.store.backends.store_files import SQLITE_BUSY_TIMEOUT_MS, sqlite_readonly_uri

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["SQLITE_BUSY_TIMEOUT_MS", "SQLiteBackend"]

# rows per INSERT statement on SQLite, at most (see SQLiteBackend.insert_metrics)
_MAX_ROWS_PER_INSERT = 1_024
# dtype codes are below this, so seq * _DTYPE_SPAN + dtype carries both (seq < 2**59: a call counter)
_DTYPE_SPAN = 8
assert max(DTYPE_OF_TYPE.values()) < _DTYPE_SPAN and max(DTYPE_NAN, DTYPE_NEG_ZERO) < _DTYPE_SPAN
# seq and dtype come packed in one int: each column fetched costs time per row
_SEQ_DTYPE = (metrics.c.seq * _DTYPE_SPAN + metrics.c.dtype).label("seq_dtype")
# the ranks that logged one key of a run, skipping along the primary key
_KEY_RANKS = sa.text(
    "WITH RECURSIVE r(rank) AS ("
    " SELECT min(rank) FROM metrics WHERE run_id = :run AND key = :key"
    " UNION ALL"
    " SELECT (SELECT min(rank) FROM metrics WHERE run_id = :run AND key = :key AND rank > r.rank)"
    " FROM r WHERE r.rank IS NOT NULL"
    ") SELECT rank FROM r WHERE rank IS NOT NULL"
)
# a run's distinct keys, by skipping from one key to the next along the primary key
_RUN_KEYS = sa.text(
    "WITH RECURSIVE k(key) AS ("
    " SELECT min(key) FROM metrics WHERE run_id = :run"
    " UNION ALL"
    " SELECT (SELECT min(key) FROM metrics WHERE run_id = :run AND key > k.key) FROM k WHERE k.key IS NOT NULL"
    ") SELECT key FROM k WHERE key IS NOT NULL"
)
# PRAGMAs that only describe the store
_READ_PRAGMAS = {
    "table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo",
    "foreign_key_list", "database_list", "collation_list", "compile_options",
    "function_list", "module_list", "pragma_list",
}
_READ_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}


class SQLiteBackend(Backend):
    name = "sqlite"
    locking_unsafe_on_network_fs = True  # SQLite's own FAQ: its POSIX locks are broken on NFS

    def has_table(self, conn: sa.Connection, name: str) -> bool:
        found = conn.execute(sa.text("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = :name"),
                             {"name": name}).scalar()
        return bool(found)

    @property
    def path(self) -> Path | None:
        db = self.url.database
        return None if db in (None, "", ":memory:") else Path(db)

    #: the URI a reader opens the file with (store_files.py: also read there without SQLAlchemy)
    _readonly_uri = staticmethod(sqlite_readonly_uri)

    def create_engine(self, readonly: bool = False) -> sa.Engine:
        url = self.url
        if readonly and self.path is not None:
            url = url.set(database=self._readonly_uri(self.path), query={"uri": "true"})
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

    def insert_metrics(self, conn: sa.Connection, table: sa.Table, batch: pa.RecordBatch) -> None:
        from multirank_logger.rows.batch import column_lists

        # The driver's own cursor on positional tuples, fed lazily: a list of a big flush's
        # row tuples, all alive at once, kept the cyclic collector running full passes over
        # the process's heap. Many rows per statement: pysqlite gives the GIL up around each
        # statement's step, and a training thread busy in Python hands it back only every
        # switch interval. One row per statement (executemany), a flush beside such a thread took
        # hundreds of times longer than alone, each hand-over stalling the training thread;
        # 1,024 rows per statement took about as long as alone (benchmarks/RESULTS.md).
        columns = [c.name for c in table.columns]
        sql = str(table.insert().compile(dialect=conn.dialect, column_keys=columns))
        driver = driver_connection(conn)
        rows = zip(*column_lists(batch, columns))
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

    def inspect_before_write(self) -> StoreFileFacts | None:
        # the driver's own read-only connection: no WAL switch, no journal, no lock held after it
        path = self.path
        if path is None or not path.is_file() or path.stat().st_size == 0:
            return None
        con = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=SQLITE_BUSY_TIMEOUT_MS / 1000)
        try:
            tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            tables = {name for name in tables if not name.startswith("sqlite_")}
            if path.stat().st_size <= FULL_CHECK_BYTES:
                # every page read and its b-tree checked: a damaged page anywhere is found now,
                # not when a query reaches it after a run was recorded there
                problems = [row[0] for row in con.execute("PRAGMA quick_check")]
                if problems != ["ok"]:
                    raise DamagedStore(str(path), "SQLite", "; ".join(problems[:3]))
            revision = None
            if "alembic_version" in tables:
                revision = con.execute("SELECT max(version_num) FROM alembic_version").fetchone()[0]
            columns = None
            if "runs" in tables:
                columns = frozenset(row[1] for row in con.execute("PRAGMA table_info(runs)"))
            return StoreFileFacts(frozenset(tables), revision, columns)
        except sqlite3.DatabaseError as exc:
            if "malformed" in str(exc):
                raise DamagedStore(str(path), "SQLite", str(exc)) from None
            raise self.translate_error(exc) or exc from None
        finally:
            con.close()

    # -- reading ---------------------------------------------------------------------------

    #: rows per fetch of one key's stream at least, however many keys a run has (rank_calls)
    min_key_fetch_rows = 1_024

    def row_chunks(self, conn: sa.Connection, stmt: sa.Select, rows: int = 0) -> Iterator[list[Any]]:
        # the driver's own cursor: SQLAlchemy's Row objects cost more than the fetch itself
        compiled = stmt.compile(dialect=conn.dialect)
        params = [compiled.params[name] for name in compiled.positiontup or ()]
        fetch = driver_connection(conn).execute(str(compiled), params).fetchmany
        yield from _chunks(fetch, rows or self.fetch_rows)

    def numpy_chunks(self, conn: sa.Connection, stmt: sa.Select, types: Sequence[type]) -> Iterator[list[np.ndarray]]:
        # the report's pass: through ADBC's C driver where installed (sqlite_arrow.py), not a
        # Python tuple a row
        uri = file_uri(self.path, self._readonly_uri)
        if uri is None or not self.arrow_reads:
            yield from super().numpy_chunks(conn, stmt, types)
            return
        yield from arrow_chunks(uri, conn, stmt, types, SQLITE_BUSY_TIMEOUT_MS)

    # the table is clustered by (run_id, key, rank, seq): one key's rows are one range read
    scan_by_key = True

    #: whether `numpy_chunks` reads through ADBC's driver where it is installed (tests read both ways)
    arrow_reads = True

    def run_keys(self, conn: sa.Connection, run_id: int) -> list[str]:
        # one seek per key, not a pass over every row of the run
        return list(conn.execute(_RUN_KEYS, {"run": run_id}).scalars())

    def per_rank_columns(self, conn: sa.Connection, run_id: int, key: str) -> list[np.ndarray]:
        # one range read per rank along the key: the rank comes from the loop, seq and dtype
        # as one int, as in rank_calls
        by_rank = sa.select(_SEQ_DTYPE, metrics.c.step, metrics.c.value).where(
            metrics.c.run_id == run_id, metrics.c.key == key
        )
        parts = []
        for rank in conn.execute(_KEY_RANKS, {"run": run_id, "key": key}).scalars():
            for chunk in self.row_chunks(conn, by_rank.where(metrics.c.rank == rank)):
                seq, step, value, dtype = _packed_columns(chunk)
                parts.append((np.full(len(seq), rank, np.int64), seq, step, value, dtype))
        return per_rank_columns(parts)

    def hold_snapshot(self, conn: sa.Connection) -> None:
        """Nothing to do: a reader's BEGIN (create_engine) holds one snapshot from its first read."""

    def rank_calls(self, conn: sa.Connection, run_id: int, rank: int) -> tuple[list[str], Iterator[LongRows]]:
        # One range read per key, each in call order, merged by `in_call_order`. The key comes
        # from the loop instead of a str per row, seq and dtype as one int (half the time per
        # row of reading every column).
        by_key = sa.select(_SEQ_DTYPE, metrics.c.step, metrics.c.value).where(
            metrics.c.run_id == run_id, metrics.c.rank == rank
        )
        run_keys = self.run_keys(conn, run_id)
        # the fetches held at once stay about fetch_rows rows together
        fetch_rows = max(self.min_key_fetch_rows, self.fetch_rows // max(len(run_keys), 1))
        streams = {}
        for key in run_keys:
            chunks = self.row_chunks(conn, by_key.where(metrics.c.key == key), fetch_rows)
            first = next(chunks, None)
            if first:  # a key only other ranks logged is no column of this rank's file
                streams[key] = _key_pieces(key, itertools.chain([first], chunks))
        return list(streams), in_call_order(streams.values())

    def run_readonly(self, conn: sa.Connection, query: str) -> Any:
        # SQLite's authorizer sees every action a statement takes: a read-only connection
        # alone would still let ATTACH (a new file) through
        import pandas as pd

        raw = driver_connection(conn)
        raw.set_authorizer(_authorizer)
        try:
            cursor = raw.execute(query)
            names = [d[0] for d in cursor.description or ()]
            rows = cursor.fetchall()
        except sqlite3.Warning as exc:  # "You can only execute one statement at a time."
            raise QueryFailed("SQLite", str(exc)) from None
        except sqlite3.Error as exc:
            raise refusal_or_failure("SQLite", query, exc) from None
        finally:
            raw.set_authorizer(None)
        return pd.DataFrame.from_records(rows, columns=names)


def _authorizer(action: int, arg1: str | None, arg2: str | None, db: str | None, trigger: str | None) -> int:
    if action in _READ_ACTIONS:
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() in _READ_PRAGMAS:
        return sqlite3.SQLITE_OK
    return sqlite3.SQLITE_DENY


def _key_pieces(key: str, chunks: Iterable[list[Any]]) -> Iterator[LongRows]:
    """Driver rows (_SEQ_DTYPE, step, value) of one key as LongRows, a fetch at a time."""
    for chunk in chunks:
        seq, step, value, dtype = _packed_columns(chunk)
        yield LongRows(seq, step, np.zeros(len(chunk), np.int32), [key], value, dtype)


def _packed_columns(chunk: list[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """seq, step, value, dtype of driver rows (_SEQ_DTYPE, step, value)."""
    seq_dtype, step, value = row_columns(chunk, (np.int64, np.int64, np.float64))
    seq, dtype = np.divmod(seq_dtype, _DTYPE_SPAN)
    return seq, step, value, dtype.astype(np.int16)


def _rows_per_insert(driver: Any, columns: int) -> int:
    """The most rows one INSERT statement takes here (a power of two, at most 1,024): the
    SQLite library bounds the ``?`` of a statement (999 before 3.32, 32,766 since)."""
    if hasattr(driver, "getlimit"):  # Python 3.11+
        limit = driver.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)  # type: ignore[attr-defined,unused-ignore]
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
