"""The verdict says where a finding lives (judgement/places.py), beside its sentence.

A store built with chosen rank places: 12 ranks on three hosts (node1: ranks 0-3, node2: 4-7,
node3: 8-11), GPUs 0-3 on each. Every rank of node2 straggles in its data wait from step 10;
every rank of node3 has a NaN loss from step 25; rank 2 alone a NaN grad_norm from step 30. The
report's text and the page's items name node2 and node3 by host, and rank 2's host and GPU; the
sentence itself stays the watch's (no host in it).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from multirank_logger.judgement.places import finding_ranks, place_clause, rank_places
from tests.helpers.places_store import build_places_store, gpu_uuid


@pytest.mark.parametrize("suffix", [".sqlite", ".duckdb"])
def test_a_host_wide_problem_is_named_by_host_and_one_rank_by_its_host_and_gpu(tmp_path: Path, suffix: str) -> None:
    from multirank_logger import open_store
    from multirank_logger.report import find
    from multirank_logger.report.render import findings_text

    db = build_places_store(str(tmp_path / f"runs{suffix}"))
    with open_store(db) as reader:
        found = find(reader)
    text = findings_text(found)
    stragglers = [line.strip() for line in text.split("Stragglers:\n")[1].split("\n\n")[0].splitlines()]
    non_finite = [line.strip() for line in text.split("Non-finite values:\n")[1].split("\n\n")[0].splitlines()]
    assert {s["rank"] for s in found.stragglers} == {4, 5, 6, 7}
    # every rank of a host going at one step: one line naming the host, not one per rank
    assert stragglers == [line for line in stragglers if line.startswith("ranks 4-7 straggle in data from step 10 ")], stragglers
    assert len(stragglers) == 1 and "; every rank of node2;" in stragglers[0], stragglers
    loss = [line for line in non_finite if "loss" in line]
    assert len(loss) == 1 and loss[0].startswith("ranks 8-11 loss NaN from step 25; every rank of node3;"), non_finite
    [grad] = [line for line in non_finite if "grad_norm" in line]
    assert f"; on node1, GPU 2 (NVIDIA H200, {gpu_uuid(2)})" in grad
    # the page's items: the same place, beside the sentence (the watch words the sentence alike)
    items = found.to_dict()
    for item in items["stragglers"]:
        assert item["place"] == "every rank of node2" and "node2" not in item["sentence"]
    # the page's list says the group once (its first item; the others name it): the text's line
    said = {kind: [i for i in items[kind] if i["said_with"] is None] for kind in ("stragglers", "non_finite")}
    assert [i["sentence"] + "; " + i["place"] + "; " + i["cost"] for i in said["stragglers"]] == stragglers
    assert [i["sentence"] for i in said["non_finite"] if i["key"] == "loss"] == ["ranks 8-11 loss NaN from step 25"]
    assert {i["said_with"] for i in items["stragglers"]} == {None, 4}
    [grad_item] = [i for i in items["non_finite"] if i["key"] == "grad_norm"]
    assert grad_item["place"] == f"on node1, GPU 2 (NVIDIA H200, {gpu_uuid(2)})" and "node1" not in grad_item["sentence"]
    # the ranks' list carries each rank's place
    assert found.ranks[5]["gpu_index"] == 1 and found.ranks[5]["gpu_uuid"] == gpu_uuid(5) and found.ranks[5]["dp_rank"] == 5


def _places(hosts: dict[str, range], gpu: bool = False) -> dict[int, dict]:
    return rank_places({"rank": r, "host": h, "gpu_index": r % 8 if gpu else math.nan} for h, rs in hosts.items() for r in rs)


def test_the_place_clause() -> None:
    """The rule, on a 32-rank run of four hosts of 8 ranks."""
    places = _places({"node1": range(0, 8), "node2": range(8, 16), "node3": range(16, 24), "node5": range(24, 32)}, gpu=True)
    assert place_clause(list(range(16, 24)), places) == "; every rank of node3"
    assert place_clause(list(range(8, 24)), places) == "; every rank of node2 and node3"
    assert place_clause([16, 17], places) == "; all on node3 (2 of its 8 ranks)"
    assert place_clause([*range(8, 16), 17, 18], places) == "; on node2 (every rank) and node3 (ranks 17-18)"
    assert place_clause([29], places) == "; on node5, GPU 5"
    assert place_clause([29], _places({"node5": range(32)})) == "; on node5"  # a CPU rank: no GPU (NULL read as NaN)
    assert place_clause([3], {}) == "" and place_clause([3, 40], places) == ""  # a host not known: nothing said
    many = _places({f"n{h}": range(2 * h, 2 * h + 2) for h in range(6)})
    assert place_clause(list(range(11)), many) == "; on 6 hosts (every rank of 5 of them)"
    assert place_clause(list(range(12)), many) == "; every rank of 6 hosts"


def test_the_ranks_a_sentence_names() -> None:
    """An origin that went with others at its step names them all; followers, the group's ranks."""
    origin = {"rank": 16, "origin": True, "spread": {"origin_ranks": [16, 17, 18], "followers": []}}
    assert finding_ranks([origin]) == [16, 17, 18]
    assert finding_ranks([{"rank": 4}, {"rank": 2}]) == [2, 4]
    assert finding_ranks([{"rank": 37}]) == [37]


def test_the_ranks_that_start_a_problem_together_are_one_sentence() -> None:
    """The origins of one problem at one step are one sentence (report text, page, kept verdict);
    origins of another series, or of another set, stay apart."""
    from multirank_logger.judgement.sentences import followers_sentence, sentence_groups

    spread = {"origin_ranks": [4, 5, 6, 7], "origin_step": 10, "followers": [[1, 12]]}
    items = [{"rank": r, "phase": "data", "first_step": 10, "last_step": 39, "steps": 30, "excess_s": 0.185,
              "share_of_step": 2.2, "origin": True, "spread": spread} for r in (4, 5, 6, 7)]
    follower = {**items[0], "rank": 1, "first_step": 12, "origin": False}
    other = {**items[0], "phase": "forward"}
    groups = sentence_groups("straggler", [*items, follower, other])
    assert [[i["rank"] for i in g] for g in groups] == [[4, 5, 6, 7], [1], [4]]
    assert followers_sentence("straggler", groups[0]) == (
        "ranks 4-7 straggle in data from step 10 to 39 (30 steps): 185 ms longer than the other ranks per step "
        "(220% of a step); followed by rank 1 at step 12")
    assert followers_sentence("straggler", items[:1]).startswith("rank 4 straggles in data from step 10 ")
