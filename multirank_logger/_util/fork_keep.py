"""Objects a forked child must never destroy, not even at its interpreter's teardown.

A forked child inherits the parent's memory but none of its threads. A native object that owns
threads (a DuckDB database: its task scheduler's workers) joins them when destroyed: in the child
those threads do not exist, and the join waits on whatever thread of the child took over their
stack (hangs), or std::terminate aborts the process ("terminate called without an active
exception", exit 134). Module globals are cleared at the interpreter's teardown, so holding such
an object in a list is not enough: its reference count must never reach zero in the child.
"""

from __future__ import annotations

import ctypes

__all__ = ["keep_forever"]


def keep_forever(obj: object) -> None:
    """Add a reference that nothing ever drops: `obj` outlives this process's teardown."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
