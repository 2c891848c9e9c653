"""Logging from the exit hooks without "--- Logging error ---" on streams already closed.

At interpreter exit a handler may still point at a stream its owner closed (pytest's capture
files, a notebook's): `logging` then prints a traceback per record ("ValueError: I/O operation
on closed file") over the user's output. Our exit hooks log with ``logging.raiseExceptions``
off, which drops just those records, as logging does in production mode.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["quiet_logging_errors"]

F = TypeVar("F", bound=Callable[..., Any])


def quiet_logging_errors(fn: F) -> F:
    """`fn`, run with logging's handler errors dropped (for atexit hooks)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        raised, logging.raiseExceptions = logging.raiseExceptions, False
        try:
            return fn(*args, **kwargs)
        finally:
            logging.raiseExceptions = raised

    return run  # type: ignore[return-value]
