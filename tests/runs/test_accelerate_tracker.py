"""`MultiRankTracker` (integrations/accelerate_tracker.py) in a real Accelerate launch:
tests/scripts/accelerate_train.py, 2 processes on CPU over gloo, each logging its own loss through
``tracker.log`` (Accelerate calls trackers on the main process only).

Launched with torchrun, not ``accelerate launch --cpu --num_processes 2``: on CPU, Accelerate 1.15's
launcher starts one process unless mpirun is set up (``simple_launcher``; ``--multi_gpu`` with
``--cpu`` is refused). The Accelerator reads torchrun's RANK/WORLD_SIZE and runs over gloo, as
under a multi-CPU ``accelerate launch``.

One launch per scenario, shared by the tests that read it.
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

TRAIN = SCRIPTS / "accelerate_train.py"
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
    env = {**train_env(), "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    return run_launch(cmd, cwd=tmp_path, env=env, timeout=LAUNCH_TIMEOUT_S)


def _launch_forked(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`_launch`'s ranks forked as torchrun starts them (launches.run_ranks_forked), where what is
    tested is the tracker's rows, not how torchrun ends a failed launch."""
    env = {**train_env(), "HF_HUB_OFFLINE": "1"}
    return run_ranks_forked(TRAIN, ["--db", str(tmp_path / "runs.duckdb"), "--steps", str(STEPS), *args], nproc=RANKS,
                            cwd=tmp_path, env=env, timeout=LAUNCH_TIMEOUT_S)


@pytest.fixture(scope="module")
def nan_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Rank 1's batches carry NaN from step 5; rank 0 holds step 6 until its watch alerted."""
    tmp_path = tmp_path_factory.mktemp("accelerate_nan")
    proc = _launch_forked(tmp_path, "--nan-rank", "1", "--nan-from", "5", "--await-alert-at", "6")
    assert proc.returncode == 0, proc.stdout[-8000:]
    return tmp_path / "runs.duckdb"


def test_every_process_in_one_run(nan_run: Path) -> None:
    """One run of 2 ranks, ``success``, config stored; each process's rows under its rank."""
    assert query(nan_run, "SELECT id, name, status, world_size, hparams FROM runs") == [
        (1, "accel", "success", RANKS, '{"lr": 0.1, "steps": 8}')]
    assert query(nan_run, "SELECT rank, status FROM ranks ORDER BY rank") == [(r, "success") for r in range(RANKS)]
    values = query(nan_run, "SELECT rank, step, value FROM metrics WHERE key = 'rank_value' ORDER BY rank, step")
    assert values == [(r, s, float(1000 * r + s)) for r in range(RANKS) for s in range(STEPS)]


def test_each_rank_keeps_its_own_loss(nan_run: Path) -> None:
    """The processes' targets differ: at step 0 their losses differ, each stored under its rank;
    ``accelerator.log`` (main process only) recorded rank 0 alone."""
    first = query(nan_run, "SELECT rank, value FROM metrics WHERE key = 'train_loss' AND step = 0 ORDER BY rank")
    assert [r for r, _ in first] == [0, 1] and first[0][1] != first[1][1]
    assert query(nan_run, "SELECT DISTINCT rank FROM metrics WHERE key = 'main_only'") == [(0,)]


def test_the_bad_rank_is_alerted_during_training_and_named(nan_run: Path) -> None:
    """The watch alerted rank 1 at step 5 while training ran (not at the end); the report names
    rank 1 as where the NaN began (rank 0 follows through the all-reduce)."""
    alerts = query(nan_run, "SELECT rank, key, first_step, detail FROM alerts WHERE kind = 'non_finite' ORDER BY seen_at")
    assert alerts[0][:3] == (1, "train_loss", 5)
    assert '"at_end": true' not in alerts[0][3], alerts[0]
    with open_store(nan_run) as reader:
        found = find(reader)
    first = min(found.non_finite, key=lambda n: n["first_step"])
    assert (first["rank"], first["key"], first["first_step"]) == (1, "train_loss", 5)


def test_a_rank_that_raises_fails_the_run(tmp_path: Path) -> None:
    """Rank 1 raises at step 3: the run and rank 1 end ``failed``, the rows before kept."""
    proc = _launch(tmp_path, "--raise-rank", "1", "--raise-at", "3")
    assert proc.returncode != 0 and "rank 1 fails at step 3" in proc.stderr, proc.stderr[-5000:]
    db = tmp_path / "runs.duckdb"
    assert query(db, "SELECT status FROM runs") == [("failed",)]
    ranks = dict(query(db, "SELECT rank, status FROM ranks ORDER BY rank"))
    assert ranks[1] == "failed" and ranks[0] in {"failed", "interrupted"}, ranks
    last = dict(query(db, "SELECT rank, max(step) FROM metrics WHERE key = 'rank_value' GROUP BY rank"))
    assert last[1] == 2 and last[0] >= 2, last


def test_importing_the_package_loads_neither_framework() -> None:
    """``import multirank_logger`` imports neither accelerate nor transformers (they are extras);
    the names load them on first use."""
    code = (
        "import sys, multirank_logger\n"
        "assert not {'accelerate', 'transformers'} & set(sys.modules), 'imported eagerly'\n"
        "assert multirank_logger.MultiRankTracker.main_process_only is False\n"
        "assert multirank_logger.MultiRankCallback.__name__ == 'MultiRankCallback'\n"
    )
    env = with_transformers({**train_env(), "PYTHONPATH": str(REPO)})
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
