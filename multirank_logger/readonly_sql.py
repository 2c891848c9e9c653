"""Run a user's SQL on a read-only connection, refusing anything that writes.

Locks on the door, per engine:

- the connection itself is read-only (SQLite ``mode=ro``, DuckDB ``read_only=True`` and
  ``enable_external_access=false``: no file, no ATTACH, no extension outside the store);
- the engine's own parser classifies the statement (DuckDB ``extract_statements``: only
  SELECT-like and EXPLAIN statements; SQLite's authorizer callback), because a read-only
  connection still lets some statements through that change things outside the store:
  DuckDB's ``COPY ... TO 'file'``, ``SET``, ``PRAGMA``/``CALL``, SQLite's ``ATTACH``;
- PostgreSQL (`_postgres`): exactly one statement (the extended query protocol refuses
  ``a; b``), inside a transaction made ``READ ONLY`` before any of the user's SQL and always
  rolled back, a ``statement_timeout``, and, for a superuser, ``SET LOCAL ROLE
  pg_read_all_data``: the query keeps read access to every table but loses what only a
  superuser may do (``COPY ... TO PROGRAM``, ``pg_read_file``, ``lo_import``,
  ``pg_terminate_backend`` of others). The statement must start with a reading keyword.

Either way the user gets ``ReadOnlyViolation`` with the statement, and the store is
unchanged. Any other engine error becomes ``QueryFailed`` with the engine's message.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any

import sqlalchemy as sa

from multirank_logger.errors import QueryFailed, ReadOnlyViolation

__all__ = ["run_readonly"]

# DuckDB statement types that only read (SHOW, DESCRIBE, SUMMARIZE, FROM-first parse as
# SELECT). Not PRAGMA or CALL: both run functions that change settings or files
# (CALL checkpoint, PRAGMA enable_profiling), and PIVOT's CREATE TYPE step is a write.
_DUCKDB_READS = {"SELECT", "EXPLAIN"}
# PostgreSQL: the first keywords of every statement that is not a read (SELECT, WITH, VALUES,
# TABLE, EXPLAIN, SHOW): these never reach the server. WITH ... DELETE is stopped by the
# read-only transaction; a word that starts no statement (a typo) gets the server's syntax error.
_POSTGRES_NOT_READS = {
    "abort", "alter", "analyze", "analyse", "begin", "call", "checkpoint", "close", "cluster", "comment",
    "commit", "copy", "create", "deallocate", "declare", "delete", "discard", "do", "drop", "end", "execute",
    "fetch", "grant", "import", "insert", "listen", "load", "lock", "merge", "move", "notify", "prepare",
    "reassign", "refresh", "reindex", "release", "reset", "revoke", "rollback", "savepoint", "security", "set",
    "start", "truncate", "unlisten", "update", "vacuum",
}  # fmt: skip
# SQLSTATEs of a refused write: read_only_sql_transaction, insufficient_privilege (what the
# reading role may not do), active_sql_transaction (a SET TRANSACTION too late)
_POSTGRES_REFUSALS = {"25006", "42501", "25001"}
#: how long one query may run on a PostgreSQL server (it holds a snapshot meanwhile)
STATEMENT_TIMEOUT_S = 300.0
# PRAGMAs that only describe the store
_SQLITE_READ_PRAGMAS = {
    "table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo",
    "foreign_key_list", "database_list", "collation_list", "compile_options",
    "function_list", "module_list", "pragma_list",
}  # fmt: skip
_SQLITE_READ_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
# the markers each engine puts in its message when a read-only connection refuses a write
_ENGINE_REFUSALS = ("read-only mode", "readonly database", "read-only transaction", "not authorized", "external access")


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
    if backend == "postgresql":
        return _postgres(conn, query)
    raise QueryFailed(backend, "sql() knows how to keep DuckDB, SQLite and PostgreSQL read-only, not this engine")


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


def _first_keyword(query: str) -> str:
    """The statement's first word, past whitespace and ``--``/``/* */`` comments (nested, as PostgreSQL's)."""
    i, n = 0, len(query)
    while i < n:
        if query[i].isspace() or query[i] == "(":
            i += 1
        elif query.startswith("--", i):
            end = query.find("\n", i)
            i = n if end < 0 else end + 1
        elif query.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if query.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif query.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        else:
            break
    match = re.match(r"[A-Za-z_]+", query[i:])
    return match.group(0).lower() if match else ""


def _postgres(conn: sa.Connection, query: str, timeout: float = STATEMENT_TIMEOUT_S) -> Any:
    import pandas as pd
    import psycopg

    if _first_keyword(query) in _POSTGRES_NOT_READS:
        raise ReadOnlyViolation(query)
    raw = conn.connection.driver_connection
    if not hasattr(raw, "pgconn"):  # psycopg2 and others send "a; b" as one string
        raise QueryFailed("PostgreSQL", "sql() needs the psycopg 3 driver (pip install 'multirank-logger[postgres]')")
    raw.rollback()  # start from no transaction, whatever the pool handed back
    try:
        with raw.cursor() as cur:
            # before any of the user's SQL: read only, bounded, and no superuser powers
            cur.execute("SET TRANSACTION READ ONLY")
            cur.execute(f"SET LOCAL statement_timeout = {int(timeout * 1000)}")
            cur.execute("SET LOCAL idle_in_transaction_session_timeout = 60000")
            cur.execute(
                "SELECT rolsuper OR pg_has_role(current_user, 'pg_read_all_data', 'MEMBER') "
                "FROM pg_roles WHERE rolname = current_user"
            )
            if cur.fetchone()[0]:
                cur.execute("SET LOCAL ROLE pg_read_all_data")
            # prepare=True: the extended protocol, which takes exactly one statement
            cur.execute(query, prepare=True)
            if cur.description is None:
                return pd.DataFrame()
            names = [d.name for d in cur.description]
            return pd.DataFrame.from_records(cur.fetchall(), columns=names)
    except psycopg.Error as exc:
        if exc.sqlstate in _POSTGRES_REFUSALS or "multiple commands" in str(exc):
            raise ReadOnlyViolation(query) from None
        raise QueryFailed(conn.dialect.name, str(exc)) from None  # "postgresql", as before
    finally:
        raw.rollback()  # whatever ran, nothing of it stays
