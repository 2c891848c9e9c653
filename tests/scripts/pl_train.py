"""A clean 2-rank DDP training on the standalone ``pytorch_lightning`` package (not ``lightning``):
its Trainer, LightningModule and ModelCheckpoint, with DecisionAudit and StepTimer.

Both ranks log the same, synced ``val_loss`` (falling each epoch), so ModelCheckpoint saves every
epoch and nothing differs between the ranks: the report of this run must say nothing stands
out. Rank 0 prints which packages' ``Logger`` the logger is an instance of. Lightning's
launcher re-runs this file for rank 1, so it is a script. Each rank reads the version before
``fit`` (rank 1 learns it from the environment pytorch_lightning's launcher gave it) and, at the
start of fit, says which run-identity variables its environment holds.

Usage: python tests/scripts/pl_train.py --db DB --save-dir DIR
"""

from __future__ import annotations

import argparse
import os
import sys

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from multirank_logger import DecisionAudit, MultiRankLogger, StepTimer

MAX_EPOCHS = 3


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def on_fit_start(self) -> None:
        import lightning.pytorch

        held = sorted(name for name in os.environ if name.startswith("MULTIRANK_LOGGER_RUN_"))
        print(f"pl_train: rank {self.global_rank} environment holds {held}", flush=True)
        if self.global_rank == 0:
            logger = self.trainer.logger
            print(f"pl_train: pytorch_lightning Logger {isinstance(logger, pl.loggers.Logger)}, "
                  f"lightning Logger {isinstance(logger, lightning.pytorch.loggers.Logger)}", flush=True)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", 10.0 - self.current_epoch, sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def _data(self, n: int) -> DataLoader:
        g = torch.Generator().manual_seed(n)
        return DataLoader(TensorDataset(torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)), batch_size=4)

    def train_dataloader(self) -> DataLoader:
        return self._data(16)

    def val_dataloader(self) -> DataLoader:
        return self._data(8)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--save-dir", required=True)
    args = parser.parse_args()

    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=MAX_EPOCHS,
        logger=MultiRankLogger(db=args.db, save_dir=args.save_dir, flush_interval=0.2),
        callbacks=[ModelCheckpoint(monitor="val_loss", mode="min", save_top_k=1), DecisionAudit(), StepTimer()],
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    print(f"pl_train: rank {os.environ.get('LOCAL_RANK', '0')} version before fit {trainer.logger.version}", flush=True)
    trainer.fit(Model())


if __name__ == "__main__":
    sys.exit(main())
