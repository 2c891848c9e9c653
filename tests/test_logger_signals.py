"""Preemption: SIGTERM sent to the whole process group of a 2-rank DDP launch, as a scheduler does.

The writer's interval is an hour, so the rows can only reach the store through the flush
that SIGTERM triggers (and the finalize("failed") that follows).

Lightning's own SIGTERM handler broadcasts from inside the signal handler, which races the
collective the other rank may be in: the job then exits within seconds, or hangs until the
scheduler's SIGKILL (seen with CSVLogger too, see DESIGN.md). Our handler runs first and
flushes, so the rows must be in the store either way; the run's status can only be recorded
when the job got to exit by itself.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.logger_helpers import query, train_cmd, train_env

SEEN_STEPS = 3
GRACE_S = 15  # a scheduler's grace period between SIGTERM and SIGKILL


def _wait_for_steps(proc: subprocess.Popen[str], steps: int, timeout: float) -> str:
    """Read the launch's output until both ranks printed `steps` steps."""
    seen: dict[int, int] = {}
    out = []
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        out.append(line)
        match = re.match(r"rank (\d) step (\d+)", line)
        if match:
            seen[int(match[1])] = int(match[2])
            if len(seen) == 2 and min(seen.values()) >= steps:
                return "".join(out)
    raise AssertionError("the launch did not reach the steps in time:\n" + "".join(out)[-3000:])


@pytest.mark.parametrize("backend", ["sqlite", "duckdb"])
def test_sigterm_to_the_process_group_flushes_every_rank(tmp_path: Path, backend: str) -> None:
    """kill -TERM -PGID: every rank's rows up to the signal are in the store; the run is interrupted."""
    db = tmp_path / ("runs.sqlite" if backend == "sqlite" else "runs.duckdb")
    cmd = train_cmd(db, tmp_path, "--steps", "400", "--sleep", "0.1", "--flush-interval", "3600")
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=train_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    exited = False
    try:
        _wait_for_steps(proc, SEEN_STEPS, timeout=90)
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            rest, _ = proc.communicate(timeout=GRACE_S)
            exited = True
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rest, _ = proc.communicate()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    counts = dict(query(db, "SELECT rank, COUNT(*) FROM metrics WHERE key = 'rank_value' GROUP BY rank"))
    # a rank that printed step S had its steps 0..S-1 through log_metrics before the signal
    assert counts.get(0, 0) >= SEEN_STEPS and counts.get(1, 0) >= SEEN_STEPS, (counts, rest[-3000:])
    if exited:
        assert query(db, "SELECT status FROM runs") == [("interrupted",)], rest[-3000:]
