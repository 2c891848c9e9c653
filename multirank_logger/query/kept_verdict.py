"""A run's kept verdict where it is the report's own: served instead of a pass over the rows.

At a run's end the watch keeps its last judgement: the ``findings`` rows and one ``verdicts`` row
of its launch (watch/watch.py ``keep_verdict``). Where it held the whole run and judged it as the
report's pass judges the rows (``verdicts.complete``: judgement/live.py), its departures and
non-finite values are the pass's, to the last number, *for the rows it judged*. So it is served
only while the store holds exactly those rows: each rank's metric rows, counted from the step
summaries inside the store, equal what it judged (``rows_by_rank``). A spill import after the
end, a resumed launch, a row lost on the way: a count differs, and the reader runs the pass.

What the pass gives besides: the NaN/inf counts per key and rank, from the coarse summaries in the
same read as the rows' counts (about 1/``COARSE_STEPS`` of the rows, aggregated inside the store);
each rank's distinct steps and last step as the watch counted them, or where a rank's rows came out
of step order, from the step summaries (the OR of its keys' step masks per bucket). Nothing here
judges: it reads.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import sqlalchemy as sa

from multirank_logger._util.arrow_numpy import column_numpy
from multirank_logger.rows.schema import SEQ_ATTEMPT_SHIFT, coarse_summaries, findings, step_summaries, verdicts

__all__ = ["KeptVerdict", "kept_verdict"]

#: runs a SELECT and returns a pyarrow Table (``StoreReader.fetch_arrow``)
FetchArrow = Callable[[sa.Select], Any]


@dataclass
class KeptVerdict:
    """What the report's pass over the rows would have found, read from the kept verdict."""

    #: the ranks departing on each key: the report's outlier items, by key, then rank
    departures: list[dict[str, Any]]
    #: per (key, rank) with NaN or inf: rank, key, first_step, value (its word), count, nan, inf; by key, then rank
    non_finite: list[dict[str, Any]]
    #: rank -> (distinct steps it logged, its last step)
    rank_steps: dict[int, tuple[int, int]]


def kept_verdict(fetch_arrow: FetchArrow, run_id: int) -> tuple[KeptVerdict | None, str | None]:
    """The run's kept verdict where it may be served (see the module docstring), else None and why
    not (None where no verdict was kept: the watch was off, or the run is from before schema 0014)."""
    v = verdicts.c
    latest = fetch_arrow(sa.select(v.seq, v.complete, v.rows_by_rank, v.steps_by_rank, v.findings, v.reason)
                         .where(v.run_id == run_id).order_by(v.seq.desc()).limit(1)).to_pylist()
    if not latest:
        return None, None
    verdict = latest[0]
    if not verdict["complete"] or verdict["rows_by_rank"] is None:
        return None, verdict["reason"] or "the verdict kept is not the whole run's"
    try:
        return _served(fetch_arrow, run_id, verdict)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:  # a damaged or foreign row: never trusted
        return None, f"the verdict kept cannot be read ({type(exc).__name__}: {exc})"


def _served(fetch_arrow: FetchArrow, run_id: int, verdict: dict[str, Any]) -> tuple[KeptVerdict | None, str | None]:
    """`kept_verdict` of a complete verdict row: served where the store holds exactly its rows."""
    judged = json.loads(verdict["rows_by_rank"])
    launch = int(verdict["seq"]) >> SEQ_ATTEMPT_SHIFT
    f = findings.c
    kept = fetch_arrow(sa.select(f.rank, f.kind, f.series, f.first_step, f.detail).where(
        f.run_id == run_id, f.seq >= launch << SEQ_ATTEMPT_SHIFT, f.seq < (launch + 1) << SEQ_ATTEMPT_SHIFT)).to_pylist()
    if len(kept) != verdict["findings"]:
        return None, f"{verdict['findings']} finding(s) were kept and {len(kept)} are stored"
    stored, bad = _counts(fetch_arrow, run_id)
    if stored != {rank: n for rank, n in enumerate(judged) if n}:
        return None, "the store holds other metric rows than the verdict judged (rows imported after the end, a later launch)"
    non_finite = _non_finite(bad, kept)
    if non_finite is None:
        return None, "the NaN/inf values stored are not those the verdict judged"
    departures = sorted(({"rank": int(r["rank"]), "key": r["series"], "first_step": int(r["first_step"]), **_detail(r)}
                         for r in kept if r["kind"] == "departure"), key=lambda item: (item["key"], item["rank"]))
    if verdict["steps_by_rank"] is not None:
        rank_steps = {rank: (int(n), int(last)) for rank, at in enumerate(json.loads(verdict["steps_by_rank"]))
                      if at is not None for n, last in [at]}
    else:
        rank_steps = _rank_steps(fetch_arrow, run_id)
    return KeptVerdict(departures, non_finite, rank_steps), None


def _detail(row: dict[str, Any]) -> dict[str, Any]:
    """A kept finding's numbers, without its spread (the reader works out where a problem started)."""
    detail = json.loads(row["detail"]) if row["detail"] else {}
    detail.pop("spread", None)
    return dict(detail)


def _counts(fetch_arrow: FetchArrow, run_id: int) -> tuple[dict[int, int], dict[tuple[str, int], tuple[int, int]]]:
    """Each rank's metric rows stored, and per (key, rank) with any its NaN and inf values, from the
    coarse summaries (each counts every row an insert added), in one aggregate inside the store."""
    s = coarse_summaries.c
    counts = fetch_arrow(
        sa.select(s.key, s.rank, sa.func.sum(s.n_finite + s.n_nan + s.n_pos_inf + s.n_neg_inf).label("n"),
                  sa.func.sum(s.n_nan).label("nan"), sa.func.sum(s.n_pos_inf + s.n_neg_inf).label("inf"))
        .where(s.run_id == run_id).group_by(s.key, s.rank)
    ).to_pylist()  # (a sum may come back as a Decimal)
    rows: dict[int, int] = {}
    bad = {}
    for c in counts:
        rows[int(c["rank"])] = rows.get(int(c["rank"]), 0) + int(c["n"])
        if c["nan"] or c["inf"]:
            bad[(c["key"], int(c["rank"]))] = (int(c["nan"]), int(c["inf"]))
    return {rank: n for rank, n in rows.items() if n}, bad


def _non_finite(stored: dict[tuple[str, int], tuple[int, int]], kept: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The kept non-finite findings with the counts the store holds (`stored`), by key then rank;
    None where the (key, rank) pairs with a NaN/inf stored are not the verdict's."""
    said = {(r["series"], int(r["rank"])): r for r in kept if r["kind"] == "non_finite"}
    if stored.keys() != said.keys():
        return None
    out = []
    for (key, rank), (nan, inf) in sorted(stored.items()):
        word = _detail(said[(key, rank)]).get("value")
        out.append({"rank": rank, "key": key, "first_step": int(said[(key, rank)]["first_step"]), "value": word,
                    "count": nan + inf, "nan": nan, "inf": inf})
    return out


def _rank_steps(fetch_arrow: FetchArrow, run_id: int) -> dict[int, tuple[int, int]]:
    """Each rank's distinct steps (any key) and last step: per (rank, bucket), the OR of its
    summaries' step masks (each bit a step), counted."""
    s = step_summaries.c
    table = fetch_arrow(sa.select(s.rank, s.step, s.steps_mask).where(s.run_id == run_id).distinct())
    rank, step = column_numpy(table.column("rank")).astype(np.int64), column_numpy(table.column("step")).astype(np.int64)
    mask = column_numpy(table.column("steps_mask")).astype(np.int64)
    if not len(rank):
        return {}
    order = np.lexsort((step, rank))
    rank, step, mask = rank[order], step[order], mask[order]
    starts = np.flatnonzero(np.r_[True, (rank[1:] != rank[:-1]) | (step[1:] != step[:-1])])
    merged = np.bitwise_or.reduceat(mask, starts)
    rank, step = rank[starts], step[starts]
    bits = np.bitwise_count(merged).astype(np.int64)
    last = step + (np.floor(np.log2(np.maximum(merged, 1))).astype(np.int64))  # its highest bit's step
    ranks, first = np.unique(rank, return_index=True)
    steps = np.add.reduceat(bits, first)
    lasts = np.maximum.reduceat(last, first)
    return {int(r): (int(n), int(t)) for r, n, t in zip(ranks.tolist(), steps.tolist(), lasts.tolist())}
