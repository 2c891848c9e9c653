"""Where a finding lives: the host (and GPU) of the ranks it names, said beside its sentence.

Pure: given each rank's place (``{rank: {"host", "gpu_index", "gpu_name", "gpu_uuid"}}``, the
``ranks`` table's columns), `place_clause` words where a set of ranks is. When the ranks are every
rank of a host, it says so (``every rank of node2``): a bad host, not bad ranks. One rank names
its host and GPU (``on node5, GPU 3 (NVIDIA H200, GPU-...)``).

Said beside the sentence, as a finding's cost is (judgement/sentences.py ``cost_clause``), not in
it: the watch words a finding during the run without the ranks' places, and a finding is said
alike on every surface. The report's text and the page's item carry it (``place``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from multirank_logger._util.readable import format_ranks

__all__ = ["MAX_HOSTS_NAMED", "finding_ranks", "place_clause", "rank_places"]

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
        out[int(row["rank"])] = place
    return out


def finding_ranks(items: list[dict[str, Any]]) -> list[int]:
    """The ranks one sentence names as where the problem is: a group's ranks; an origin's, with the
    ranks that went at its step (``spread.origin_ranks``: every rank of a host going at once)."""
    if len(items) == 1 and items[0].get("origin") and items[0].get("spread"):
        return sorted({int(r) for r in items[0]["spread"]["origin_ranks"]} | {int(items[0]["rank"])})
    return sorted({int(i["rank"]) for i in items})


def place_clause(ranks: list[int], places: Places) -> str:
    """Where `ranks` are (see the module docstring), as ``"; ..."``; "" where a rank's host is
    not known (a run from before hosts were registered, a rank that never said)."""
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


def _known(value: Any) -> Any:
    return None if value is None or value != value else value  # NaN: pandas' NULL in a number column
