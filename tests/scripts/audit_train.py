"""A 2-rank DDP training whose ranks disagree, for the DecisionAudit and log-capture tests.

Each rank logs its own (unsynced) validation values from the tables below:

- ``val_score`` (ModelCheckpoint, min, save_top_k=1): both ranks improve at epochs 1 and 3;
  at epoch 2 rank 0 improves (3 < 4) and rank 1 does not (4.5 > 4): no checkpoint then.
- ``val_stop`` (EarlyStopping, min, patience=1): rank 1 stops improving at epoch 3 and votes
  to stop; any rank stops the run, so training ends after epoch 3 of MAX_EPOCHS.

Every rank also logs a banner (the same text on every rank), one line of its own, and rank 1
alone a logging WARNING and a `warnings.warn`. Lightning's launcher re-runs this file for
rank 1, so it is a script.

Usage: python tests/scripts/audit_train.py --db DB --save-dir DIR [--console]
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from multirank_logger import DecisionAudit, MultiRankLogger, rank_aware_console

VAL_SCORE = {0: [5.0, 4.0, 3.0, 2.0, 1.0, 0.5], 1: [5.0, 4.0, 4.5, 3.0, 2.0, 1.0]}
VAL_STOP = {0: [4.0, 3.0, 2.0, 1.0, 0.5, 0.2], 1: [4.0, 3.0, 2.0, 2.5, 2.6, 2.7]}
MAX_EPOCHS = 6
BANNER = "audit_train 1.0: the same banner on every rank"

log = logging.getLogger("audit_train")


class RankWarning(UserWarning):
    """Shown whatever PYTHONWARNINGS says (the tests' launches ignore the others)."""


class Model(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def on_fit_start(self) -> None:
        log.info("rank %d has its own line", self.global_rank)
        if self.global_rank == 1:
            log.warning("rank 1 alone: this shard is slow")
            warnings.warn("rank 1 alone: a warnings.warn", RankWarning, stacklevel=1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        rank, epoch = self.global_rank, self.current_epoch
        self.log("val_score", VAL_SCORE[rank][epoch])  # unsynced on purpose: each rank its own
        self.log("val_stop", VAL_STOP[rank][epoch])

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
    parser.add_argument("--console", action="store_true", help="turn the rank-aware console on")
    args = parser.parse_args()

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    warnings.simplefilter("always", RankWarning)
    if args.console:
        rank_aware_console()
    logger = MultiRankLogger(db=args.db, save_dir=args.save_dir, flush_interval=0.2)
    log.info(BANNER)  # rank 1 (re-run by the launcher) logs it too
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=MAX_EPOCHS,
        logger=logger,
        callbacks=[
            ModelCheckpoint(monitor="val_score", mode="min", save_top_k=1),
            EarlyStopping(monitor="val_stop", mode="min", patience=1),
            DecisionAudit(),
        ],
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Model())


if __name__ == "__main__":
    sys.exit(main())
