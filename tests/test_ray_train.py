"""Ray Train (v2) with 2 CPU workers: MultiRankRayCallback stores every worker's reports under its rank."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")  # the `test` extra installs it: never skipped under make test
from ray.train import RunConfig, ScalingConfig  # noqa: E402
from ray.train.torch import TorchTrainer  # noqa: E402

from multirank_logger import open_store  # noqa: E402
from multirank_logger.integrations.ray_train import MultiRankRayCallback  # noqa: E402
from multirank_logger.report import find  # noqa: E402
from tests.logger_helpers import query  # noqa: E402

STEPS = 8
BAD_RANK, BAD_FROM = 1, 5


def _train(config: dict[str, Any]) -> None:
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    for step in range(STEPS):
        if config.get("raise_at") == step and rank == 1:
            raise RuntimeError("worker 1 fails")
        loss = float("nan") if rank == BAD_RANK and step >= BAD_FROM else 1.0 / (step + 1) + rank * 0.01
        ray.train.report({"step": step, "loss": loss})


@pytest.fixture(scope="module")
def ray_session():
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
    db = _fit(tmp_path, "ok", {})
    assert query(db, "SELECT name, status, world_size FROM runs") == [("ok", "success", 2)]
    assert query(db, "SELECT rank, status FROM ranks ORDER BY rank") == [(0, "success"), (1, "success")]
    steps = query(db, "SELECT rank, count(DISTINCT step) FROM metrics WHERE key = 'loss' GROUP BY rank ORDER BY rank")
    assert steps == [(0, STEPS), (1, STEPS)]
    with open_store(db) as reader:
        found = find(reader)
    assert [(n["rank"], n["key"], n["first_step"]) for n in found.non_finite] == [(BAD_RANK, "loss", BAD_FROM)]


def test_a_worker_that_raises_fails_the_run(ray_session, tmp_path: Path) -> None:
    db = _fit(tmp_path, "bad", {"raise_at": 3})
    assert query(db, "SELECT name, status FROM runs") == [("bad", "failed")]
    assert dict(query(db, "SELECT rank, status FROM ranks"))[1] == "failed"
