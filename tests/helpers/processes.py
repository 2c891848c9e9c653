"""Processes for tests: stopping one for sure (a rank 0 that stops answering), and a TCPStore
server in a process of its own, to stop and go on (a rank 0 that stops answering for a while)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tests.helpers.launches import free_port


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


@contextlib.contextmanager
def tcpstore_server_process() -> Iterator[tuple[int, subprocess.Popen[str]]]:
    """A TCPStore server in a child process: its port, and the process to SIGSTOP and SIGCONT."""
    port = free_port()
    code = (
        "import datetime, sys, time, torch.distributed as dist\n"
        f"s = dist.TCPStore('127.0.0.1', {port}, None, True, datetime.timedelta(seconds=10), wait_for_workers=False)\n"
        "print('up', flush=True)\ntime.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
        yield port, proc
    finally:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def stopped(process: subprocess.Popen[str]) -> Iterator[None]:
    """`process` stopped (SIGSTOP) inside the block, and going on (SIGCONT) after it."""
    stop_process(process.pid)
    try:
        yield
    finally:
        os.kill(process.pid, signal.SIGCONT)
