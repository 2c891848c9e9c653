"""A SQLite SELECT's rows as Arrow batches, read by ADBC's SQLite driver (C) instead of Python's.

The report's pass reads every metric row of a run (query/run_scan.py). Through Python's
``sqlite3`` each row is a tuple of Python objects, and that was most of the page's findings on a
SQLite store; ADBC's driver steps the same statement in C and fills Arrow buffers, the same
doubles bit for bit (the figures: benchmarks/RESULTS.md, "Figures the source cites").

Where ``adbc-driver-sqlite`` is not installed (the ``[fast-sqlite]`` extra), or the store has no
file (``:memory:``), `arrow_chunks` answers None and the caller reads through ``sqlite3``.

Two things differ from a read on the caller's connection:
- the driver infers a column's type from its first batch, and a column whose first batch is all
  NULL (a key NaN from its first step: NaN is stored as NULL) is taken for INT64, then refused at
  the first double. The statement is read behind one row of the wanted types (``UNION ALL``),
  dropped here;
- the read is on a connection of its own (read-only, the URI the backend's readers open), so it
  sees the store as of its own first step, not the caller's snapshot. The report's pass drops a
  row of a key or rank it did not know when it began (a live run), as it does on every backend.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import sqlalchemy as sa

from multirank_logger._util.arrow_numpy import column_numpy

__all__ = ["arrow_chunks", "available"]

#: rows per Arrow batch the driver hands over (about 8 MB as the report's pass reads them)
BATCH_ROWS = 262_144


def available() -> bool:
    """Whether ADBC's SQLite driver is installed (the ``[fast-sqlite]`` extra)."""
    return importlib.util.find_spec("adbc_driver_sqlite") is not None


def arrow_chunks(uri: str, conn: sa.Connection, stmt: sa.Select, types: Sequence[type],
                 busy_timeout_ms: int = 20_000) -> Iterator[list[np.ndarray]]:
    """The rows of `stmt` as NumPy columns of `types` (int, float or object: a string), a batch
    at a time (none empty), read from the SQLite file at `uri` (a read-only URI); a NULL float is NaN.

    Args:
        uri: the store's file as the backend's readers open it (``SQLiteBackend._readonly_uri``).
        conn: the caller's connection: its dialect compiles `stmt` (nothing is read on it).
        stmt: a SELECT without ORDER BY or LIMIT (a member of the ``UNION ALL``).
        types: each column's NumPy type.
        busy_timeout_ms: how long a lock (a writer's checkpoint, another reader opening the WAL
            index) is waited for, as the backend's own connections wait.
    """
    import adbc_driver_sqlite.dbapi

    compiled = stmt.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    params = [compiled.params[name] for name in compiled.positiontup or ()]
    # one row of the wanted types first: the driver's type inference sees a double, a string
    typed = ", ".join("0.5" if t in (float, np.float64) else "''" if t is object else "0" for t in types)
    sql = f"SELECT {typed} UNION ALL {compiled}"
    with adbc_driver_sqlite.dbapi.connect(uri) as adbc, adbc.cursor() as cursor:
        cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")  # the driver's own is 0: locked at once
        cursor.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(BATCH_ROWS)})
        cursor.execute(sql, params or None)
        first = True
        for batch in cursor.fetch_record_batch():
            if first:
                batch, first = batch.slice(1), False
            if batch.num_rows:
                yield [_numpy(batch.column(i), t) for i, t in enumerate(types)]


def _numpy(column: Any, kind: type) -> np.ndarray:
    if kind is object:
        return np.asarray(column.to_pylist(), dtype=object)
    return column_numpy(column, null=np.nan if kind in (float, np.float64) else None)


def file_uri(path: Path | None, readonly_uri: Any) -> str | None:
    """The URI ADBC opens `path` with, or None (no file, or the driver not installed)."""
    if path is None or not available():
        return None
    return str(readonly_uri(path))
