"""A run's log calls as Lightning's Trainer makes them, written the two ways the read side is checked
against: by Lightning's own CSVLogger (the golden metrics.csv) and through the logger's own write
path into a store. Shared by the query, export, cli and drop-in tests."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import CSVLogger

from multirank_logger.store.sql_store import Store
from multirank_logger.write.buffer import RecordBuffer

Call = tuple[Mapping[str, Any], int]
ODD_KEYS = ['it\'s "quoted", comma', "naïve ключ", "x; DROP TABLE metrics; --"]


def trainer_calls(rank: int = 0, steps: int = 60) -> list[Call]:
    """A run's log calls as the Trainer makes them: train steps, validation and epoch-end rows."""
    calls: list[Call] = []
    for step in range(steps):
        metrics: dict[str, Any] = {"train_loss": 1.0 / (step + 1) + rank, "epoch": step // 20}
        metrics["rank_value"] = 1000 * rank + step
        if step % 7 == 3:
            metrics["flag"] = step % 2 == 0  # bool
        if step == 11:
            metrics["train_loss"] = math.nan
        if step == 12:
            metrics["train_loss"] = math.inf
        if step == 13:
            metrics["train_loss"] = -math.inf
        if step == 14:
            metrics["train_loss"] = -0.0
        if step >= 35:  # a key that first appears late: CSVLogger rewrites its file
            metrics["late"] = step * 1e-5
            metrics[ODD_KEYS[step % 3]] = 1e16 + step if step % 2 else 0.1 * step
        calls.append((metrics, step))
        if step % 20 == 19:  # validation, then the epoch-end row, at the same step
            calls.append(({"val_loss": 0.5 + rank + step * 1e-3, "epoch": step // 20}, step))
            calls.append(({"train_loss_epoch": 2.5e-7 * step, "epoch": step // 20}, step))
    return calls


def prefixed(metrics: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    # Lightning's _add_prefix with LOGGER_JOIN_CHAR = "-"
    return {f"{prefix}-{k}" if prefix else k: v for k, v in metrics.items()}


def csvlogger_file(tmp_path: Path, calls: Sequence[Call], prefix: str = "", flush: int = 10) -> bytes:
    """What Lightning's own CSVLogger writes for these calls."""
    logger = CSVLogger(tmp_path / "csv", name="golden", prefix=prefix, flush_logs_every_n_steps=flush)
    for metrics, step in calls:
        logger.log_metrics(dict(metrics), step)
    logger.save()
    return Path(logger.experiment.metrics_file_path).read_bytes()


def store_calls(
    db: Path, per_rank: Mapping[int, Sequence[Call]], prefix: str = "", name: str = "lightning_logs"
) -> int:
    """Write the calls through the logger's own path (RecordBuffer -> drain -> Store.write)."""
    store = Store(db)
    run = store.create_run(name, world_size=len(per_rank))
    for rank, calls in per_rank.items():
        buffer = RecordBuffer()
        drain = buffer.drain
        for i, (metrics, step) in enumerate(calls):
            buffer.append(step, prefixed(metrics, prefix))
            if i % 17 == 0:  # several flushes, as the writer thread does
                store.write(drain(run.id, rank))
        store.write(drain(run.id, rank))
    store.close()
    return run.id
