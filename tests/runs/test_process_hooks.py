"""Process-wide hooks with real forks and real signals (tests/scripts/hooks_scenarios.py runs each
scenario in its own process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.launches import SCRIPTS
from tests.helpers.logger_helpers import query, run_training, train_env

SCENARIOS = SCRIPTS / "hooks_scenarios.py"



def _run(*args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, str(SCENARIOS), *args],
        check=False, env=train_env(), capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_forked_child_neither_hangs_nor_writes_the_parents_rows(tmp_path: Path) -> None:
    """os.fork with the parent's writer thread, store connection and locks taken: the child logs
    and finalizes on its own; every row (parent's before and after the fork, child's) is stored
    exactly once and the SQLite file is intact."""
    out = _run("fork", str(tmp_path / "runs.sqlite"))
    assert not out["child_hung"] and out["child_status"] == 0, out
    assert out["values"] == [float(i) for i in [*range(60), *range(100, 130)]]
    assert len(set(out["seqs"])) == len(out["seqs"]) == 90
    assert out["integrity"] == "ok"


@pytest.mark.parametrize("suffix", [".sqlite", ".duckdb"])
def test_a_fork_that_is_no_launch_leaves_no_run_behind(tmp_path: Path, suffix: str) -> None:
    """The before-fork hook allocates an unused logger's run (it cannot tell a DataLoader
    worker's fork from ddp_notebook's); the process's exit removes it, since no launch began."""
    db = tmp_path / f"runs{suffix}"
    out = _run("unused-fork", str(db))
    assert out == {"runs_after_the_fork": 1, "run_id": 1}
    assert query(db, "SELECT count(*) FROM runs") == [(0,)]


def test_sigterm_during_setup_chains_without_waiting_for_the_setup(tmp_path: Path) -> None:
    """SIGTERM while the main thread holds the logger's set-up lock: our handler does not wait for a
    flush that needs that lock (it chains at once, so the set-up can finish), and the rows are stored."""
    out = _run("sigterm-in-setup", str(tmp_path / "runs.duckdb"), str(tmp_path / "chained"))
    assert out["chained"] == [15], out  # passed on once
    assert out["released_by"] == "marker", out  # the chain ran while the set-up was still waiting
    assert out["rows"] == 10, out


def test_finalize_puts_the_previous_sigterm_handler_back(tmp_path: Path) -> None:
    """Our handler is outermost while the run logs, and the one from before is back after finalize."""
    out = _run("release", str(tmp_path / "runs.sqlite"))
    assert out == {"ours_during_the_run": True, "previous_back_after_finalize": True}


@pytest.mark.parametrize("suffix", [".sqlite", ".duckdb"])
def test_ddp_notebook_forks_ranks_that_log_every_row_once(tmp_path: Path, suffix: str) -> None:
    """strategy="ddp_notebook" forks the ranks from a parent whose logger already allocated the run
    and started its writer: each rank stores its own rows once, and the run ends as success."""
    db = tmp_path / f"runs{suffix}"
    run_training(db, tmp_path, "--strategy", "ddp_notebook", "--steps", "6", timeout=240)
    rows = query(
        db,
        "SELECT rank, count(*), count(DISTINCT seq) FROM metrics WHERE key = 'rank_value' GROUP BY rank ORDER BY rank",
    )
    assert rows == [(0, 6, 6), (1, 6, 6)]
    assert query(db, "SELECT status FROM runs") == [("success",)]
