"""Preemption: SIGTERM sent to the whole process group of a 2-rank DDP launch, as a scheduler does.

The writer's interval is an hour, so the rows can only reach the store through the flush
that SIGTERM triggers (and the finalize("failed") that follows).

Lightning's own SIGTERM handler broadcasts from inside the signal handler, which pairs with
whatever collective the other rank is in: the job hung until SIGKILL in 3 of 7 launches looped
here under load (issue 13 item 5). Our handler is outermost and chains to Lightning's without
that broadcast (process_hooks.py; Lightning's loop broadcasts the flag at every batch from a
safe point), so the job must now end by itself, every time: the test is repeated
(MULTIRANK_SIGTERM_REPEATS, default 2 to keep the suite short; set it to 25 to hunt a race)
because one launch proves little about one.
Measured locally before the fix: 3 hangs in 7 launches (DuckDB); after: 0 in 20 (DuckDB) and
0 in 12 (SQLite), 2 cores shared with other test runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.helpers.logger_helpers import query, train_cmd, train_env, wait_for_steps

SEEN_STEPS = 3
GRACE_S = 60  # a scheduler's grace period between SIGTERM and SIGKILL (generous: CI is slow, a hang is forever)
REPEATS = int(os.environ.get("MULTIRANK_SIGTERM_REPEATS", "2"))



@pytest.mark.parametrize("attempt", range(REPEATS))
def test_sigterm_to_the_process_group_flushes_every_rank(tmp_path: Path, attempt: int) -> None:
    """kill -TERM -PGID: the job ends by itself; every rank's rows up to the signal are stored; interrupted.
    One launch logs to a SQLite store (direct) and a DuckDB one (gather), a logger each: both flush."""
    (tmp_path / "duckdb").mkdir()
    stores = [tmp_path / "runs.sqlite", tmp_path / "duckdb" / "runs.duckdb"]
    cmd = train_cmd(stores[0], tmp_path, "--also-db", str(stores[1]), "--steps", "400", "--sleep", "0.1",
                    "--flush-interval", "3600")
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=train_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    exited = False
    try:
        wait_for_steps(proc, SEEN_STEPS, timeout=90)
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
    assert exited, f"the job hung after SIGTERM (killed after {GRACE_S} s):\n{rest[-3000:]}"
    for db, transport in zip(stores, ("direct", "gather")):
        counts = dict(query(db, "SELECT rank, COUNT(*) FROM metrics WHERE key = 'rank_value' GROUP BY rank"))
        # a rank that printed step S had its steps 0..S-1 through log_metrics before the signal
        assert counts.get(0, 0) >= SEEN_STEPS and counts.get(1, 0) >= SEEN_STEPS, (db.name, counts, rest[-3000:])
        assert query(db, "SELECT status, transport FROM runs") == [("interrupted", transport)], rest[-3000:]


def test_sigterm_reaches_every_rank_at_once_while_rank_0_flushes(tmp_path: Path) -> None:
    """kill -TERM -PGID landing in the work after a step, while rank 0's flush takes seconds.

    Rank 1 needs nothing from rank 0 until the next step: it ends its run, and Lightning's
    teardown puts the default SIGTERM action back, while rank 0 still flushes. Lightning's
    launcher forwards SIGTERM to the ranks it started. Sent once rank 0's flush was over, that
    forward killed rank 1 while it took its time to exit (-15); Lightning's child observer then
    SIGKILLed rank 0, in CI before it recorded the run's end, which stayed "running". The
    forward now goes out at once, from the listener thread.
    """
    db = tmp_path / "runs.duckdb"
    cmd = train_cmd(
        db, tmp_path, "--steps", "400", "--sleep-after", "0.5", "--slow-sigterm-flush", "3", "--linger", "7",
        "--flush-interval", "3600",
    )
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=train_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    try:
        wait_for_steps(proc, SEEN_STEPS, timeout=90)  # both ranks just printed: they sleep after their step
        os.killpg(proc.pid, signal.SIGTERM)
        rest, _ = proc.communicate(timeout=GRACE_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert "terminated with code" not in rest and proc.returncode == 0, (proc.returncode, rest[-3000:])
    assert query(db, "SELECT status FROM runs") == [("interrupted",)], rest[-3000:]
    counts = dict(query(db, "SELECT rank, COUNT(*) FROM metrics WHERE key = 'rank_value' GROUP BY rank"))
    assert counts.get(0, 0) >= SEEN_STEPS and counts.get(1, 0) >= SEEN_STEPS, (counts, rest[-3000:])
