"""`all_gather` for tensors of different shapes on each rank, keeping the caller's autograd graph.

`torch.distributed.all_gather` needs the same shape on every rank and hands back tensors
with no graph, so a metric gathered for use in a loss loses its gradient (TorchMetrics'
`_simple_gather_all_tensors`). Here the ranks first exchange their shapes (one small
collective), then every tensor is padded to the largest size in each dimension, gathered
(one collective), and trimmed back; the calling rank's own entry is its input tensor itself,
so gradients flow to it, and to nothing else (other ranks' tensors have no graph here).

Example::

    from multirank_logger.ddp import all_gather

    preds = model(x)                      # rank 0: 3 rows, rank 1: 5 rows
    everyone = all_gather(preds)          # [tensor 3 x C, tensor 5 x C] on every rank
    loss = torch.cat(everyone).mean()     # the gradient reaches this rank's preds
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from multirank_logger.errors import GatherMismatch

__all__ = ["all_gather"]

#: dimensions a header carries; more is an error on every rank (after the header exchange,
#: so that no rank raises alone while the others wait in a collective)
MAX_NDIM = 32
#: every dtype torch knows, in one order on every rank (same torch version): a dtype's index is its wire code
_DTYPES: list[torch.dtype] = []
for _name in sorted(dir(torch)):
    _value = getattr(torch, _name)
    if isinstance(_value, torch.dtype) and _value not in _DTYPES:
        _DTYPES.append(_value)
# gloo has no bool reduction/gather kernels everywhere: bools travel as uint8
_WIRE_DTYPE = {torch.bool: torch.uint8}


def all_gather(tensor: torch.Tensor, group: Any = None) -> list[torch.Tensor]:
    """Gather one tensor from every rank of `group`, each keeping its own shape.

    Every rank must call this (it runs two collectives). Sizes may differ between ranks in
    any dimension, down to 0; the number of dimensions and the dtype must be the same.

    Args:
        tensor: this rank's tensor, on CPU or CUDA, any shape (a scalar too).
        group: the process group; ``None`` is the default (world) group.

    Returns:
        One tensor per rank of the group, in group-rank order, each with the shape that rank
        passed, on `tensor`'s device. The entry of the calling rank is `tensor` itself (its
        autograd graph kept); the others are new tensors without a graph. Without an
        initialized process group (or with one rank), ``[tensor]``.

    Raises:
        GatherMismatch: on every rank, when the ranks' dtypes or numbers of dimensions differ,
            or a tensor has more than `MAX_NDIM` dimensions.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return [tensor]
    world = dist.get_world_size(group)
    if world == 1:
        return [tensor]
    me = dist.get_rank(group)
    device = _comm_device(tensor, group)

    header = torch.zeros(2 + MAX_NDIM, dtype=torch.int64, device=device)
    header[0], header[1] = _DTYPES.index(tensor.dtype), tensor.dim()
    header[2 : 2 + min(tensor.dim(), MAX_NDIM)] = torch.tensor(tensor.shape[:MAX_NDIM], dtype=torch.int64)
    headers = [torch.empty_like(header) for _ in range(world)]
    dist.all_gather(headers, header, group=group)
    shapes = _check_headers([h.tolist() for h in headers])

    wire_dtype = _WIRE_DTYPE.get(tensor.dtype, tensor.dtype)
    if all(_numel(s) == 0 for s in shapes):  # nothing to send: every rank knows it from the headers
        gathered = [torch.empty(s, dtype=tensor.dtype, device=tensor.device) for s in shapes]
    else:
        big = [max(sizes) for sizes in zip(*shapes)] if tensor.dim() else []
        padded = torch.zeros(big, dtype=wire_dtype, device=device)
        padded[_region(tensor.shape)] = tensor.detach().to(device=device, dtype=wire_dtype)
        received = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(received, padded, group=group)
        gathered = [r[_region(s)].to(device=tensor.device, dtype=tensor.dtype) for r, s in zip(received, shapes)]
    gathered[me] = tensor  # the input itself: its graph is what a loss needs
    return gathered


def _comm_device(tensor: torch.Tensor, group: Any) -> torch.device:
    """Where the collectives run: NCCL only moves CUDA tensors, so a CPU tensor travels through
    the current CUDA device there; every other case uses the tensor's own device."""
    if tensor.device.type != "cuda" and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return tensor.device


def _check_headers(headers: list[list[int]]) -> list[list[int]]:
    """Each rank's shape, once every rank's dtype and number of dimensions agree (else raise,
    on every rank alike: each one reads the same headers)."""
    dtypes = [_DTYPES[h[0]] for h in headers]
    ndims = [h[1] for h in headers]
    if len(set(dtypes)) > 1:
        listed = ", ".join(f"rank {r}: {str(d).removeprefix('torch.')}" for r, d in enumerate(dtypes))
        raise GatherMismatch(
            f"all_gather: the ranks passed different dtypes ({listed}). Cast the tensor to one dtype on every rank."
        )
    if len(set(ndims)) > 1:
        listed = ", ".join(f"rank {r}: {n}" for r, n in enumerate(ndims))
        raise GatherMismatch(
            f"all_gather: the ranks passed tensors with different numbers of dimensions ({listed}); sizes may "
            "differ, the number of dimensions may not. Reshape so every rank passes the same number."
        )
    if ndims[0] > MAX_NDIM:
        raise GatherMismatch(f"all_gather: tensors of {ndims[0]} dimensions; at most {MAX_NDIM} are supported.")
    return [h[2 : 2 + h[1]] for h in headers]


def _region(shape: Any) -> tuple[slice, ...]:
    return tuple(slice(0, s) for s in shape)


def _numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
