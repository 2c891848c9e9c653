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


def prefetched(produce: Callable[[], Iterator[T]], ahead: int = 0) -> Iterator[T]:
    """The items of ``produce()``, which runs on a thread of its own: it makes the next item while
    the caller uses this one, and holds at most ``ahead`` more ready (each held item is memory).

    Everything ``produce`` opens (a connection) is used on that thread alone. An exception it
    raises is raised here, at the item where it happened. When the caller stops early (a break,
    an exception), the producer is told to stop at its next item and is waited for, so what it
    holds open is closed before this returns.
    """
    items: queue.SimpleQueue[tuple[Any, BaseException | None]] = queue.SimpleQueue()
    room = threading.Semaphore(ahead + 1)  # items the producer may make before the caller takes one
    stop = threading.Event()

    def run() -> None:
        try:
            for item in produce():
                items.put((item, None))
                while not room.acquire(timeout=0.1):  # wait for the caller to take one
                    if stop.is_set():
                        return
            items.put((_DONE, None))
        except BaseException as exc:  # handed to the caller, who raises it
            items.put((_DONE, exc))

    room.acquire()  # the first item
    worker = threading.Thread(target=run, name="multirank-logger-prefetch", daemon=True)
    worker.start()
    try:
        while True:
            item, error = items.get()
            if error is not None:
                raise error
            if item is _DONE:
                return
            room.release()
            yield item
    finally:
        stop.set()
        worker.join()
