"""Which rank is the problem: a run's findings, read through the query side.

For one run: the ranks (status, host, steps, duration); stragglers (a rank whose data wait or
forward time stands out, from ``StepTimer``'s ``step_timing``); outlier ranks per key; non-finite
values; ranks whose peak memory stands out; decisions the ranks disagreed on; warnings and errors
from the ranks' logs, apart from the library warnings every rank raised alike (`library_notice`),
which are shown as notices, not findings. Nothing here writes: every read goes through a ``StoreReader``.

How a rank *departs* (outliers and stragglers), with no fixed threshold on the values:

1. at each step, the median of the ranks, and each rank's deviation from it;
2. the ranks' typical spread at that step: the median of the ranks' absolute deviations
   (robust to one rank in three going astray), smoothed over neighbouring steps so that a step
   where two ranks happen to agree does not make every other rank look far;
3. a rank departs at a step when its deviation is over ``DEPART_SPREADS`` typical spreads, and
   it *persistently* departs when it does so on most steps of a stretch of at least
   ``MIN_STEPS`` steps (or 5% of the run), so a one-off spike or the noise of normal shards is
   no finding. The finding gives the stretch's first step and the size of the departure.

It takes three ranks: with two, each is as far from their median as the other.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from multirank_logger._util.background_import import import_in_background
from multirank_logger.model.run_ref import RunRef
from multirank_logger.query.run_scan import RunScan, scan_run
from multirank_logger.query.step_buckets import BucketSummary

if TYPE_CHECKING:
    from multirank_logger.query.reader import StoreReader

__all__ = ["Findings", "departures", "find", "find_with_buckets", "library_notice", "outliers"]

#: a rank departs at a step when it is this many typical spreads of the ranks from their median
DEPART_SPREADS = 8.0
#: a departure is persistent over at least this many steps (or 5% of the run's steps, if more)
MIN_STEPS = 5
#: steps each side whose typical spreads are pooled (a rolling median)
SPREAD_WINDOW = 5
#: a straggler's extra time must be at least this share of a step to be worth a finding
STRAGGLER_MIN_SHARE = 0.1
#: a rank's peak memory stands out at this many times the other ranks' median peak
MEMORY_RATIO = 1.25
#: host memory (RSS) rank 0 of a gather run may hold beyond the others' before the ratio counts: it
#: alone writes the store (connection, cache, the batches it receives). Measured: +113 MiB in a clean
#: 2-rank DuckDB run (412 vs 525 MiB), 358-379 MiB peak under 256 senders (benchmarks/RESULTS.md, Scale)
WRITER_RSS_ALLOWANCE = 384 * 2**20
#: warnings/errors listed at most (distinct messages)
MAX_LOG_MESSAGES = 20


@dataclass
class Findings:
    """What ``multirank-logger report`` says about one run; lists of plain dicts, JSON-ready."""

    run: str
    run_id: int
    world_size: int
    ranks: list[dict[str, Any]] = field(default_factory=list)
    timing: list[dict[str, Any]] = field(default_factory=list)
    stragglers: list[dict[str, Any]] = field(default_factory=list)
    outliers: list[dict[str, Any]] = field(default_factory=list)
    non_finite: list[dict[str, Any]] = field(default_factory=list)
    memory: list[dict[str, Any]] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    log_messages: list[dict[str, Any]] = field(default_factory=list)
    #: warnings raised alike by library code (`library_notice`): shown apart, no finding
    library_warnings: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def problems(self) -> bool:
        """Whether anything was found (the ranks' table and the notes are no finding)."""
        return any((self.stragglers, self.outliers, self.non_finite, self.memory, self.decisions, self.log_messages))

    def keys_with_findings(self) -> list[str]:
        seen = dict.fromkeys(item["key"] for item in self.outliers + self.non_finite)
        return list(seen)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def find(reader: StoreReader, run: int | str | None = None) -> Findings:
    """Every finding for one run (the latest by default), read through ``reader``.

    ``multirank_logger.report.find(open_store(db), run=...)``; the CLI's ``report`` prints it.

    Raises:
        LookupFailed: for an unknown run.
    """
    return find_with_buckets(reader, run)[0]


def find_with_buckets(
    reader: StoreReader, run: int | str | None = None, bucket_columns: int = 0
) -> tuple[Findings, dict[str, BucketSummary]]:
    """``find``, and from the same pass over the rows each key's per-bucket summary (what the
    ui's page draws) when ``bucket_columns`` is set: ``report -o`` costs no second read."""
    ref = reader.resolve_run(run)
    # the tables after the pass are pandas': its import runs beside the pass (report: ~0.3 s less)
    import_in_background("pandas")
    out = Findings(run=ref.label, run_id=ref.id, world_size=ref.world_size)
    # one pass over the run's rows, in windows of steps: the ranks' steps, NaN/inf, and per key
    # the per-step statistics and the rows that may depart (query/run_scan.py)
    scan = scan_run(reader, ref, spread_window=SPREAD_WINDOW, depart_spreads=DEPART_SPREADS,
                    bucket_columns=bucket_columns)  # fmt: skip
    out.ranks = _ranks(reader, ref, scan.rank_steps)
    timing = _sql(reader, f"SELECT * FROM step_timing WHERE run_id = {ref.id}")
    if len(timing):
        out.timing, out.stragglers = _timing(timing)
        transport = _sql(reader, f"SELECT transport FROM runs WHERE id = {ref.id}")["transport"]
        out.memory = _memory(timing, writers={0} if "gather" in transport.tolist() else set())
    else:
        out.notes.append("No step timing in this run: add multirank_logger.StepTimer() to the Trainer's callbacks.")
    out.non_finite = scan.non_finite
    if ref.world_size < 3:
        out.notes.append(f"Outlier ranks need 3 ranks or more (this run has {ref.world_size}).")
    else:
        out.outliers = outliers(scan)
    out.decisions = _decisions(reader, ref)
    messages = _log_messages(reader, ref)
    out.library_warnings = [m for m in messages if library_notice(m, ref.world_size)]
    out.log_messages = [m for m in messages if not library_notice(m, ref.world_size)]
    return out, scan.buckets


def outliers(scan: RunScan) -> list[dict[str, Any]]:
    """The ranks departing persistently on each key of a run, from one pass over its rows:
    ``departures`` of each key's ``per_rank`` table, without the table."""
    out = []
    for key in scan.keys:
        steps = scan.per_key.get(key)
        if steps is None or len(steps.steps) < MIN_STEPS:
            continue
        found = _judge(steps.steps, steps.median, steps.mad, steps.cand_pos, steps.cand_rank, steps.cand_value,
                       steps.cand_dev, higher_only=False)  # fmt: skip
        out += [{"rank": item.pop("rank"), "key": key, **item} for item in found]
    return out


# -- the robust departure test -------------------------------------------------------------


def departures(table: Any, *, higher_only: bool = False) -> list[dict[str, Any]]:
    """Ranks departing persistently from the others in a step x rank table (see the module doc).

    Returns:
        One dict per departing rank: rank, first_step, last_step, steps (departing), ratio
        (its median value over the ranks' median, where that is not 0), spreads (its median
        deviation in typical spreads), excess (its median deviation, in the values' unit).
    """
    values = table.to_numpy(dtype=float, copy=True)
    values[~np.isfinite(values)] = np.nan  # NaN/inf are the non-finite finding's
    counted = (~np.isnan(values)).sum(axis=1) >= 3
    values, steps = values[counted], table.index.to_numpy()[counted]
    if len(steps) < MIN_STEPS:
        return []
    median = np.nanmedian(values, axis=1)
    dev = values - median[:, None]
    per_step = np.nanmedian(np.abs(dev), axis=1)
    pos, col = np.nonzero(~np.isnan(dev))  # every value is a candidate here
    rank = np.asarray(table.columns, dtype=np.int64)[col]
    return _judge(steps, median, per_step, pos, rank, values[pos, col], dev[pos, col], higher_only=higher_only)


def _judge(
    steps: np.ndarray,
    median: np.ndarray,
    per_step: np.ndarray,
    pos: np.ndarray,
    rank: np.ndarray,
    value: np.ndarray,
    dev: np.ndarray,
    *,
    higher_only: bool,
) -> list[dict[str, Any]]:
    """The departing ranks, from the per-step medians and spreads of the counted steps and the
    candidate values (their step's position in `steps`, rank, value, deviation from the median):
    every value that departs must be among the candidates (query/run_scan.py keeps a superset)."""
    import pandas as pd

    window = 2 * SPREAD_WINDOW + 1
    spread = pd.Series(per_step).rolling(window, center=True, min_periods=1).median().to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        score = np.where(dev == 0, 0.0, (dev if higher_only else np.abs(dev)) / spread[pos])
    depart = np.nan_to_num(score, nan=0.0) > DEPART_SPREADS
    min_steps = max(MIN_STEPS, math.ceil(0.05 * len(steps)))
    found = []
    for r in np.unique(rank[depart]).tolist():
        mine = rank == r
        flags = np.zeros(len(steps), bool)
        flags[pos[mine & depart]] = True
        where = _persistent(flags, min_steps)
        if not where.any():
            continue
        sel = mine & depart & where[pos]
        at = pos[sel]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.nanmedian(np.where(median[at] != 0, value[sel] / median[at], np.nan))
        found.append(
            {
                "rank": int(r),
                "first_step": int(steps[at].min()),
                "last_step": int(steps[at].max()),
                "steps": int(len(at)),
                "ratio": None if np.isnan(ratio) else float(ratio),
                "spreads": float(np.nanmedian(np.minimum(score[sel], 1e300))),
                "excess": float(np.nanmedian(dev[sel])),
            }
        )
    return found


def _persistent(depart: np.ndarray, min_steps: int) -> np.ndarray:
    """The departing steps inside stretches where most steps depart and that last ``min_steps``,
    each with the shorter such stretches just before it (fewer than ``MIN_STEPS`` steps apart):
    a few steps where the other ranks were noisy too (a loaded host) do not move where a
    departure began. A short stretch alone is still no finding."""
    import pandas as pd

    most = pd.Series(depart.astype(float)).rolling(5, center=True, min_periods=1).mean().to_numpy() > 0.5
    keep = np.zeros(len(depart), bool)
    edges = np.flatnonzero(np.diff(np.r_[0, most.astype(np.int8), 0]))
    stretches = list(zip(edges[::2], edges[1::2]))
    for i, (start, stop) in enumerate(stretches):
        if stop - start < min_steps:
            continue
        first = i
        while first > 0 and stretches[first][0] - stretches[first - 1][1] < MIN_STEPS:
            first -= 1
        keep[stretches[first][0] : stop] = True
    return keep & depart


# -- each finding ----------------------------------------------------------------------------


def _sql(reader: StoreReader, query: str) -> Any:
    return reader.frame(query)  # our own SQL: not through the guard for users' (StoreReader.frame)


def _ranks(reader: StoreReader, ref: RunRef, rank_steps: dict[int, tuple[int, int]]) -> list[dict[str, Any]]:
    registered = _sql(reader, f"SELECT rank, host, status, started_at, ended_at FROM ranks WHERE run_id = {ref.id}")
    by_rank = {int(r.rank): r for r in registered.itertuples()}
    out = []
    for rank in sorted(set(range(ref.world_size)) | set(by_rank) | set(rank_steps)):
        reg, log = by_rank.get(rank), rank_steps.get(rank)
        ended = None if reg is None or reg.ended_at is None or reg.ended_at != reg.ended_at else reg.ended_at
        out.append(
            {
                "rank": rank,
                "status": reg.status if reg is not None else "unregistered",
                "host": reg.host if reg is not None else None,
                "steps": log[0] if log is not None else 0,
                "last_step": log[1] if log is not None else None,
                "duration_s": float(ended - reg.started_at) if ended is not None and reg is not None else None,
            }
        )
    return out


def _timing(timing: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per-rank medians of the step's parts, and the ranks whose data wait or forward stands out."""
    summary = [
        {
            "rank": int(rank),
            "steps": int(len(rows)),
            **{col: _median(rows[col]) for col in ("data_s", "forward_s", "rest_s")},
            "batch_size": _median(rows["batch_size"]),
        }
        for rank, rows in timing.groupby("rank")
    ]
    parts = timing[["data_s", "forward_s", "rest_s"]].astype(float)
    step_time = float(np.nanmedian(parts.sum(axis=1, min_count=1))) if len(parts) else math.nan
    stragglers = []
    for phase in ("data_s", "forward_s"):
        # steps with gradient accumulation share a global_step: a step's time is their sum
        table = timing.dropna(subset=[phase]).pivot_table(index="step", columns="rank", values=phase, aggfunc="sum")
        for item in departures(table, higher_only=True):
            share = item["excess"] / step_time if step_time > 0 else math.nan
            if not share >= STRAGGLER_MIN_SHARE:
                continue
            stragglers.append(
                {"rank": item["rank"], "phase": phase.removesuffix("_s"), "first_step": item["first_step"],
                 "last_step": item["last_step"], "steps": item["steps"], "excess_s": item["excess"],
                 "share_of_step": share, "spreads": item["spreads"]}
            )  # fmt: skip
    return summary, stragglers


def _memory(timing: Any, writers: set[int]) -> list[dict[str, Any]]:
    """Ranks whose peak memory (CUDA reserved, else RSS) is well above the other ranks'; the
    ranks that write the others' rows (`writers`) are judged on RSS less `WRITER_RSS_ALLOWANCE`."""
    cuda = timing["mem_reserved_peak"].notna().any()
    measure = "mem_reserved_peak" if cuda else "rss"
    peaks = timing.groupby("rank")[measure].max().dropna().astype(float)
    retries = timing.groupby("rank")["alloc_retries"].max().fillna(0) if cuda else None
    out = []
    for rank, peak in peaks.items():
        others = float(peaks.drop(rank).median()) if len(peaks) > 1 else math.nan
        judged = peak - WRITER_RSS_ALLOWANCE if measure == "rss" and rank in writers else peak
        ratio = judged / others if others > 0 else math.nan
        retried = int(retries[rank]) if retries is not None else 0
        if ratio >= MEMORY_RATIO or retried:
            out.append({"rank": int(rank), "measure": measure, "peak_bytes": int(peak),
                        "others_median_bytes": None if math.isnan(others) else int(others),
                        "ratio": None if math.isnan(ratio) else ratio, "alloc_retries": retried})  # fmt: skip
    return out


def _decisions(reader: StoreReader, ref: RunRef) -> list[dict[str, Any]]:
    """Checkpoint/early-stopping decisions where the ranks' own votes differed."""
    rows = _sql(
        reader,
        "SELECT seq, step, callback, monitor, rank, value, vote, decision FROM decisions "
        f"WHERE run_id = {ref.id} ORDER BY seq, rank",
    )
    out = []
    for seq, group in rows.groupby("seq", sort=True):
        votes = {int(r): None if v is None or v != v else bool(v) for r, v in zip(group["rank"], group["vote"])}
        if len({v for v in votes.values() if v is not None}) < 2:
            continue
        first = group.iloc[0]
        decision = None if _float(first["decision"]) is None else bool(first["decision"])
        out.append(
            {"seq": int(seq), "step": int(first["step"]), "callback": first["callback"], "monitor": first["monitor"],
             "decision": decision, "votes": votes,
             "values": {int(r): _float(v) for r, v in zip(group["rank"], group["value"])},
             "ranks": [r for r, v in votes.items() if v is not None and v != decision]}
        )  # fmt: skip
    return out


def _log_messages(reader: StoreReader, ref: RunRef) -> list[dict[str, Any]]:
    """Warnings and errors the ranks logged, one item per distinct message, first seen first."""
    rows = _sql(
        reader,
        f"SELECT rank, level, levelno, logger, message, time FROM logs WHERE run_id = {ref.id} AND levelno >= 30 "
        "ORDER BY time LIMIT 100000",
    )
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows.itertuples():
        item = out.setdefault((r.level, r.message), {"level": r.level, "logger": r.logger, "message": r.message,
                                                     "ranks": [], "count": 0})  # fmt: skip
        item["count"] += 1
        if int(r.rank) not in item["ranks"]:
            item["ranks"].append(int(r.rank))
    for item in out.values():
        item["ranks"].sort()
    ordered = sorted(out.values(), key=lambda i: -_LEVELS.get(i["level"], 0))  # stable: errors first, then by time
    return ordered[:MAX_LOG_MESSAGES]


_LEVELS = {"CRITICAL": 50, "ERROR": 40, "WARNING": 30}
#: where installed packages' files are: a warning raised there is library code's
_LIBRARY_DIRS = ("/site-packages/", "/dist-packages/")
#: Lightning's packages, which warn on rank 0 alone by design (``rank_zero_warn``)
_LIGHTNING_DIRS = ("/lightning/", "/pytorch_lightning/", "/lightning_fabric/")


def library_notice(message: dict[str, Any], world_size: int) -> bool:
    """A warning from library code that names no rank: a `warnings.warn` of an installed package
    (e.g. Lightning's deprecation FutureWarnings) raised alike on every rank, or by Lightning on
    rank 0 alone (its rank_zero_warn). A notice worth reading, not a finding about a rank."""
    if message["level"] != "WARNING" or message["logger"] != "py.warnings":
        return False
    where = str(message["message"]).split(": ", 1)[0].replace("\\", "/")  # warnings' "path:line: Category: text"
    if not any(part in where for part in _LIBRARY_DIRS):
        return False
    ranks = message["ranks"]
    return ranks == list(range(world_size)) or (ranks == [0] and any(part in where for part in _LIGHTNING_DIRS))


def _median(column: Any) -> float | None:
    values = column.dropna().astype(float)
    return float(values.median()) if len(values) else None


def _float(value: Any) -> float | None:
    return None if value is None or value != value else float(value)
