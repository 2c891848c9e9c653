"""Opening a server store from a rank that writes it, where the server may refuse the connection.

A PostgreSQL server admits ``max_connections`` clients (fewer for a role or a database): past
that it answers "too many clients already". Rank 0 asks it how many connections are free
before the transport is chosen (`free_connections`, for transport_choice.py); a rank other than
0 that writes (direct, or a node's writer) and is refused at set-up goes on without the
connection (`open_or_later`): its writer retries at each flush, with backoff, holds the rows
meanwhile and spills them past its bound (write/writer_thread.py). Training never stops for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from multirank_logger._util.best_effort import safely
from multirank_logger.rows.run_ref import RunRef
from multirank_logger.store.run_lifecycle import check_same_run
from multirank_logger.store.sql_store import Store
from multirank_logger.store.write_errors import describe, is_transient

__all__ = ["CONNECT_WAIT_S", "free_connections", "open_or_later", "store_of_writer"]

log = logging.getLogger(__name__)

#: how long a writing rank other than 0 retries a store that refuses it at set-up before it goes
#: on without the connection (the writer retries it, then spills)
CONNECT_WAIT_S = 5.0


def free_connections(store: Store) -> tuple[int, str] | None:
    """(connections free now, what the server said) for a server store; None for a file, or no answer."""

    def ask() -> tuple[int, str] | None:
        with store.begin() as conn:
            return store.backend.free_connections(conn)

    return safely(ask, "reading the server's free connections")


def open_or_later(opened: Callable[[], Store], rank: int, timeout: float) -> Store | Callable[[], Store]:
    """`opened()`, retried for up to `CONNECT_WAIT_S` while the failure is transient (a refused
    connection); then `opened` itself, for the sink to call at each write (sinks.DirectSink).

    Raises:
        Whatever `opened` raised that is not transient (a schema to upgrade, another run).
    """
    deadline = time.monotonic() + min(CONNECT_WAIT_S, timeout)
    delay = 0.1
    while True:
        try:
            return opened()
        except Exception as exc:
            if not is_transient(exc):
                raise
            if time.monotonic() + delay > deadline:
                log.warning(
                    "multirank_logger: rank %d cannot open the store yet (%s); it goes on: its rows are kept, "
                    "retried at each flush, and past the writer's bound put in its spill file", rank, describe(exc),
                )
                return opened
        time.sleep(delay)
        delay = min(delay * 2, 1.0)


def store_of_writer(
    open_store: Callable[[], Store], run: RunRef, rank: int, timeout: float
) -> Store | Callable[[], Store]:
    """A rank other than 0 that writes: its store, checked against rank 0's run, or what opens it
    later (`open_or_later`)."""

    def opened() -> Store:
        store = open_store()
        check_same_run(store, rank, run.id, run.name, run.version, run.started_at)
        return store

    return open_or_later(opened, rank, timeout)
