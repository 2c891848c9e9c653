"""multirank_logger: every rank's metrics from a Lightning DDP run, in one SQL store."""

from __future__ import annotations

__version__ = "0.1.0"

from multirank_logger.query import open_store  # noqa: E402
from multirank_logger.logger import MultiRankLogger  # noqa: E402
from multirank_logger.store import Store  # noqa: E402

__all__ = ["Store", "__version__", "open_store"]
