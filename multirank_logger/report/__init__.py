"""Which rank is the problem: findings computed from the query side, rendered as text, HTML and plots.

Example::

    from multirank_logger import open_store
    from multirank_logger.report import find

    with open_store("runs.sqlite") as reader:
        found = find(reader, run="lightning_logs/version_3")   # a Findings
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from multirank_logger.report.findings import Findings, find

__all__ = ["Findings", "find"]


def __getattr__(name: str) -> Any:
    # on first use (PEP 562): a module of this package that lays out rows (host_list.py) imports
    # no findings pass with it (tests/project/test_import_set.py)
    if name in __all__:
        return getattr(importlib.import_module("multirank_logger.report.findings"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
