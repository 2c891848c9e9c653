"""What each rank says about itself for the ``ranks`` table (local and node rank, host, pid, the
GPU it drives, its data-parallel index), and how a rank that does not write the store hands those
facts to rank 0 over the run's channel.

The GPU is read only where the process has started CUDA already (the strategy set its device):
asking torch for the current device would start CUDA itself, in a process that may fork later.
`gpu_facts` and `data_parallel_index` take what torch reports (``torch.cuda``, a device mesh), so
a test can hand them a simulated device.

A gather sender publishes its facts at set-up (`publish_facts`); rank 0 fetches them at the end
(`fetch_facts`) and records them with each rank's end (store/status.py: record_rank_end). Every wait is bounded:
a rank that never published is recorded without its facts.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import sys
import time
from collections.abc import Iterable
from typing import Any

from multirank_logger.channel.row_channel import RowChannel
from multirank_logger.errors import ChannelError

__all__ = ["FACTS_WAIT_S", "RANK_FACT_KEYS", "data_parallel_index", "fetch_facts", "gpu_facts", "given_mesh", "mesh_coordinates", "publish_facts",
           "rank_facts", "use_mesh"]

log = logging.getLogger(__name__)

#: the longest rank 0 waits, for all ranks together, for facts the others did not publish
FACTS_WAIT_S = 2.0
_FACTS_KEY = "facts/{rank}"
#: the `ranks` columns a rank's facts may set (what rank 0 takes from what another rank published)
RANK_FACT_KEYS = ("local_rank", "node_rank", "host", "pid", "gpu_index", "gpu_name", "gpu_uuid", "dp_rank", "slurm_node", "mesh")
#: the names a device mesh's data-parallel dimensions go by (Lightning's ModelParallelStrategy,
#: torchtitan's HSDP: replicate x shard, FSDP)
DP_DIM_NAMES = ("data_parallel", "dp", "dp_replicate", "dp_shard", "replicate", "shard", "fsdp", "ddp")
#: the device mesh this process said it trains on (`use_mesh`: ``init(mesh=...)``, a strategy's ``device_mesh``)
_GIVEN_MESH: list[Any] = []
_PLAIN_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


def rank_facts(rank: int | None = None, mesh: Any = None) -> dict[str, Any]:
    """This process's facts for the `ranks` table; `rank`: its global rank (else ``RANK``'s),
    `mesh`: the strategy's device mesh where the caller has it (else the mesh torch has entered)."""
    torch = sys.modules.get("torch")  # every training process has it; the CLI's never needs it here
    rank = _env_int("RANK", 0) if rank is None else rank
    if mesh is None:
        mesh = _GIVEN_MESH[-1] if _GIVEN_MESH else _current_mesh(torch)
    return {
        "local_rank": _env_int("LOCAL_RANK", 0),
        "node_rank": _env_int("NODE_RANK", _env_int("GROUP_RANK", 0)),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        **gpu_facts(getattr(torch, "cuda", None)),
        "dp_rank": data_parallel_index(mesh, rank),
        "slurm_node": os.environ.get("SLURMD_NODENAME") or None,  # the name Slurm's --exclude takes
        "mesh": mesh_coordinates(mesh),
    }


def use_mesh(mesh: Any) -> None:
    """Record `mesh` (a ``torch.distributed.device_mesh.DeviceMesh``) as this process's device mesh:
    its coordinates go in the rank's ``ranks`` row (torch keeps no registry of the meshes made)."""
    _GIVEN_MESH[:] = [] if mesh is None else [mesh]


def given_mesh() -> Any:
    """The device mesh this process was told (`use_mesh`), or None."""
    return _GIVEN_MESH[-1] if _GIVEN_MESH else None


def mesh_coordinates(mesh: Any) -> str | None:
    """This rank's coordinates in `mesh` as JSON text, ``{"dp": [1, 2], "tp": [0, 2]}``: each
    dimension's name (``dim0``... where unnamed) with the coordinate along it and its size,
    outermost first; None without a mesh, or one this rank is not in."""
    if mesh is None:
        return None
    try:
        coords = mesh.get_coordinate()
        if coords is None:
            return None
        shape = tuple(int(n) for n in mesh.shape)
        names = tuple(getattr(mesh, "mesh_dim_names", None) or (f"dim{i}" for i in range(len(shape))))
        text = json.dumps({str(n): [int(c), s] for n, c, s in zip(names, coords, shape)})
    except Exception as exc:  # an object that is not the mesh we know: no coordinates
        log.debug("multirank_logger: no mesh coordinates: %s", exc)
        return None
    return text if len(text) <= 1024 else None


def gpu_facts(cuda: Any) -> dict[str, Any]:
    """``gpu_index``, ``gpu_name`` and ``gpu_uuid`` of the device this process drives, from
    `cuda` (``torch.cuda``, or an object answering as it does); None each where CUDA is absent or
    not started in this process, and the UUID None where this torch's device properties lack it.
    The UUID is written as nvidia-smi and the driver's XID messages write it: ``GPU-<uuid>``."""
    none: dict[str, Any] = {"gpu_index": None, "gpu_name": None, "gpu_uuid": None}
    try:
        if cuda is None or not cuda.is_available() or not cuda.is_initialized():
            return none
        index = int(cuda.current_device())
        props = cuda.get_device_properties(index)
        name = getattr(props, "name", None) or cuda.get_device_name(index)
        uuid = getattr(props, "uuid", None)
    except Exception as exc:  # a broken driver must not stop the run: the place is a nicety
        log.debug("multirank_logger: no GPU facts: %s", exc)
        return none
    text = None if uuid is None else str(uuid)
    if text is not None and _PLAIN_UUID.match(text):
        text = f"GPU-{text}"
    return {"gpu_index": index, "gpu_name": None if name is None else str(name)[:255], "gpu_uuid": text}


def data_parallel_index(mesh: Any, rank: int) -> int:
    """The rank's index among the data-parallel replicas: on a device mesh, its coordinates along
    the mesh's data-parallel dimensions (`DP_DIM_NAMES`, outermost first, as one index); on a mesh
    of one unnamed dimension, its place in it; without a mesh (plain DDP), the global rank."""
    if mesh is None:
        return rank
    try:
        names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
        shape = tuple(int(n) for n in mesh.shape) if hasattr(mesh, "shape") else tuple(mesh.mesh.shape)
        if not names:
            return int(mesh.get_local_rank()) if len(shape) == 1 else rank
        dims = [i for i, name in enumerate(names) if name in DP_DIM_NAMES]
        if not dims:
            return 0  # no data-parallel dimension: one replica
        index = 0
        for i in dims:
            index = index * shape[i] + int(mesh.get_local_rank(names[i]))
        return index
    except Exception as exc:  # an object that is not the mesh we know: the plain answer
        log.debug("multirank_logger: no data-parallel index from the mesh: %s", exc)
        return rank


def _current_mesh(torch: Any) -> Any:
    """The device mesh torch has entered (``with mesh:``), else None."""
    if torch is None:
        return None
    try:
        from torch.distributed.device_mesh import _mesh_resources

        return _mesh_resources.get_current_mesh() if _mesh_resources.mesh_stack else None
    except Exception:  # no distributed build, or a torch without the private registry
        return None


def publish_facts(channel: RowChannel) -> None:
    """A rank that does not write the store (gather): leave its facts for rank 0. Best effort."""
    try:
        channel.publish(_FACTS_KEY.format(rank=channel.rank), json.dumps(rank_facts(channel.rank)).encode())
    except ChannelError as exc:
        log.warning("multirank_logger: rank %d could not publish its host and pid: %s", channel.rank, exc)


def fetch_facts(channel: RowChannel, ranks: Iterable[int], bound: float = FACTS_WAIT_S) -> dict[int, dict[str, Any]]:
    """Rank 0: the facts `ranks` published, waiting at most `bound` seconds for all of them."""
    deadline = time.monotonic() + bound
    out: dict[int, dict[str, Any]] = {}
    for rank in ranks:
        try:
            raw = channel.fetch(_FACTS_KEY.format(rank=rank), max(0.01, deadline - time.monotonic()))
            facts = json.loads(raw)
        except (ChannelError, ValueError):
            continue  # died before set-up ended, or the channel is gone: status only
        if isinstance(facts, dict):
            out[rank] = {k: facts[k] for k in RANK_FACT_KEYS if k in facts}
    return out


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return default
