"""A 2-rank Fabric run (strategy="ddp", Lightning's launcher re-runs this script for rank 1).

Each rank logs ``rank_value`` = 1000 * rank + step with `fabric.log_dict`, trains a tiny
Linear model for a few steps, and finalizes the logger itself (Fabric does not).

Usage: python tests/logger_fabric.py DB STEPS
"""

from __future__ import annotations

import sys

import torch
from lightning.fabric import Fabric

from multirank_logger import MultiRankLogger


def main(db: str, steps: int) -> None:
    logger = MultiRankLogger(db=db, name="fabric", flush_interval=0.1)
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp", loggers=[logger])
    fabric.launch()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = fabric.setup(model, optimizer)
    g = torch.Generator().manual_seed(fabric.global_rank)
    for step in range(steps):
        x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), y)
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        fabric.log_dict({"rank_value": float(1000 * fabric.global_rank + step), "loss": loss.item()}, step=step)
    fabric.barrier()
    logger.finalize("success")
    print(f"rank {fabric.global_rank} version {logger.version} run {logger.run_id}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
