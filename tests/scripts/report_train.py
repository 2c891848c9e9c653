"""A 3-rank DDP training on CPU for the report tests, with StepTimer and faults to inject.

With ``--faults``: rank 1's data loader sleeps 100 ms per batch (a slow shard), rank 2 logs a
train_loss 20x its own from step 20 on, and rank 2 logs NaN for weight_norm from step 25 on.
Without: the same model and data, nothing injected.

Usage: python tests/scripts/report_train.py --db DB --save-dir DIR --name NAME [--faults] [--steps N] [--seed S]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.distributed as dist
from lightning.pytorch import LightningModule, Trainer, seed_everything
from torch.utils.data import DataLoader, TensorDataset, default_collate

from multirank_logger import MultiRankLogger, StepTimer

# 100 ms: well above the 10-50 ms waits a loaded 2-core CI host puts on every rank's data now and
# then (with 30 ms, those moved the straggler's first step found from 1 to 8 or 13)
SLOW_RANK, SLOW_S = 1, 0.100
# every rank's compute per step, in both runs: a step of 20 ms made a loaded host's few extra ms
# of data wait on one rank (3.5 ms over 7 steps in CI) a tenth of a step, a straggler in the clean run
COMPUTE_S = 0.050
BAD_RANK, LOSS_FROM, LOSS_FACTOR, NAN_FROM = 2, 20, 20.0, 25


class Regression(LightningModule):
    def __init__(self, faults: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        time.sleep(COMPUTE_S)  # the model's compute, the same on every rank
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        bad = self.hparams.faults and self.global_rank == BAD_RANK
        self.log("train_loss", loss * (LOSS_FACTOR if bad and self.global_step >= LOSS_FROM else 1.0))
        norm = self.layer.weight.detach().norm()
        self.log("weight_norm", torch.tensor(float("nan")) if bad and self.global_step >= NAN_FROM else norm)
        self.log("mean_loss", loss, sync_dist=True)  # the same on every rank: never an outlier
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.02)

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(3 * 8 * 60, 8, generator=g)
        y = x @ torch.randn(8, 1, generator=g) + 0.5 * torch.randn(len(x), 1, generator=g)
        return DataLoader(TensorDataset(x, y), batch_size=8, collate_fn=self._collate)

    def _collate(self, items: list) -> list[torch.Tensor]:
        if self.hparams.faults and dist.is_initialized() and dist.get_rank() == SLOW_RANK:
            time.sleep(SLOW_S)  # a slow shard: this rank waits for its data, the others for it
        return default_collate(items)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--save-dir", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--faults", action="store_true")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    seed_everything(args.seed, verbose=False)  # the initial weights too: one trajectory, the same findings every run
    torch.set_num_threads(1)
    trainer = Trainer(
        accelerator="cpu", devices=3, strategy="ddp", max_steps=args.steps, log_every_n_steps=1,
        logger=MultiRankLogger(db=args.db, save_dir=args.save_dir, name=args.name, flush_interval=0.5),
        callbacks=[StepTimer()], enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
    )
    trainer.fit(Regression(faults=args.faults))


if __name__ == "__main__":
    sys.exit(main())
