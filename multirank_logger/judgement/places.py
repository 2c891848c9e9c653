"""Where a finding lives: the host (and GPU) of the ranks it names, said beside its sentence.

Pure: given each rank's place (``{rank: {"host", "gpu_index", "gpu_name", "gpu_uuid"}}``, the
``ranks`` table's columns), `place_clause` words where a set of ranks is. When the ranks are every
rank of a host, it says so (``every rank of node2``): a bad host, not bad ranks. One rank names
its host and GPU (``on node5, GPU 3 (NVIDIA H200, GPU-...)``). Where the ranks recorded their
coordinates in a device mesh (``ranks.mesh``, schema 0013), it says the group they make up when
they are every rank of one (``every rank of tp group 1``: the ranks that differ only along ``tp``,
numbered by their coordinates in the other dimensions), or one rank's coordinates (``at dp 1, tp 0
in the mesh``).

Said beside the sentence, as a finding's cost is (judgement/sentences.py ``cost_clause``), not in
it: the watch words a finding during the run without the ranks' places, and a finding is said
alike on every surface. The report's text and the page's item carry it (``place``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from multirank_logger._util.readable import format_ranks

__all__ = ["MAX_HOSTS_NAMED", "finding_ranks", "mesh_clause", "mesh_label", "place_clause", "rank_places"]

#: hosts named one by one in a clause; past it, the clause counts them
MAX_HOSTS_NAMED = 4

Places = Mapping[int, Mapping[str, Any]]


def rank_places(rows: Iterable[Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
    """Each rank's place from rows carrying ``rank``, ``host`` and (where known) the GPU's
    columns; a NaN read from a table (a NULL in a number column) is None."""
    out = {}
    for row in rows:
        place = {k: _known(row.get(k)) for k in ("host", "gpu_index", "gpu_name", "gpu_uuid")}
        if place["gpu_index"] is not None:
            place["gpu_index"] = int(place["gpu_index"])
        place["mesh"] = _mesh(row.get("mesh"))
        out[int(row["rank"])] = place
    return out


def finding_ranks(items: list[dict[str, Any]]) -> list[int]:
    """The ranks one sentence names as where the problem is: a group's ranks; an origin's, with the
    ranks that went at its step (``spread.origin_ranks``: every rank of a host going at once)."""
    if len(items) == 1 and items[0].get("origin") and items[0].get("spread"):
        return sorted({int(r) for r in items[0]["spread"]["origin_ranks"]} | {int(items[0]["rank"])})
    return sorted({int(i["rank"]) for i in items})


def place_clause(ranks: list[int], places: Places) -> str:
    """Where `ranks` are (see the module docstring), as ``"; ..."``: their hosts, then their group in
    the device mesh; "" where neither is known (a run from before hosts were registered, a rank
    that never said)."""
    on_hosts, in_mesh = _host_clause(ranks, places), mesh_clause(ranks, places)
    if not in_mesh:
        return on_hosts
    return f"{on_hosts}, {in_mesh}" if on_hosts else f"; {in_mesh}"


def mesh_clause(ranks: list[int], places: Places) -> str:
    """`ranks`' place in the device mesh: one rank's coordinates (``at dp 1, tp 0 in the mesh``); ranks that are
    every rank of one group along a dimension (``every rank of tp group 1``) or of one slice
    (``every rank at pp 2``); "" otherwise, or where a rank's coordinates are not known."""
    coords: dict[int, Any] = {r: (places.get(r) or {}).get("mesh") for r in places}
    if not ranks or any(coords.get(r) is None for r in ranks):
        return ""
    if len(ranks) == 1:
        return f"at {mesh_label(coords[ranks[0]])} in the mesh"
    dims = list(coords[ranks[0]])
    if any(list(coords[r]) != dims for r in ranks):
        return ""  # ranks of different meshes
    fixed = [d for d in dims if len({coords[r][d][0] for r in ranks}) == 1]
    if not fixed or len(fixed) == len(dims):
        return ""
    at = {d: coords[ranks[0]][d][0] for d in fixed}
    slice_ = {r for r, c in coords.items() if c is not None and list(c) == dims and all(c[d][0] == at[d] for d in fixed)}
    if slice_ != set(ranks):
        return ""  # some of a group, not all of it
    varying = [d for d in dims if d not in fixed]
    if len(varying) == 1:
        index = 0
        for d in fixed:  # the group's number: its coordinates in the other dimensions, outermost first
            index = index * coords[ranks[0]][d][1] + at[d]
        return f"every rank of {varying[0]} group {index}"
    return "every rank at " + ", ".join(f"{d} {at[d]}" for d in fixed)


def mesh_label(mesh: Mapping[str, Any] | None) -> str:
    """One rank's coordinates, ``dp 1, tp 0``; "" without them."""
    return ", ".join(f"{d} {c[0]}" for d, c in mesh.items()) if mesh else ""


def _host_clause(ranks: list[int], places: Places) -> str:
    if not ranks or any(_host(places, r) is None for r in ranks):
        return ""
    if len(ranks) == 1:
        place = places[ranks[0]]
        gpu = "" if place.get("gpu_index") is None else f", GPU {place['gpu_index']}"
        about = [str(place[k]) for k in ("gpu_name", "gpu_uuid") if place.get(k)]
        return f"; on {place['host']}{gpu}" + (f" ({', '.join(about)})" if about else "")
    on: dict[str, list[int]] = {}
    for r in ranks:
        on.setdefault(str(_host(places, r)), []).append(r)
    of_host: dict[str, int] = {}
    for r in places:
        if (host := _host(places, r)) is not None:
            of_host[str(host)] = of_host.get(str(host), 0) + 1
    whole = [h for h, rs in on.items() if len(rs) == of_host[h]]
    if len(on) == 1:
        host, named = next(iter(on.items()))
        return f"; every rank of {host}" if whole else f"; all on {host} ({len(named)} of its {of_host[host]} ranks)"
    if len(whole) == len(on):
        hosts = list(on)
        if len(hosts) <= MAX_HOSTS_NAMED:
            return f"; every rank of {', '.join(hosts[:-1])} and {hosts[-1]}"
        return f"; every rank of {len(hosts)} hosts"
    if len(on) <= MAX_HOSTS_NAMED:
        said = [f"{h} ({'every rank' if h in whole else format_ranks(rs)})" for h, rs in on.items()]
        return f"; on {', '.join(said[:-1])} and {said[-1]}"
    return f"; on {len(on)} hosts" + (f" (every rank of {len(whole)} of them)" if whole else "")


def _host(places: Places, rank: int) -> Any:
    place = places.get(rank)
    return None if place is None else place.get("host")


def _mesh(text: Any) -> dict[str, tuple[int, int]] | None:
    """``ranks.mesh``'s JSON as {dim: (coordinate, size)}; None where absent or not of that shape."""
    if not isinstance(text, str):
        return None
    try:
        return {str(d): (int(c[0]), int(c[1])) for d, c in json.loads(text).items()}
    except (ValueError, TypeError, AttributeError, IndexError):
        return None


def _known(value: Any) -> Any:
    return None if value is None or value != value else value  # NaN: pandas' NULL in a number column
