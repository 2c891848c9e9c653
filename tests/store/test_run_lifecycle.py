"""Which run a launch writes under, in one process: versions free on disk, named versions,
resume (version, run_key, latest), attempts and superseded steps, a logger never used,
who may take itself for rank 0, orphan rows."""

from __future__ import annotations

import csv
import datetime
import os
import time
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
import torch.distributed as dist
from click.testing import CliRunner

from multirank_logger._util.dist_env import current_rank
from multirank_logger.channel.row_channel import RowChannel
from multirank_logger.cli import main as cli
from multirank_logger.errors import ResumeRefused, RunIdentityMismatch
from multirank_logger.query.reader import open_store
from multirank_logger.rows.batch import metrics_batch
from multirank_logger.rows.schema import SEQ_ATTEMPT_SHIFT
from multirank_logger.rows.side_records import encode_side
from multirank_logger.store.run_lifecycle import begin_attempt, check_same_run
from multirank_logger.store.sql_store import Store
from multirank_logger.write.buffer import RecordBuffer
from multirank_logger.write.sinks import GatherReceiver
from tests.helpers.launches import free_port
from tests.helpers.logger_helpers import held_logger, logged_launch, query

_LAUNCH_VARS = ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID", "SLURM_NODEID", "SLURM_LOCALID")


def _csv_rows(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_version_none_skips_version_dirs_of_other_loggers(db_path: Path, tmp_path: Path) -> None:
    """A save_dir holding CSVLogger's version_0 and TensorBoard's version_1: the new run takes version_2."""
    save = tmp_path / "logs"
    for v in (0, 1):
        (save / "lightning_logs" / f"version_{v}").mkdir(parents=True)
        (save / "lightning_logs" / f"version_{v}" / "metrics.csv").write_text("step\n0\n")
    logger = held_logger(db_path, save_dir=str(save))
    assert logger.version == 2
    assert logger.log_dir == str(save / "lightning_logs" / "version_2")
    assert (save / "lightning_logs" / "version_0" / "metrics.csv").read_text() == "step\n0\n"
    logger.finalize("success")


def test_explicit_version_over_a_non_empty_dir_warns(db_path: Path, tmp_path: Path) -> None:
    """version=0 whose directory another logger filled: CSVLogger's warning, and a new run."""
    (tmp_path / "lightning_logs" / "version_0").mkdir(parents=True)
    (tmp_path / "lightning_logs" / "version_0" / "events.out").write_text("x")
    logger = held_logger(db_path, save_dir=str(tmp_path), version=0)
    with pytest.warns(UserWarning, match="exists and is not empty"):
        _ = logger.run_id
    assert logger.run_id == 1
    logger.finalize("success")


def test_explicit_version_keeps_an_earlier_runs_files(db_path: Path, tmp_path: Path) -> None:
    """version=0 whose directory holds another store's run (CSVLogger deletes its metrics.csv):
    the earlier metrics.csv and hparams.yaml are kept, moved aside, never overwritten by the new
    run's; a third run on the directory keeps the second's too."""
    log_dir = tmp_path / "lightning_logs" / "version_0"
    log_dir.mkdir(parents=True)
    (log_dir / "metrics.csv").write_text("loss,step\n0.5,0\n")
    (log_dir / "hparams.yaml").write_text("lr: 0.5\n")
    for n, (db, lr) in enumerate([(db_path, 0.1), (tmp_path / "other.sqlite", 0.2)]):
        logger = held_logger(db, save_dir=str(tmp_path), version=0)
        with pytest.warns(UserWarning, match="exists and is not empty.*the earlier ones are kept as"):
            logger.log_hyperparams({"lr": lr})
        logger.log_metrics({"loss": 9.0 + n}, step=0)
        logger.finalize("success")
        assert (log_dir / "metrics.csv").read_text() == f"loss,step\n{9.0 + n},0\n"
    assert (log_dir / "metrics.earlier.csv").read_text() == "loss,step\n0.5,0\n"
    assert (log_dir / "hparams.earlier.yaml").read_text() == "lr: 0.5\n"
    assert (log_dir / "metrics.earlier-2.csv").read_text() == "loss,step\n9.0,0\n"
    assert (log_dir / "hparams.earlier-2.yaml").read_text() == "lr: 0.1\n"
    assert (log_dir / "hparams.yaml").read_text() == "lr: 0.2\n"


def test_named_version_is_the_directory_and_keeps_an_int_version(db_path: Path, tmp_path: Path) -> None:
    """version="2020-02-05-162402": log_dir ends with it; runs.version stays an allocated int."""
    first = logged_launch(db_path, range(2), 0.0, version="2020-02-05-162402", save_dir=str(tmp_path))
    assert first.version == "2020-02-05-162402"
    assert first.log_dir == str(tmp_path / "job" / "2020-02-05-162402")
    assert query(db_path, "SELECT version, version_name FROM runs") == [(0, "2020-02-05-162402")]
    assert [r["step"] for r in _csv_rows(os.path.join(first.log_dir, "metrics.csv"))] == ["0", "1"]
    other = logged_launch(db_path, range(1), 0.0, save_dir=str(tmp_path))  # the next int version is still free
    assert other.version == 1
    with open_store(db_path) as reader:
        assert reader.resolve_run("job/2020-02-05-162402").id == first.run_id
        assert reader.runs()["run"].tolist() == ["job/2020-02-05-162402", "job/version_1"]


def test_named_version_resumes(db_path: Path, tmp_path: Path) -> None:
    """The same named version again continues that run."""
    first = logged_launch(db_path, range(2), 0.0, version="named", save_dir=str(tmp_path))
    second = logged_launch(db_path, range(2, 4), 0.0, version="named", save_dir=str(tmp_path))
    assert second.run_id == first.run_id
    assert query(db_path, "SELECT count(*) FROM runs") == [(1,)]


def test_resume_continues_the_run_as_a_new_attempt(db_path: Path) -> None:
    """version=0 again: same run id and log_dir, a second attempt, seq above the first's, status success."""
    first = logged_launch(db_path, range(3), 100.0)
    second = logged_launch(db_path, range(2, 5), 200.0, version=0)  # resumed from a checkpoint at step 2
    assert (second.run_id, second.log_dir) == (first.run_id, first.log_dir)
    assert query(db_path, "SELECT status, ended_at IS NOT NULL FROM runs") == [("success", True)]
    assert query(db_path, "SELECT attempt, world_size, status FROM attempts ORDER BY attempt") == [
        (0, 1, "success"),
        (1, 1, "success"),
    ]
    seqs = query(db_path, "SELECT DISTINCT seq FROM metrics ORDER BY seq")
    assert [s for (s,) in seqs] == [0, 1, 2, 1 << SEQ_ATTEMPT_SHIFT, (1 << SEQ_ATTEMPT_SHIFT) + 1, (1 << SEQ_ATTEMPT_SHIFT) + 2]


def test_superseded_steps_hidden_by_default_every_launch_on_request(db_path: Path) -> None:
    """Step 2, logged by both launches: per_rank and metrics() show the resumed launch's value once."""
    logged_launch(db_path, range(3), 100.0)
    logged_launch(db_path, range(2, 5), 200.0, version=0)
    with open_store(db_path) as reader:
        table = reader.per_rank("loss")
        assert table[0].tolist() == [100.0, 101.0, 202.0, 203.0, 204.0]
        latest = reader.metrics(keys=["loss"])
        assert latest["step"].tolist() == [0, 1, 2, 3, 4]
        assert latest["attempt"].tolist() == [0, 0, 1, 1, 1]
        every = reader.metrics(keys=["loss"], all_attempts=True)
        assert every["value"].tolist() == [100.0, 101.0, 102.0, 202.0, 203.0, 204.0]
        assert reader.attempts()["attempt"].tolist() == [0, 1]


def test_metrics_csv_holds_every_launch_in_order(db_path: Path) -> None:
    """metrics.csv after the resume: the first launch's rows, then the second's, as CSVLogger lays them out."""
    logged_launch(db_path, range(3), 100.0)
    second = logged_launch(db_path, range(2, 5), 200.0, version=0)
    rows = _csv_rows(os.path.join(second.log_dir, "metrics.csv"))
    assert [(r["step"], r["loss"]) for r in rows] == [
        ("0", "100.0"), ("1", "101.0"), ("2", "102.0"), ("2", "202.0"), ("3", "203.0"), ("4", "204.0")
    ]
    assert list(rows[0]) == ["loss", "step", "step_only"]


def test_run_key_resumes_without_knowing_the_version(db_path: Path) -> None:
    """run_key= (a job id): the first launch creates the run, a requeued one continues it."""
    logged_launch(db_path, range(1), 0.0)  # another run of the name first
    first = logged_launch(db_path, range(2), 0.0, run_key="slurm-4242")
    second = logged_launch(db_path, range(2, 4), 0.0, run_key="slurm-4242")
    third = logged_launch(db_path, range(1), 0.0, run_key="slurm-5151")
    assert first.run_id == second.run_id != third.run_id
    assert (first.version, third.version) == (1, 2)
    assert query(db_path, "SELECT run_key FROM runs ORDER BY id") == [(None,), ("slurm-4242",), ("slurm-5151",)]


def test_resume_must_takes_the_latest_run_of_the_name(db_path: Path) -> None:
    """resume="must" with no version: the latest run of the name continues."""
    logged_launch(db_path, range(1), 0.0)
    latest = logged_launch(db_path, range(1), 0.0)
    again = logged_launch(db_path, range(1, 2), 0.0, resume="must")
    assert again.run_id == latest.run_id


def test_resume_must_without_a_run_is_refused(db_path: Path) -> None:
    """resume="must" for a version the store does not hold: a clear error, no run created."""
    logger = held_logger(db_path, name="job", version=3, resume="must")
    with pytest.raises(ResumeRefused, match="holds no run job/version_3"):
        _ = logger.run_id
    assert query(db_path, "SELECT count(*) FROM runs") == [(0,)]


def test_resume_never_refuses_an_existing_version(db_path: Path) -> None:
    """resume="never": version=0 that exists is an error that says what to pass."""
    logged_launch(db_path, range(1), 0.0)
    logger = held_logger(db_path, name="job", version=0, resume="never")
    with pytest.raises(ResumeRefused, match="already exists.*resume='allow'"):
        _ = logger.run_id


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"version": "a/b"}, "directory name"), ({"resume": "sometimes"}, "resume="), ({"run_key": ""}, "run_key=")],
)
def test_bad_run_arguments_are_refused(db_path: Path, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        held_logger(db_path, **kwargs)


def test_logger_built_and_never_used_leaves_no_run(db_path: Path) -> None:
    """Built, then dropped: the store holds no running run."""
    logger = held_logger(db_path, name="unused")
    del logger
    assert query(db_path, "SELECT count(*) FROM runs") == [(0,)]


@pytest.mark.parametrize(
    ("env", "rank"),
    [
        ({}, 0),
        ({"LOCAL_RANK": "0", "NODE_RANK": "0"}, 0),
        ({"LOCAL_RANK": "0", "NODE_RANK": "1"}, -1),  # hand-launched node 1: not rank 0
        ({"LOCAL_RANK": "1", "NODE_RANK": "0"}, -1),
        ({"RANK": "3", "LOCAL_RANK": "1", "GROUP_RANK": "1"}, 3),  # torchrun
        ({"RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0"}, 0),
        ({"GROUP_RANK": "1", "LOCAL_RANK": "0"}, -1),
        ({"SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_NODEID": "1"}, -1),
        ({"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}, 0),
        ({"NODE_RANK": "x"}, -1),
    ],
)
def test_rank_zero_only_when_certain(monkeypatch: pytest.MonkeyPatch, env: dict, rank: int) -> None:
    for var in _LAUNCH_VARS:
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    assert current_rank() == rank


def test_a_process_not_known_to_be_rank_0_creates_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Node 1's first process, built before its process group: no directory, no store, no run."""
    for var in _LAUNCH_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NODE_RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    db = tmp_path / "not_yet" / "runs.sqlite"
    logger = held_logger(db)
    logger.finalize("failed")
    assert not db.parent.exists()


def test_direct_rank_refuses_a_store_that_is_not_rank_0s(db_path: Path) -> None:
    """A rank told run 4 by rank 0, opening a store where id 4 is not that run: a clear error."""
    store = Store(db_path)
    for _ in range(3):
        store.create_run("job")
    mine = store.create_run("other")
    with pytest.raises(RunIdentityMismatch, match="holds no run with id 9|no run with id 9"):
        check_same_run(store, 1, 9, "job", 3, 0.0)
    with pytest.raises(RunIdentityMismatch, match="other/version_0"):
        check_same_run(store, 1, mine.id, "job", 3, 0.0)
    check_same_run(store, 1, mine.id, "other", 0, 0.0)  # the right run passes
    store.close()


def test_cli_runs_reports_orphan_rows(db_path: Path) -> None:
    """Metric rows under a run id with no runs row are named by `multirank-logger runs`."""
    logger = logged_launch(db_path, range(2), 0.0)
    store = Store(db_path)
    # as a rank that took itself for rank 0 elsewhere writes them: through the store, under its own id
    two = np.ones(2, np.int64)
    store.write(metrics_batch(run_id=7 * two, rank=np.arange(2), seq=two, step=two, codes=two - 1, keys=["loss"],
                              value=two * 0.5, valid=None, dtype=two - 1, time=two * 1.7e9))
    store.close()
    result = CliRunner().invoke(cli, ["runs", str(db_path)])
    assert result.exit_code == 0, result.output
    assert "Warning: 2 metric row(s) under run id 7, which has no runs row (orphans)." in result.output
    assert f"job/version_{logger.version}" in result.output


def test_rank_0_files_received_rows_under_its_own_run(db_path: Path) -> None:
    """Rows (and side rows) a sender shipped under another run id are stored under rank 0's run."""
    server = dist.TCPStore("127.0.0.1", free_port(), None, True, datetime.timedelta(seconds=10), wait_for_workers=False)
    store = Store(db_path)
    run = store.create_run("job", world_size=2)
    receiver = RowChannel("stamp", 0, 2, host="127.0.0.1", port=server.port)
    sink = GatherReceiver(store, run.id, receiver)

    def take() -> None:  # what rank 0's writer does each cycle: receive, then store
        batches, side = sink.receive()
        for batch in batches:
            store.write(batch)
        for tables in side:
            store.write_side(tables)

    take()  # connect first, as rank 0's writer does
    buf = RecordBuffer()
    for step in range(3):
        buf.append(step, {"loss": float(step)})
    sender = RowChannel("stamp", 1, 2, host="127.0.0.1", port=server.port)
    sender.send(buf.drain(run_id=run.id + 40, rank=1))  # an identity rank 0 never allocated
    side = {"logs": [{"run_id": run.id + 40, "rank": 1, "seq": 0, "time": 0.0, "level": "INFO", "levelno": 20,
                      "logger": "x", "message": "hi"}]}
    sender.send_side(encode_side(side))
    for _ in range(100):  # bounded: rank 0 takes what arrived at each cycle
        take()
        if query(db_path, "SELECT count(*) FROM metrics") == [(3,)]:
            break
        time.sleep(0.05)
    take()
    assert query(db_path, "SELECT DISTINCT run_id FROM metrics") == [(run.id,)]
    assert query(db_path, "SELECT run_id, message FROM logs") == [(run.id, "hi")]
    sender.close()
    sink.close()
    store.close()


def test_new_attempt_closes_running_attempts_and_ranks(db_path: Path) -> None:
    """begin_attempt over a launch that never recorded its end (2 ranks, resumed on 1): that attempt
    becomes 'vanished' and its ranks 'missing', so no row says 'running' for a launch that is gone."""
    store = Store(db_path)
    run = store.create_run("job", world_size=2)
    assert begin_attempt(store, run.id, 2) == 0
    for rank in (0, 1):
        store.register_rank(run.id, rank)
    assert begin_attempt(store, run.id, 1) == 1
    store.close()
    assert query(db_path, "SELECT attempt, status FROM attempts ORDER BY attempt") == [(0, "vanished"), (1, "running")]
    assert query(db_path, "SELECT rank, status FROM ranks ORDER BY rank") == [(0, "missing"), (1, "missing")]


def _elastic(monkeypatch: pytest.MonkeyPatch, run_id: str, restart: int) -> None:
    """The variables torchrun gives each worker (a 1-rank group)."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", run_id)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(restart))


@pytest.mark.parametrize("run_id", ["job-8d1f", "none"])
def test_torchelastic_restart_continues_the_run(monkeypatch: pytest.MonkeyPatch, db_path: Path, run_id: str) -> None:
    """A restarted worker group (same TORCHELASTIC_RUN_ID, restart count 1) continues the run its
    first group opened, as a second attempt; a new torchrun (restart count 0 again) opens a new run,
    even with the same run id ("none" is every torchrun's without rendezvous settings)."""
    _elastic(monkeypatch, run_id, 0)
    first = logged_launch(db_path, range(3), 0.0)
    _elastic(monkeypatch, run_id, 1)
    restarted = logged_launch(db_path, range(5), 100.0)
    assert restarted.run_id == first.run_id and restarted.log_dir == first.log_dir
    assert query(db_path, "SELECT attempt, status FROM attempts ORDER BY attempt") == [(0, "success"), (1, "success")]
    _elastic(monkeypatch, run_id, 0)
    again = logged_launch(db_path, range(1), 200.0)
    assert again.run_id != first.run_id
    assert query(db_path, "SELECT run_id, seq >> 40, count(*) FROM metrics WHERE key = 'loss' GROUP BY 1, 2 ORDER BY 1, 2") == [
        (first.run_id, 0, 3),
        (first.run_id, 1, 5),
        (again.run_id, 0, 1),
    ]


def test_torchelastic_restart_keeps_an_explicit_choice(monkeypatch: pytest.MonkeyPatch, db_path: Path) -> None:
    """The job's own run_key (or version) wins over torchelastic's: the restart continues that run,
    and resume="never" still refuses an existing run."""
    _elastic(monkeypatch, "job-1", 0)
    first = logged_launch(db_path, range(2), 0.0, run_key="mine")
    _elastic(monkeypatch, "job-1", 1)
    assert logged_launch(db_path, range(2), 0.0, run_key="mine").run_id == first.run_id
    assert query(db_path, "SELECT run_key FROM runs") == [("mine",)]
    with pytest.raises(ResumeRefused):
        _ = held_logger(db_path, name="job", version=0, resume="never").run_id


def test_resume_on_postgresql(postgres_url: str, tmp_path: Path) -> None:
    """Two launches against the real PostgreSQL server, the second with version=0: one run, two
    attempts, the rows of both launches apart by seq, and a metrics.csv with the whole history."""
    first = logged_launch(postgres_url, range(3), 100.0, save_dir=str(tmp_path))
    second = logged_launch(postgres_url, range(2, 5), 200.0, version=0, save_dir=str(tmp_path))
    assert second.run_id == first.run_id
    store = Store(postgres_url)
    try:
        with store.begin() as conn:
            assert conn.execute(sa.text("SELECT id, status FROM runs")).all() == [(first.run_id, "success")]
            assert conn.execute(sa.text("SELECT attempt, status FROM attempts ORDER BY attempt")).all() == [
                (0, "success"),
                (1, "success"),
            ]
            rows = conn.execute(sa.text("SELECT step, seq >> 40, value FROM metrics WHERE key = 'loss' ORDER BY seq")).all()
    finally:
        store.close()
    assert [tuple(r) for r in rows] == [(0, 0, 100.0), (1, 0, 101.0), (2, 0, 102.0), (2, 1, 202.0), (3, 1, 203.0), (4, 1, 204.0)]
    exported = _csv_rows(os.path.join(second.log_dir, "metrics.csv"))
    assert [(r["step"], r["loss"]) for r in exported] == [
        ("0", "100.0"), ("1", "101.0"), ("2", "102.0"), ("2", "202.0"), ("3", "203.0"), ("4", "204.0"),
    ]


def test_side_rows_of_a_resumed_launch_never_collide(db_path: Path) -> None:
    """decisions, logs and step_timing rows of two launches of one run: each launch numbers its
    rows from 0, and the attempt's seq base keeps them apart, so every row of both is stored."""
    import logging

    for attempt, tag in enumerate((100.0, 200.0)):
        logger = held_logger(db_path, name="job", version=0 if attempt else None, capture_logs="WARNING")
        for step in range(3):
            logger.log_metrics({"loss": tag + step}, step=step)
            logger.record("step_timing", step=step, forward_s=tag, time=time.time())
            logger.record("decisions", step=step, callback="ModelCheckpoint", value=tag, time=time.time())
            logging.getLogger("user").warning("launch %s step %s", attempt, step)
        logger.finalize("success")
    for table in ("step_timing", "decisions", "logs"):
        rows = query(db_path, f"SELECT seq >> 40, seq & 1023, count(*) FROM {table} WHERE rank = 0 GROUP BY 1, 2 ORDER BY 1, 2")
        assert rows == [(a, s, 1) for a in (0, 1) for s in range(3)], (table, rows)
    messages = query(db_path, "SELECT message FROM logs WHERE logger = 'user' ORDER BY seq")
    assert [m for (m,) in messages] == [f"launch {a} step {s}" for a in (0, 1) for s in range(3)]
    assert query(db_path, "SELECT forward_s, count(*) FROM step_timing GROUP BY 1 ORDER BY 1") == [(100.0, 3), (200.0, 3)]


def test_a_rank_registering_while_rank_0_writes_its_placeholder_keeps_its_own_row(postgres_url: str) -> None:
    """On a server, rank 0 writes a placeholder row for each rank not registered yet
    (`register_absent_ranks`) while the ranks register themselves: where the placeholder commits
    between a rank's DELETE and its INSERT (READ COMMITTED), that rank used to fail its set-up with a
    UniqueViolation on ``pk_ranks`` (a fresh clone's 16 ranks on a server of 10 connections). Here the
    placeholder is committed from another connection exactly then; the rank's row, with its facts,
    is what stays. (SQLite cannot interleave so: the DELETE holds the file's write lock to the commit.)"""
    store, rank_0 = Store(postgres_url), Store(postgres_url)
    run = store.create_run("job", world_size=4)
    planted: list[str] = []

    def placeholder_in_between(conn: object, cursor: object, statement: str, *rest: object) -> None:
        if statement.startswith("INSERT INTO ranks") and not planted:
            planted.append(statement)
            rank_0.register_absent_ranks(run.id, range(1, 4))  # its own connection: committed now

    sa.event.listen(store.engine, "before_cursor_execute", placeholder_in_between)
    try:
        store.register_rank(run.id, 3, host="node-3", pid=4242, local_rank=1)
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", placeholder_in_between)
    assert planted  # the placeholder did land between the DELETE and the INSERT
    with store.begin() as conn:
        rows = conn.execute(sa.text("SELECT rank, host, pid, local_rank, status FROM ranks ORDER BY rank")).all()
    assert [tuple(r) for r in rows] == [(1, None, None, None, "running"), (2, None, None, None, "running"),
                                        (3, "node-3", 4242, 1, "running")]
    store.close()
    rank_0.close()
