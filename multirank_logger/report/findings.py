"""Which rank is the problem: a run's findings, read through the query side.

For one run: the ranks (status, host, steps, duration); stragglers (a rank whose data wait or
forward time stands out, from ``StepTimer``'s ``step_timing``); outlier ranks per key; non-finite
values; ranks whose peak memory stands out; decisions the ranks disagreed on; warnings and errors
from the ranks' logs, apart from the library warnings every rank raised alike (`library_notice`),
which are shown as notices, not findings. Nothing here writes: every read goes through a
``StoreReader``, and whether a rank departs, straggles or stands out in memory is decided by the
one judgement, ``judgement/ranks.py`` (its module docstring says how), which the page shows too
(`Findings.departing`).

Where the watch kept a verdict of the whole run and the store holds exactly the rows it judged
(query/kept_verdict.py), the departures and NaN/inf values are read from it, not from a pass over
the rows: the same findings, in a fraction of the time (``Findings.judged_from`` says which).
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from multirank_logger._util.background_import import import_in_background
from multirank_logger.judgement import ranks as judgement
from multirank_logger.judgement.cost import steps_after, straggler_cost
from multirank_logger.judgement.finding import Finding
from multirank_logger.judgement.origin import with_origin
from multirank_logger.judgement.places import finding_ranks, place_clause, rank_places
from multirank_logger.judgement.sentences import (
    KINDS,
    cost_clause,
    finding_sentence,
    followers_sentence,
    sentence_groups,
    series_of,
    steps_after_clause,
)
from multirank_logger.query.kept_verdict import kept_verdict
from multirank_logger.query.run_scan import RunScan, scan_run
from multirank_logger.query.side_tables import disagreements
from multirank_logger.query.step_buckets import BucketSummary
from multirank_logger.rows.run_ref import RunRef

if TYPE_CHECKING:
    from multirank_logger.query.reader import StoreReader

__all__ = ["Findings", "departures", "find", "find_with_buckets", "library_notice", "non_finite_lines", "outliers", "raised_alerts"]

#: warnings/errors listed at most (distinct messages)
MAX_LOG_MESSAGES = 20
#: warning and error records read at most (the first, in time order)
MAX_LOG_RECORDS = 100_000


#: each kind of finding the watch raises too (judgement/sentences.py), and its list in `Findings`
_KIND_LISTS = dict(zip(KINDS, ("non_finite", "outliers", "stragglers", "memory"), strict=True))


@dataclass
class Findings:
    """What ``multirank-logger report`` says about one run; lists of plain dicts, JSON-ready."""

    run: str
    run_id: int
    world_size: int
    #: the run's one identity everywhere (``runs.run_uuid``); None for a run from before schema 0007
    run_uuid: str | None = None
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
    #: what the watch raised during the run (the ``alerts`` table), each with ``in_report``:
    #: whether this report finds the same (rank, key, first step)
    alerts: list[dict[str, Any]] = field(default_factory=list)
    #: how `StopOnAlert` ended the run (``StoreReader.stopped_by``: its step and the alert), else None
    stopped_by: dict[str, Any] | None = None
    #: where the departures and NaN/inf values come from: ``"rows"`` (a pass over them) or
    #: ``"kept verdict"`` (the watch's of the whole run, for exactly the rows stored)
    judged_from: str = "rows"
    #: why a verdict kept at the run's end was not served (None: served, or none kept)
    verdict_not_served: str | None = None

    @property
    def problems(self) -> bool:
        """Whether anything was found (the ranks' table and the notes are no finding)."""
        return any((self.stragglers, self.outliers, self.non_finite, self.memory, self.decisions, self.log_messages))

    def verdict(self) -> list[Finding]:
        """Every finding of the four kinds the watch raises too, as typed records (judgement/finding.py),
        each kind's origins first."""
        return [Finding.from_item(kind, item) for kind, name in _KIND_LISTS.items() for item in getattr(self, name)]

    def departing(self, series: str) -> list[int]:
        """The ranks this report names under one of the page's series (a metric key, or
        ``timing:COLUMN``): outliers of a key, stragglers of a phase, memory of its measure."""
        return self.departing_by_series().get(series, [])

    def departing_by_series(self) -> dict[str, list[int]]:
        """`departing` for every series under which this report names a rank."""
        out: dict[str, set[int]] = {}
        for f in self.verdict():
            if f.kind != "non_finite":
                out.setdefault(f.series, set()).add(f.rank)
        return {series: sorted(ranks) for series, ranks in sorted(out.items())}

    def origins_by_series(self) -> dict[str, list[int]]:
        """Per series, the ranks where a problem several ranks show started (judgement/origin.py):
        the page marks their heatmap rows."""
        out: dict[str, set[int]] = {}
        for f in self.verdict():
            if f.spread and f.origin:
                out.setdefault(f.series, set()).add(f.rank)
        return {series: sorted(ranks) for series, ranks in sorted(out.items())}

    def places(self) -> dict[int, dict[str, Any]]:
        """Each rank's place (host, GPU) from the ranks' list: what `place_clause` words."""
        return rank_places(self.ranks)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, each finding with its ``sentence`` and ``series`` (judgement/sentences.py:
        what the page shows, and the chart it links to), its ``place`` and ``cost``."""
        out = asdict(self)
        places = self.places()
        for kind, name in _KIND_LISTS.items():
            for item in out[name]:
                item.update(sentence=finding_sentence(kind, item), series=series_of(kind, item), said_with=None)
                # where it lives, said beside the sentence (judgement/places.py: the watch knows no hosts)
                item["place"] = place_clause(finding_ranks([item]), places).removeprefix("; ") or None
                # what it cost, said beside the sentence (judgement/cost.py; the page shows it after it)
                cost = cost_clause(kind, [item]) or steps_after_clause(item)
                item["cost"] = cost.removeprefix("; ") or None
            # the ranks one sentence says together (every rank of a host going at one step; the
            # followers at one step): the first item carries the group's sentence, place and cost,
            # as the report's text says them; the others name it (``said_with``) and the page skips them
            for group in sentence_groups(kind, out[name]):
                if len(group) > 1:
                    head = group[0]
                    head["sentence"] = followers_sentence(kind, group)
                    head["place"] = place_clause(finding_ranks(group), places).removeprefix("; ") or None
                    cost = cost_clause(kind, group) or steps_after_clause(head)
                    head["cost"] = cost.removeprefix("; ") or None
                    for item in group[1:]:
                        item["said_with"] = head["rank"]
        return out


def find(reader: StoreReader, run: int | str | None = None, *, from_rows: bool = False) -> Findings:
    """Every finding for one run (the latest by default), read through ``reader``.

    ``multirank_logger.report.find(open_store(db), run=...)``; the CLI's ``report`` prints it.
    `from_rows`: judge the rows even where a verdict of the whole run was kept (see the module docstring).

    Raises:
        LookupFailed: for an unknown run.
    """
    return find_with_buckets(reader, run, from_rows=from_rows)[0]


def find_with_buckets(
    reader: StoreReader, run: int | str | None = None, bucket_columns: int = 0, *, from_rows: bool = False
) -> tuple[Findings, dict[str, BucketSummary]]:
    """``find``, and from the same pass over the rows each key's per-bucket summary (what the
    ui's page draws) when ``bucket_columns`` is set: ``report -o`` costs no second read (where
    the kept verdict is served, there is no pass: the caller summarizes each key)."""
    ref = reader.resolve_run(run)
    # the tables after the pass are pandas': its import runs beside the pass (report: ~0.3 s less)
    import_in_background("pandas")
    out = Findings(run=ref.label, run_id=ref.id, world_size=ref.world_size, run_uuid=ref.uuid)
    kept, out.verdict_not_served = (None, None) if from_rows else kept_verdict(reader.fetch_arrow, ref.id)
    if kept is not None:
        out.judged_from = "kept verdict"
        scan = RunScan(reader.keys(ref.id), rank_steps=kept.rank_steps, non_finite=kept.non_finite)
    else:
        # one pass over the run's rows, in windows of steps: the ranks' steps, NaN/inf, and per key
        # the per-step statistics and the values that may depart (query/run_scan.py)
        scan = scan_run(reader, ref, bucket_columns=bucket_columns)
    out.ranks = _ranks(reader, ref, scan.rank_steps)
    out.notes += holes_said(reader.calls_not_stored(ref.id))
    timing = reader.step_timing(ref)
    if len(timing):
        out.timing, out.stragglers = _timing(timing, ref.world_size)
        out.memory = _memory(timing, writers={0} if reader.transport(ref) == "gather" else set())
    else:
        out.memory = _device_stats_memory(reader, ref, scan.keys)
        out.notes.append("No step timing in this run: add multirank_logger.StepTimer() to the Trainer's callbacks.")
    out.non_finite = scan.non_finite
    if ref.world_size < judgement.MIN_RANKS:
        out.notes.append(f"Outlier ranks need {judgement.MIN_RANKS} ranks or more (this run has {ref.world_size}).")
    else:
        out.outliers = kept.departures if kept is not None else outliers(scan)
    _lead_with_origins(out)
    _nan_cost(out.non_finite, max((last for _, last in scan.rank_steps.values() if last is not None), default=None))
    out.decisions = _decisions(reader, ref)
    out.alerts = raised_alerts(reader, ref, out)
    out.stopped_by = reader.stopped_by(ref)
    messages = _log_messages(reader, ref)
    out.library_warnings = [m for m in messages if library_notice(m, ref.world_size)]
    out.log_messages = [m for m in messages if not library_notice(m, ref.world_size)]
    return out, scan.buckets


#: holes in the ranks' calls said one per line up to this many, then counted
HOLES_SAID = 8


def non_finite_lines(firsts_by_rank: dict[int, tuple[int, int]]) -> list[str]:
    """Where each rank's NaN/inf began ({rank: (first step, count)}) and which ranks logged one first."""
    firsts = sorted(firsts_by_rank.items(), key=lambda item: (item[1][0], item[0]))
    first = [str(rank) for rank, (step, _) in firsts if step == firsts[0][1][0]]
    return [
        "NaN or inf logged: " + "; ".join(f"rank {rank} from step {step:,} ({count:,} values)" for rank, (step, count) in firsts) + ".",
        f"{'Rank' if len(first) == 1 else 'Ranks'} {', '.join(first)} logged one first; `report` says whether it spread to the others.",
    ]


def holes_said(holes: list[Any]) -> list[str]:
    """The calls the store lacks (`StoreReader.calls_not_stored`), as the report's notes say them."""
    lines = [f"{hole}." for hole in holes[:HOLES_SAID]]
    if len(holes) > HOLES_SAID:
        rest = holes[HOLES_SAID:]
        lines.append(f"... and {len(rest)} more such gap(s) on {len({h.rank for h in rest})} rank(s), "
                     f"{sum(h.calls for h in rest)} call(s) in all.")
    return lines


def _lead_with_origins(found: Findings) -> None:
    """Each kind's findings ordered by where their problem started, the origin first, each with
    its ``origin`` and ``spread`` (judgement/origin.py)."""
    for kind, name in _KIND_LISTS.items():
        setattr(found, name, with_origin(getattr(found, name), functools.partial(series_of, kind), found.world_size))


def outliers(scan: RunScan) -> list[dict[str, Any]]:
    """The ranks departing persistently on each key of a run, from one pass over its rows:
    ``departures`` of each key's ``per_rank`` table, without the table."""
    out = []
    for key in scan.keys:
        if (steps := scan.per_key.get(key)) is None:
            continue
        found = judgement.judge_departures(steps)
        out += [{"rank": item.pop("rank"), "key": key, **item} for item in found]
    return out


def departures(table: Any, *, higher_only: bool = False) -> list[dict[str, Any]]:
    """``judgement.ranks.departures`` of a step x rank DataFrame (``StoreReader.per_rank``)."""
    return judgement.departures(table.index.to_numpy(), np.asarray(table.columns), table.to_numpy(dtype=float),
                                higher_only=higher_only)


def raised_alerts(reader: StoreReader, ref: RunRef, found: Findings) -> list[dict[str, Any]]:
    """The alerts the watch raised during the run, each with whether this report finds the same."""
    rows = reader.alerts(ref)
    named = {(f.kind, f.key, f.rank, f.first_step) for f in found.verdict()}
    out = []
    for r in rows.itertuples():
        first = None if r.first_step != r.first_step or r.first_step is None else int(r.first_step)
        item = {"kind": r.kind, "rank": int(r.rank), "key": r.key, "first_step": first,
                "step_seen": None if r.step_seen != r.step_seen else int(r.step_seen), "seen_at": float(r.seen_at),
                "message": r.message}
        item["in_report"] = None if r.kind == "stop" else (r.kind, r.key, item["rank"], first) in named
        out.append(item)
    return out


# -- each finding ----------------------------------------------------------------------------


def _ranks(reader: StoreReader, ref: RunRef, rank_steps: dict[int, tuple[int, int]]) -> list[dict[str, Any]]:
    registered = reader.rank_rows(ref)
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
                **{col: _place_value(getattr(reg, col, None)) for col in _PLACE_COLUMNS},
                "steps": log[0] if log is not None else 0,
                "last_step": log[1] if log is not None else None,
                "duration_s": float(ended - reg.started_at) if ended is not None and reg is not None else None,
            }
        )
    return out


#: a rank's place beyond its host (schema 0011, 0013; None for a rank from before them)
_PLACE_COLUMNS = ("gpu_index", "gpu_name", "gpu_uuid", "dp_rank", "slurm_node", "mesh")


def _place_value(value: Any) -> Any:
    """A place column's value: None for NULL (NaN in a number column), an int for an index."""
    if value is None or value != value:
        return None
    return value if isinstance(value, str) else int(value)


def _nan_cost(items: list[dict[str, Any]], last_step: int | None) -> None:
    """Each NaN/inf finding's ``steps_after``: the steps the run trained after its origin's first
    step (judgement/cost.py), `last_step` the run's last."""
    for item in items:
        origin_step = item["spread"]["origin_step"] if item.get("spread") else item["first_step"]
        item["steps_after"] = steps_after(origin_step, last_step)


def _timing(timing: Any, world_size: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per-rank medians of the step's parts, and the ranks whose data wait or forward stands out,
    each with what it cost (judgement/cost.py: the time every rank waited on it, the hours lost)."""
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
    phases = {}
    for phase in judgement.STRAGGLER_PHASES:
        # steps with gradient accumulation share a global_step: a step's time is their sum
        table = timing.dropna(subset=[phase]).pivot_table(index="step", columns="rank", values=phase, aggfunc="sum")
        phases[phase] = (table.index.to_numpy(), np.asarray(table.columns), table.to_numpy(dtype=float))
    stragglers = judgement.stragglers(phases, step_time)
    on_gpu = bool(timing["mem_reserved_peak"].notna().any())  # StepTimer timed the forward on CUDA
    for item in stragglers:
        steps, _, values = phases[f"{item['phase']}_s"]
        item.update(straggler_cost(steps, values, item["first_step"], item["last_step"], world_size, on_gpu))
    return summary, stragglers


def _memory(timing: Any, writers: set[int]) -> list[dict[str, Any]]:
    """Each rank's peak memory (CUDA reserved, else RSS) and CUDA allocation retries, judged by
    ``judgement.ranks.memory_outliers`` (the `writers` of the others' rows on RSS less an allowance)."""
    cuda = bool(timing["mem_reserved_peak"].notna().any())
    measure = judgement.memory_measure(cuda)
    peaks = timing.groupby("rank")[measure].max().dropna().astype(float)
    retries = timing.groupby("rank")["alloc_retries"].max().fillna(0).reindex(peaks.index).to_numpy() if cuda else None
    return judgement.memory_outliers(peaks.index.to_numpy(), peaks.to_numpy(), measure, retries, writers)


#: Lightning's DeviceStatsMonitor on CUDA logs torch.cuda.memory_stats() per rank, at each batch's end
DEVICE_STATS_PEAK = "DeviceStatsMonitor.on_train_batch_end/reserved_bytes.all.peak"
DEVICE_STATS_RETRIES = "DeviceStatsMonitor.on_train_batch_end/num_alloc_retries"


def _device_stats_memory(reader: StoreReader, ref: RunRef, keys: list[str]) -> list[dict[str, Any]]:
    """Without StepTimer, each rank's peak CUDA reserved memory as DeviceStatsMonitor logged it on
    every rank (its metric key is the measure), judged as `_memory` judges StepTimer's. On CPU the
    monitor logs the host's figures (psutil: the same on every rank of a node): nothing to judge."""
    if DEVICE_STATS_PEAK not in keys:
        return []
    peaks = reader.per_rank(DEVICE_STATS_PEAK, ref.id).max(axis=0).dropna().astype(float)
    retries = None
    if DEVICE_STATS_RETRIES in keys:
        retries = reader.per_rank(DEVICE_STATS_RETRIES, ref.id).max(axis=0).reindex(peaks.index).fillna(0).to_numpy()
    return judgement.memory_outliers(peaks.index.to_numpy(), peaks.to_numpy(), DEVICE_STATS_PEAK, retries)


def _decisions(reader: StoreReader, ref: RunRef) -> list[dict[str, Any]]:
    """Checkpoint/early-stopping decisions where the ranks' own votes differed."""
    rows = reader.decisions(ref)
    split = set(disagreements(rows))  # the one rule: `decisions` marks the same (judgement.ranks.votes_split)
    out = []
    for seq, group in rows.groupby("seq", sort=True):
        if seq not in split:
            continue
        votes = {int(r): _bool(v) for r, v in zip(group["rank"], group["vote"])}
        first = group.iloc[0]
        decision = _bool(first["decision"])
        out.append(
            {"seq": int(seq), "step": int(first["step"]), "callback": first["callback"], "monitor": first["monitor"],
             "decision": decision, "votes": votes,
             "values": {int(r): _float(v) for r, v in zip(group["rank"], group["value"])},
             "ranks": [r for r, v in votes.items() if v is not None and v != decision]}
        )
    return out


def _log_messages(reader: StoreReader, ref: RunRef) -> list[dict[str, Any]]:
    """Warnings and errors the ranks logged, one item per distinct message, first seen first."""
    rows = reader.logs(ref, level="WARNING", limit=MAX_LOG_RECORDS)
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows.itertuples():
        item = out.setdefault((r.level, r.message), {"level": r.level, "logger": r.logger, "message": r.message,
                                                     "ranks": [], "count": 0})
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
    import pandas as pd

    return None if pd.isna(value) else float(value)


def _bool(value: Any) -> bool | None:
    """A vote or decision (pandas' nullable boolean: NA where not recorded) as True, False or None."""
    import pandas as pd

    return None if pd.isna(value) else bool(value)
