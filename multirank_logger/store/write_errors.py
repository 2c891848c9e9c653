"""Which errors of a write to the store may pass: `is_transient`, and `describe` for the messages.

The logger's writer (write/writer_thread.py) keeps a failing batch in memory and retries it while
the error is *transient* (a reader holding the DuckDB file, a busy SQLite file, a full disk
that may free up, a PostgreSQL server restarting). A *permanent* error (a row colliding with
a stored one on the unique key (run_id, rank, seq, key)) would fail the same way forever:
those rows go to the spill file at once (write/spiller.py), and the rows after them are
written as usual.
"""

from __future__ import annotations

import re

import sqlalchemy as sa

from multirank_logger.errors import StoreGone, StoreLocked, StoreUnreachable

__all__ = ["describe", "is_transient"]


# what a driver says when the failure is the store's state, not the rows: it may pass
_TRANSIENT_TEXT = (
    "locked", "busy", "disk is full", "no space left", "disk i/o error", "readonly database", "read-only",
    "unable to open", "could not connect", "connection", "server closed", "terminating", "shutting down",
    "could not write", "io error", "cannot open", "timeout", "timed out", "not accepting",
)


# a store whose tables vanished: its file was deleted and a fresh one opened at the same path
# (between the check in write/sinks.py's DirectSink and the open; the new file can even reuse the inode)
_MISSING_TABLE = re.compile(r"no such table|Table with name \w+ does not exist|relation \"\w+\" does not exist")


def is_transient(exc: BaseException) -> bool:
    """True when retrying the same rows later may succeed (the store, not the rows, is at fault)."""
    if isinstance(exc, (StoreLocked, StoreGone, StoreUnreachable, OSError)):
        return True  # StoreUnreachable: a server stopped or restarting (the connection's own failure)
    if _MISSING_TABLE.search(str(exc)):
        return True  # the store's file was replaced under us (an empty one at its path): not the rows' fault
    if isinstance(exc, sa.exc.IntegrityError):
        return False  # a key collision or a NOT NULL: these rows fail the same way every time
    if isinstance(exc, sa.exc.DBAPIError):
        if exc.connection_invalidated or isinstance(exc, (sa.exc.OperationalError, sa.exc.InterfaceError)):
            return True
        text = str(exc.orig).lower()
        return any(marker in text for marker in _TRANSIENT_TEXT)
    text = str(exc).lower()  # DuckDB raises its own classes (IOException, ...) through some paths
    return type(exc).__name__ in ("IOException", "ConnectionException") or any(m in text for m in _TRANSIENT_TEXT)


def describe(exc: BaseException) -> str:
    """One line for a message: the error's class and the first line of its text."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]
