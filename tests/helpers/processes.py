"""Processes for tests: stopping one for sure (a rank 0 that stops answering)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def stop_process(pid: int, timeout: float = 30.0) -> None:
    """SIGSTOP `pid` and return once every thread of it is stopped: kill() only queues the signal,
    and on a loaded machine a server thread can still answer a request after kill() returned."""
    os.kill(pid, signal.SIGSTOP)
    tasks = Path(f"/proc/{pid}/task")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = []
        for task in tasks.iterdir():
            try:  # "pid (comm) S ...": the state follows the last ')'
                states.append((task / "stat").read_text().rpartition(")")[2].split()[0])
            except (FileNotFoundError, ProcessLookupError):
                continue  # a thread that ended meanwhile
        if states and all(state in "tT" for state in states):
            return
        time.sleep(0.005)
    raise TimeoutError(f"process {pid} did not stop within {timeout:g} s of SIGSTOP")
