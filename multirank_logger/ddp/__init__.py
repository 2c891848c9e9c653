"""Helpers for DDP code itself: a rank-aware console, every rank's log records, and `all_gather`
of tensors of different shapes that keeps the local slice's autograd graph."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from multirank_logger.ddp.console import rank_aware_console

if TYPE_CHECKING:
    from multirank_logger.ddp.tensor_gather import all_gather

__all__ = ["all_gather", "rank_aware_console"]


def __getattr__(name: str) -> Any:
    # all_gather imports torch (seconds): load it on first use
    if name == "all_gather":
        return importlib.import_module("multirank_logger.ddp.tensor_gather").all_gather
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
