"""A tiny 2-rank DDP fit with CSVLogger and MultiRankLogger side by side, for the golden test.

Lightning's launcher (strategy="ddp") re-runs this script for rank 1, so it is a file.
Each rank logs what CSVLogger's file must reproduce: train steps, validation and
epoch-end rows, an int, a NaN, a key that first appears late, a prefix, and
``rank_value`` = 1000 * rank + step, never synced, so each rank's export differs.

Usage: python tests/scripts/query_train.py DB SAVE_DIR CSV_DIR
"""

from __future__ import annotations

import sys

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

from multirank_logger import MultiRankLogger

PREFIX = "fit"


class TinyModel(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        step = self.global_step
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        self.log("rank_value", float(1000 * self.global_rank + step), sync_dist=False)
        self.log("int_metric", torch.tensor(step))
        self.log("maybe_nan", float("nan") if step == 2 else 0.25 * step)
        if step >= 4:
            self.log("late_key", step / 3)
        return loss

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def _loader(self, seed: int) -> DataLoader:
        g = torch.Generator().manual_seed(seed)
        return DataLoader(TensorDataset(torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g)), batch_size=4)

    def train_dataloader(self) -> DataLoader:
        return self._loader(0)

    def val_dataloader(self) -> DataLoader:
        return self._loader(1)


def main(db: str, save_dir: str, csv_dir: str) -> None:
    loggers = [
        CSVLogger(csv_dir, prefix=PREFIX),
        MultiRankLogger(db=db, save_dir=save_dir, prefix=PREFIX, flush_interval=0.2),
    ]
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=2,
        limit_train_batches=3,
        limit_val_batches=2,
        log_every_n_steps=1,
        logger=loggers,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    trainer.fit(TinyModel())


if __name__ == "__main__":
    main(*sys.argv[1:4])
