"""The logger under each way of starting a DDP job, with real processes over gloo on CPU.

- two Lightning launches started together against one SQLite store (distinct versions);
- a DuckDB run read by another process while it trains (gather, short flush interval);
- ``strategy="ddp_spawn"`` with the version read in the main process before fit;
- torchrun (``python -m torch.distributed.run``), where rank 0 is not the launcher;
- Fabric with ``fabric.log_dict`` on each rank.

Each launch is tiny (Linear(4, 1), a few steps); the assertions read the store afterwards.
"""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from multirank_logger.errors import MultiRankLoggerError
from multirank_logger.query.reader import open_store
from tests.helpers.launches import REPO, SCRIPTS, ForkedLaunch, free_port, start_ranks_forked
from tests.helpers.logger_helpers import TRAIN, query, rank_reports, train_cmd, train_env

pytestmark = pytest.mark.timeout(240)
TESTS = SCRIPTS
LAUNCH_TIMEOUT_S = 150
STEPS = 5


def _finish(proc: subprocess.Popen[str], timeout: float = LAUNCH_TIMEOUT_S) -> str:
    """Wait (bounded) for a launch; fail with its output unless it succeeded."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate(timeout=30)
        pytest.fail(f"launch still running after {timeout} s:\n{out[-5000:]}")
    assert proc.returncode == 0, out[-5000:]
    return out


def _start(cmd: list[str], cwd: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        cmd, cwd=cwd, env={**train_env(), **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _rank_values(db: Path, run_id: int, key: str = "rank_value") -> dict[int, list[tuple[int, float]]]:
    rows = query(db, "SELECT rank, step, value FROM metrics WHERE run_id = :r AND key = :k ORDER BY rank, seq", r=run_id, k=key)
    out: dict[int, list[tuple[int, float]]] = {}
    for rank, step, value in rows:
        out.setdefault(rank, []).append((step, value))
    return out


def _expected(steps: int, ranks: int = 2) -> dict[int, list[tuple[int, float]]]:
    return {r: [(s, float(1000 * r + s)) for s in range(steps)] for r in range(ranks)}


# -- two launches at once, one SQLite store -------------------------------------------------


def test_two_launches_at_once_never_share_a_version(tmp_path: Path) -> None:
    """Two 2-rank jobs on different MASTER_PORTs, started together: two versions, each agreed by its ranks."""
    db = tmp_path / "runs.sqlite"
    procs = {}
    for job in ("a", "b"):
        cmd = train_cmd(db, tmp_path, "--steps", str(STEPS), "--report", str(tmp_path / f"report-{job}"))
        procs[job] = _start(cmd, tmp_path, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    for proc in procs.values():
        _finish(proc)
    versions = {}
    for job in ("a", "b"):
        reports = rank_reports(tmp_path / f"report-{job}")
        assert sorted(reports) == [0, 1]
        assert reports[0]["version"] == reports[1]["version"], reports
        versions[job] = reports[0]["version"]
    assert sorted(versions.values()) == [0, 1]
    runs = query(db, "SELECT id, version, status, world_size FROM runs ORDER BY version")
    assert [(v, s, w) for _, v, s, w in runs] == [(0, "success", 2), (1, "success", 2)]
    for run_id, _, _, _ in runs:
        assert _rank_values(db, run_id) == _expected(STEPS)


# -- a reader while training runs -------------------------------------------------------------


def test_reader_while_training_sees_rows_and_nothing_is_lost(tmp_path: Path) -> None:
    """Another process reads the DuckDB store over and over while a 2-rank gather run writes it.

    The training is held after step 4 (logger_train.py --gate) until the reader has seen both ranks'
    rows, then let go: rows are readable mid-run by construction, not because the machine was slow
    enough (on a loaded machine the first read that got through could come after the last flush)."""
    db = tmp_path / "runs.duckdb"
    steps, held_at = 12, 4
    gate = tmp_path / "gate"
    gate.write_text(str(held_at))
    # the ranks forked as torchrun starts them (launches.start_ranks_forked): the reader is what is tested here
    training = start_ranks_forked(TRAIN, ["--db", str(db), "--save-dir", str(tmp_path), "--steps", str(steps),
                                          "--gate", str(gate), "--flush-interval", "0.1"], nproc=2, cwd=tmp_path,
                                  env=train_env())
    seen: list[tuple[int, set[int]]] = []  # (rows, ranks) of each read that found the run
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    with training:
        _read_while_running(db, training, gate, steps, seen, deadline)
        done = training.wait(max(1.0, deadline - time.monotonic()))
    assert done.returncode == 0, done.stdout[-5000:]
    output = done.stdout
    assert gate.read_text() == str(steps), f"the reader never saw both ranks' rows while the training was held: {seen}"
    (run_id,) = [r for (r,) in query(db, "SELECT id FROM runs")]
    assert _rank_values(db, run_id) == _expected(steps), output[-3000:]
    assert query(db, "SELECT status, transport FROM runs") == [("success", "gather")]
    final = query(db, "SELECT count(*) FROM metrics")[0][0]
    during = [rows for rows, _ in seen if rows]
    assert during[0] < final  # rows were readable mid-run, not only at the end
    assert all(a <= b for a, b in itertools.pairwise(during))  # never a row vanished


def _read_while_running(db: Path, training: ForkedLaunch, gate: Path, steps: int, seen: list[tuple[int, set[int]]],
                        deadline: float) -> None:
    """Read the store over and over while `training` runs; let it go on once both ranks' rows were read."""
    while training.running and time.monotonic() < deadline:
        try:
            with open_store(db, lock_timeout=10) as reader:
                runs = reader.runs()
                if len(runs):
                    frame = reader.metrics()
                    seen.append((len(frame), set(frame["rank"].tolist())))
        except MultiRankLoggerError:
            pass  # not created yet, or a flush held the file past lock_timeout: read again
        if seen and seen[-1][1] == {0, 1} and gate.read_text() != str(steps):
            gate.write_text(str(steps))  # both ranks' rows read while the training waits: let it finish
        time.sleep(0.05)


# -- ddp_spawn -----------------------------------------------------------------------------------


def test_ddp_spawn_ranks_use_the_version_read_before_fit(tmp_path: Path) -> None:
    """strategy="ddp_spawn": the version the main process read before fit is the one both ranks wrote."""
    db = tmp_path / "runs.sqlite"
    out = _finish(_start(train_cmd(db, tmp_path, "--strategy", "ddp_spawn", "--steps", str(STEPS), "--read-version"), tmp_path))
    before = re.findall(r"^version before fit: (\d+) (.*)$", out, re.MULTILINE)
    assert len(before) == 1, out[-3000:]
    version = int(before[0][0])
    runs = query(db, "SELECT id, version, status, world_size FROM runs")
    assert [(v, s, w) for _, v, s, w in runs] == [(version, "success", 2)]
    run_id = runs[0][0]
    assert _rank_values(db, run_id) == _expected(STEPS)
    assert query(db, "SELECT rank, status FROM ranks WHERE run_id = :r ORDER BY rank", r=run_id) == [
        (0, "success"),
        (1, "success"),
    ]
    assert (tmp_path / "lightning_logs" / f"version_{version}" / "metrics.csv").is_file()


# -- torchrun ----------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".duckdb"])
def test_torchrun_records_both_ranks_in_one_run(tmp_path: Path, suffix: str) -> None:
    """torchrun starts both ranks (rank 0 is a worker, not the launcher): one run, each rank's own values."""
    db = tmp_path / f"runs{suffix}"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2", f"--master-port={free_port()}",
        str(TESTS / "logger_train.py"), "--db", str(db), "--save-dir", str(tmp_path), "--steps", str(STEPS),
        "--report", str(tmp_path / "report"),
    ]
    _finish(_start(cmd, tmp_path, PYTHONPATH=str(REPO)))
    reports = rank_reports(tmp_path / "report")
    assert sorted(reports) == [0, 1] and reports[0]["version"] == reports[1]["version"] == 0
    runs = query(db, "SELECT id, status, world_size FROM runs")
    assert [(s, w) for _, s, w in runs] == [("success", 2)]
    assert _rank_values(db, runs[0][0]) == _expected(STEPS)


# -- Fabric ------------------------------------------------------------------------------------


def test_fabric_log_dict_records_each_rank(tmp_path: Path) -> None:
    """Fabric(strategy="ddp", loggers=[MultiRankLogger]) and fabric.log_dict on each rank: rows for
    both; the version read before launch is rank 0's on both, and rank 0's environment holds no
    run-identity variable."""
    db = tmp_path / "runs.sqlite"
    out = _finish(_start([sys.executable, str(TESTS / "logger_fabric.py"), str(db), str(STEPS)], tmp_path, PYTHONPATH=str(REPO)))
    said = sorted(re.findall(r"rank (\d) version (\d+) run (\d+)", out))
    assert said == [("0", "0", "1"), ("1", "0", "1")], out[-3000:]
    # read before launch: rank 1 learned rank 0's run from the environment Lightning's launcher gave
    # it; rank 0's own environment never held the variable (issue 29)
    # not anchored to lines: the two ranks' lines may interleave on the shared pipe
    assert sorted(re.findall(r"rank (\d) version before launch (\d+)", out)) == [("0", "0"), ("1", "0")]
    held = sorted(re.findall(r"rank (\d) environment holds (\[[^]]*\])", out))
    assert held == [("0", "[]"), ("1", "['MULTIRANK_LOGGER_RUN_0']")], out[-3000:]
    assert _rank_values(db, 1) == _expected(STEPS)
    assert query(db, "SELECT count(*) FROM metrics WHERE key = 'loss'") == [(2 * STEPS,)]
    assert query(db, "SELECT name, version, status, world_size FROM runs") == [("fabric", 0, "success", 2)]
