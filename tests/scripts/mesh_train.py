"""A plain torch.distributed script on a 3 x 2 device mesh (``dp`` x ``tp``), launched by
tests/runs/test_mesh_places.py with ``python -m torch.distributed.run --nproc-per-node 6`` over gloo on CPU.

``init_device_mesh("cpu", (3, 2), mesh_dim_names=("dp", "tp"))``: ranks 0-1 are tp group 0 (dp 0),
ranks 2-3 tp group 1 (dp 1), ranks 4-5 tp group 2. Three groups, not two: the straggler rule
measures a rank against the ranks' median, and one tp group of a 2 x 2 mesh is half of the ranks
(a 2 x 2 run with ranks 2-3 slow: "Stragglers: none"). The mesh goes to ``multirank_logger.init(mesh=...)``; every step each
rank times its data wait and records it (``step_timing``), and the ranks of ``--slow-dp`` wait
``--slow-s`` longer for theirs from step ``--slow-from``; an all-reduce over the world ends each
step, as a training step's gradient sync does (the others wait on the slow group).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import multirank_logger


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--slow-dp", type=int, default=1)
    parser.add_argument("--slow-from", type=int, default=5)
    parser.add_argument("--slow-s", type=float, default=0.05)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (3, 2), mesh_dim_names=("dp", "tp"))
    rank = dist.get_rank()
    slow = mesh.get_local_rank("dp") == args.slow_dp
    with multirank_logger.init(db=args.db, name="mesh", flush_interval=0.5, mesh=mesh) as run:
        ended = time.perf_counter()
        for step in range(args.steps):
            if slow and step >= args.slow_from:
                time.sleep(args.slow_s)  # this group's loader is slow
            started = time.perf_counter()
            x = torch.ones(4) * rank
            dist.all_reduce(x, group=mesh.get_group("tp"))  # the tensor-parallel exchange
            forward = time.perf_counter() - started
            dist.all_reduce(x)  # the gradient sync: every rank waits for the slowest
            run.record("step_timing", step=step, data_s=started - ended, forward_s=forward,
                       rest_s=time.perf_counter() - started - forward, batch_size=4, time=time.time())
            run.log({"loss": 1.0 / (step + 1) + 0.01 * rank}, step=step)
            ended = time.perf_counter()


if __name__ == "__main__":
    main()
