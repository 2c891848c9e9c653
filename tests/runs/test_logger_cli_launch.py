"""MultiRankLogger picked from LightningCLI's command line, the way CSVLogger users write it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.launches import SCRIPTS, run_script_forked
from tests.helpers.logger_helpers import query, train_env

# LightningCLI needs jsonargparse[signatures], not among the package's test extras yet
pytest.importorskip("jsonargparse")

CLI = SCRIPTS / "logger_cli.py"


def _fit(cwd: Path) -> None:
    """`python logger_cli.py fit ...`, forked from a server that imported Lightning once
    (launches.run_script_forked): the CLI's reading of the logger is what is tested, not a process's start."""
    args = [
        "fit", "--trainer.logger=multirank_logger.MultiRankLogger", "--trainer.logger.db=runs.sqlite",
        "--trainer.max_steps=2", "--trainer.accelerator=cpu", "--trainer.devices=1",
        "--trainer.enable_progress_bar=false", "--trainer.log_every_n_steps=1",
    ]
    proc = run_script_forked(CLI, args, cwd=cwd, env=train_env(), timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:]


def test_lightningcli_runs_twice_in_one_directory(tmp_path: Path) -> None:
    """Two runs from LightningCLI: config.yaml lands in each version dir, the 2nd run does not fail."""
    _fit(tmp_path)
    _fit(tmp_path)
    for version in (0, 1):
        assert (tmp_path / "lightning_logs" / f"version_{version}" / "config.yaml").is_file()
    assert not (tmp_path / "config.yaml").exists()
    assert query(tmp_path / "runs.sqlite", "SELECT version, status FROM runs ORDER BY id") == [(0, "success"), (1, "success")]
