"""One node of a tiny multi-node DDP training, for the shared-nothing tests.

Started once per simulated host (``NODE_RANK=k``), each under ``unshare -m`` with its own
tmpfs on the store's directory, so that the hosts share no disk. Lightning's launcher
starts the node's other local ranks, which inherit the node's mount namespace.

Every rank logs ``rank_value = 1000 * rank + step``. Since the store's directory vanishes
with the namespace, each rank leaves a report in ``--out`` (a directory outside the
tmpfs), and rank 0 copies the store there.

Usage: NODE_RANK=k MASTER_ADDR=... MASTER_PORT=... python tests/scripts/shared_nothing_train.py
    --db DB --out DIR --num-nodes N --devices D [--mode normal|asym|kill] [--steps S]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import time

import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset

from multirank_logger import MultiRankLogger


class TinyModel(LightningModule):
    def __init__(self, mode: str, kill_rank: int, kill_step: int, sleep: float) -> None:
        super().__init__()
        self.mode, self.kill_rank, self.kill_step, self.sleep = mode, kill_rank, kill_step, sleep
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        rank, step = self.global_rank, self.global_step
        if self.mode == "asym":
            # rank 0 logs two keys, rank 1 every other step, the others nothing at all
            if rank == 0:
                self.log_dict({"rank_value": float(1000 * rank + step), "zero_only": float(step)})
            elif rank == 1 and step % 2 == 0:
                self.log("rank_value", float(1000 * rank + step))
        else:
            self.log("rank_value", float(1000 * rank + step))
        if self.mode == "kill" and rank == self.kill_rank and step == self.kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.sleep:
            time.sleep(self.sleep)  # lets the writer flush mid-run, so rows stream during training
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        return DataLoader(TensorDataset(torch.randn(256, 4, generator=g), torch.randn(256, 1, generator=g)), batch_size=4)


def _digest(path: str) -> str | None:
    """The store file's content hash, so a test can tell it was left unchanged."""
    if not os.path.exists(path):
        return None
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--num-nodes", type=int, default=2)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--mode", default="normal", choices=["normal", "asym", "kill"])
    parser.add_argument("--kill-rank", type=int, default=1)
    parser.add_argument("--kill-step", type=int, default=3)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--transport", default="auto")
    parser.add_argument("--timeout", type=float, default=20.0)
    args = parser.parse_args()

    logger = MultiRankLogger(
        db=args.db, name="sn", flush_interval=0.1, transport=args.transport, timeout=args.timeout, export_csv=False
    )
    trainer = Trainer(
        accelerator="cpu",
        devices=args.devices,
        num_nodes=args.num_nodes,
        strategy="ddp",
        max_steps=args.steps,
        logger=logger,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = TinyModel(args.mode, args.kill_rank, args.kill_step, args.sleep)
    outcome = "success"
    try:
        trainer.fit(model)
    except BaseException as exc:  # the peer's death reaches us as a gloo error
        outcome = f"{type(exc).__name__}: {exc}"[:300]
        raise
    finally:
        rank = trainer.global_rank
        report = {
            "rank": rank,
            "node": int(os.environ.get("NODE_RANK", 0)),
            "outcome": outcome,
            "store_exists": os.path.exists(args.db),
            "files": sorted(os.listdir(os.path.dirname(args.db))),
            "transport": logger.transport,
            "store_digest": _digest(args.db),
        }
        if rank == 0 and os.path.exists(args.db):
            base = os.path.basename(args.db)
            for suffix in ("", "-wal", "-shm"):  # a SQLite store in WAL mode is up to three files
                if os.path.exists(args.db + suffix):
                    shutil.copy(args.db + suffix, os.path.join(args.out, f"host0-{base}{suffix}"))
        for name in report["files"]:  # spill files live on the rank's own disk: keep them
            if name.endswith(".mrspill"):
                shutil.copy(os.path.join(os.path.dirname(args.db), name), os.path.join(args.out, name))
        with open(os.path.join(args.out, f"rank{rank}.json"), "w") as fh:
            json.dump(report, fh)


if __name__ == "__main__":
    main()
