"""Run a generator one item ahead, on its own thread: the next item is made while this one is used.

The report's pass over a run reads a window of rows from the store (DuckDB, SQLite and NumPy
release the GIL while they work) while the previous window's statistics are computed: on two
cores the read no longer waits for the arithmetic, nor the arithmetic for the read.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

__all__ = ["prefetched"]

T = TypeVar("T")

_DONE = object()


def prefetched(produce: Callable[[], Iterator[T]], ahead: int = 1) -> Iterator[T]:
    """The items of ``produce()``, which runs on a thread of its own, at most ``ahead`` items
    ahead of the caller (each held item is memory: keep it small).

    Everything ``produce`` opens (a connection) is used on that thread alone. An exception it
    raises is raised here, at the item where it happened. When the caller stops early (a break,
    an exception), the producer is told to stop at its next item and is waited for, so what it
    holds open is closed before this returns.
    """
    items: queue.Queue[tuple[Any, BaseException | None]] = queue.Queue(maxsize=max(1, ahead))
    stop = threading.Event()

    def put(item: Any, error: BaseException | None = None) -> bool:
        while not stop.is_set():
            try:
                items.put((item, error), timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for item in produce():
                if not put(item):
                    return
            put(_DONE)
        except BaseException as exc:  # handed to the caller, who raises it
            put(_DONE, exc)

    worker = threading.Thread(target=run, name="multirank-logger-prefetch", daemon=True)
    worker.start()
    try:
        while True:
            item, error = items.get()
            if error is not None:
                raise error
            if item is _DONE:
                return
            yield item
    finally:
        stop.set()
        worker.join()
