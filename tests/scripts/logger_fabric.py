"""A 2-rank Fabric run (strategy="ddp", Lightning's launcher re-runs this script for rank 1).

Each rank logs ``rank_value`` = 1000 * rank + step with `fabric.log_dict`, trains a tiny
Linear model for a few steps, and finalizes the logger itself (Fabric does not). Each rank reads
the version before ``fabric.launch()`` (rank 1 learns it from the environment the launcher gave
it) and says which run-identity variables its environment holds once launched.

Usage: python tests/scripts/logger_fabric.py DB STEPS
"""

from __future__ import annotations

import os
import sys

import torch
from lightning.fabric import Fabric

from multirank_logger import MultiRankLogger


def main(db: str, steps: int) -> None:
    logger = MultiRankLogger(db=db, name="fabric", flush_interval=0.1)
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp", loggers=[logger])
    print(f"rank {os.environ.get('LOCAL_RANK', '0')} version before launch {logger.version}", flush=True)
    fabric.launch()
    held = sorted(name for name in os.environ if name.startswith("MULTIRANK_LOGGER_RUN_"))
    print(f"rank {fabric.global_rank} environment holds {held}", flush=True)
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
