"""A store damaged during a run never gets a `success` run (issue 38: the store is checked
before it is written, and read back before its run is called a success)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers.launches import SCRIPTS
from tests.helpers.logger_helpers import train_env

SCRIPT = SCRIPTS / "damage_during_run.py"



def test_duckdb_store_damaged_while_the_logger_waits_is_not_a_success(tmp_path: Path) -> None:
    """4 KB overwritten in a block of the metrics table between two writes: DuckDB took every
    write and said nothing, and the run ended `success` with no spill file and exit 0. Rank 0
    reads the run's rows back before recording its end: the run is `failed`, and the message
    says the store was damaged and what to do."""
    db = tmp_path / "runs.duckdb"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(db), str(tmp_path / "spill")],
        cwd=tmp_path, env=train_env(), capture_output=True, text=True, timeout=240, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["status"] != ["success"], proc.stderr[-4000:]
    assert out["status"] == ["failed"], out
    assert "cannot read this run's rows back" in proc.stderr and "log the next run to another file" in proc.stderr
