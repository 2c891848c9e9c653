"""Ray Train (v2) with 2 CPU workers: MultiRankRayCallback stores every worker's reports under its rank."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")  # the `test` extra installs it: never skipped under make test
from ray.train import RunConfig, ScalingConfig  # noqa: E402
from ray.train.torch import TorchTrainer  # noqa: E402

from multirank_logger import open_store  # noqa: E402
from multirank_logger.integrations.ray_train import MultiRankRayCallback  # noqa: E402
from multirank_logger.report import find  # noqa: E402
from tests.helpers.launches import RAY_FAST_POLL  # noqa: E402
from tests.helpers.logger_helpers import query  # noqa: E402

STEPS = 8
BAD_RANK, BAD_FROM = 1, 5


def _train(config: dict[str, Any]) -> None:
    import sqlite3
    import time

    import ray.train

    rank = ray.train.get_context().get_world_rank()
    for step in range(STEPS):
        if config.get("raise_at") == step and rank == 1:
            raise RuntimeError("worker 1 fails")
        if config.get("hold_for_alert") and step == BAD_FROM + 2:
            # hold the training (not a sleep racing it): on until the controller's watch stored its alert.
            # The watch judges step BAD_FROM once a later step came from every worker (a worker may
            # still log at the newest step): held before step BAD_FROM + 1 was reported, the alert
            # could only come after the deadline
            deadline = time.monotonic() + 120
            while not _alert_stored(sqlite3, config["hold_for_alert"]) and time.monotonic() < deadline:
                time.sleep(0.1)
        loss = float("nan") if rank == BAD_RANK and step >= BAD_FROM else 1.0 / (step + 1) + rank * 0.01
        ray.train.report({"step": step, "loss": loss})


def _alert_stored(sqlite3: Any, db: str) -> bool:
    try:
        with sqlite3.connect(db, timeout=5) as conn:
            return conn.execute("SELECT count(*) FROM alerts").fetchone()[0] > 0
    except sqlite3.OperationalError:  # the store or its table not made yet
        return False


@pytest.fixture(scope="module")
def ray_session():
    with pytest.MonkeyPatch.context() as patch:
        for name, value in RAY_FAST_POLL.items():  # the cluster's processes (the controller among them) inherit it
            patch.setenv(name, value)
        ray.init(num_cpus=2, include_dashboard=False)
        yield
        ray.shutdown()


def _fit(tmp: Path, name: str, config: dict[str, Any]) -> Path:
    db = tmp / "runs.sqlite"
    trainer = TorchTrainer(
        _train,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(
            name=name, storage_path=str(tmp / "ray"), callbacks=MultiRankRayCallback(db, name=name).callbacks()
        ),
    )
    try:
        trainer.fit()
    except Exception:  # the failing run: its status is what the test reads
        pass
    return db


def test_every_worker_in_one_run_and_the_bad_one_named(ray_session, tmp_path: Path) -> None:
    """Worker 1 reports NaN from step 5: every worker's rows in one run, ``success``; the watch on
    the controller stores its alert while the workers train (they hold at step 7, step 6 reported,
    until it is there: an alert only at the run's end would leave them held, and the test failing); the
    report names the same rank, key and step."""
    db = _fit(tmp_path, "ok", {"hold_for_alert": str(tmp_path / "runs.sqlite")})
    assert query(db, "SELECT name, status, world_size FROM runs") == [("ok", "success", 2)]
    assert query(db, "SELECT rank, status FROM ranks ORDER BY rank") == [(0, "success"), (1, "success")]
    # each worker's place from the group Ray started (its own process), not the controller's
    places = query(db, "SELECT rank, host, local_rank, node_rank, pid FROM ranks ORDER BY rank")
    assert [p[:4] for p in places] == [(0, socket.gethostname(), 0, 0), (1, socket.gethostname(), 1, 0)], places
    assert len({p[4] for p in places} - {None, os.getpid()}) == 2, places
    steps = query(db, "SELECT rank, count(DISTINCT step) FROM metrics WHERE key = 'loss' GROUP BY rank ORDER BY rank")
    assert steps == [(0, STEPS), (1, STEPS)]
    with open_store(db) as reader:
        found = find(reader)
    assert [(n["rank"], n["key"], n["first_step"]) for n in found.non_finite] == [(BAD_RANK, "loss", BAD_FROM)]
    alerts = query(db, "SELECT kind, rank, key, first_step, step_seen, detail FROM alerts ORDER BY seq")
    assert [a[:4] for a in alerts] == [("non_finite", BAD_RANK, "loss", BAD_FROM)], alerts
    assert alerts[0][4] <= BAD_FROM + 1 and "at_end" not in alerts[0][5], alerts  # raised during training


def test_a_worker_that_raises_fails_the_run(ray_session, tmp_path: Path) -> None:
    db = _fit(tmp_path, "bad", {"raise_at": 3})
    assert query(db, "SELECT name, status FROM runs") == [("bad", "failed")]
    assert dict(query(db, "SELECT rank, status FROM ranks"))[1] == "failed"
