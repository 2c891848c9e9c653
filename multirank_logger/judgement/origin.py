"""Where a problem that several ranks show started, and how it spread: the origin of a finding.

A NaN on one rank's batch reaches every rank's weights through the gradient all-reduce, and
every rank logs NaN from the next step: four findings, one cause. What a user hunts is the
rank where it started (the bad shard, the bad GPU), so every surface leads with it. The same
holds for a departure or a straggler that starts on one rank and reaches others.

The findings of one problem are those of one kind on one series (a key; a straggler's phase).
Their *origin* is the rank or ranks with the earliest first step; the others *followed*. One
function decides it for every surface (`with_origin`): the report, the watch's alerts, the
page and the stop all read the fields it adds, and none orders or words the spread itself.

Pure Python on plain dicts (the report's JSON items and the watch's findings alike).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["ALL_REDUCE_LAG", "origin_of", "spread_for", "spread_of", "with_origin"]

#: steps within which every other rank following one rank reads as spread by a collective (the
#: gradient all-reduce carries one rank's NaN into every rank's weights at the next step)
ALL_REDUCE_LAG = 1


def origin_of(firsts: Iterable[tuple[int, int]]) -> tuple[int, list[int]] | None:
    """The earliest first step among ``(rank, first_step)`` pairs and the ranks at it (the
    origin), or None without a pair."""
    pairs = list(firsts)
    if not pairs:
        return None
    step = min(s for _, s in pairs)
    return step, sorted(r for r, s in pairs if s == step)


def spread_of(firsts: Iterable[tuple[int, int]], world_size: int) -> dict[str, Any] | None:
    """How one problem spread among the ranks that show it (``(rank, first_step)`` pairs).

    Returns:
        None for no pair; else ``origin_ranks``, ``origin_step``, ``followers`` (``[rank,
        first_step]`` in order of first step, then rank), ``lag`` (steps from the origin to the
        last follower; None without one) and ``all_reduce``: every other rank of the run
        followed within `ALL_REDUCE_LAG` steps (what a collective's spread looks like).
    """
    pairs = sorted(set(firsts), key=lambda p: (p[1], p[0]))
    found = origin_of(pairs)
    if found is None:
        return None
    step, origin = found
    followers = [[r, s] for r, s in pairs if s != step]
    lag = followers[-1][1] - step if followers else None
    ranks = {r for r, _ in pairs}
    all_reduce = bool(followers) and lag is not None and lag <= ALL_REDUCE_LAG and len(ranks) >= world_size
    return {"origin_ranks": origin, "origin_step": step, "followers": followers, "lag": lag, "all_reduce": all_reduce}


def spread_for(spread: dict[str, Any] | None, rank: int) -> dict[str, Any] | None:
    """`spread` as one rank's finding carries it: the origin's lists its followers; a follower's
    names the origin only (1,024 followers each holding the 1,023 others would be a million pairs
    in a report's JSON or the alerts table)."""
    if spread is None or rank in spread["origin_ranks"]:
        return spread
    return {k: v for k, v in spread.items() if k != "followers"}


def with_origin(items: list[dict[str, Any]], series: Callable[[dict[str, Any]], str],
                world_size: int) -> list[dict[str, Any]]:
    """The items of one kind (dicts with ``rank`` and ``first_step``), each with where its problem
    started: ``origin`` (this rank is, or is among, the earliest) and ``spread`` (`spread_of` of
    the items on its series: the origin's whole, a follower's without the followers, `spread_for`),
    ordered as a user should read them:
    problems by their origin's step, and within one the origin first, then the followers by
    their first step. Items without a first step (memory) keep their order, after the others.
    """
    by_series: dict[str, list[dict[str, Any]]] = {}
    undated = []
    for item in items:
        if item.get("first_step") is None:
            undated.append(item)
        else:
            by_series.setdefault(series(item), []).append(item)
    groups = []
    for members in by_series.values():
        spread = spread_of(((int(m["rank"]), int(m["first_step"])) for m in members), world_size)
        assert spread is not None
        members = sorted(members, key=lambda m: (int(m["first_step"]), int(m["rank"])))
        for m in members:
            m["origin"] = int(m["first_step"]) == spread["origin_step"]
            m["spread"] = spread_for(spread, int(m["rank"])) if len(members) > 1 else None
        groups.append((spread["origin_step"], members))
    groups.sort(key=lambda g: g[0])  # stable: series with the same origin step keep their order
    return [m for _, members in groups for m in members] + undated
