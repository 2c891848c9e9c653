"""multirank_logger: every rank's metrics from a Lightning DDP run, in one SQL store."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from multirank_logger._version import __version__
from multirank_logger.query import open_store
from multirank_logger.store import Store

if TYPE_CHECKING:
    from multirank_logger.logger import MultiRankLogger
    from multirank_logger.step_timer import StepTimer

__all__ = ["MultiRankLogger", "StepTimer", "Store", "__version__", "open_store"]


def __getattr__(name: str) -> Any:
    # MultiRankLogger imports lightning and torch (~3 s): load it on first use, so that the
    # CLI and the query side start fast. (With lightning loaded, DuckDB 2.0 also prints
    # nanobind "leaked instances" noise at interpreter exit.)
    if name == "MultiRankLogger":
        from multirank_logger.logger import MultiRankLogger

        return MultiRankLogger
    if name == "StepTimer":
        from multirank_logger.step_timer import StepTimer

        return StepTimer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
