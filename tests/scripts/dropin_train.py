"""A 2-rank DDP training that reads rank 0's metrics.csv while it trains, for tests/runs/test_dropin_ddp.py.

CSVLogger logs first and MultiRankLogger second, in one Trainer, so both get the same calls.
A key appears late (the file must be rewritten with a wider header), and with ``--crash-at``
every rank raises at that step (the run fails; both files must be left as they were).
At the ``--snapshot-at`` steps, rank 0 waits (bounded) for our metrics.csv to hold the calls
logged so far and copies it aside, so the test sees what a user tailing the file saw.

Usage: python tests/scripts/dropin_train.py --db DB --save-dir DIR --csv-dir DIR [--crash-at N] ...

--db may repeat: a MultiRankLogger each (after CSVLogger), its files (metrics.csv, the snapshots,
experiment.R) in its store's folder, so the backends share one training.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
import time
from pathlib import Path

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

from multirank_logger import MultiRankLogger

#: the longest rank 0 waits for the file to catch up at a snapshot
SNAPSHOT_WAIT_S = 30.0
LATE_KEY_FROM = 10


class TinyModel(LightningModule):
    def __init__(self, crash_at: int = -1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        step = self.global_step
        if step == self.hparams.crash_at:
            raise RuntimeError(f"crash at step {step}, as asked")
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        self.log("rank_value", float(1000 * self.global_rank + step))
        if step >= LATE_KEY_FROM:
            self.log("late_key", step)  # an int, and a new column: the file is rewritten
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(160, 4, generator=g), torch.randn(160, 1, generator=g))
        return DataLoader(data, batch_size=4)


class Snapshots(Callback):
    """Rank 0 copies each of our live metrics.csv files aside at given steps, into its logger's
    save_dir; every rank says there what its ``logger.experiment`` is."""

    def __init__(self, steps: list[int]) -> None:
        self.steps = set(steps)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        for ours in trainer.loggers[1:]:
            kind = type(ours.experiment).__name__
            (Path(ours.save_dir) / f"experiment.{trainer.global_rank}").write_text(kind)

    def on_train_batch_end(self, trainer: Trainer, *args: object) -> None:
        step = trainer.global_step  # calls logged so far (one per step, log_every_n_steps=1)
        if trainer.global_rank != 0 or step not in self.steps:
            return
        for ours in trainer.loggers[1:]:
            path = Path(ours.log_dir) / "metrics.csv"
            deadline = time.monotonic() + SNAPSHOT_WAIT_S
            # the batch that just ended is logged after this hook: the file can hold step - 1 calls
            while time.monotonic() < deadline and _data_rows(path) < step - 1:
                time.sleep(0.05)
            if path.exists():
                shutil.copyfile(path, Path(ours.save_dir) / f"snapshot.{step}.csv")


def _data_rows(path: Path) -> int:
    try:
        with open(path, newline="") as fh:
            return sum(1 for _ in csv.reader(fh)) - 1
    except FileNotFoundError:
        return 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True, action="append")
    parser.add_argument("--save-dir", required=True)
    parser.add_argument("--csv-dir", required=True)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--crash-at", type=int, default=-1)
    parser.add_argument("--snapshot-at", type=int, nargs="*", default=[6, 16])
    args = parser.parse_args()

    out = Path(args.save_dir)
    ours = [
        MultiRankLogger(args.save_dir if len(args.db) == 1 else str(Path(db).parent), db=db, flush_logs_every_n_steps=2,
                        flush_interval=0.2)
        for db in args.db
    ]
    theirs = CSVLogger(args.csv_dir, flush_logs_every_n_steps=2)
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=args.steps,
        log_every_n_steps=1,
        logger=[theirs, *ours],
        callbacks=[Snapshots(args.snapshot_at)],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    trainer.fit(TinyModel(crash_at=args.crash_at))
    (out / f"done.{trainer.global_rank}").write_text(json.dumps({"log_dir": ours[0].log_dir}))


if __name__ == "__main__":
    sys.exit(main())
