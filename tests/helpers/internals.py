"""The one way a test reaches inside a logger, for what no public call shows: the writer's own
pacing and counters, a lock held to plant a fault at a chosen moment. Everything else goes
through the public API (``logger.flush()`` to have rows stored)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from multirank_logger.write.writer_thread import BackgroundWriter

__all__ = ["run_of", "writer_cycle_held", "writer_of"]


def run_of(logger: Any) -> Any:
    """This process's part in the run behind a `MultiRankLogger` (logger/rank_run.RankRun)."""
    return logger._run


def writer_of(logger: Any) -> BackgroundWriter:
    """The logger's background writer (write/writer_thread.py): its counters and bounds."""
    return logger._run.logged.writer


@contextlib.contextmanager
def writer_cycle_held(logger: Any) -> Iterator[None]:
    """Hold the writer's I/O lock, as a cycle in progress does: no write starts meanwhile."""
    with writer_of(logger)._io_lock:
        yield
