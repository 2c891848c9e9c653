"""A plain torch.distributed script logging with ``multirank_logger.init`` (no Lightning Trainer):
launched by tests/runs/test_plain_api.py as users launch one: ``python -m torch.distributed.run
--nproc-per-node N``; ``--spawn N`` (the script starts its ranks with ``torch.multiprocessing.spawn``);
``--slurm`` (one process per task, as ``srun`` starts them: the group's rank and size from
``SLURM_PROCID`` and ``SLURM_NTASKS``, ``MASTER_ADDR``/``MASTER_PORT`` set by the launcher).

A tiny DDP loop on CPU over gloo: ``Linear(4, 1)``, random tensors drawn per rank, each rank's
own loss logged at each step. Options plant what the run must show: a NaN logged by one rank
from a step on (the training itself stays finite), a rank that raises at a step. Each rank
writes what it knows (its place, the run's id, version and transport) to ``--report``.rank.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import multirank_logger


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--name", default="plain")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--nan-rank", type=int, default=-1)
    parser.add_argument("--nan-from", type=int, default=-1)
    parser.add_argument("--raise-rank", type=int, default=-1)
    parser.add_argument("--raise-at", type=int, default=-1)
    parser.add_argument("--no-with", action="store_true", help="no `with` block and no finish(): the exit ends the run")
    parser.add_argument("--report", required=True)
    parser.add_argument("--spawn", type=int, default=0, help="start this many ranks with torch.multiprocessing.spawn")
    parser.add_argument("--slurm", action="store_true", help="the group's rank and size from SLURM_PROCID, SLURM_NTASKS")
    args = parser.parse_args()
    if args.spawn:
        torch.multiprocessing.spawn(rank_main, args=(args,), nprocs=args.spawn)
    else:
        rank_main(None, args)


def rank_main(spawned_rank: int | None, args: argparse.Namespace) -> None:
    if spawned_rank is not None:
        dist.init_process_group("gloo", rank=spawned_rank, world_size=args.spawn)
    elif args.slurm:
        dist.init_process_group("gloo", rank=int(os.environ["SLURM_PROCID"]), world_size=int(os.environ["SLURM_NTASKS"]))
    else:
        dist.init_process_group("gloo")  # torchrun's variables
    rank = dist.get_rank()
    run = multirank_logger.init(db=args.db, name=args.name, config={"lr": 0.1, "steps": args.steps}, flush_interval=0.5)
    facts = {"rank": run.rank, "world_size": run.world_size, "local_rank": run.local_rank, "node_rank": run.node_rank,
             "run_id": run.id, "version": run.version, "transport": run.transport}
    Path(f"{args.report}.{rank}.json").write_text(json.dumps(facts))
    if args.no_with:
        train(run, rank, args)  # the exit finishes the run (failed after an uncaught exception)
    else:
        with run:
            train(run, rank, args)


def train(run: multirank_logger.Run, rank: int, args: argparse.Namespace) -> None:
    torch.manual_seed(0)  # one model on every rank; each rank's own data
    model = DistributedDataParallel(nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(1000 + rank)
    for step in range(args.steps):
        x = torch.randn(16, 4, generator=data)
        y = x.sum(dim=1, keepdim=True) * (1 + rank)  # each rank's own target: its own loss
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()  # the allreduce of every rank's gradients
        optimizer.step()
        if rank == args.raise_rank and step == args.raise_at:
            raise RuntimeError(f"rank {rank} fails at step {step}")
        logged = math.nan if rank == args.nan_rank and step >= args.nan_from else loss.item()
        run.log({"train_loss": logged, "rank_value": float(1000 * rank + step)}, step=step)


if __name__ == "__main__":
    main()
