"""`MultiRankCallback` (integrations/transformers_callback.py) with Transformers' `Trainer` under
``torchrun --nproc-per-node 2`` on CPU (gloo): tests/scripts/transformers_train.py, a tiny GPT-2 from a
config, random embeddings, no hub. One launch per scenario, shared by the tests that read it (the
NaN run's ranks forked with torchrun's variables, launches.run_ranks_forked; the failing run is torchrun's own).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from multirank_logger import open_store
from multirank_logger.report import find
from tests.helpers.launches import REPO, SCRIPTS, free_port, run_launch, run_ranks_forked, with_transformers
from tests.helpers.logger_helpers import query, train_env

pytestmark = pytest.mark.timeout(600)

TRAIN = SCRIPTS / "transformers_train.py"
RANKS = 2
STEPS = 8
#: one launch's bound: a fresh CI machine's first launch imports torch, accelerate and transformers
#: cold (one ran past 240 s there, at the suite's start, where it passes in 70 s warm)
LAUNCH_TIMEOUT_S = 420


def _launch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={RANKS}",
        f"--master-port={free_port()}", str(TRAIN), "--db", str(tmp_path / "runs.duckdb"), "--steps", str(STEPS), *args,
    ]
    env = with_transformers({**train_env(), "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"})
    return run_launch(cmd, cwd=tmp_path, env=env, timeout=LAUNCH_TIMEOUT_S)


def _launch_forked(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`_launch`'s ranks forked as torchrun starts them (launches.run_ranks_forked), where what is
    tested is the callback's rows, not how torchrun ends a failed launch."""
    env = with_transformers({**train_env(), "HF_HUB_OFFLINE": "1"})
    return run_ranks_forked(TRAIN, ["--db", str(tmp_path / "runs.duckdb"), "--steps", str(STEPS), *args], nproc=RANKS,
                            cwd=tmp_path, env=env, timeout=LAUNCH_TIMEOUT_S)


@pytest.fixture(scope="module")
def nan_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Rank 1's batches carry NaN from its 6th batch (global step 6); rank 0 holds step 7 until
    its watch alerted."""
    tmp_path = tmp_path_factory.mktemp("transformers_nan")
    proc = _launch_forked(tmp_path, "--nan-rank", "1", "--nan-from", "5", "--await-alert-at", "7")
    assert proc.returncode == 0, proc.stdout[-8000:]
    return tmp_path / "runs.duckdb"


def test_every_rank_in_one_run(nan_run: Path) -> None:
    """One run of 2 ranks, ``success`` at ``on_train_end``; every rank's per-step values, steps 1..8."""
    assert query(nan_run, "SELECT id, name, status, world_size FROM runs") == [(1, "hf", "success", RANKS)]
    assert query(nan_run, "SELECT rank, status FROM ranks ORDER BY rank") == [(r, "success") for r in range(RANKS)]
    for key in ("train/loss", "train/learning_rate", "train/grad_norm", "log/loss"):
        steps = query(nan_run, f"SELECT rank, step FROM metrics WHERE key = '{key}' ORDER BY rank, step")
        assert steps == [(r, s) for r in range(RANKS) for s in range(1, STEPS + 1)], key


def test_each_rank_keeps_its_own_loss(nan_run: Path) -> None:
    """Before the NaN, each rank's own ``train/loss`` differs at every step, while the Trainer's
    ``on_log`` loss (its cross-rank reduction) is the same on both ranks."""
    own = query(nan_run, "SELECT step, count(DISTINCT value) FROM metrics WHERE key = 'train/loss' AND step < 6 GROUP BY step")
    assert own and all(n == RANKS for _, n in own), own
    logged = query(nan_run, "SELECT step, count(DISTINCT value) FROM metrics WHERE key = 'log/loss' GROUP BY step")
    assert logged and all(n == 1 for _, n in logged), logged


def test_the_bad_rank_is_alerted_during_training_and_named(nan_run: Path) -> None:
    """The watch alerted rank 1's own loss at step 6 while training ran; the report names rank 1
    as where the NaN loss began (rank 0 follows at step 7 through the all-reduce)."""
    alerts = query(nan_run, "SELECT rank, first_step, detail FROM alerts WHERE key = 'train/loss' ORDER BY seen_at")
    assert alerts[0][:2] == (1, 6) and '"at_end": true' not in alerts[0][2], alerts
    with open_store(nan_run) as reader:
        found = find(reader)
    losses = [n for n in found.non_finite if n["key"] == "train/loss"]
    first = min(losses, key=lambda n: n["first_step"])
    assert (first["rank"], first["first_step"]) == (1, 6)


def test_a_rank_that_raises_fails_the_run(tmp_path: Path) -> None:
    """Rank 1's collator raises at its 4th batch: the run and rank 1 end ``failed``."""
    proc = _launch(tmp_path, "--raise-rank", "1", "--raise-at", "3")
    assert proc.returncode != 0 and "rank 1 fails at batch 3" in proc.stderr, proc.stderr[-5000:]
    db = tmp_path / "runs.duckdb"
    assert query(db, "SELECT status FROM runs") == [("failed",)]
    ranks = dict(query(db, "SELECT rank, status FROM ranks ORDER BY rank"))
    assert ranks[1] == "failed" and ranks[0] in {"failed", "interrupted"}, ranks
    last = dict(query(db, "SELECT rank, max(step) FROM metrics WHERE key = 'train/loss' GROUP BY rank"))
    # batch 3 (0-based) feeds global step 4: rank 1 ends within step 3 (the Trainer's loader
    # builds the next batch before a step ends), its steps 1-2 kept
    assert last[1] == 2 and last[0] >= 2, last


def test_grad_norm_is_what_the_optimizer_receives(nan_run: Path) -> None:
    """Before the NaN: the same on both ranks (DDP all-reduced the gradients), positive, and at
    most the Trainer's ``max_grad_norm`` (1.0 by default: read after its clipping)."""
    norms = query(nan_run, "SELECT step, min(value), max(value) FROM metrics WHERE key = 'train/grad_norm' AND step < 6 GROUP BY step")
    assert len(norms) == 5 and all(0 < lo and hi - lo <= 1e-6 * hi and hi <= 1.0 + 1e-6 for _, lo, hi in norms), norms
