"""Import a module on a thread of its own while the caller does work that releases the GIL."""

from __future__ import annotations

import importlib
import sys
import threading

__all__ = ["import_in_background"]


def import_in_background(name: str) -> None:
    """Start importing module `name` on a daemon thread; nothing when it is imported already.

    ``per_rank`` builds a pandas DataFrame from a query that DuckDB runs without the GIL: pandas'
    import (0.3-0.5 s on 2 cores) runs beside the query instead of before it. A later ``import``
    of the same module waits for this one (Python's per-module import lock), and an error is
    raised there: a failed import here leaves nothing behind.
    """
    if name not in sys.modules:
        threading.Thread(target=_import_quietly, args=(name,), name=f"multirank-logger-import-{name}", daemon=True).start()


def _import_quietly(name: str) -> None:
    try:
        importlib.import_module(name)
    except Exception:  # noqa: BLE001 - the caller's own import raises it where it is needed
        pass
