"""all_gather on CUDA tensors, over gloo and NCCL: run on a GPU machine by hand.

``python benchmarks/cuda_gather_check.py``: two spawned ranks on the one GPU (cuda:0),
first over gloo with CUDA tensors, then over NCCL with CUDA and with CPU tensors (which
travel through the GPU). Each checks uneven sizes, values, the own entry being the input,
and the gradient. NCCL refuses two ranks on one GPU in some versions: that is printed, not
hidden. CI has no GPU; tests/runs/test_tensor_gather.py covers gloo on CPU.
"""

from __future__ import annotations

import datetime
import os
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from multirank_logger.ddp import all_gather  # noqa: E402


def _check(rank: int, world: int, device: str) -> str:
    sizes = [0, 3][:world] if device == "cuda" else [2, 5][:world]
    x = (torch.arange(sizes[rank] * 2, dtype=torch.float32, device=device).reshape(-1, 2) + 100 * rank).requires_grad_()
    out = all_gather(x)
    torch.cat(out).sum().backward()
    ok = (
        [list(t.shape) for t in out] == [[n, 2] for n in sizes]
        and all(t.device.type == device for t in out)
        and all(bool((t.detach().cpu() >= 100 * r).all()) for r, t in enumerate(out))
        and out[rank] is x
        and x.grad is not None
        and bool((x.grad == 1).all())
        and not any(t.requires_grad for r, t in enumerate(out) if r != rank)
    )
    scalar = all_gather(torch.tensor(float(rank), device=device))
    ok = ok and [t.item() for t in scalar] == [float(r) for r in range(world)]
    return "ok" if ok else f"WRONG: {[t.tolist() for t in out]}"


def _rank(rank: int, world: int, backend: str, port: int, results: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(0)
    try:
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
        for device in ("cuda", "cpu"):
            results[f"{backend} {device} tensors, rank {rank}"] = _check(rank, world, device)
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - reported, not raised: the other backend still runs
        results[f"{backend}, rank {rank}"] = "FAILED: " + traceback.format_exc(limit=3).strip().splitlines()[-1]


def main() -> None:
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, NCCL {torch.cuda.nccl.version()}")
    with mp.Manager() as manager:
        for i, backend in enumerate(("gloo", "nccl")):
            results = manager.dict()
            mp.spawn(_rank, args=(2, backend, 29400 + i, results), nprocs=2, join=True)
            for key in sorted(results):
                print(f"{key}: {results[key]}")


if __name__ == "__main__":
    main()
