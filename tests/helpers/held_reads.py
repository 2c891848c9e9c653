"""A report's pass (or a page request's) held mid-way until its reads are stopped: a test that
must act while the reads run (Ctrl-C, a request's bound) holds them there itself, instead of
counting on a store big enough, or a machine slow enough, for the reads to last.

The pass asks `StoreReader.check_stopped` before each connection and window it reads, on its own
threads (``PASS_THREADS``). The hold takes the `HOLD_AT`-th such question: the run's span has
been read and the next read (SQLite: the first window; DuckDB: a reader thread's connection or
window) waits until the reader is stopped (`StoreReader.interrupt`: Ctrl-C, the page's bound,
the test), then goes on to the real check, which raises `ReadsStopped`. A pass never held (a
renamed thread, a run with no rows) goes on unheld and the waiting test fails saying so.

In a process of its own: ``python -m tests.helpers.held_reads MARKER ARGS...`` runs
``multirank-logger ARGS...`` with the hold, and creates the file MARKER once the pass is held.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from multirank_logger.query.reader import StoreReader
from tests.helpers.quick_exit import with_real_teardown

__all__ = ["HOLD_AT", "PASS_THREADS", "held_pass", "start_held", "wait_held"]

#: the threads the report's pass reads on (query/run_scan.py: the prefetch thread, the reader pool)
PASS_THREADS = ("multirank-logger-prefetch", "multirank-logger-read_")
#: the question held: the first is the prefetch thread's connection, before the run's span is read
HOLD_AT = 2
#: the longest a pass is held with nobody stopping it (then it goes on, and the test fails)
HOLD_LIMIT_S = 60.0


def _install(on_held: Callable[[], None]) -> Callable[[], None]:
    """Hold the pass (see the module docstring); returns what undoes it."""
    original = StoreReader.check_stopped
    asked = 0
    counting = threading.Lock()

    def check_stopped(self: StoreReader) -> None:
        nonlocal asked
        if threading.current_thread().name.startswith(PASS_THREADS):
            with counting:
                asked += 1
                hold = asked == HOLD_AT
            if hold:
                on_held()
                ends_by = time.monotonic() + HOLD_LIMIT_S
                while self.stopped is None and time.monotonic() < ends_by:
                    time.sleep(0.01)
        original(self)

    StoreReader.check_stopped = check_stopped  # type: ignore[method-assign]
    return lambda: setattr(StoreReader, "check_stopped", original)


@contextlib.contextmanager
def held_pass() -> Iterator[threading.Event]:
    """In this process: every pass begun in the block is held; the event is set once one is."""
    held = threading.Event()
    undo = _install(held.set)
    try:
        yield held
    finally:
        undo()


def start_held(marker: Path, *args: str) -> subprocess.Popen[str]:
    """``multirank-logger ARGS...`` in a process of its own whose pass is held; ``marker`` is
    created once it is (`wait_held`). Text pipes for stdout and stderr."""
    # its whole teardown (tests/query/test_reads_stop.py: a stopped read must not abort at the end)
    return subprocess.Popen([sys.executable, "-m", "tests.helpers.held_reads", str(marker), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=with_real_teardown(os.environ))


def wait_held(proc: subprocess.Popen[str], marker: Path, limit_s: float = HOLD_LIMIT_S) -> None:
    """Until ``proc``'s pass is held; an AssertionError with what it said if it ended first."""
    ends_by = time.monotonic() + limit_s
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > ends_by:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"the pass was never held (exit {proc.returncode}):\n{out}\n{err}")
        time.sleep(0.01)


if __name__ == "__main__":
    from multirank_logger.cli import main

    _install(lambda: Path(sys.argv[1]).touch())
    main(sys.argv[2:], prog_name="multirank-logger")
