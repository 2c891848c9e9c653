"""A run across launches, with real 2-rank DDP over gloo: resume from a checkpoint (direct and
gather, SQLite and DuckDB), a preempted launch then its resume, a resume with fewer ranks, and
ddp_spawn's fit then test (each spawned launch a new attempt: nothing collides)."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from multirank_logger.query.reader import open_store
from multirank_logger.rows.schema import SEQ_ATTEMPT_SHIFT
from tests.helpers.kept_verdict import assert_served_as_judged
from tests.helpers.launches import SCRIPTS, run_ranks_forked
from tests.helpers.logger_helpers import query, train_env, wait_for_steps

pytestmark = pytest.mark.timeout(400)
SCRIPT = SCRIPTS / "resume_train.py"
LAUNCH_TIMEOUT_S = 150
GRACE_S = 15


def _cmd(db: Path, save_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, str(SCRIPT), "--db", str(db), "--save-dir", str(save_dir), *extra]


def _launch(db: Path, save_dir: Path, *extra: str) -> str:
    proc = subprocess.run(
        _cmd(db, save_dir, *extra), cwd=save_dir, env=train_env(), capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout + proc.stderr


def _ddp_launch(db: Path, save_dir: Path, *extra: str, nproc: int = 2) -> None:
    """A strategy="ddp" launch whose ranks run as torchrun starts them (launches.run_ranks_forked:
    what these tests are about is the run across launches, not how a launch starts its ranks)."""
    proc = run_ranks_forked(SCRIPT, ["--db", str(db), "--save-dir", str(save_dir), "--devices", str(nproc), *extra],
                            nproc=nproc, cwd=save_dir, env=train_env(), timeout=LAUNCH_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-8000:]


def _by_rank_step(db: Path, key: str) -> dict[tuple[int, int], list[tuple[int, float]]]:
    """(rank, step) -> [(attempt, value)] of every stored row of `key`, in call order."""
    out: dict[tuple[int, int], list[tuple[int, float]]] = {}
    for rank, step, seq, value in query(db, "SELECT rank, step, seq, value FROM metrics WHERE key = :k ORDER BY seq", k=key):
        out.setdefault((rank, step), []).append((seq >> SEQ_ATTEMPT_SHIFT, value))
    return out


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


#: the store and transport of each variant of the resume: one launch pair logs to all three, a
#: logger each (tests/scripts/resume_train.py), instead of a launch pair each (~35 s on 2 cores)
RESUME_VARIANTS = [("runs.sqlite", "direct"), ("runs.sqlite", "gather"), ("runs.duckdb", "gather")]


@pytest.fixture(scope="module")
def resumed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1 epoch, then fit(ckpt_path=last) to 2 epochs with version=0, each launch logging to every
    variant's store (its folder ``<store>-<transport>``, its CSV files beside it)."""
    work = tmp_path_factory.mktemp("resumed")
    stores: list[str] = []
    for db_name, transport in RESUME_VARIANTS:
        (work / f"{db_name}-{transport}").mkdir()
        stores += ["--db", str(work / f"{db_name}-{transport}" / db_name), "--transport", transport]
    for launch in (["--epochs", "1", "--launch", "0"], ["--epochs", "2", "--launch", "1", "--resume", "--version", "0"]):
        proc = run_ranks_forked(SCRIPT, [*stores, "--save-dir", str(work), *launch], nproc=2, cwd=work, env=train_env(),
                                timeout=LAUNCH_TIMEOUT_S)
        assert proc.returncode == 0, proc.stdout[-8000:]
    return work


@pytest.mark.parametrize(("db_name", "transport"), RESUME_VARIANTS)
def test_resume_from_checkpoint_continues_the_run(resumed: Path, db_name: str, transport: str) -> None:
    """1 epoch, then fit(ckpt_path=last) to 2 epochs with version=0: one run, two attempts, every
    rank's rows of both launches, and a metrics.csv with the whole history in order."""
    folder = resumed / f"{db_name}-{transport}"
    db = folder / db_name
    assert query(db, "SELECT id, version, status, world_size, transport FROM runs") == [(1, 0, "success", 2, transport)]
    assert query(db, "SELECT attempt, world_size, status FROM attempts ORDER BY attempt") == [
        (0, 2, "success"),
        (1, 2, "success"),
    ]
    launches = _by_rank_step(db, "launch")
    # 32 samples, batch 4, 2 ranks: 4 steps an epoch; the checkpoint at the epoch's end, so nothing superseded
    assert launches == {(r, s): [(s // 4, float(s // 4))] for r in (0, 1) for s in range(8)}
    values = _by_rank_step(db, "rank_value")
    assert {k: [v for _, v in rows] for k, rows in values.items()} == {
        (r, s): [float(1000 * r + s)] for r in (0, 1) for s in range(8)
    }
    rows = [r for r in _csv(folder / "job" / "version_0" / "metrics.csv") if r["launch"]]
    assert [(r["step"], r["launch"]) for r in rows] == [(str(s), f"{float(s // 4)}") for s in range(8)]
    with open(folder / "job" / "version_0" / "metrics.csv") as fh:
        assert fh.readline().strip() == "epoch,launch,rank_value,step"
    # the verdict of the second launch's watch is served only where it judged the whole run's rows:
    # with gather it saw its own launch's; with direct it read them all from the store
    from multirank_logger.report.findings import find

    with open_store(db) as reader:
        served, judged = find(reader, 1), find(reader, 1, from_rows=True)
    if transport == "gather":
        assert served.judged_from == "rows" and served.verdict_not_served is not None
    else:
        assert_served_as_judged(served, judged)


def test_resume_with_fewer_ranks_by_run_key(tmp_path: Path) -> None:
    """2 ranks, then resumed on 1 rank by run_key (no version known): both launches' rows kept."""
    db = tmp_path / "runs.sqlite"
    _ddp_launch(db, tmp_path, "--epochs", "1", "--launch", "0", "--run-key", "job-77")
    _ddp_launch(db, tmp_path, "--epochs", "2", "--launch", "1", "--run-key", "job-77", "--resume", nproc=1)
    assert query(db, "SELECT id, status, world_size, run_key FROM runs") == [(1, "success", 1, "job-77")]
    assert query(db, "SELECT attempt, world_size, status FROM attempts ORDER BY attempt") == [
        (0, 2, "success"),
        (1, 1, "success"),
    ]
    launches = _by_rank_step(db, "launch")
    # launch 0: 4 steps on each of 2 ranks; launch 1: epoch 2 alone on rank 0, 8 steps (4..11)
    expected = {(r, s): [(0, 0.0)] for r in (0, 1) for s in range(4)}
    expected.update({(0, s): [(1, 1.0)] for s in range(4, 12)})
    assert launches == expected



def test_preempted_launch_then_resume_shows_superseded_steps_once(tmp_path: Path) -> None:
    """SIGTERM to the whole job in epoch 2 (checkpoint at step 4), then a resume from it: steps
    4 and 5 were logged by both launches; per_rank and metrics() show the resumed launch's once,
    metrics(all_attempts=True) shows both; metrics.csv has every launch's rows."""
    db = tmp_path / "runs.sqlite"
    first = subprocess.Popen(
        _cmd(db, tmp_path, "--epochs", "2", "--launch", "0", "--ckpt-every", "4", "--sleep", "0.3"),
        cwd=tmp_path, env=train_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    try:
        wait_for_steps(first, 5, timeout=LAUNCH_TIMEOUT_S)
        os.killpg(first.pid, signal.SIGTERM)
        try:
            first.communicate(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(first.pid, signal.SIGKILL)  # the scheduler's SIGKILL after its grace period
            first.communicate()
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    _ddp_launch(db, tmp_path, "--epochs", "2", "--launch", "1", "--resume", "--version", "0")

    every = _by_rank_step(db, "launch")
    for rank in (0, 1):
        for step in (4, 5):  # after the checkpoint, before the preemption: logged twice
            assert [a for a, _ in every[(rank, step)]] == [0, 1], every
    with open_store(db) as reader:
        table = reader.per_rank("launch")
        assert table.index.tolist() == list(range(8))
        assert table[0].tolist() == table[1].tolist() == [0.0] * 4 + [1.0] * 4
        latest = reader.metrics(keys=["launch"])
        assert sorted(zip(latest["rank"], latest["step"])) == [(r, s) for r in (0, 1) for s in range(8)]
        both = reader.metrics(keys=["launch"], all_attempts=True)
        assert len(both) == sum(map(len, every.values())) > len(latest)
        assert reader.attempts()["status"].tolist()[-1] == "success"
    assert query(db, "SELECT status FROM runs") == [("success",)]
    rows = [r for r in _csv(tmp_path / "job" / "version_0" / "metrics.csv") if r["launch"]]
    # rank 0's calls, launch after launch, each in step order
    calls = sorted((a, s) for (rank, s), seen in every.items() if rank == 0 for a, _ in seen)
    assert [(int(r["step"]), float(r["launch"])) for r in rows] == [(s, float(a)) for a, s in calls]


def test_ddp_spawn_fit_then_test_keeps_both_phases(tmp_path: Path) -> None:
    """strategy="ddp_spawn", fit then test: each spawned launch is an attempt of the one run, so
    test's rows never collide with fit's; both phases are in the store and in metrics.csv."""
    db = tmp_path / "runs.sqlite"
    _launch(db, tmp_path, "--strategy", "ddp_spawn", "--epochs", "1", "--test")
    assert query(db, "SELECT count(*), min(status) FROM runs") == [(1, "success")]
    assert query(db, "SELECT attempt, world_size, status FROM attempts ORDER BY attempt") == [
        (0, 2, "success"),
        (1, 2, "success"),
    ]
    test_rows = query(db, "SELECT rank, seq >> 40 FROM metrics WHERE key = 'test_loss' ORDER BY rank")
    assert test_rows == [(0, 1), (1, 1)]
    assert query(db, "SELECT rank, count(*) FROM metrics WHERE key = 'rank_value' GROUP BY rank ORDER BY rank") == [
        (0, 4),
        (1, 4),
    ]
    rows = _csv(tmp_path / "job" / "version_0" / "metrics.csv")
    assert sum(1 for r in rows if r["rank_value"]) == 4 and sum(1 for r in rows if r["test_loss"]) == 1


@pytest.mark.parametrize("db_name", ["runs.sqlite", "runs.duckdb"])
def test_ddp_notebook_fit_then_test_is_one_run(tmp_path: Path, db_name: str) -> None:
    """strategy="ddp_notebook" (forked ranks), fit then test in one process, version never read:
    the parent owns the run, so both fork launches write under it as two attempts of one run."""
    db = tmp_path / db_name
    _launch(db, tmp_path, "--strategy", "ddp_notebook", "--epochs", "1", "--test")
    assert query(db, "SELECT id, version, status FROM runs") == [(1, 0, "success")]
    assert query(db, "SELECT attempt, world_size, status FROM attempts ORDER BY attempt") == [
        (0, 2, "success"),
        (1, 2, "success"),
    ]
    assert query(db, "SELECT rank, seq >> 40 FROM metrics WHERE key = 'test_loss' ORDER BY rank") == [(0, 1), (1, 1)]
    assert query(
        db, "SELECT rank, count(*), count(DISTINCT seq) FROM metrics WHERE key = 'rank_value' GROUP BY rank ORDER BY rank"
    ) == [(0, 4, 4), (1, 4, 4)]
    rows = _csv(tmp_path / "job" / "version_0" / "metrics.csv")
    assert sum(1 for r in rows if r["rank_value"]) == 4 and sum(1 for r in rows if r["test_loss"]) == 1
