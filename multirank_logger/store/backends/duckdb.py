"""DuckDB: one writing process per file, opened only inside a transaction; rows go in as Arrow.

Reads come back as Arrow from the driver's own connection, never as Python rows.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from multirank_logger._util.arrow_numpy import column_numpy
from multirank_logger._util.fork_keep import keep_forever
from multirank_logger.errors import DamagedStore, NotADatabase, QueryFailed, ReadOnlyViolation, StoreError, StoreLocked
from multirank_logger.rows.csv_layout import LongRows
from multirank_logger.rows.schema import metrics
from multirank_logger.store.backends.base import FULL_CHECK_BYTES, Backend, StoreFileFacts, driver_connection, json_path
from multirank_logger.store.backends.duckdb_params import inline_before_cursor_execute, inline_parameters
from multirank_logger.store.backends.readonly_sql import refusal_or_failure
from multirank_logger.store.backends.store_files import reader_config

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["DuckDBBackend", "register_alembic_impl"]

# Statement types that only read (SHOW, DESCRIBE, SUMMARIZE, FROM-first parse as SELECT).
# Not PRAGMA or CALL: both run functions that change settings or files (CALL checkpoint,
# PRAGMA enable_profiling), and PIVOT's CREATE TYPE step is a write.
_READ_STATEMENTS = {"SELECT", "EXPLAIN"}


# -- fork --------------------------------------------------------------------------------
# `import duckdb` opens the module's default connection (an in-memory database with its own
# worker threads). A forked child that exits normally destroys it at its teardown, joining
# threads that only the parent has: the child hung, or aborted ("terminate called without an
# active exception"). The child keeps the parent's for good (issue 38 point 7).
_PARENTS_DEFAULT_CONNECTION: list[Any] = []


def _hold_default_connection() -> None:
    duckdb = sys.modules.get("duckdb")
    if duckdb is not None and hasattr(duckdb, "default_connection"):
        try:
            _PARENTS_DEFAULT_CONNECTION[:] = [duckdb.default_connection()]
        except Exception:  # noqa: BLE001 - a fork must go on whatever the driver says
            _PARENTS_DEFAULT_CONNECTION.clear()


def _keep_parents_default_connection() -> None:
    for connection in _PARENTS_DEFAULT_CONNECTION:
        keep_forever(connection)
    _PARENTS_DEFAULT_CONNECTION.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_hold_default_connection,
        after_in_child=_keep_parents_default_connection,
        after_in_parent=_PARENTS_DEFAULT_CONNECTION.clear,
    )


#: the block size of a store file DuckDB creates (bytes; DuckDB takes 16 KiB to 256 KiB). Measured
#: in benchmarks/RESULTS.md ("DuckDB block size"): the 20-value store and ingest at each size
BLOCK_SIZE = 2**16

#: Arrow batch size of a read result: one chunk up to 8.4M rows (per_rank's key of 256 ranks x
#: 20,000 steps is 5.1M). DuckDB reserves address space for a whole batch: 2**30 reserved 21 GB
#: for a 4,800-row result, and a process holding that much could no longer fork (ENOMEM)
ONE_CHUNK_ROWS = 2**23
#: rows a chunk of `per_rank_chunks` (about 22 MB of columns)
STREAM_ROWS = 2**20
#: and the address space one batch may reserve, all its columns together: a wide side table
#: (step timing's 14 columns) gets shorter chunks, a key's few columns still one
CHUNK_RESERVE_BYTES = 2**28


class DuckDBBackend(Backend):
    name = "duckdb"
    concurrent_writers = False
    opens_per_transaction = True  # see create_engine

    @property
    def path(self) -> Path | None:
        db = self.url.database
        return None if db in (None, "", ":memory:") else Path(db)

    def create_engine(self, readonly: bool = False) -> sa.Engine:
        # Rows come and go as Arrow tables: load pyarrow (a noticeable import) with the store, not
        # in the writer thread's first flush, where it competes with the training for a core.
        import pyarrow  # noqa: F401

        # NullPool: the file is open only inside a transaction, so that between two
        # flushes another process (a reader, `multirank-logger sql`) can open it.
        connect_args: dict[str, Any] = {"read_only": readonly}
        if readonly:
            connect_args["config"] = reader_config()
        else:
            # one thread: DuckDB's default is one per core, and a writer inserting a few thousand
            # rows then checkpointing gains nothing from them but CPU taken from the training
            # (benchmarks/RESULTS.md, "Figures the source cites")
            # a new file's blocks (an existing file keeps its own): DuckDB's 256 KiB default made a
            # store of 20 values 5.3 MB, where every table, index and checkpoint's metadata holds
            # at least one block of its own (SQLite: 96 KB); see BLOCK_SIZE
            connect_args["config"] = {"threads": 1, "default_block_size": str(BLOCK_SIZE)}
        engine = sa.create_engine(self.url, poolclass=NullPool, connect_args=connect_args)
        sa.event.listen(engine, "connect", _no_progress_bar)
        # a bound parameter makes DuckDB's client import pandas first (duckdb_params.py)
        sa.event.listen(engine, "before_cursor_execute", inline_before_cursor_execute, retval=True)
        return engine

    def insert_metrics(self, conn: sa.Connection, table: sa.Table, batch: pa.RecordBatch) -> None:
        # DuckDB's executemany runs row by row; from Arrow it reads whole columns (the gap is in
        # benchmarks/RESULTS.md's cited figures).
        # duckdb_engine turns the "register" statement into DuckDBPyConnection.register.
        view = "_multirank_batch"
        conn.exec_driver_sql("register", (view, batch))  # read in place: no copy, no Python row
        cols = ", ".join(f'"{c.name}"' for c in table.columns)
        conn.exec_driver_sql(f'INSERT INTO "{table.name}" ({cols}) SELECT {cols} FROM {view}')
        driver_connection(conn).unregister(view)

    def insert_rows(self, conn: sa.Connection, table: sa.Table, rows: list[dict[str, Any]]) -> int:
        # executemany runs row by row here: go through Arrow as the metrics do
        import pyarrow as pa

        if not rows:
            return 0
        columns = [c.name for c in table.columns]
        view = f"_multirank_{table.name}"
        data = pa.Table.from_pylist([{c: row.get(c) for c in columns} for row in rows])
        conn.exec_driver_sql("register", (view, data))
        cols = ", ".join(f'"{c}"' for c in columns)
        conn.exec_driver_sql(f'INSERT INTO "{table.name}" ({cols}) SELECT {cols} FROM {view}')
        driver_connection(conn).unregister(view)
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

    def inspect_before_write(self) -> StoreFileFacts | None:
        import duckdb

        path = self.path
        if path is None or not path.is_file() or path.stat().st_size == 0:
            return None
        try:
            con = duckdb.connect(str(path), read_only=True, config={"threads": 1})
        except duckdb.ConnectionException as exc:
            if "different configuration" in str(exc):
                return None  # this process has the file open already: it was checked when opened
            raise self._refusal(exc) from None
        except duckdb.Error as exc:
            raise self._refusal(exc) from None
        try:
            return _file_facts(con, full=path.stat().st_size <= FULL_CHECK_BYTES)
        except duckdb.Error as exc:
            raise self._refusal(exc) from None
        finally:
            con.close()  # before the writer opens it: DuckDB keeps one instance, of one configuration, per file

    def _refusal(self, exc: Exception) -> Exception:
        """Our error for a DuckDB error met reading a file before writing it."""
        text = str(exc)
        block = re.search(r"in block at location (\d+)", text)
        if block and int(block.group(1)) > 0:  # past the file's header: a DuckDB file, damaged
            return DamagedStore(str(self.path), "DuckDB", text.splitlines()[0])
        return self.translate_error(exc) or DamagedStore(str(self.path), "DuckDB", text.splitlines()[0] if text else repr(exc))

    # -- reading ---------------------------------------------------------------------------

    #: rows sorted at once for an export (see _windows)
    sort_window_rows = 524_288

    def fetch_arrow(self, conn: sa.Connection, stmt: sa.Select) -> Any:
        # one chunk (DuckDB's default is one per 1M rows): each column is then viewed as NumPy,
        # not concatenated (per_rank of 5.1M rows: 112 MB of copies)
        rows = min(ONE_CHUNK_ROWS, CHUNK_RESERVE_BYTES // (8 * max(1, len(stmt.selected_columns))))
        return _execute(conn, stmt).to_arrow_table(rows)

    #: DuckDB turns a result into Arrow on one thread: two windows are read at once, each on a
    #: connection of its own (no one writes a DuckDB file a reader holds: every connection sees
    #: the same rows)
    window_readers = 2

    def value_or_nan(self, value: Any) -> Any:
        # DuckDB hands NaN over, and Arrow's arrays then need no copy
        return sa.func.coalesce(value, sa.cast(sa.literal("NaN"), sa.Float(53))).label("value")

    def key_hash(self, key: Any) -> Any:
        # DuckDB hashes a dictionary-compressed column's strings once per dictionary entry
        return sa.func.hash(key)

    def json_member(self, column: Any, keys: tuple[str, ...]) -> tuple[Any, Any]:
        # DuckDB's json extension: its types are its own (VARCHAR, DOUBLE, BIGINT, UBIGINT, BOOLEAN, NULL...)
        path = json_path(keys)
        valid = sa.func.json_valid(column)
        kind = sa.func.json_type(column, path)
        text = sa.case((~valid, None), (kind == "VARCHAR", sa.func.json_extract_string(column, path)),
                       else_=sa.cast(sa.func.json_extract(column, path), sa.Text))
        number = sa.case((~valid, None),
                         (kind.in_(["DOUBLE", "BIGINT", "UBIGINT"]), sa.cast(sa.func.json_extract(column, path), sa.Float(53))))
        return text, number

    def numpy_columns(self, conn: sa.Connection, stmt: sa.Select, types: Sequence[type]) -> list[np.ndarray] | None:
        table = self.fetch_arrow(conn, stmt)
        if table.num_rows == 0:
            return None
        return [column_numpy(table.column(i)) for i in range(table.num_columns)]

    def numpy_chunks(self, conn: sa.Connection, stmt: sa.Select, types: Sequence[type]) -> Iterator[list[np.ndarray]]:
        # streamed Arrow batches: DuckDB holds no whole result, Arrow no copy of it
        result = _execute(conn, stmt)
        to_reader = getattr(result, "to_arrow_reader", None) or result.fetch_record_batch
        for batch in to_reader(self.scan_batch_rows):
            if batch.num_rows:
                yield [column_numpy(batch.column(i)) for i in range(batch.num_columns)]

    #: rows of a batch `numpy_chunks` hands over (8 MB as the report's pass reads them; batches of
    #: 1M rows: the report's peak 650 MB on the 25.6M-row scale store, these 570 MB, in the same time)
    scan_batch_rows = 262_144

    def per_rank_columns(self, conn: sa.Connection, run_id: int, key: str) -> Sequence[np.ndarray | None]:
        # in no order: the pivot places each row by counting (query/rank_spread.py); a sort of a
        # large key's rows took longer than the rest of per_rank, in memory that grew with them.
        # seq only decides between a rank's calls at one step, so it is read only where a (rank,
        # step) repeats: DuckDB holds its whole result, and Arrow a copy, at the peak of per_rank
        # (5.1M rows: 8 B of seq a row is 82 MB of both)
        where = (metrics.c.run_id == run_id, metrics.c.key == key)
        names = ["rank", "step", "value", "dtype"]
        table = self.fetch_arrow(conn, sa.select(*map(_column, names)).where(*where))
        rank, step, value, dtype = (_numpy(table, name) for name in names)
        del table
        if _one_row_per_cell(rank, step):
            # seq: not read, and the pivot need not count the cells again
            return [rank, None if len(rank) else np.zeros(0, np.int64), step, value, dtype]
        del rank, step, value, dtype
        names.insert(1, "seq")
        table = self.fetch_arrow(conn, sa.select(*map(_column, names)).where(*where))
        return [_numpy(table, name) for name in names]

    def per_rank_chunks(self, conn: sa.Connection, run_id: int, key: str) -> Iterator[list[np.ndarray]]:
        # streamed Arrow batches: DuckDB holds no whole result, Arrow no copy of it (per_rank of
        # 25.6M rows held 1.4 GB of both at its peak)
        names = ["rank", "step", "value", "dtype"]
        result = _execute(conn, sa.select(*map(_column, names)).where(metrics.c.run_id == run_id, metrics.c.key == key))
        to_reader = getattr(result, "to_arrow_reader", None) or result.fetch_record_batch
        for batch in to_reader(STREAM_ROWS):
            yield [_numpy(batch, name) for name in names]

    def hold_snapshot(self, conn: sa.Connection) -> None:
        """Nothing to do: no one writes a DuckDB file that a reader holds open."""

    def _in_call_order(self, conn: sa.Connection, stmt: sa.Select, where: tuple[Any, ...]) -> Iterator[LongRows]:
        return map(LongRows.from_arrow, self._windows(conn, stmt, where))

    def _windows(self, conn: sa.Connection, stmt: sa.Select, where: tuple[Any, ...]) -> Iterator[Any]:
        """`stmt` (ordered by seq) as Arrow batches, sorted a window of seq at a time.

        One ORDER BY over a rank's rows sorts them all before the first comes back (~57 bytes a
        row: 280 MiB for 5M). A window of about `sort_window_rows` rows holds that many, and
        costs a scan of only the row groups its seq range overlaps (DuckDB's min/max per row
        group skips the rest, as a rank's seq rises with the file). The window is sized from
        the rank's mean rows per call: a stretch of calls with many more keys makes it larger.
        """
        low, high, count = conn.execute(
            sa.select(sa.func.min(metrics.c.seq), sa.func.max(metrics.c.seq), sa.func.count()).where(*where)
        ).one()
        if not count:
            return
        calls_per_window = max(1, self.sort_window_rows * (high - low + 1) // count)
        for start in range(low, high + 1, calls_per_window):
            window = stmt.where(metrics.c.seq >= start, metrics.c.seq < start + calls_per_window)
            result = _execute(conn, window)
            # to_arrow_reader in newer duckdb; fetch_record_batch in older ones (deprecated in 1.5)
            to_reader = getattr(result, "to_arrow_reader", None) or result.fetch_record_batch
            yield from to_reader(self.fetch_rows)

    def run_readonly(self, conn: sa.Connection, query: str) -> Any:
        # The connection is read_only with enable_external_access off (create_engine); DuckDB's
        # own parser classifies each statement, as read-only still lets COPY ... TO, SET through.
        import duckdb
        import pandas as pd

        try:
            statements = duckdb.extract_statements(query)
        except duckdb.Error as exc:
            raise QueryFailed("DuckDB", str(exc)) from None
        for statement in statements:
            if statement.type.name not in _READ_STATEMENTS:
                raise ReadOnlyViolation(statement.query)
        con = driver_connection(conn)
        limit = _memory_limit(con)
        try:
            # a user's query runs under DuckDB's own memory limit: a reader's small one (reader_config)
            # bounds the package's own reads' cache, and a COUNT(DISTINCT ...) or a list(), which DuckDB
            # cannot spill to disk, failed under it ("Out of Memory Error": a per-rank count over 12.8M rows).
            # RESET alone changes the setting's value, not the limit in force (DuckDB 1.5): set it.
            con.execute("RESET memory_limit")
            con.execute(f"SET memory_limit = '{_memory_limit(con)}'")
            relation = con.sql(query)
            return pd.DataFrame() if relation is None else relation.df()
        except duckdb.Error as exc:
            raise refusal_or_failure("DuckDB", query, exc) from None
        finally:  # the database instance may be another connection's too (DuckDB shares one per file)
            con.execute(f"SET memory_limit = '{limit}'")


def _file_facts(con: Any, full: bool) -> StoreFileFacts:
    """What a DuckDB file holds; with `full`, every column of every table read (each block's
    checksum checked: a damaged one raises)."""
    columns: dict[str, list[str]] = {}
    for table, column in con.execute(
        "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = current_schema() "
        "ORDER BY table_name, ordinal_position"
    ).fetchall():
        columns.setdefault(table, []).append(column)
    if full:
        for table, names in columns.items():
            # hash() needs every value: a count or a min/max may be answered from statistics alone
            hashes = ", ".join(f'bit_xor(hash("{name}"))' for name in names)
            con.execute(f'SELECT {hashes} FROM "{table}"').fetchall()
    revision = None
    if "alembic_version" in columns:
        revision = con.execute("SELECT max(version_num) FROM alembic_version").fetchone()[0]
    runs_columns = frozenset(columns["runs"]) if "runs" in columns else None
    return StoreFileFacts(frozenset(columns), revision, runs_columns)


def _execute(conn: sa.Connection, stmt: sa.Select) -> Any:
    """Run a SELECT on DuckDB's own connection; returns the driver's result, to read as Arrow."""
    compiled = stmt.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    params = [compiled.params[name] for name in compiled.positiontup or ()]
    # execute(), not sql(): a relation with parameters ran orders of magnitude slower here
    # (duckdb 1.5, one key of a large store: benchmarks/RESULTS.md's cited figures)
    statement = str(compiled)
    inlined = inline_parameters(statement, params)  # no pandas import (duckdb_params.py)
    return driver_connection(conn).execute(statement, params) if inlined is None else driver_connection(conn).execute(inlined)


def _memory_limit(con: Any) -> str:
    row = con.execute("SELECT current_setting('memory_limit')").fetchone()
    return str(row[0])


def _no_progress_bar(dbapi_conn: Any, _record: Any) -> None:
    # DuckDB draws a progress bar on stderr for a query past 2 s (a report, per_rank on a large
    # store), in the user's terminal or the training's log; it is a session setting, not a config one
    dbapi_conn.execute("SET enable_progress_bar = false")


def _one_row_per_cell(rank: np.ndarray, step: np.ndarray) -> bool:
    """Whether no (rank, step) occurs twice; False (read seq) where the steps are too sparse to count."""
    if not len(rank):
        return True
    low, width = int(step.min()), int(rank.max()) + 1
    cells = (int(step.max()) - low + 1) * width
    if cells > 8 * len(rank) + 1024:
        return False
    seen = np.zeros(cells, bool)  # not bincount: its int64 counts take 8 bytes a cell where this takes 1
    seen[(step - low) * width + rank] = True
    return np.count_nonzero(seen) == len(rank)


def _column(name: str) -> Any:
    """A metrics column as read into NumPy: the value with NaN for NULL (a logged NaN), done by
    DuckDB, so that Arrow hands the values over without a copy (41 MB for 5.1M rows)."""
    if name == "value":
        return sa.func.coalesce(metrics.c.value, sa.cast(sa.literal("NaN"), sa.Float(53))).label("value")
    return metrics.c[name]


def _numpy(table: Any, name: str) -> np.ndarray:
    column = table.column(name)
    if name == "value":
        return column_numpy(column)
    # rank (INTEGER) and dtype (SMALLINT) as stored: an int64 copy of each was 62 MB more at the
    # peak of per_rank over 5.1M rows; the pivot and neg_zero take any integer width
    return column_numpy(column) if name in ("rank", "dtype") else column_numpy(column).astype(np.int64, copy=False)


@functools.cache
def register_alembic_impl() -> None:
    """Let Alembic accept the duckdb dialect (duckdb_engine's documented recipe). Called where a
    migration runs, not at import: Alembic is 0.2 s of import that reading a store never needs."""
    from alembic.ddl.impl import DefaultImpl

    class AlembicDuckDBImpl(DefaultImpl):
        __dialect__ = "duckdb"
        transactional_ddl = True
