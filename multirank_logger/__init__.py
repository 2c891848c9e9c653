"""multirank_logger: every rank's metrics from a DDP run (Lightning, or any torch.distributed script), in one SQL store.

The public names are here; the layers below are described in docs/architecture.md.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

from multirank_logger._version import __version__

if TYPE_CHECKING:
    from multirank_logger.callbacks.decision_audit import DecisionAudit
    from multirank_logger.callbacks.step_timer import StepTimer
    from multirank_logger.callbacks.stop_on_alert import StopOnAlert
    from multirank_logger.ddp.console import rank_aware_console
    from multirank_logger.integrations.accelerate_tracker import MultiRankTracker
    from multirank_logger.integrations.plain import Run, init
    from multirank_logger.integrations.ray_train import MultiRankRayCallback
    from multirank_logger.integrations.transformers_callback import MultiRankCallback
    from multirank_logger.logger.multi_rank_logger import MultiRankLogger
    from multirank_logger.query.reader import StoreReader, open_store
    from multirank_logger.store.sql_store import Store

__all__ = [
    "DecisionAudit", "MultiRankCallback", "MultiRankLogger", "MultiRankRayCallback", "MultiRankTracker", "Run", "StepTimer", "StopOnAlert", "Store", "StoreReader", "__version__", "init",
    "open_store", "rank_aware_console",
]

# Each public name is imported on first use (PEP 562): the logger and callbacks import lightning
# or torch (seconds), the reader pyarrow and every query module, and a command that needs none of
# it (``multirank-logger hosts``) starts without them: tests/project/test_import_set.py. (With lightning
# loaded, DuckDB 2.0 also prints nanobind "leaked instances" noise at interpreter exit.)
_LAZY = {
    "StoreReader": "multirank_logger.query.reader",
    "open_store": "multirank_logger.query.reader",
    "Store": "multirank_logger.store.sql_store",
    "rank_aware_console": "multirank_logger.ddp.console",
    "MultiRankLogger": "multirank_logger.logger.multi_rank_logger",
    "DecisionAudit": "multirank_logger.callbacks.decision_audit",
    "StepTimer": "multirank_logger.callbacks.step_timer",
    "StopOnAlert": "multirank_logger.callbacks.stop_on_alert",
    # the plain API for any torch.distributed script (integrations/plain.py)
    "init": "multirank_logger.integrations.plain",
    "Run": "multirank_logger.integrations.plain",
    # optional frameworks (extras accelerate, transformers, ray): imported only when asked for
    "MultiRankTracker": "multirank_logger.integrations.accelerate_tracker",
    "MultiRankCallback": "multirank_logger.integrations.transformers_callback",
    "MultiRankRayCallback": "multirank_logger.integrations.ray_train",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name == "all_gather":
        warnings.warn(
            "multirank_logger.all_gather moved: import it from multirank_logger.ddp "
            "(from multirank_logger.ddp import all_gather). The old name will be removed.",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module("multirank_logger.ddp.tensor_gather").all_gather
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
