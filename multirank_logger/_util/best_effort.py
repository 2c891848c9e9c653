"""Best-effort and bounded calls: the end of a run logs what failed and goes on, never raising
over it, and never waits on a call that may not return (a server stopped mid-call)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["bounded", "safely"]

T = TypeVar("T")
log = logging.getLogger("multirank_logger.logger.finalize")


def safely(fn: Callable[[], T], what: str = "finishing the run") -> T | None:
    """`fn()`, or None after logging what failed: the end of a run must not raise over
    Lightning's own error (or turn a success into a crash)."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001
        log.error("multirank_logger: %s failed: %s: %s", what, type(exc).__name__, exc)
        return None


def bounded(call: Callable[[], T], timeout: float, what: str = "the call") -> T:
    """`call` in a daemon helper thread, given up after `timeout` seconds.

    For a call that may never return: a TCPStore whose server stopped (SIGSTOP, a hung host),
    a database server stopped mid-query (libpq has no read timeout). A call given up on leaves its
    thread blocked until the other side answers or the process ends; the caller must not wait for
    what it holds. The caller's own wait stays interruptible: Ctrl-C reaches the main thread here,
    while the call goes on behind it.

    Raises:
        TimeoutError: when `call` did not return within `timeout`; else whatever `call` raised.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=run, name="multirank-bounded-call", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"{what} did not return within {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]
