"""A 4-rank gather DDP training on CPU whose ranks log a NaN now and then: the watch's latency, end to end.

Run by ``bench_watch.py --ddp-latency`` (never by hand): ``python benchmarks/_watch_latency_train.py
--db DB --out DIR [--flush-interval 5] [--probes 16] [--no-peek]``. Every rank logs ``probe_0`` ..
``probe_{N-1}`` at every step; probe ``i`` is NaN once, on rank ``i % 4`` at step ``START + EVERY * i``
(each its own first non-finite value: one alert each). The rank that logs it writes the wall time
of its ``self.log`` call into ``DIR/logged-RANK.jsonl``; rank 0's ``on_alert`` (called on the watch's
thread right after the alert's console line) the wall time of the alert into ``DIR/alerts.jsonl``.
``--no-peek`` sets ``watch.watch.PEEK_S = None`` (the watch fed by rank 0's writer cycles alone: the
behaviour before ``RowChannel.peek``). Lightning's launcher starts ranks 1-3 by running this script again.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from lightning.pytorch import LightningModule, Trainer, seed_everything
from torch.utils.data import DataLoader, TensorDataset

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import multirank_logger.watch.watch as watch_module
from multirank_logger import MultiRankLogger
from multirank_logger.watch.alerts import Alert

START, EVERY, TAIL = 20, 23, 150  # steps: the first probe, between two probes, after the last
COMPUTE_S = 0.05  # each step's work (a sleep): ~15 steps a second


class Probes(LightningModule):
    def __init__(self, probes: int, out: str) -> None:
        super().__init__()
        self.probes, self.out = probes, Path(out)
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        time.sleep(COMPUTE_S)
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        step, rank = self.global_step, self.global_rank
        for i in range(self.probes):
            nan = rank == i % 4 and step == START + EVERY * i
            if nan:
                with (self.out / f"logged-{rank}.jsonl").open("a") as fh:
                    fh.write(json.dumps({"key": f"probe_{i}", "rank": rank, "step": step, "t": time.time()}) + "\n")
            self.log(f"probe_{i}", float("nan") if nan else 1.0)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(4 * 4 * 2000, 8, generator=g)
        return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--flush-interval", type=float, default=5.0)
    parser.add_argument("--probes", type=int, default=16)
    parser.add_argument("--no-peek", action="store_true")
    args = parser.parse_args()
    if args.no_peek:
        watch_module.PEEK_S = None
    seed_everything(0, verbose=False)
    torch.set_num_threads(1)
    out = Path(args.out)

    def on_alert(alert: Alert) -> None:  # rank 0's watch thread, after the console line
        with (out / "alerts.jsonl").open("a") as fh:
            fh.write(json.dumps({"kind": alert.kind, "key": alert.key, "rank": alert.rank, "step": alert.first_step,
                                 "t": time.time()}) + "\n")

    logger = MultiRankLogger(db=args.db, save_dir=args.out, name="latency", flush_interval=args.flush_interval,
                             transport="gather", on_alert=on_alert)
    trainer = Trainer(
        accelerator="cpu", devices=4, strategy="ddp", max_steps=START + EVERY * args.probes + TAIL, log_every_n_steps=1,
        logger=logger, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
    )
    trainer.fit(Probes(args.probes, args.out))


if __name__ == "__main__":
    main()
