"""A 4-rank DDP training on CPU whose NaN starts on one rank and spreads, as it does in the field.

Rank 2's batch at step ``--nan-step`` is NaN: its loss is NaN there, its gradient too, and the
gradient all-reduce carries it into every rank's weights, so every rank's loss is NaN from the
next step on. Each rank logs its own loss (no sync_dist). With ``--stop``,
``StopOnAlert(kinds={"non_finite"})`` ends the fit; rank 0 prints ``TRAINING ENDS AT STEP N``.

Usage: python tests/scripts/origin_train.py --db DB --save-dir DIR --nan-step S --steps N
       [--flush-interval SECONDS] [--stop]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from torch.utils.data import DataLoader, TensorDataset

from multirank_logger import MultiRankLogger, StopOnAlert

NAN_RANK = 2


class Regression(LightningModule):
    def __init__(self, nan_step: int) -> None:
        super().__init__()
        self.nan_step = nan_step
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        if self.global_rank == NAN_RANK and self.global_step == self.nan_step:
            x = x * float("nan")  # a bad sample on one rank's shard
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss.detach())  # each rank's own, as it is
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(4 * 8 * 500, 8, generator=g)
        y = x @ torch.randn(8, 1, generator=g)
        return DataLoader(TensorDataset(x, y), batch_size=8)


class SayTheEnd(Callback):
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.global_rank == 0:
            print(f"TRAINING ENDS AT STEP {trainer.global_step}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--save-dir", required=True)
    parser.add_argument("--nan-step", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--flush-interval", type=float, default=5.0)
    parser.add_argument("--stop", action="store_true")
    args = parser.parse_args()
    seed_everything(0, verbose=False)
    torch.set_num_threads(1)
    logger = MultiRankLogger(db=args.db, save_dir=args.save_dir, name="spread", flush_interval=args.flush_interval)
    callbacks: list[Callback] = [SayTheEnd()]
    if args.stop:
        callbacks.append(StopOnAlert(kinds={"non_finite"}))
    trainer = Trainer(
        accelerator="cpu", devices=4, strategy="ddp", max_steps=args.steps, log_every_n_steps=1, logger=logger,
        callbacks=callbacks, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
    )
    trainer.fit(Regression(args.nan_step))
    Path(args.save_dir, "fit-returned").touch()


if __name__ == "__main__":
    sys.exit(main())
