"""One launch of a resumable DDP job, for the resume tests: fit (from a checkpoint or not), maybe test.

Every rank logs ``rank_value`` = 1000 * rank + step and ``launch`` = --launch (which launch
logged a step), and prints ``rank R step S`` so a test can preempt it mid-epoch. Checkpoints
go to ``SAVE_DIR/ckpt`` (``last.ckpt`` every --ckpt-every steps and at each epoch's end).

Usage: python tests/scripts/resume_train.py --db DB --save-dir DIR [--epochs N] [--resume] [--launch K] ...

--db and --transport may be given several times, paired in order: one launch then logs to each
store with its own logger (its files beside its store), so the variants of a test share one
training instead of paying a launch each.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from multirank_logger import MultiRankLogger


class TinyModel(LightningModule):
    def __init__(self, launch: int, sleep: float) -> None:
        super().__init__()
        self.launch, self.sleep = launch, sleep
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        rank, step = self.global_rank, self.global_step
        self.log_dict({"rank_value": float(1000 * rank + step), "launch": float(self.launch)})
        if self.sleep:
            time.sleep(self.sleep)
        print(f"rank {rank} step {step}", flush=True)
        return loss

    def test_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("test_loss", torch.nn.functional.mse_loss(self.layer(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def _data(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        return DataLoader(TensorDataset(torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g)), batch_size=4)

    def train_dataloader(self) -> DataLoader:
        return self._data()

    def test_dataloader(self) -> DataLoader:
        return self._data()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True, action="append")
    parser.add_argument("--save-dir", required=True)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--transport", action="append")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--resume", action="store_true", help="fit from SAVE_DIR/ckpt/last.ckpt")
    parser.add_argument("--launch", type=int, default=0)
    parser.add_argument("--version", type=int, default=None)
    parser.add_argument("--run-key", default=None)
    parser.add_argument("--ckpt-every", type=int, default=None)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--test", action="store_true", help="trainer.test after fit")
    args = parser.parse_args()

    transports = args.transport or ["auto"] * len(args.db)
    if len(transports) != len(args.db):
        parser.error("give --transport once for each --db, or not at all")
    loggers = [
        MultiRankLogger(
            db=db, save_dir=args.save_dir if len(args.db) == 1 else os.path.dirname(db), name="job",
            version=args.version, run_key=args.run_key, transport=transport, flush_interval=0.2,
        )
        for db, transport in zip(args.db, transports)
    ]
    ckpt_dir = os.path.join(args.save_dir, "ckpt")
    checkpoint = ModelCheckpoint(dirpath=ckpt_dir, save_last=True, every_n_train_steps=args.ckpt_every)
    trainer = Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=args.strategy,
        max_epochs=args.epochs,
        log_every_n_steps=1,
        logger=loggers,
        callbacks=[checkpoint],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = TinyModel(args.launch, args.sleep)
    trainer.fit(model, ckpt_path=os.path.join(ckpt_dir, "last.ckpt") if args.resume else None)
    if args.test:
        trainer.test(model)


if __name__ == "__main__":
    sys.exit(main())
