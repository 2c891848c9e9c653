"""Reads that Ctrl-C or a timeout can stop: the reads run in a thread of their own while the caller's
thread waits, since a query inside the engine's C code never returns to Python to see Ctrl-C
(``StoreReader.sql`` and ``StoreReader.stoppable``; the caller's ``stop`` interrupts the query)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from multirank_logger.errors import QueryTimedOut

__all__ = ["run_stoppable"]

#: how long a query stopped (Ctrl-C, a timeout) may take to end before the caller goes on without it
_STOP_GRACE_S = 10.0
#: how often the waiting thread looks up: Ctrl-C and a timeout are seen within this
_STOP_POLL_S = 0.05


def run_stoppable(run: Callable[[], Any], stop: Callable[[], None], timeout: float | None) -> Any:
    """``run()`` in a daemon thread, its result or error returned here; on Ctrl-C, or past
    ``timeout`` seconds, ``stop()`` is called (again until ``run`` ends: the query may not have
    started yet) and KeyboardInterrupt or QueryTimedOut is raised once it has ended."""
    outcome: dict[str, Any] = {}
    # an Event, not Thread.join/is_alive: a join that Ctrl-C interrupts can leave is_alive() False
    # while the thread runs on, and the process then exited under a running DuckDB query (SIGABRT)
    ended = threading.Event()

    def target() -> None:
        try:
            outcome["value"] = run()
        except BaseException as exc:  # noqa: BLE001 (raised again in the caller's thread)
            outcome["error"] = exc
        finally:
            ended.set()

    threading.Thread(target=target, name="multirank-logger-read", daemon=True).start()
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while not ended.wait(_STOP_POLL_S) and (deadline is None or time.monotonic() < deadline):
            pass
    except KeyboardInterrupt:
        _stop_until_ended(ended, stop)
        # the stopped query's error holds the engine's objects through its frames: dropped now
        outcome.clear()
        raise
    if not ended.is_set():
        _stop_until_ended(ended, stop)
        outcome.clear()
        raise QueryTimedOut(timeout or 0.0)
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def _stop_until_ended(ended: threading.Event, stop: Callable[[], None]) -> None:
    ends_by = time.monotonic() + _STOP_GRACE_S
    while not ended.is_set() and time.monotonic() < ends_by:
        with contextlib.suppress(Exception):  # the connection may be closing as the query ends
            stop()
        ended.wait(_STOP_POLL_S * 2)
