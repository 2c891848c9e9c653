"""A rank's place in a device mesh (schema 0013's ``ranks.mesh``, judgement/places.mesh_clause).

One real run: tests/scripts/mesh_train.py, 6 ranks over gloo on CPU on a ``(3, 2)`` mesh (``dp`` x ``tp``)
built with ``torch.distributed.device_mesh.init_device_mesh`` and given to
``multirank_logger.init(mesh=...)``; tp group 1 (ranks 2-3) waits 50 ms more for its data from
step 5. Each rank's coordinates are stored; the report's straggler names "every rank of tp group
1"; the page's hover of a heatmap row shows the rank's coordinates. And the wording's rule over
every group of a 3-D mesh, without a run.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from multirank_logger.judgement.places import mesh_clause, place_clause, rank_places
from tests.helpers.launches import SCRIPTS, run_ranks_forked
from tests.helpers.logger_helpers import query, train_env

TRAIN = SCRIPTS / "mesh_train.py"
RANKS, SHAPE = 6, (3, 2)


@pytest.fixture(scope="module")
def mesh_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("mesh")
    args = ["--db", str(tmp / "runs.sqlite"),
            "--slow-from", "0"]  # (slow from the first step: a loaded host's hiccup before it moved one rank's first step)
    proc = run_ranks_forked(TRAIN, args, nproc=RANKS, cwd=tmp, env=train_env(), timeout=300)
    assert proc.returncode == 0, proc.stdout[-8000:]
    return tmp / "runs.sqlite"


def test_each_rank_stores_its_mesh_coordinates(mesh_run: Path) -> None:
    got = {r: json.loads(m) for r, m in query(mesh_run, "SELECT rank, mesh FROM ranks")}
    assert got == {r: {"dp": [r // 2, 3], "tp": [r % 2, 2]} for r in range(RANKS)}
    assert dict(query(mesh_run, "SELECT rank, dp_rank FROM ranks")) == {r: r // 2 for r in range(RANKS)}


def test_the_straggler_is_named_by_its_tp_group(mesh_run: Path) -> None:
    from multirank_logger import open_store
    from multirank_logger.report import find
    from multirank_logger.report.render import findings_text

    with open_store(mesh_run) as reader:
        found = find(reader)
    slow = [s for s in found.to_dict()["stragglers"] if s["phase"] == "data"]
    assert sorted(s["rank"] for s in slow) == [2, 3], found.to_dict()["stragglers"]
    assert {s["place"] for s in slow} == {f"all on {_host(mesh_run)} (2 of its 6 ranks), every rank of tp group 1"}, slow
    assert "every rank of tp group 1" in findings_text(found)


def test_the_pages_hover_shows_the_coordinates(mesh_run: Path) -> None:
    from multirank_logger import open_store
    from multirank_logger.ui import views

    with open_store(mesh_run) as reader:
        _, places = views._places(reader, 1)
    assert places == {str(r): f"dp {r // 2}, tp {r % 2}" for r in range(RANKS)}


def _host(db: Path) -> str:
    return str(query(db, "SELECT DISTINCT host FROM ranks")[0][0])


def test_every_group_of_a_mesh_is_named_and_no_part_of_one() -> None:
    """A (2, 3, 2) mesh (pp x dp x tp), ranks numbered row-major, spread over hosts of 4: every group
    along every dimension (the ranks differing only there) is "every rank of D group I", I its
    coordinates in the other dimensions row-major, each (D, I) once; any proper part of a group
    (two or more ranks) gets no group; a whole slice at one coordinate, "every rank at"."""
    shape, names = (2, 3, 2), ("pp", "dp", "tp")
    coords = list(itertools.product(*(range(n) for n in shape)))
    rows = [{"rank": r, "host": f"node{r // 4}", "mesh": json.dumps({d: [c[i], shape[i]] for i, d in enumerate(names)})}
            for r, c in enumerate(coords)]
    places = rank_places(rows)
    said = set()
    for i, d in enumerate(names):
        others = [j for j in range(len(names)) if j != i]
        for fixed in itertools.product(*(range(shape[j]) for j in others)):
            group = [r for r, c in enumerate(coords) if [c[j] for j in others] == list(fixed)]
            index = 0
            for j, at in zip(others, fixed):
                index = index * shape[j] + at
            assert mesh_clause(group, places) == f"every rank of {d} group {index}", (d, fixed, group)
            said.add((d, index))
            for part in itertools.combinations(group, len(group) - 1):
                if len(part) > 1:
                    assert "group" not in mesh_clause(list(part), places), part
    assert len(said) == sum(len(coords) // n for n in shape)  # each group named once, none twice
    assert mesh_clause([r for r, c in enumerate(coords) if c[0] == 1], places) == "every rank at pp 1"
    assert place_clause([7], places) == "; on node1, at pp 1, dp 0, tp 1 in the mesh"
    assert mesh_clause([0, 1], {0: {"host": "a"}, 1: places[1]}) == ""  # a rank without coordinates


LIGHTNING_TRAIN = SCRIPTS / "model_parallel_train.py"


@pytest.fixture(scope="module")
def model_parallel_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One 4-rank ModelParallelStrategy launch logging to a store per transport (a logger each):
    ``<transport>/runs.sqlite``. Two loggers is also a case of its own: the second (gather) found
    the mesh already recorded by the first's log_graph and its ranks were left without coordinates."""
    tmp = tmp_path_factory.mktemp("model_parallel")
    args = []
    for transport in ("direct", "gather"):
        (tmp / transport).mkdir()
        args += ["--db", str(tmp / transport / "runs.sqlite"), "--transport", transport]
    proc = run_ranks_forked(LIGHTNING_TRAIN, args, nproc=4, cwd=tmp, env=train_env(), timeout=300)
    assert proc.returncode == 0, proc.stdout[-8000:]
    return tmp


@pytest.mark.parametrize("transport", ["direct", "gather"])
def test_lightning_model_parallel_ranks_store_the_strategys_mesh(model_parallel_run: Path, transport: str) -> None:
    """Lightning's ModelParallelStrategy builds its mesh after the logger registered the ranks; the
    coordinates still reach every rank's row (a rank that writes its own: with its end; a gather
    sender: its facts published again, recorded by rank 0), and the data-parallel index is the
    mesh's."""
    db = model_parallel_run / transport / "runs.sqlite"
    assert query(db, "SELECT transport FROM runs") == [(transport,)]
    assert query(db, "SELECT status, world_size FROM runs") == [("success", 4)]
    got = {r: json.loads(m) if m else None for r, m in query(db, "SELECT rank, mesh FROM ranks")}
    assert got == {r: {"data_parallel": [r // 2, 2], "tensor_parallel": [r % 2, 2]} for r in range(4)}, got
    assert dict(query(db, "SELECT rank, dp_rank FROM ranks")) == {r: r // 2 for r in range(4)}
