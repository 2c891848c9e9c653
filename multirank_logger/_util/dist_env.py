"""What this process knows of its place in the launch: its global rank and the world size.

Read from torch.distributed once the process group is up, else from the launcher's variables.
Below every layer that needs it (the console, the logger, the identity exchange).
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

__all__ = ["LaunchPlace", "current_rank", "current_world_size", "dist_if_initialized", "env_int", "launch_place"]


def dist_if_initialized() -> Any:
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def current_rank() -> int:
    """This process's global rank when it is certain; -1 for "not 0, or not known yet".

    Before the process group is up only the launcher's variables tell. A process is rank 0
    only when they say so or say nothing: Lightning's own guess (``LOCAL_RANK`` first) takes
    the first process of every node for rank 0, which would allocate a run of its own on
    node 1's disk. `RANK` (torchrun, Lightning's children) is global; a node rank above 0,
    or a local/SLURM rank above 0 without `RANK`, is some rank other than 0.
    """
    dist = dist_if_initialized()
    if dist is not None:
        return dist.get_rank()
    if os.environ.get("RANK", "").strip():
        return env_int("RANK")
    for var in ("NODE_RANK", "GROUP_RANK", "SLURM_NODEID", "SLURM_PROCID", "LOCAL_RANK", "SLURM_LOCALID"):
        if env_int(var) != 0:  # above 0, or unreadable
            return -1
    return 0


def env_int(var: str) -> int:
    try:
        return int(os.environ.get(var, "0") or 0)
    except ValueError:
        return -1  # unreadable: not certain to be rank 0


def current_world_size() -> int:
    dist = dist_if_initialized()
    if dist is not None:
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


class LaunchPlace(NamedTuple):
    """Where this process stands in its launch, as a plain torch.distributed script reads it."""

    #: the global rank
    rank: int
    world_size: int
    #: the rank among this node's processes
    local_rank: int
    #: the node's rank among the launch's nodes
    node_rank: int


def launch_place() -> LaunchPlace:
    """This process's rank, world size, local and node rank: the process group's once it is up,
    else the launcher's variables (torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``GROUP_RANK``; Slurm's ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``,
    ``SLURM_NODEID``). Without a local rank in the environment (``mp.spawn``: one node) the local
    rank is the global one.

    Unlike `current_rank` this is no judgement of whether the process may act as rank 0: it says
    what the group or the launcher says, for the user's own code.
    """
    dist = dist_if_initialized()
    if dist is not None:
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank = _first_int(("RANK", "SLURM_PROCID"), 0)
        world = _first_int(("WORLD_SIZE", "SLURM_NTASKS"), 1)
    local_rank = _first_int(("LOCAL_RANK", "SLURM_LOCALID"), rank)
    node_rank = _first_int(("GROUP_RANK", "NODE_RANK", "SLURM_NODEID"), 0)
    return LaunchPlace(rank, world, local_rank, node_rank)


def _first_int(names: tuple[str, ...], default: int) -> int:
    """The first of the variables `names` set to a whole number, else `default`."""
    for name in names:
        text = os.environ.get(name, "").strip()
        if text:
            try:
                return int(text)
            except ValueError:
                continue
    return default
