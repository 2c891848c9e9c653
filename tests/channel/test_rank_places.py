"""Each rank's place (schema 0011, channel/rank_facts.py): the GPU it drives, read from what
torch reports (no GPU here: a simulated ``torch.cuda`` and device properties), its data-parallel
index from a device mesh (a simulated one) or its rank, and a real CPU run storing NULL GPUs."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from multirank_logger import MultiRankLogger
from multirank_logger.channel.rank_facts import data_parallel_index, fetch_facts, gpu_facts, publish_facts, rank_facts
from tests.helpers.logger_helpers import query

UUID = "5a7e1c2d-0b3f-4e51-9d2a-6c8b7f0e1a23"


class FakeCuda:
    """What ``torch.cuda`` answers on a node of H200s, this process driving device 3."""

    def __init__(self, *, initialized: bool = True, uuid: Any = UUID, available: bool = True) -> None:
        self.initialized, self.available = initialized, available
        props: dict[str, Any] = {"name": "NVIDIA H200", "total_memory": 150_000_000_000}
        if uuid is not None:
            props["uuid"] = uuid
        self.props = SimpleNamespace(**props)

    def is_available(self) -> bool:
        return self.available

    def is_initialized(self) -> bool:
        return self.initialized

    def current_device(self) -> int:
        assert self.initialized, "asking for the device would start CUDA"
        return 3

    def get_device_properties(self, index: int) -> Any:
        assert index == 3
        return self.props

    def get_device_name(self, index: int) -> str:
        return "NVIDIA H200"


def test_a_gpu_rank_records_its_device_index_name_and_uuid() -> None:
    assert gpu_facts(FakeCuda()) == {"gpu_index": 3, "gpu_name": "NVIDIA H200", "gpu_uuid": f"GPU-{UUID}"}
    # a UUID torch already writes with its prefix (MIG) is kept as it is
    assert gpu_facts(FakeCuda(uuid=f"MIG-{UUID}"))["gpu_uuid"] == f"MIG-{UUID}"
    # a torch whose device properties have no uuid: the index and name, the UUID unknown
    assert gpu_facts(FakeCuda(uuid=None)) == {"gpu_index": 3, "gpu_name": "NVIDIA H200", "gpu_uuid": None}


def test_no_gpu_facts_without_cuda_or_before_cuda_started() -> None:
    none = {"gpu_index": None, "gpu_name": None, "gpu_uuid": None}
    assert gpu_facts(None) == none
    assert gpu_facts(FakeCuda(available=False)) == none
    # CUDA present but not started in this process: asking would start it (a fork later breaks)
    assert gpu_facts(FakeCuda(initialized=False)) == none


class FakeMesh:
    """A DeviceMesh's surface: dimension names, shape, this rank's coordinate along each."""

    def __init__(self, names: tuple[str, ...] | None, shape: tuple[int, ...], coords: tuple[int, ...]) -> None:
        self.mesh_dim_names, self.shape, self.coords = names, shape, coords

    def get_local_rank(self, dim: str | None = None) -> int:
        if dim is None:
            assert len(self.coords) == 1
            return self.coords[0]
        assert self.mesh_dim_names is not None
        return self.coords[self.mesh_dim_names.index(dim)]


def test_the_data_parallel_index() -> None:
    assert data_parallel_index(None, 13) == 13  # plain DDP: the rank
    # Lightning's ModelParallelStrategy: a (data_parallel, tensor_parallel) mesh of 4 x 4; rank 13 sits at (3, 1)
    assert data_parallel_index(FakeMesh(("data_parallel", "tensor_parallel"), (4, 4), (3, 1)), 13) == 3
    # HSDP: replicate x shard together, outermost first, then tensor parallel
    assert data_parallel_index(FakeMesh(("dp_replicate", "dp_shard", "tp"), (2, 4, 2), (1, 2, 0)), 12) == 6
    assert data_parallel_index(FakeMesh(None, (8,), (5,)), 5) == 5  # one unnamed dimension
    assert data_parallel_index(FakeMesh(("tp",), (8,), (5,)), 5) == 0  # no data parallelism: one replica
    assert data_parallel_index(object(), 7) == 7  # not a mesh we know: the rank


def test_rank_facts_on_this_cpu_machine() -> None:
    facts = rank_facts(5)
    assert facts["gpu_index"] is None and facts["gpu_name"] is None and facts["gpu_uuid"] is None
    assert facts["dp_rank"] == 5 and facts["host"]


def test_a_cpu_run_stores_null_gpus_and_its_rank_as_dp_index(db_path: Path) -> None:
    logger = MultiRankLogger(db=str(db_path), flush_interval=3600)
    logger.log_metrics({"a": 1.0}, step=0)
    logger.finalize("success")
    rows = query(db_path, "SELECT rank, host, gpu_index, gpu_name, gpu_uuid, dp_rank FROM ranks")
    assert len(rows) == 1
    rank, host, *gpu, dp = rows[0]
    assert rank == 0 and host and gpu == [None, None, None] and dp == 0


class FakeChannel:
    """The run's channel as a dict: what a gather sender publishes, rank 0 fetches."""

    def __init__(self, rank: int, kept: dict[str, bytes]) -> None:
        self.rank, self.kept = rank, kept

    def publish(self, key: str, value: bytes) -> None:
        self.kept[key] = value

    def fetch(self, key: str, timeout: float) -> bytes:
        return self.kept[key]


def test_a_sender_hands_its_place_to_rank_0() -> None:
    """A gather sender's facts reach rank 0 with the GPU and data-parallel columns."""
    kept: dict[str, bytes] = {}
    publish_facts(FakeChannel(2, kept))  # type: ignore[arg-type]
    got = fetch_facts(FakeChannel(0, kept), [2], bound=0.1)  # type: ignore[arg-type]
    assert set(got[2]) == {"local_rank", "node_rank", "host", "pid", "gpu_index", "gpu_name", "gpu_uuid", "dp_rank",
                           "slurm_node", "mesh"}
    assert got[2]["dp_rank"] == 2 and got[2]["gpu_uuid"] is None
