"""The standalone ``pytorch_lightning`` package: one real 2-rank DDP training on its Trainer,
LightningModule and ModelCheckpoint (tests/scripts/pl_train.py), with DecisionAudit and StepTimer, run
as a user runs it (warnings on). Each test reads one behaviour of that one training."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from multirank_logger import MultiRankLogger, open_store
from multirank_logger.cli import main as cli
from tests.helpers.launches import SCRIPTS
from tests.helpers.logger_helpers import query, train_env

SCRIPT = SCRIPTS / "pl_train.py"


@pytest.fixture(scope="module")
def launch(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("pl")
    db = root / "runs.sqlite"
    env = train_env()
    del env["PYTHONWARNINGS"]  # as a user runs it: Lightning's own FutureWarnings are captured on every rank
    proc = subprocess.run([sys.executable, str(SCRIPT), "--db", str(db), "--save-dir", str(root)], cwd=root, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-6000:]
    return {"db": db, "output": proc.stdout}


def test_logger_is_both_packages_logger(launch: dict, tmp_path: Path) -> None:
    """Code that filters trainer.loggers by type finds it, under either package's Logger."""
    import lightning.pytorch
    import pytorch_lightning

    assert "pytorch_lightning Logger True, lightning Logger True" in launch["output"]
    # read before fit: rank 1 learned rank 0's run from the environment pytorch_lightning's launcher
    # gave it (launch_env.py hooks that package's launcher too); rank 0's own never held it
    out = launch["output"]
    # not anchored to lines: the two ranks' lines may interleave on the shared pipe
    assert sorted(re.findall(r"pl_train: rank (\d) version before fit (\d+)", out)) == [("0", "0"), ("1", "0")]
    held = sorted(re.findall(r"pl_train: rank (\d) environment holds (\[[^]]*\])", out))
    assert held == [("0", "[]"), ("1", "['MULTIRANK_LOGGER_RUN_0']")], out[-3000:]
    logger = MultiRankLogger(tmp_path, db=tmp_path / "runs.sqlite")
    assert isinstance(logger, (pytorch_lightning.loggers.Logger, pytorch_lightning.loggers.CSVLogger))
    assert isinstance(logger, (lightning.pytorch.loggers.Logger, lightning.pytorch.loggers.CSVLogger))


def test_decision_audit_records_pytorch_lightning_checkpoints(launch: dict) -> None:
    """pytorch_lightning's ModelCheckpoint saves at every epoch (val_loss falls): each rank's row."""
    with open_store(launch["db"]) as reader:
        df = reader.decisions()
    rows = sorted((r["epoch"], r["rank"], r["vote"], r["decision"]) for r in df.to_dict("records"))
    assert rows == [(epoch, rank, True, True) for epoch in range(3) for rank in range(2)]
    assert all(str(path).endswith(".ckpt") for path in df[df["rank"] == 0]["path"])


def test_step_timer_records_every_rank(launch: dict) -> None:
    """StepTimer under pytorch_lightning's Trainer: every step of both ranks (2 a epoch, 3 epochs)."""
    rows = query(launch["db"], "SELECT rank, COUNT(*), MIN(forward_s) FROM step_timing GROUP BY rank ORDER BY rank")
    assert [(rank, count) for rank, count, _ in rows] == [(0, 6), (1, 6)] and all(r[2] > 0 for r in rows)


def test_clean_run_report_says_nothing_stands_out(launch: dict) -> None:
    """Lightning's own FutureWarning, raised alike on every rank, is a notice shown apart; the
    report of a clean run ends saying nothing stands out."""
    result = CliRunner().invoke(cli, ["report", str(launch["db"])])
    assert result.exit_code == 0, result.output
    assert "Warnings and errors" not in result.output
    if "LeafSpec" in launch["output"]:  # lightning 2.6 on torch 2.13: every rank warns alike
        notices = result.output.split("Notices (library warnings that name no rank; no finding):")[1]
        assert "on ranks [0, 1] (2x)" in notices and "FutureWarning: `isinstance(treespec, LeafSpec)`" in notices
    assert result.output.rstrip().endswith("Nothing stands out.")
