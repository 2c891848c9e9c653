"""A launch SIGKILLed (as the OOM killer does) records no end; the resumed launch closes that
attempt as 'vanished' (a real process, killed)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from multirank_logger.cli import main as cli
from tests.helpers.logger_helpers import logged_launch, query, train_env

_KILLED_LAUNCH = """
import sys, time
from multirank_logger import MultiRankLogger
logger = MultiRankLogger(db=sys.argv[1], name="job", flush_interval=3600)
for step in range(3):
    logger.log_metrics({"loss": float(step)}, step=step)
logger.experiment.save()  # stored now: the run is 'running' with values, then the process dies unrecorded
print("stored", flush=True)
time.sleep(600)
"""


def test_sigkilled_attempt_is_vanished_when_the_run_resumes(db_path: Path) -> None:
    """A launch SIGKILLed (as the OOM killer does) records no end: `runs` shows the run running and
    how long it has been silent; the resumed launch closes that attempt as 'vanished' and ends the
    run as success with both launches' rows."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_LAUNCH, str(db_path)], stdout=subprocess.PIPE, text=True, env=train_env()
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "stored"
    finally:
        proc.kill()
        proc.wait(30)
    assert query(db_path, "SELECT status FROM runs") == [("running",)]
    shown = CliRunner().invoke(cli, ["runs", str(db_path)])
    assert shown.exit_code == 0, shown.output
    assert re.search(r"running \(last value \d+(\.\d)?s ago\)", shown.output), shown.output
    assert query(db_path, "SELECT attempt, status, ended_at FROM attempts") == [(0, "running", None)]

    logged_launch(db_path, range(2, 5), 100.0, version=0)
    assert query(db_path, "SELECT attempt, status, ended_at IS NULL FROM attempts ORDER BY attempt") == [
        (0, "vanished", True),
        (1, "success", False),
    ]
    assert query(db_path, "SELECT rank, status FROM ranks") == [(0, "success")]
    assert query(db_path, "SELECT status FROM runs") == [("success",)]
    values = query(db_path, "SELECT step, seq >> 40 FROM metrics WHERE key = 'loss' ORDER BY seq")
    assert values == [(0, 0), (1, 0), (2, 0), (2, 1), (3, 1), (4, 1)]
    assert "success" in CliRunner().invoke(cli, ["runs", str(db_path)]).output
