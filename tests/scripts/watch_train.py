"""A 4-rank DDP training on CPU (gather) for the watch's tests: alerts while it runs, and a stop.

Rank 2 logs NaN for train_loss from step 40, rank 1's train_loss departs (x10) from step 60.
Two loggers watch it: ``watched`` (its webhook a local HTTP server, ``--hook``) and
``hanging`` (its webhook a server that never answers, ``--dead-hook``). With ``--stop``,
``StopOnAlert(kinds={"departure"})`` ends the fit on every rank. With ``--clean`` nothing is
injected. Rank 0 prints ``TRAINING ENDS AT STEP N`` when the fit ends; every rank writes its
last step into ``steps-RANK.txt``.

Usage: python tests/scripts/watch_train.py --db DB --save-dir DIR [--hook URL] [--dead-hook URL] [--stop] [--clean]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from torch.utils.data import DataLoader, TensorDataset

import multirank_logger.watch.alerts as alerts
from multirank_logger import MultiRankLogger, StopOnAlert

NAN_RANK, NAN_FROM, DEPART_RANK, DEPART_FROM = 2, 40, 1, 60
COMPUTE_S = 0.03  # every rank's step: the alerts come while the fit still runs


class Regression(LightningModule):
    def __init__(self, clean: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        time.sleep(COMPUTE_S)
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        shown = loss.detach()
        if not self.hparams.clean and self.global_rank == NAN_RANK and self.global_step >= NAN_FROM:
            shown = torch.tensor(float("nan"))
            if self.global_step == NAN_FROM:  # when the NaN was logged (the watch's latency: logged -> alert)
                (Path(self.trainer.loggers[0].save_dir) / "nan-logged-at.txt").write_text(repr(time.time()))
        if not self.hparams.clean and self.global_rank == DEPART_RANK and self.global_step >= DEPART_FROM:
            shown = shown * 10
        self.log("train_loss", shown)
        self.log("weight_norm", self.layer.weight.detach().norm())
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.02)

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(4 * 8 * 400, 8, generator=g)
        y = x @ torch.randn(8, 1, generator=g) + 0.5 * torch.randn(len(x), 1, generator=g)
        return DataLoader(TensorDataset(x, y), batch_size=8)


class SayTheEnd(Callback):
    def __init__(self, out: Path) -> None:
        self.out = out

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        (self.out / f"steps-{trainer.global_rank}.txt").write_text(str(trainer.global_step))
        if trainer.global_rank == 0:
            print(f"TRAINING ENDS AT STEP {trainer.global_step}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--save-dir", required=True)
    parser.add_argument("--hook")
    parser.add_argument("--dead-hook")
    parser.add_argument("--stop", action="store_true")
    parser.add_argument("--clean", action="store_true")
    parser.add_argument("--steps", type=int, default=250)
    args = parser.parse_args()
    alerts.WEBHOOK_TIMEOUT_S, alerts.WEBHOOK_TRIES = 1.0, 2  # the dead hook's failure said within the run
    seed_everything(0, verbose=False)
    torch.set_num_threads(1)
    seen = Path(args.save_dir) / "alerts-seen.txt"

    def on_alert(alert: alerts.Alert) -> None:  # rank 0's watch thread
        with seen.open("a") as fh:
            fh.write(f"{alert.kind} {alert.rank} {alert.first_step} {time.time()!r}\n")

    loggers = [MultiRankLogger(db=args.db, save_dir=args.save_dir, name="watched", flush_interval=0.5,
                               transport="gather", alert_url=args.hook, on_alert=on_alert)]
    if args.dead_hook:
        loggers.append(MultiRankLogger(db=args.db, save_dir=args.save_dir, name="hanging", flush_interval=0.5,
                                       transport="gather", alert_url=args.dead_hook))
    # no StepTimer: a loaded host's few steps where rank 0 (two loggers' writer) lags are a true straggler
    # finding, not this test's (the watch's stragglers are tests/runs/test_report_ddp.py's)
    callbacks: list[Callback] = [SayTheEnd(Path(args.save_dir))]
    if args.stop:
        callbacks.append(StopOnAlert(kinds={"departure"}))
    trainer = Trainer(
        accelerator="cpu", devices=4, strategy="ddp", max_steps=args.steps, log_every_n_steps=1, logger=loggers,
        callbacks=callbacks, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
    )
    trainer.fit(Regression(clean=args.clean))


if __name__ == "__main__":
    sys.exit(main())
