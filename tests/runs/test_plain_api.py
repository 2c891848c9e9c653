"""The plain API (``multirank_logger.init``, integrations/plain.py) in a torch.distributed script
with no Lightning Trainer: tests/scripts/plain_train.py under ``python -m torch.distributed.run
--nproc-per-node 3`` (the NaN run's ranks forked with torchrun's variables, launches.run_ranks_forked),
a tiny DDP loop on CPU over gloo, each rank logging its own loss.

- a clean launch with rank 1 logging NaN from step 5: one run holding every rank's rows, the
  config stored, ``success``; the watch's alert for rank 1 at step 5 in the ``alerts`` table, and
  the report names it;
- rank 1 raises at step 3, inside the ``with`` block and (another launch) with no block and no
  ``finish()``: the run ends ``failed``, rank 1 ``failed``, every rank's rows up to the crash kept;
- the same crash with the ranks started by ``torch.multiprocessing.spawn`` and no ``with`` block
  (torch catches the exception and calls ``sys.exit(1)``: the exit alone would say ``success``);
- ranks started as ``srun`` starts its tasks (``SLURM_*`` only, no torchrun variables): each rank's
  place from Slurm's variables, every rank's rows in one run.

The plain API in one process (no launcher) is the docs' example (tests/project/test_docs.py runs it).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from multirank_logger import open_store
from multirank_logger.report import find
from tests.helpers.launches import REPO, SCRIPTS, free_port, run_launch, run_ranks_forked
from tests.helpers.logger_helpers import query, train_env

pytestmark = pytest.mark.timeout(300)

TRAIN = SCRIPTS / "plain_train.py"
RANKS = 3
STEPS = 8
LAUNCH_TIMEOUT_S = 180


def _launch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={RANKS}",
        f"--master-port={free_port()}", str(TRAIN), "--db", str(tmp_path / "runs.duckdb"), "--steps", str(STEPS),
        "--report", str(tmp_path / "report"), *args,
    ]
    env = {**train_env(), "PYTHONPATH": str(REPO)}
    return run_launch(cmd, cwd=tmp_path, env=env, timeout=LAUNCH_TIMEOUT_S)


def _reports(tmp_path: Path) -> dict[int, dict[str, object]]:
    return {r: json.loads((tmp_path / f"report.{r}.json").read_text()) for r in range(RANKS)}


def test_every_rank_in_one_run_with_the_watchs_alert(tmp_path: Path) -> None:
    """Three ranks log their own loss; rank 1 logs NaN from step 5: one run, each rank's rows,
    ``success``; an alert for rank 1 at step 5, and the report finds the same."""
    # the ranks forked as torchrun starts them (launches.run_ranks_forked): the launch is not what
    # this test is about; the failing launches below are torchrun's own (it ends the other ranks)
    args = ["--db", str(tmp_path / "runs.duckdb"), "--steps", str(STEPS), "--report", str(tmp_path / "report"),
            "--nan-rank", "1", "--nan-from", "5"]
    proc = run_ranks_forked(TRAIN, args, nproc=RANKS, cwd=tmp_path, env=train_env(), timeout=LAUNCH_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-8000:]
    db = tmp_path / "runs.duckdb"
    reports = _reports(tmp_path)
    assert [(r["rank"], r["world_size"], r["local_rank"], r["node_rank"]) for r in reports.values()] == [
        (r, RANKS, r, 0) for r in range(RANKS)]
    assert {(r["run_id"], r["version"], r["transport"]) for r in reports.values()} == {(1, 0, "gather")}
    assert query(db, "SELECT id, name, status, world_size, hparams FROM runs") == [
        (1, "plain", "success", RANKS, json.dumps({"lr": 0.1, "steps": STEPS}))]
    assert query(db, "SELECT rank, status FROM ranks ORDER BY rank") == [(r, "success") for r in range(RANKS)]
    values = query(db, "SELECT rank, step, value FROM metrics WHERE key = 'rank_value' ORDER BY rank, step")
    assert values == [(r, s, float(1000 * r + s)) for r in range(RANKS) for s in range(STEPS)]
    losses = query(db, "SELECT rank, count(*), count(DISTINCT value) FROM metrics WHERE key = 'train_loss' "
                       "AND NOT isnan(value) GROUP BY rank ORDER BY rank")
    assert [(r, n) for r, n, _ in losses] == [(0, STEPS), (1, 5), (2, STEPS)]  # rank 1: steps 0-4 finite
    assert query(db, "SELECT kind, rank, key, first_step FROM alerts WHERE run_id = 1") == [
        ("non_finite", 1, "train_loss", 5)]
    with open_store(db) as reader:
        found = find(reader)
    assert [(n["rank"], n["key"], n["first_step"]) for n in found.non_finite] == [(1, "train_loss", 5)]
    assert [a["in_report"] for a in found.alerts] == [True]
    # each rank's own loss: the ranks' targets differ, so do their losses at a step
    first = query(db, "SELECT rank, value FROM metrics WHERE key = 'train_loss' AND step = 0 ORDER BY rank")
    assert len({v for _, v in first}) == RANKS


@pytest.mark.parametrize("block", ["with", "no-with"])
def test_a_rank_that_raises_fails_the_run(tmp_path: Path, block: str) -> None:
    """Rank 1 raises at step 3 (torchrun then stops the others): the run and rank 1 end ``failed``
    (the `with` block's end, or the exit's), every rank's rows up to its last step kept."""
    proc = _launch(tmp_path, "--raise-rank", "1", "--raise-at", "3", *(["--no-with"] if block == "no-with" else []))
    assert proc.returncode != 0 and "rank 1 fails at step 3" in proc.stderr, proc.stderr[-5000:]
    db = tmp_path / "runs.duckdb"
    assert query(db, "SELECT status FROM runs") == [("failed",)]
    ranks = dict(query(db, "SELECT rank, status FROM ranks ORDER BY rank"))
    assert ranks[1] == "failed" and set(ranks) == set(range(RANKS)), ranks
    # the others end failed (the collective with rank 1 broke) or interrupted (torchrun's SIGTERM)
    assert {ranks[0], ranks[2]} <= {"failed", "interrupted"}, ranks
    last = dict(query(db, "SELECT rank, max(step) FROM metrics WHERE key = 'rank_value' GROUP BY rank"))
    assert last[1] == 2, last  # rank 1 raised before logging step 3
    assert all(last[r] >= 2 for r in (0, 2)), last


def test_a_spawned_rank_that_raises_fails_the_run_without_a_with_block(tmp_path: Path) -> None:
    """``mp.spawn`` of 3 ranks, rank 1 raising at step 3, no ``with`` and no ``finish()``: torch's
    spawn wrapper catches the exception, so only its error file tells the exit it failed."""
    cmd = [sys.executable, str(TRAIN), "--spawn", str(RANKS), "--db", str(tmp_path / "runs.duckdb"), "--steps", str(STEPS),
           "--report", str(tmp_path / "report"), "--raise-rank", "1", "--raise-at", "3", "--no-with"]
    env = {**train_env(), "PYTHONPATH": str(REPO), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    proc = run_launch(cmd, cwd=tmp_path, env=env, timeout=LAUNCH_TIMEOUT_S)
    assert proc.returncode != 0 and "rank 1 fails at step 3" in proc.stderr, proc.stderr[-5000:]
    db = tmp_path / "runs.duckdb"
    assert query(db, "SELECT status FROM runs") == [("failed",)]
    ranks = dict(query(db, "SELECT rank, status FROM ranks ORDER BY rank"))
    assert ranks[1] == "failed" and set(ranks) == set(range(RANKS)), ranks
    # the others: the collective with rank 1 broke (failed), or spawn's join terminated them (interrupted)
    assert {ranks[0], ranks[2]} <= {"failed", "interrupted"}, ranks


def test_srun_tasks_take_their_place_from_slurm_variables(tmp_path: Path) -> None:
    """Three tasks started as ``srun --ntasks 3`` over two nodes starts them (tasks 0, 1 on node 0,
    task 2 on node 1; no torchrun variables): each run's rank, size, local and node rank are
    Slurm's, every rank's rows land in one run, ``success``. Each task records Slurm's name of its
    node (``SLURMD_NODENAME``, schema 0013), and the hosts ledger's exclude list uses it: task 2
    logs a NaN, its node is named in the run's kept verdict."""
    base = {k: v for k, v in train_env().items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")}
    base.update(PYTHONPATH=str(REPO), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                SLURM_NTASKS=str(RANKS), SLURM_JOB_ID="4242", SLURM_JOB_NAME="plain")
    places = {0: (0, 0), 1: (1, 0), 2: (0, 1)}  # task: (SLURM_LOCALID, SLURM_NODEID)
    # Slurm's name of the node, not this machine's host name (every task runs here: one host, one name)
    slurm_names = {0: "sn-node7", 1: "sn-node7", 2: "sn-node7"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(TRAIN), "--slurm", "--db", str(tmp_path / "runs.duckdb"), "--steps", str(STEPS),
             "--report", str(tmp_path / "report"), "--nan-rank", "2", "--nan-from", "4"],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**base, "SLURM_PROCID": str(task), "SLURM_LOCALID": str(local), "SLURM_NODEID": str(node),
                 "SLURMD_NODENAME": slurm_names[task]},
        )
        for task, (local, node) in places.items()
    ]
    outs = [proc.communicate(timeout=LAUNCH_TIMEOUT_S) for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * RANKS, [err[-3000:] for _, err in outs]
    reports = _reports(tmp_path)
    assert {r: (f["rank"], f["world_size"], f["local_rank"], f["node_rank"]) for r, f in reports.items()} == {
        task: (task, RANKS, local, node) for task, (local, node) in places.items()}
    db = tmp_path / "runs.duckdb"
    assert query(db, "SELECT name, status, world_size FROM runs") == [("plain", "success", RANKS)]
    steps = query(db, "SELECT rank, count(DISTINCT step) FROM metrics WHERE key = 'train_loss' GROUP BY rank ORDER BY rank")
    assert steps == [(r, STEPS) for r in range(RANKS)]
    assert dict(query(db, "SELECT rank, slurm_node FROM ranks")) == slurm_names
    assert query(db, "SELECT DISTINCT rank FROM findings WHERE kind = 'non_finite'") == [(2,)]
    from click.testing import CliRunner

    from multirank_logger.cli import main

    # the exclude list names the node as Slurm knows it, not as the host calls itself
    out = CliRunner().invoke(main, ["hosts", str(db), "--format", "slurm", "--chronic", "1/1"]).output
    assert out == "--exclude=sn-node7\n", out


ONE_PROCESS = """
import os, signal, sys
import multirank_logger
from multirank_logger.errors import RunFinished

db = sys.argv[1]
done = multirank_logger.init(db=db, name="done")
done.log({"a": 1.0})
done.log({"a": 2.0})  # the step after the last one: 1
done.record("step_timing", step=1, data_s=0.25)  # no time: the call's
try:
    done.record("step_timing", data_s=0.5)  # no step: refused at the call, not dropped at the insert
except ValueError as exc:
    print("row refused:", exc)
done.finish()
done.finish("failed")  # a second finish does nothing
try:
    done.log({"a": 3.0})
except RunFinished:
    print("log after finish refused")
try:
    multirank_logger.init(db=db, name="bad").finish("ok")
except ValueError:
    print("status refused")

with multirank_logger.init(db=db, name="term") as run:
    for step in range(1000):
        run.log({"a": float(step)})
        if step == 3:
            os.kill(os.getpid(), signal.SIGTERM)
print("not reached")
"""


def test_one_process_ends_and_sigterm_interrupts(tmp_path: Path) -> None:
    """No launcher: a run's steps count on without step=, a second finish does nothing, a log
    after it is refused; a side row without ``time`` stored at the call's time, one without its
    step refused at the call; SIGTERM inside the `with` block ends the script (exit 143) and the run
    ``interrupted``, its rows kept. The run whose `finish("ok")` was refused is ended at exit, as
    ``interrupted`` too: the process ends by the SIGTERM."""
    db = tmp_path / "runs.sqlite"
    env = {**train_env(), "PYTHONPATH": str(REPO)}  # this checkout, from tmp_path
    proc = subprocess.run([sys.executable, "-c", ONE_PROCESS, str(db)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=LAUNCH_TIMEOUT_S)
    assert proc.returncode == 143, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "log after finish refused" in proc.stdout and "status refused" in proc.stdout
    assert "row refused: a step_timing row needs step: pass step=..." in proc.stdout, proc.stdout
    timed = query(db, "SELECT step, data_s, time > 1e9 FROM step_timing WHERE run_id = 1")
    assert timed == [(1, 0.25, 1)] and "spill" not in proc.stderr, (timed, proc.stderr[-3000:])
    assert "not reached" not in proc.stdout
    assert query(db, "SELECT name, status FROM runs ORDER BY id") == [
        ("done", "success"), ("bad", "interrupted"), ("term", "interrupted")]
    assert query(db, "SELECT step, value FROM metrics WHERE run_id = 1 ORDER BY step") == [(0, 1.0), (1, 2.0)]
    assert query(db, "SELECT step FROM metrics WHERE run_id = 3 ORDER BY step") == [(s,) for s in range(4)]
