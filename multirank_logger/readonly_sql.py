"""Run a user's SQL on a read-only connection, refusing anything that writes.

Two locks on the door, neither a string match on the query text:

- the connection itself is read-only (SQLite ``mode=ro``, DuckDB ``read_only=True``,
  PostgreSQL ``default_transaction_read_only``), so the engine refuses a write;
- before that, the engine's own parser classifies the statement (DuckDB
  ``extract_statements``, SQLite's authorizer callback), because a read-only
  connection still lets some statements through that change things outside the
  store: DuckDB's ``COPY ... TO 'file'`` and temp tables, SQLite's ``ATTACH``.

Either way the user gets ``ReadOnlyViolation`` with the statement, and the store is
unchanged. Any other engine error becomes ``QueryFailed`` with the engine's message.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import sqlalchemy as sa

from multirank_logger.errors import QueryFailed, ReadOnlyViolation

__all__ = ["run_readonly"]

# DuckDB statement types that only read (SHOW, DESCRIBE, SUMMARIZE parse as SELECT;
# PIVOT as MULTI, a sequence of SELECTs)
_DUCKDB_READS = {"SELECT", "EXPLAIN", "PRAGMA", "CALL", "MULTI"}
# PRAGMAs that only describe the store
_SQLITE_READ_PRAGMAS = {
    "table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo",
    "foreign_key_list", "database_list", "collation_list", "compile_options",
    "function_list", "module_list", "pragma_list",
}  # fmt: skip
_SQLITE_READ_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
# the markers each engine puts in its message when a read-only connection refuses a write
_ENGINE_REFUSALS = ("read-only mode", "readonly database", "read-only transaction", "not authorized")


def run_readonly(conn: sa.Connection, backend: str, query: str) -> Any:
    """Run ``query`` on ``conn`` and return the last statement's result as a pandas DataFrame.

    Raises:
        ReadOnlyViolation: the query would write; it was not run.
        QueryFailed: the engine rejected it (syntax, unknown table...), with its message.
    """
    if backend == "duckdb":
        return _duckdb(conn.connection.driver_connection, query)
    if backend == "sqlite":
        return _sqlite(conn.connection.driver_connection, query)
    return _generic(conn, query)


def _refusal_or_failure(engine: str, query: str, exc: BaseException) -> Exception:
    text = str(getattr(exc, "orig", exc))
    if any(marker in text for marker in _ENGINE_REFUSALS):
        return ReadOnlyViolation(query)
    return QueryFailed(engine, text)


def _duckdb(raw: Any, query: str) -> Any:
    import duckdb
    import pandas as pd

    try:
        statements = duckdb.extract_statements(query)
    except duckdb.Error as exc:
        raise QueryFailed("DuckDB", str(exc)) from None
    for statement in statements:
        if statement.type.name not in _DUCKDB_READS:
            raise ReadOnlyViolation(statement.query)
    try:
        relation = raw.sql(query)
        return pd.DataFrame() if relation is None else relation.df()
    except duckdb.Error as exc:
        raise _refusal_or_failure("DuckDB", query, exc) from None


def _sqlite_authorizer(action: int, arg1: str | None, arg2: str | None, db: str | None, trigger: str | None) -> int:
    if action in _SQLITE_READ_ACTIONS:
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() in _SQLITE_READ_PRAGMAS:
        return sqlite3.SQLITE_OK
    return sqlite3.SQLITE_DENY


def _sqlite(raw: sqlite3.Connection, query: str) -> Any:
    import pandas as pd

    raw.set_authorizer(_sqlite_authorizer)
    try:
        cursor = raw.execute(query)
        names = [d[0] for d in cursor.description or ()]
        rows = cursor.fetchall()
    except sqlite3.Warning as exc:  # "You can only execute one statement at a time."
        raise QueryFailed("SQLite", str(exc)) from None
    except sqlite3.Error as exc:
        raise _refusal_or_failure("SQLite", query, exc) from None
    finally:
        raw.set_authorizer(None)
    return pd.DataFrame.from_records(rows, columns=names)


def _generic(conn: sa.Connection, query: str) -> Any:
    import pandas as pd

    try:
        with conn.begin():  # PostgreSQL: read-only by default_transaction_read_only
            result = conn.exec_driver_sql(query)
            if not result.returns_rows:
                return pd.DataFrame()
            return pd.DataFrame.from_records(result.fetchall(), columns=list(result.keys()))
    except sa.exc.DBAPIError as exc:
        raise _refusal_or_failure(conn.dialect.name, query, exc) from None
