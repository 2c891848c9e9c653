"""multirank_logger: every rank's metrics from a Lightning DDP run, in one SQL store."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from multirank_logger._version import __version__
from multirank_logger.console import rank_aware_console
from multirank_logger.query import open_store
from multirank_logger.store import Store

if TYPE_CHECKING:
    from multirank_logger.decisions import DecisionAudit
    from multirank_logger.logger import MultiRankLogger
    from multirank_logger.step_timer import StepTimer
    from multirank_logger.tensor_gather import all_gather

__all__ = [
    "DecisionAudit", "MultiRankLogger", "StepTimer", "Store", "__version__", "all_gather", "open_store",
    "rank_aware_console",
]

# These import lightning or torch (seconds): load them on first use, so that the CLI and the
# query side start fast. (With lightning loaded, DuckDB 2.0 also prints nanobind "leaked
# instances" noise at interpreter exit.)
_LAZY = {
    "MultiRankLogger": "multirank_logger.logger",
    "DecisionAudit": "multirank_logger.decisions",
    "StepTimer": "multirank_logger.step_timer",
    "all_gather": "multirank_logger.tensor_gather",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
