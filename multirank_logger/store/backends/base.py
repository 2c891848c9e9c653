"""What the SQL backends share: the `Backend` each one subclasses, with the standard SQL a server runs as
its defaults (PostgreSQL takes them as they are; SQLite and DuckDB override what their layout makes faster).

Everything else talks SQLAlchemy Core. Each backend (one module per backend, next to this one)
says how to build its engine, how to bulk-insert a batch of metric rows in one transaction, how
to serialize schema creation between processes, and how to turn its driver's errors into ours.

On the read side (``query/reader.py`` asks, the backend answers, over a connection the reader opened):

- ``fetch_arrow``: any SELECT as a pyarrow Table;
- ``run_keys``: the distinct keys of a run;
- ``per_rank_columns``: one key of every rank, in any order (``per_rank`` places each row by its step and rank);
- ``rank_calls``: one rank's keys and its rows in call order, streamed (the CSV export);
- ``hold_snapshot``: make the reads that follow see one state of a store still written;
- ``window_readers``, ``value_or_nan``, ``key_hash``, ``numpy_columns``, ``numpy_chunks``: how the report's pass
  (``query/run_scan.py``) reads a run's rows fastest;
- ``run_readonly``: a user's SQL, refused when it would write (``readonly_sql.py``, next to this one);
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import URL

from multirank_logger.errors import QueryFailed
from multirank_logger.rows.csv_layout import LongRows, row_columns, whole_calls
from multirank_logger.rows.schema import metrics, step_summaries

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["FULL_CHECK_BYTES", "PER_RANK_TYPES", "Backend", "StoreFileFacts", "per_rank_columns"]

@dataclass(frozen=True)
class StoreFileFacts:
    """What a store file holds, read before anything writes it (`Backend.inspect_before_write`).

    Args:
        tables: the names of its tables (empty: a new, empty file).
        revision: what its ``alembic_version`` table holds, if it has one.
        runs_columns: the columns of its ``runs`` table, if it has one.
    """

    tables: frozenset[str]
    revision: str | None = None
    runs_columns: frozenset[str] | None = None


#: a store file up to this size is read whole before it is written (every page, every block: a
#: damaged one is refused untouched); a larger one only as far as opening it and reading its
#: schema goes, so that opening a large store stays cheap (quick_check read ~140 MB/s here)
FULL_CHECK_BYTES = 256 << 20


class Backend:
    """Defaults shared by the SQL backends; subclasses override what differs."""

    name = "generic"
    #: True when several processes may write the store at once.
    concurrent_writers = True
    #: True when every transaction opens and closes the database (so that readers get in
    #: between): a write costs an open whatever its size, and writers should write seldom.
    opens_per_transaction = False
    #: True for a store file this process reads itself, whose damage a read of the rows shows (a
    #: DuckDB block's checksum, a malformed SQLite page): `status.read_back_run` reads a run back
    #: before its success. A server keeps its own pages: a scan of the run over the network there
    #: (minutes at 1,024 ranks x 100k steps) would check nothing of ours.
    rows_read_back_show_damage = True
    #: True when the engine's file locking is unsafe on a network filesystem (NFS, CIFS...):
    #: ranks writing the file there themselves (transport='direct') may corrupt it.
    locking_unsafe_on_network_fs = False

    def __init__(self, url: URL) -> None:
        self.url = url

    @property
    def path(self) -> Path | None:
        """The database file, or None for a server."""
        return None

    def create_engine(self, readonly: bool = False) -> sa.Engine:
        return sa.create_engine(self.url)

    def insert_metrics(self, conn: sa.Connection, table: sa.Table, batch: pa.RecordBatch) -> None:
        """Insert one batch of metric rows (`batch.METRICS_SCHEMA`) on an open transaction
        (SQLAlchemy's executemany)."""
        from multirank_logger.rows.batch import column_lists  # pyarrow: not for a store opened to read

        columns = [c.name for c in table.columns]
        conn.execute(table.insert(), [dict(zip(columns, row)) for row in zip(*column_lists(batch, columns))])

    def insert_rows(self, conn: sa.Connection, table: sa.Table, rows: list[dict[str, Any]]) -> int:
        """Insert a few rows of any table given as dicts (the side tables); returns how many."""
        if rows:
            columns = [c.name for c in table.columns]
            conn.execute(table.insert(), [{c: row.get(c) for c in columns} for row in rows])
        return len(rows)

    def lock_for_migration(self, conn: sa.Connection) -> None:
        """Serialize schema creation between processes, on `conn`'s open transaction."""

    def has_table(self, conn: sa.Connection, name: str) -> bool:
        """Whether the store's schema holds table `name`: the standard catalog, one small query
        (SQLAlchemy's inspector took 0.4 s of every command's start on DuckDB)."""
        found = conn.execute(
            sa.text("SELECT count(*) FROM information_schema.tables WHERE table_name = :name AND table_schema = current_schema()"),
            {"name": name},
        ).scalar()
        return bool(found)

    def lock_seq_spans(self, conn: sa.Connection, runs_ranks: list[tuple[int, int]]) -> None:
        """Keep other writers of these (run, rank)s from reading their seq spans until `conn`'s
        transaction ends (store/seq_spans.py reads them, checks, then writes them). Nothing to do
        on SQLite (BEGIN IMMEDIATE: one writing transaction at a time) or DuckDB (a writing
        transaction holds the file alone among processes; in one, a rank's rows have one writer
        thread, and the resume's import of earlier launches holds other seqs)."""

    def translate_error(self, exc: Exception) -> Exception | None:
        """Our error for a driver error met while opening the store, or None."""
        return None

    def inspect_before_write(self) -> StoreFileFacts | None:
        """Read the store file, without writing it or its journal, before anything is written:
        what it holds; None where there is no file to read (a server, a file not there yet).

        Raises:
            NotADatabase, DamagedStore, StoreLocked: the file cannot be written as it is.
        """
        return None

    def free_connections(self, conn: sa.Connection) -> tuple[int, str] | None:
        """A server's connections free now for this user and database, and one line saying what
        it read (for the transport choice); None where connections are not counted (a file)."""
        return None

    # -- reading (query/reader.py): each on a connection the caller holds open -----------

    #: rows per fetch: bounds what is alive at once while exporting
    fetch_rows = 65_536

    def fetch_arrow(self, conn: sa.Connection, stmt: sa.Select) -> Any:
        """Run a SELECT and return its result as a pyarrow Table."""
        import pyarrow as pa

        result = conn.execute(stmt)
        names = list(result.keys())
        data = result.fetchall()
        columns: list[Any] = list(zip(*data)) if data else [[] for _ in names]
        return pa.table({name: pa.array(col) for name, col in zip(names, columns)})

    def row_chunks(self, conn: sa.Connection, stmt: sa.Select, rows: int = 0) -> Iterator[list[Any]]:
        """A SELECT's rows as driver tuples, `rows` (default `fetch_rows`) at a time; no empty chunk."""
        # a server: its own cursor (stream_results), in its driver's own parameter style
        fetch = conn.execute(stmt, execution_options={"stream_results": True}).fetchmany
        yield from _chunks(fetch, rows or self.fetch_rows)

    def window_ranks(self, conn: sa.Connection, run_id: int) -> list[int] | None:
        """Every rank with a metric row in run `run_id`, where a read of a range of steps is
        served by an index only when its ranks are named (PostgreSQL's (run_id, rank, step));
        None where naming them gains nothing (DuckDB's zone maps skip by step, SQLite's table
        is clustered by key)."""
        return None

    #: windows of a run's rows the report's pass reads at once, each on a connection of its own
    window_readers = 1
    #: whether the report's pass reads a window's rows one key at a time (a range read along a
    #: primary key that starts (run_id, key): SQLite's), not all keys at once named by a CASE
    scan_by_key = False

    #: whether `numpy_chunks` may read through a second driver of the engine (SQLite: ADBC's, where installed)
    arrow_reads = False

    def value_or_nan(self, value: Any) -> Any:
        """The metric `value` column as a read into NumPy should select it: where the driver can
        hand NaN over, a NULL (a logged NaN) as NaN; here as it is (a NULL reads as None, then NaN)."""
        return value

    def key_hash(self, key: Any) -> Any | None:
        """A 64-bit hash of a string column that the engine computes for little more than reading
        it (numbering a row's key by it: query/key_numbers.py), or None where there is none."""
        return None

    def json_member(self, column: Any, keys: tuple[str, ...]) -> tuple[Any, Any]:
        """The member under `keys` (from the top, objects only: rows/param_path.py) of a JSON text column (``runs.hparams``), as two SQL
        expressions: its text (a string's own characters; a number, true, false, null, a list or
        an object as JSON text) and its value as a float where it is a number (else NULL). Both
        NULL where the column or the member is missing. Here SQLite's JSON functions (JSON1)."""
        path = json_path(keys)
        valid = sa.func.json_valid(column) == 1  # a store from before issue 38 may hold bare NaN
        kind = sa.func.json_type(column, path)
        text = sa.case((~valid, None), (kind == "text", sa.func.json_extract(column, path)),
                       (kind.in_(["true", "false", "null"]), kind),
                       else_=sa.cast(sa.func.json_extract(column, path), sa.Text))
        number = sa.case((~valid, None), (kind.in_(["integer", "real"]), sa.cast(sa.func.json_extract(column, path), sa.Float)))
        return text, number

    def numpy_columns(self, conn: sa.Connection, stmt: sa.Select, types: Sequence[type]) -> list[np.ndarray] | None:
        """A SELECT's columns as NumPy arrays (the driver's rows converted to `types`; a backend
        that reads Arrow keeps Arrow's types); None when it returned no row."""
        parts = list(self.numpy_chunks(conn, stmt, types))
        if not parts:
            return None
        return [np.concatenate(col) for col in zip(*parts)]

    def numpy_chunks(self, conn: sa.Connection, stmt: sa.Select, types: Sequence[type]) -> Iterator[list[np.ndarray]]:
        """`numpy_columns`, a chunk of rows at a time (none empty): what a reader places and lets go."""
        for chunk in self.row_chunks(conn, stmt):
            yield row_columns(chunk, list(types))

    def run_keys(self, conn: sa.Connection, run_id: int) -> list[str]:
        """The distinct metric keys of a run, any rank, in no particular order: from the summaries
        kept with every insert of rows (about 1/16 of them; 1B rows: 2.2 s from the rows)."""
        s = step_summaries.c
        return list(conn.execute(sa.select(s.key).where(s.run_id == run_id).distinct()).scalars())

    def per_rank_columns(self, conn: sa.Connection, run_id: int, key: str) -> Sequence[np.ndarray | None]:
        """One key's rows of every rank as columns (rank, seq, step, value, dtype) of
        `PER_RANK_TYPES` (DuckDB: in no order); empty when no rank logged it. seq may be None
        where the backend found no (rank, step) twice."""
        stmt = (
            sa.select(metrics.c.rank, metrics.c.seq, metrics.c.step, metrics.c.value, metrics.c.dtype)
            .where(metrics.c.run_id == run_id, metrics.c.key == key)
            .order_by(metrics.c.rank, metrics.c.seq)
        )
        return per_rank_columns([row_columns(chunk, PER_RANK_TYPES) for chunk in self.row_chunks(conn, stmt)])

    def per_rank_chunks(self, conn: sa.Connection, run_id: int, key: str) -> Iterator[list[np.ndarray]]:
        """One key's rows of every rank as columns (rank, step, value with NaN for NULL, dtype), a
        chunk at a time, in no order: `per_rank` places each chunk and lets it go."""
        stmt = sa.select(metrics.c.rank, metrics.c.step, metrics.c.value, metrics.c.dtype).where(
            metrics.c.run_id == run_id, metrics.c.key == key
        )
        types = [PER_RANK_TYPES[0], *PER_RANK_TYPES[2:]]
        for chunk in self.row_chunks(conn, stmt):
            rank, step, value, dtype = row_columns(chunk, types)
            yield [rank, step, value, dtype]

    def hold_snapshot(self, conn: sa.Connection) -> None:
        """Make the reads that follow on `conn` see one state of the store, though a run may
        still be writing (the export reads the keys, then the rows: a key first logged between
        the two would miss the header). Call before the first read."""
        if not conn.in_transaction():
            conn.execution_options(isolation_level="REPEATABLE READ")

    def rank_calls(self, conn: sa.Connection, run_id: int, rank: int) -> tuple[list[str], Iterator[LongRows]]:
        """The keys one rank logged, and its rows as pieces of whole calls in call order,
        fetched while the caller keeps `conn` open: a long run's export holds a few fetches,
        never every row. Both empty for a rank that logged nothing."""
        where = (metrics.c.run_id == run_id, metrics.c.rank == rank)
        keys = list(conn.execute(sa.select(metrics.c.key).where(*where).distinct()).scalars())
        stmt = sa.select(metrics.c.seq, metrics.c.step, metrics.c.key, metrics.c.value, metrics.c.dtype)
        return keys, whole_calls(self._in_call_order(conn, stmt.where(*where).order_by(metrics.c.seq), where))

    def _in_call_order(self, conn: sa.Connection, stmt: sa.Select, where: tuple[Any, ...]) -> Iterator[LongRows]:
        """`stmt` (one rank's rows, ordered by seq) as LongRows pieces; calls may straddle two."""
        return (LongRows.from_rows([chunk]) for chunk in self.row_chunks(conn, stmt))

    def run_readonly(self, conn: sa.Connection, query: str) -> Any:
        """Run a user's ``query`` and return its last statement's result as a pandas DataFrame.

        Raises:
            ReadOnlyViolation: the query would write; it was not run.
            QueryFailed: the engine rejected it (syntax, unknown table...), with its message.
        """
        raise QueryFailed(self.name, "sql() knows how to keep DuckDB, SQLite and PostgreSQL read-only, not this engine")

    def interrupt(self, conn: sa.Connection) -> None:
        """Stop the statement running on ``conn`` (``run_readonly``'s), from another thread: Ctrl-C
        or a timeout. The statement fails with the engine's own error; a no-op when none runs."""
        driver_connection(conn).interrupt()  # sqlite3's and duckdb's connections: thread-safe


# the NumPy types of per_rank_columns: rank, seq, step, value, dtype
PER_RANK_TYPES = (np.int64, np.int64, np.int64, np.float64, np.int16)


def per_rank_columns(parts: list[Any]) -> list[np.ndarray]:
    """per_rank_columns' columns, one part (a list of columns) per fetch, joined."""
    return [np.concatenate(col) for col in zip(*parts)] if parts else [np.zeros(0, t) for t in PER_RANK_TYPES]


def _chunks(fetch: Callable[[int], Any], rows: int) -> Iterator[list[Any]]:
    """What `fetch(rows)` returns, call after call, until a short one; no empty chunk."""
    while True:
        chunk = fetch(rows)
        if chunk:
            yield chunk
        if len(chunk) < rows:  # the last: no second round trip to learn that
            return


def json_path(keys: tuple[str, ...]) -> str:
    """The JSON path of the member under `keys`, each quoted (a dot, a space, ``=`` may be in a key;
    a quoted key never indexes a list, so a list is a value, never walked into). SQLite's paths
    have no escape: a key holding ``"`` or ``\\``, or an empty one, is refused before
    (query/run_filter.parse_param)."""
    return "$" + "".join(f'."{key}"' for key in keys)


def driver_connection(conn: sa.Connection) -> Any:
    """The driver's own connection under `conn` (sqlite3, duckdb, psycopg), for what SQLAlchemy does slower."""
    raw = conn.connection.driver_connection
    assert raw is not None, "a connection that is open has its driver's connection"
    return raw


@contextlib.contextmanager
def _raised_as_sqlalchemy_would(conn: sa.Connection, sql: str) -> Iterator[None]:
    """A driver error met on the driver's own cursor, raised as SQLAlchemy's DBAPIError, as
    for every other statement (the store translates those: a locked file, not a database)."""
    dbapi_error = conn.dialect.loaded_dbapi.Error
    try:
        yield
    except dbapi_error as exc:
        raise sa.exc.DBAPIError.instance(sql, None, exc, dbapi_error) from exc
