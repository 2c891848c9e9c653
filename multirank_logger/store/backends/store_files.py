"""An embedded store's file, told and read without SQLAlchemy: which engine wrote it (from its
first bytes or its suffix), the URI a SQLite reader opens it with, and rows through the engine's
own Python driver (``sqlite3``, ``duckdb``).

Why a second way in: a command that reads a few rows and exits (``multirank-logger hosts``)
spent most of its cold start importing SQLAlchemy (benchmarks/RESULTS.md, "Hosts ledger").
``driver_rows`` serves only the plain case (a regular file at this code's schema head, not held
by a writer); anything else answers None and the caller opens the store the usual way
(``query/reader.open_store``), which says what is wrong. PostgreSQL always goes that way.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from multirank_logger._util.cpus import usable_cpus
from multirank_logger._version import SCHEMA_HEAD
from multirank_logger.errors import WalNotReadable

__all__ = ["SQLITE_BUSY_TIMEOUT_MS", "SUFFIXES", "FetchSql", "driver_rows", "kind_from_bytes", "reader_config", "sqlite_readonly_uri"]

SQLITE_BUSY_TIMEOUT_MS = 20_000
# filesystem suffix -> SQLAlchemy drivername
SUFFIXES = {".duckdb": "duckdb", ".db": "sqlite", ".sqlite": "sqlite", ".sqlite3": "sqlite"}

#: DuckDB's memory limit in a reading process (its buffer cache and the working memory of a query):
#: READER_MEMORY_MB, or READER_MEMORY_MB_PER_THREAD for each of its threads where that is more.
#: A query's working memory grows with its threads: at 64MB, a per-rank COUNT(DISTINCT ...) over
#: 768k rows ran with 2-8 threads and failed with 16 ("Out of Memory Error"), as on a 16-core machine
READER_MEMORY_MB = 64
READER_MEMORY_MB_PER_THREAD = 16

#: runs one SELECT (SQL text, no parameters) and returns its rows as the driver's tuples
FetchSql = Callable[[str], Sequence[Sequence[Any]]]


def kind_from_bytes(path: str | os.PathLike[str]) -> str | None:
    """The backend an existing regular file is, told from its first bytes (a copy such as
    ``runs.duckdb.bak`` keeps them, not its suffix); None for no file, an empty one or another kind.
    Only a regular file is opened: a FIFO would block the open."""
    try:
        path = Path(path).expanduser()
        if not stat.S_ISREG(path.stat().st_mode):
            return None
        with open(path, "rb") as f:
            head = f.read(16)
    except (OSError, ValueError):  # unreadable here: the suffix decides, the open says what is wrong
        return None
    if head.startswith(b"SQLite format 3\x00"):
        return "sqlite"
    if head[8:12] == b"DUCK":  # DuckDB's magic sits after an 8-byte checksum
        return "duckdb"
    return None


def sqlite_readonly_uri(path: Path) -> str:
    """The URI a reader opens ``path`` with. ``mode=ro``: the query side can never take a write
    lock that would block training. Under WAL, SQLite reads through ``-shm`` beside the file and
    creates it when missing: in a directory the reader cannot write (a read-only mount, a
    colleague's results) that fails ("unable to open database file"). With no ``-wal`` there is
    no writer and nothing outside the file (a WAL writer keeps its log while it is open), so
    ``immutable=1`` reads the file without ``-shm`` or locks.

    Raises:
        WalNotReadable: the directory cannot be written and a ``-wal`` holds rows but no ``-shm`` is there.
    """
    uri = f"file:{quote(str(path))}?mode=ro"
    if os.access(path.parent, os.W_OK):  # also False on a read-only mount for root
        return uri
    wal, shm = Path(f"{path}-wal"), Path(f"{path}-shm")
    if wal.is_file() and wal.stat().st_size > 0:
        if shm.is_file():  # a writer's -shm: SQLite reads through it, read-only
            return uri
        raise WalNotReadable(str(path))
    return uri + "&immutable=1"


def reader_config() -> dict[str, Any]:
    """A reading connection's DuckDB settings."""
    threads = usable_cpus()  # DuckDB's default is every core of the machine
    memory_mb = max(READER_MEMORY_MB, READER_MEMORY_MB_PER_THREAD * threads)
    # a reader sees the store and nothing else: no read_csv('/etc/passwd'), COPY TO, ATTACH, INSTALL;
    # and a small memory limit: DuckDB keeps what it read cached up to that limit (80% of RAM by
    # default), so a report over a large store grew with it; a scan reads each block once, so a
    # small cache costs no time (benchmarks/RESULTS.md, "Figures the source cites")
    return {"enable_external_access": False, "threads": threads, "memory_limit": f"{memory_mb}MB"}


@contextlib.contextmanager
def driver_rows(db: str | os.PathLike[str]) -> Iterator[FetchSql | None]:
    """A read-only `FetchSql` on the SQLite or DuckDB file `db`, through the engine's own driver, in
    one snapshot; None where `db` is a URL, no regular file, of a schema other than this code's head,
    or a DuckDB file a writer holds now: open it with ``query/reader.open_store`` then."""
    text = os.fspath(db)
    kind = None if "://" in text else kind_from_bytes(text)
    opener = _OPENERS.get(kind or "")
    conn = None
    if opener is not None:
        path = Path(text).expanduser().resolve()
        try:
            conn = opener(path)
        except Exception:  # noqa: BLE001 - a held or odd file: the usual open says what it is
            conn = None
    if conn is None:
        yield None
        return
    try:
        cur = conn.cursor()
        try:
            cur.execute("SELECT version_num FROM alembic_version")
            revision = cur.fetchone()
        except Exception:  # noqa: BLE001 - no alembic_version: not a store of ours, said the usual way
            revision = None
        if revision is None or revision[0] != SCHEMA_HEAD:
            yield None
            return

        def fetch(sql: str) -> Sequence[Sequence[Any]]:
            cur.execute(sql)
            return cur.fetchall()

        yield fetch
    finally:
        conn.close()


def _open_sqlite(path: Path) -> Any:
    import sqlite3

    conn = sqlite3.connect(sqlite_readonly_uri(path), uri=True, timeout=SQLITE_BUSY_TIMEOUT_MS / 1000,
                           isolation_level=None)
    conn.execute("BEGIN")  # one snapshot for every read that follows (as the store's readers)
    return conn


def _open_duckdb(path: Path) -> Any:
    import duckdb

    conn = duckdb.connect(str(path), read_only=True, config=reader_config())
    conn.execute("SET enable_progress_bar = false")
    return conn


_OPENERS: dict[str, Callable[[Path], Any]] = {"sqlite": _open_sqlite, "duckdb": _open_duckdb}
