"""Run a user's SQL on a read-only connection, refusing anything that writes.

``StoreReader.sql`` calls its backend's ``run_readonly``; the locks on the door are each kept
by that backend (``sqlite.py``, ``duckdb.py``, ``postgresql.py`` next to this module):

- the connection itself is read-only (SQLite ``mode=ro``, DuckDB ``read_only=True`` and
  ``enable_external_access=false``: no file, no ATTACH, no extension outside the store;
  PostgreSQL ``default_transaction_read_only``);
- the engine's own parser classifies the statement (DuckDB ``extract_statements``: only
  SELECT-like and EXPLAIN statements; SQLite's authorizer callback), because a read-only
  connection still lets some statements through that change things outside the store:
  DuckDB's ``COPY ... TO 'file'``, ``SET``, ``PRAGMA``/``CALL``, SQLite's ``ATTACH``;
- PostgreSQL: exactly one statement (the extended query protocol refuses ``a; b``), inside a
  transaction made ``READ ONLY`` before any of the user's SQL and always rolled back, a
  ``statement_timeout``, and, for a superuser, ``SET LOCAL ROLE pg_read_all_data``. The
  statement must start with a reading keyword.

Either way the user gets ``ReadOnlyViolation`` with the statement, and the store is
unchanged. Any other engine error becomes ``QueryFailed`` with the engine's message.
"""

from __future__ import annotations

from multirank_logger.errors import QueryFailed, ReadOnlyViolation

__all__ = ["refusal_or_failure"]

# the markers each engine puts in its message when a read-only connection refuses a write
_ENGINE_REFUSALS = ("read-only mode", "readonly database", "read-only transaction", "not authorized", "external access")


def refusal_or_failure(engine: str, query: str, exc: BaseException) -> Exception:
    """The error to raise for an engine error met running ``query``: a refused write, or a failure."""
    text = str(getattr(exc, "orig", exc))
    if any(marker in text for marker in _ENGINE_REFUSALS):
        return ReadOnlyViolation(query)
    return QueryFailed(engine, text)
