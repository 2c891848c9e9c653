"""Best-effort calls: the end of a run logs what failed and goes on, never raising over it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

__all__ = ["safely"]

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
