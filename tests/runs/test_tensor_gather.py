"""multirank_logger.ddp.all_gather over real gloo process groups of 2 and 3 ranks (spawned processes).

Each rank runs every case and writes what it saw to a JSON file; the test reads them all.
"""

from __future__ import annotations

import datetime
import json
import os
import traceback
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from multirank_logger.ddp import all_gather
from multirank_logger.errors import GatherMismatch
from tests.helpers.launches import spawn_ranks

pytestmark = pytest.mark.timeout(180)
_JOIN_S = 120

#: first-dimension sizes by rank, one call each: 0, 1 and several rows, in every rank order
SIZE_CASES = [[0, 1, 4], [4, 0, 1], [1, 4, 0], [0, 0, 3]]


def _rows(rank: int, n: int) -> torch.Tensor:
    """What rank `rank` passes with `n` rows: values that say which rank and row they are."""
    return (torch.arange(n * 2, dtype=torch.float32).reshape(n, 2) + 100 * rank).requires_grad_()


def _case_sizes(rank: int, world: int) -> list[dict[str, Any]]:
    seen = []
    for sizes in SIZE_CASES:
        sizes = sizes[:world]
        x = _rows(rank, sizes[rank])
        out = all_gather(x)
        torch.cat(out).sum().backward()
        seen.append(
            {
                "sizes": sizes,
                "shapes": [list(t.shape) for t in out],
                "values_ok": all(torch.equal(t, _rows(r, sizes[r]).detach()) for r, t in enumerate(out)),
                "own_is_input": out[rank] is x,
                "others_have_graph": any(t.requires_grad for r, t in enumerate(out) if r != rank),
                "grad": x.grad.tolist(),
            }
        )
    return seen


def _case_other_dims(rank: int, world: int) -> dict[str, Any]:
    """Sizes differ in the second and third dimensions too."""
    x = torch.full((rank + 1, 2 * rank + 1, 3 - rank), float(rank), requires_grad=True)
    out = all_gather(x)
    (sum(t.sum() * (r + 1) for r, t in enumerate(out))).backward()  # weights tell entries apart
    return {
        "shapes": [list(t.shape) for t in out],
        "values_ok": all(bool((t == r).all()) for r, t in enumerate(out)),
        "grad_is_own_weight": bool((x.grad == rank + 1).all()),
    }


def _case_scalar(rank: int, world: int) -> dict[str, Any]:
    leaf = torch.tensor(float(rank), requires_grad=True)
    x = leaf * 3
    out = all_gather(x)
    torch.stack(out).sum().backward()
    return {"values": [t.item() for t in out], "shapes": [list(t.shape) for t in out], "grad": leaf.grad.item()}


def _case_dtypes(rank: int, world: int) -> dict[str, Any]:
    ints = all_gather(torch.arange(rank + 1, dtype=torch.int64) + 10 * rank)
    bools = all_gather(torch.tensor([rank % 2 == 0] * (rank + 2)))
    return {
        "ints": [t.tolist() for t in ints],
        "int_dtypes": sorted({str(t.dtype) for t in ints}),
        "bools": [t.tolist() for t in bools],
        "bool_dtypes": sorted({str(t.dtype) for t in bools}),
    }


def _case_errors(rank: int, world: int) -> dict[str, str]:
    errors = {}
    for name, tensor in (
        ("dtype", torch.zeros(2, dtype=torch.float32 if rank == 0 else torch.float64)),
        ("ndim", torch.zeros(2) if rank == 0 else torch.zeros(2, 1)),
    ):
        try:
            all_gather(tensor)
            errors[name] = "no error"
        except GatherMismatch as exc:
            errors[name] = str(exc)
    # the group is still usable afterwards: every rank raised at the same point
    errors["after"] = str([t.tolist() for t in all_gather(torch.tensor([rank]))])
    return errors


def _case_subgroup(rank: int, world: int) -> dict[str, Any] | None:
    """A group of the last two ranks: entries come in group-rank order, own entry is the input."""
    members = list(range(world - 2, world))
    group = dist.new_group(members)  # every rank must call new_group
    if rank not in members:
        return None
    x = torch.tensor([float(rank)] * (rank + 1), requires_grad=True)
    out = all_gather(x, group=group)
    return {"values": [t.tolist() for t in out], "own_index": [i for i, t in enumerate(out) if t is x]}


def _rank_main(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        seen = {
            "sizes": _case_sizes(rank, world),
            "other_dims": _case_other_dims(rank, world),
            "scalar": _case_scalar(rank, world),
            "dtypes": _case_dtypes(rank, world),
            "errors": _case_errors(rank, world),
            "subgroup": _case_subgroup(rank, world),
        }
    except Exception:  # noqa: BLE001 - reported through the file, for the test's message
        seen = {"crash": traceback.format_exc()}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(seen))
    dist.destroy_process_group()


def _run(world: int, tmp_path: Path) -> list[dict[str, Any]]:
    assert spawn_ranks(_rank_main, world, str(tmp_path), join_s=_JOIN_S) == [0] * world
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    for r, s in enumerate(seen):
        assert "crash" not in s, f"rank {r}:\n{s['crash']}"
    return seen


@pytest.fixture(scope="module", params=[2, 3], ids=lambda w: f"{w}ranks")
def gathered(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, list]:
    world = request.param
    return world, _run(world, tmp_path_factory.mktemp(f"gather{world}"))


def test_uneven_first_dimension_sizes_zero_one_several(gathered: tuple[int, list]) -> None:
    """Every rank gets every rank's rows with that rank's own size (0, 1, 4), values intact."""
    _world, seen = gathered
    for rank, s in enumerate(seen):
        for case in s["sizes"]:
            assert case["shapes"] == [[n, 2] for n in case["sizes"]], (rank, case)
            assert case["values_ok"], (rank, case)


def test_backward_reaches_own_slice_only(gathered: tuple[int, list]) -> None:
    """The own entry is the input itself: a sum of everything gives it ones; others carry no graph."""
    _world, seen = gathered
    for rank, s in enumerate(seen):
        for case in s["sizes"]:
            assert case["own_is_input"] and not case["others_have_graph"], (rank, case)
            assert case["grad"] == [[1.0, 1.0]] * case["sizes"][rank], (rank, case)


def test_other_dimensions_may_differ(gathered: tuple[int, list]) -> None:
    """Shapes (r+1, 2r+1, 3-r): padded and trimmed in every dimension; the gradient is the own entry's weight."""
    world, seen = gathered
    for rank, s in enumerate(seen):
        case = s["other_dims"]
        assert case["shapes"] == [[r + 1, 2 * r + 1, 3 - r] for r in range(world)]
        assert case["values_ok"] and case["grad_is_own_weight"], (rank, case)


def test_scalars(gathered: tuple[int, list]) -> None:
    """0-dim tensors gather as 0-dim tensors; the gradient flows through the own one (d(3x)/dx = 3)."""
    world, seen = gathered
    for s in seen:
        assert s["scalar"] == {"values": [3.0 * r for r in range(world)], "shapes": [[]] * world, "grad": 3.0}


def test_integer_and_bool_tensors_keep_their_dtype(gathered: tuple[int, list]) -> None:
    world, seen = gathered
    for s in seen:
        d = s["dtypes"]
        assert d["ints"] == [[10 * r + i for i in range(r + 1)] for r in range(world)]
        assert d["bools"] == [[r % 2 == 0] * (r + 2) for r in range(world)]
        assert d["int_dtypes"] == ["torch.int64"] and d["bool_dtypes"] == ["torch.bool"]


def test_dtype_or_ndim_mismatch_is_a_clear_error_on_every_rank(gathered: tuple[int, list]) -> None:
    """Every rank raises the same GatherMismatch naming each rank's dtype / ndim, and the group lives on."""
    world, seen = gathered
    others = ", ".join(f"rank {r}: float64" for r in range(1, world))
    for s in seen:
        e = s["errors"]
        assert e["dtype"] == (
            f"all_gather: the ranks passed different dtypes (rank 0: float32, {others}). "
            "Cast the tensor to one dtype on every rank."
        )
        assert e["ndim"].startswith(
            "all_gather: the ranks passed tensors with different numbers of dimensions (rank 0: 1, rank 1: 2"
        )
        assert e["after"] == str([[r] for r in range(world)])


def test_subgroup_in_group_rank_order(gathered: tuple[int, list]) -> None:
    world, seen = gathered
    members = list(range(world - 2, world))
    for rank, s in enumerate(seen):
        if rank not in members:
            assert s["subgroup"] is None
            continue
        assert s["subgroup"]["values"] == [[float(m)] * (m + 1) for m in members]
        assert s["subgroup"]["own_index"] == [members.index(rank)]


def test_without_process_group_returns_the_input() -> None:
    """One process, no group: the list holds the input itself."""
    x = torch.ones(3, requires_grad=True)
    assert all_gather(x)[0] is x and len(all_gather(x)) == 1


def test_the_old_top_level_name_still_imports_with_a_deprecation_warning() -> None:
    """`from multirank_logger import all_gather` keeps working, and says where the name moved."""
    import multirank_logger

    with pytest.warns(DeprecationWarning, match="multirank_logger.ddp"):
        old = multirank_logger.all_gather
    assert old is all_gather
