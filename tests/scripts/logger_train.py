"""A tiny DDP training run for the logger tests, started as its own process.

Lightning's launcher (strategy="ddp") re-runs this script for ranks > 0, so it must be a
file, not a function inside pytest. Each rank logs values that say which rank logged them:
``rank_value`` = 1000 * rank + step (never synced), ``synced`` (sync_dist=True).

Usage: python tests/scripts/logger_train.py --db DB --save-dir DIR [--mode MODE] [--steps N] ...
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import DeviceStatsMonitor
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

from multirank_logger import MultiRankLogger
from multirank_logger.write import process_hooks
from tests.helpers.internals import run_of


class TinyModel(LightningModule):
    def __init__(self, mode: str = "normal", lr: float = 0.1, sleep: float = 0.0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        rank, step = self.global_rank, self.global_step
        mode = self.hparams.mode
        self.log("train_loss", loss)
        self.log("rank_value", float(1000 * rank + step))
        self.log("synced", torch.tensor(float(rank)), sync_dist=True)
        if mode == "asym":
            # each rank its own key; rank 0 alone logs another; rank 1 skips odd steps
            self.log(f"only_rank_{rank}", float(step))
            if rank == 0:  # rank_zero_only=True: "I call this from rank 0 only"
                self.log("zero_only", float(step), rank_zero_only=True)
            if rank == 1 and step % 2 == 1:
                pass
            else:
                self.log("sometimes", float(step))
        if mode == "special":
            self.log("it's \"quoted\"; DROP TABLE metrics; --", float("nan"))
            self.log("space key é ünï", float("inf"))
            self.log("int_value", torch.tensor(step))
        if self.hparams.sleep:
            time.sleep(self.hparams.sleep)
            print(f"rank {rank} step {step}", flush=True)
        return loss

    def on_train_batch_end(self, outputs: object, batch: object, batch_idx: int) -> None:
        # work after the optimizer step (a callback's, an EMA update): no collective until the next step
        if getattr(self, "sleep_after", 0.0):
            print(f"rank {self.global_rank} step {self.global_step}", flush=True)
            time.sleep(self.sleep_after)
        gate = getattr(self, "gate", None)
        while gate and _steps_allowed(gate) < self.global_step:
            time.sleep(0.05)  # the test lets the training on a few steps at a time (--gate)

    def on_train_end(self) -> None:
        # what a secret could have reached (--dump-env): this rank's environment (its children's
        # too) and the run identity in the launch's TCPStore, as every rank can read it
        prefix = getattr(self, "dump_env", None)
        if prefix:
            logger = next(lg for lg in self.loggers if isinstance(lg, MultiRankLogger))
            board = run_of(logger).board
            channel = board.channel(self.global_rank, self.trainer.world_size)
            identity = channel.fetch("identity", 10).decode() if channel is not None else ""
            with open(f"{prefix}.{self.global_rank}", "w") as fh:
                json.dump({"environ": dict(os.environ), "identity": identity}, fh)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g))
        return DataLoader(data, batch_size=4)


def _steps_allowed(gate: str) -> int:
    """The steps the test lets the training take so far: the number in the file `gate` (0 until it is written)."""
    try:
        return int(Path(gate).read_text() or 0)
    except (FileNotFoundError, ValueError):  # not there yet, or caught mid-write
        return 0


def slow_sigterm_flush(seconds: float) -> None:
    """The flush SIGTERM triggers takes `seconds` more, as a large backlog on a slow disk would."""
    flush_all = process_hooks.flush_all

    def slow(*args: Any, **kwargs: Any) -> None:
        flush_all(*args, **kwargs)
        if process_hooks.sigterm_received.is_set():
            time.sleep(seconds)

    process_hooks.flush_all = slow  # type: ignore[assignment]


def main() -> None:
    faulthandler.register(signal.SIGUSR1)  # a hung test can ask every rank for its stacks
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--also-db", action="append", default=[],
                        help="another store, logged to by a logger of its own (its files beside it): variants share a launch")
    parser.add_argument("--save-dir", required=True)
    parser.add_argument("--mode", default="normal")
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--csv-dir", default=None, help="also log with CSVLogger (first) into this dir")
    parser.add_argument("--read-version", action="store_true", help="read logger.version before fit")
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--sleep-after", type=float, default=0.0, help="sleep after each optimizer step")
    parser.add_argument("--gate", default=None, help="after each step, wait until this file holds a number >= the steps taken")
    parser.add_argument("--linger", type=float, default=0.0, help="every rank takes this long to exit after fit")
    parser.add_argument("--slow-sigterm-flush", type=float, default=0.0, help="rank 0's SIGTERM flush takes this long")
    parser.add_argument("--flush-interval", type=float, default=0.2)
    parser.add_argument("--report", default=None, help="each rank writes {rank: version, log_dir} here")
    parser.add_argument("--timeout", type=float, default=60.0, help="the logger's timeout")
    parser.add_argument("--spill-dir", default=None)
    parser.add_argument("--device-stats", action="store_true", help="with Lightning's DeviceStatsMonitor")
    parser.add_argument("--dump-env", default=None, help="each rank writes its environment and the TCPStore identity here")
    args = parser.parse_args()
    if args.slow_sigterm_flush and os.environ.get("LOCAL_RANK", "0") == "0":  # the launcher's process: rank 0
        slow_sigterm_flush(args.slow_sigterm_flush)

    logger = MultiRankLogger(
        db=args.db, save_dir=args.save_dir, flush_interval=args.flush_interval, timeout=args.timeout, spill_dir=args.spill_dir
    )
    if args.read_version:
        print(f"version before fit: {logger.version} {logger.log_dir}", flush=True)
    loggers = [logger] if args.csv_dir is None else [CSVLogger(args.csv_dir), logger]
    loggers += [
        MultiRankLogger(db=db, save_dir=os.path.dirname(db), flush_interval=args.flush_interval, timeout=args.timeout)
        for db in args.also_db
    ]
    trainer = Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=args.strategy,
        max_steps=args.steps,
        log_every_n_steps=1,
        logger=loggers,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=args.mode == "checkpoint",
        callbacks=[DeviceStatsMonitor()] if args.device_stats else None,
    )
    model = TinyModel(mode=args.mode, sleep=args.sleep)
    model.sleep_after = args.sleep_after
    model.gate = args.gate
    model.dump_env = args.dump_env  # not a hyperparameter: the stored hparams stay as the tests expect
    try:
        trainer.fit(model)
    finally:
        if args.linger:
            time.sleep(args.linger)  # slow to exit after fit: a DataLoader's workers, an upload at exit
    if args.report and args.strategy != "ddp_spawn":
        rank = trainer.global_rank
        with open(f"{args.report}.{rank}", "w") as fh:
            json.dump({"rank": rank, "version": logger.version, "log_dir": logger.log_dir, "pid": os.getpid()}, fh)


if __name__ == "__main__":
    sys.exit(main())
