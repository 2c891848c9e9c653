"""An Accelerate script logging every process with `MultiRankTracker`: launched by
tests/runs/test_accelerate_tracker.py with ``accelerate launch --cpu --num_processes 2``.

A tiny model on CPU over gloo, random tensors drawn per process (each its own loss). Accelerate
calls trackers on the main process only (``accelerator.log``), so every process logs through the
tracker it made: ``tracker.log``. Options plant what the run must show: one rank's batches NaN
from a step on (the NaN then spreads through the gradients' all-reduce), a rank that raises.
"""

from __future__ import annotations

import argparse
import gc
import time

import torch
from accelerate import Accelerator
from torch import nn

from multirank_logger import MultiRankTracker


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--nan-rank", type=int, default=-1)
    parser.add_argument("--nan-from", type=int, default=-1)
    parser.add_argument("--raise-rank", type=int, default=-1)
    parser.add_argument("--raise-at", type=int, default=-1)
    parser.add_argument("--await-alert-at", type=int, default=-1, help="rank 0 holds this step until the watch alerted")
    args = parser.parse_args()

    tracker = MultiRankTracker(db=args.db, name="accel", flush_interval=0.5)
    accelerator = Accelerator(cpu=True, log_with=tracker)
    accelerator.init_trackers("accel", config={"lr": 0.1, "steps": args.steps})
    rank = accelerator.process_index
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    data = torch.Generator().manual_seed(1000 + rank)
    for step in range(args.steps):
        x = torch.randn(16, 4, generator=data)
        if rank == args.nan_rank and step >= args.nan_from:
            x[0, 0] = float("nan")  # a bad shard: this rank's batches carry NaN
        y = x.sum(dim=1, keepdim=True) * (1 + rank)  # each process's own target: its own loss
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()
        if rank == args.raise_rank and step == args.raise_at:
            raise RuntimeError(f"rank {rank} fails at step {step}")
        tracker.log({"train_loss": loss.item(), "rank_value": float(1000 * rank + step)}, step=step)
        accelerator.log({"main_only": float(step)}, step=step)  # Accelerate's path: rank 0 alone
        if rank == 0 and step == args.await_alert_at:
            await_alert(tracker)
    # DDP's reducer holds the process group. Freed while the group is still registered, the group's
    # last reference goes in destroy_process_group, whose destructor lets go of the GIL while gloo's
    # threads end. Freed after it (at main's return), the reducer's destructor holds the GIL while it
    # joins those threads, one of which may be waiting for the GIL to free the last all-reduce's
    # work: a hang at exit (torch 2.13, seen where rank 1 waited long in that all-reduce)
    accelerator.free_memory()
    model = optimizer = loss = None  # noqa: F841 - the last references (the loss's graph holds DDP's)
    gc.collect()
    accelerator.end_training()


def await_alert(tracker: MultiRankTracker, limit_s: float = 120.0) -> None:
    """Hold training (the other rank waits in the next all-reduce) until rank 0's watch alerted:
    the alert is raised during training, not at the run's end."""
    deadline = time.monotonic() + limit_s
    while not tracker.run.alerts:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no alert from the watch within {limit_s:.0f} s")
        time.sleep(0.05)


if __name__ == "__main__":
    main()
