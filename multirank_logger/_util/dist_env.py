"""What this process knows of its place in the launch: its global rank and the world size.

Read from torch.distributed once the process group is up, else from the launcher's variables.
Below every layer that needs it (the console, the logger, the identity exchange).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["current_rank", "current_world_size", "dist_if_initialized", "env_int"]


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
