"""Files we write get the mode the user's umask gives, as CSVLogger's do (a real umask, a real process)."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.logger_helpers import train_env

# one process, one rank: MultiRankLogger and CSVLogger log the same calls, then a spill file
_SCRIPT = r"""
import json, os, sys
os.umask(int(sys.argv[2], 8))
from pathlib import Path
from lightning.pytorch.loggers import CSVLogger
from multirank_logger import MultiRankLogger
from multirank_logger.write.buffer import RecordBuffer
from multirank_logger.store.spill_file import SpillWriter

out = Path(sys.argv[1])
ours = MultiRankLogger(db=str(out / "runs.sqlite"), save_dir=str(out / "ours"))
theirs = CSVLogger(str(out / "theirs"))
for logger in (ours, theirs):
    logger.log_hyperparams({"lr": 0.1})
    for step in range(3):
        logger.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
    logger.save()
    logger.finalize("success")
buffer = RecordBuffer()
buffer.append(0, {"loss": 1.0})
spill = SpillWriter(out / "spill", run_id=1, name="x", version=0, rank=1)
spill.write([buffer.drain(1, 1)])

def mode(path):
    return os.stat(path).st_mode & 0o777

print(json.dumps({
    "ours_csv": mode(Path(ours.log_dir) / "metrics.csv"),
    "ours_yaml": mode(Path(ours.log_dir) / "hparams.yaml"),
    "theirs_csv": mode(Path(theirs.log_dir) / "metrics.csv"),
    "theirs_yaml": mode(Path(theirs.log_dir) / "hparams.yaml"),
    "spill": mode(spill.path),
}))
"""


@pytest.mark.parametrize("umask", [0o022, 0o007])  # the usual, and a group-shared one (no bits for others)
def test_written_files_follow_the_umask(tmp_path: Path, umask: int) -> None:
    """metrics.csv, hparams.yaml and spill files: 0o666 & ~umask, the mode CSVLogger's files get."""
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(tmp_path), oct(umask)[2:]],
        check=False,
        env=train_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    modes = json.loads(proc.stdout.strip().splitlines()[-1])
    expected = 0o666 & ~umask
    assert modes == {k: expected for k in modes}, {k: stat.filemode(v) for k, v in modes.items()}
