"""Read side of the side tables: checkpoint / early-stopping decisions, every rank's log, StepTimer's
step timing; and the rows of a run's ranks and its transport, as the report reads them.

`read_decisions`, `read_logs`, `read_step_timing`, `read_rank_rows` and `read_transport` build the
queries and shape their frames; `StoreReader` (``query/reader.py``) delegates to them with its
``fetch_arrow``, so ``open_store(db).decisions()``, ``.logs()``, ``.step_timing()`` sit beside ``.metrics()``. The pure helpers below (`disagreements`,
`group_alike`, `format_ranks`) shape those frames for the CLI and for anyone reading them.
`read_timing_series` and `read_rank_nodes` answer a run's page header: its StepTimer series, its ranks' nodes.

Example::

    store = open_store("runs.duckdb")
    d = store.decisions()                 # one row per (decision, rank)
    d[d.seq.isin(disagreements(d))]       # the decisions where the ranks voted differently
    group_alike(store.logs(level="INFO")) # a message every rank logged: one row, all its ranks
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import sqlalchemy as sa

from multirank_logger._util.readable import format_ranks
from multirank_logger.ddp.log_capture import level_number
from multirank_logger.errors import LookupFailed
from multirank_logger.judgement.ranks import votes_split
from multirank_logger.rows.run_ref import RunRef
from multirank_logger.rows.schema import (
    SEQ_ATTEMPT_SHIFT,
    alerts,
    decisions,
    findings,
    fits_bigint,
    logs,
    ranks,
    runs,
    step_timing,
)

__all__ = ["FINDING_COLUMNS", "disagreements", "format_ranks", "group_alike", "read_alerts", "read_decisions", "read_findings", "read_logs", "read_rank_nodes",
           "read_rank_rows", "read_step_timing", "read_stops", "read_timing_columns", "read_timing_series", "read_transport",
           "stop_text"]

#: runs a SELECT and returns a pyarrow Table (``StoreReader.fetch_arrow``)
FetchArrow = Callable[[sa.Select], Any]

DECISION_COLUMNS = ("seq", "step", "epoch", "callback", "monitor", "mode", "rank", "value", "vote", "decision",
                    "path", "best", "time")
LOG_COLUMNS = ("rank", "seq", "time", "level", "levelno", "logger", "message")
TIMING_COLUMNS = ("rank", "seq", "step", "epoch", "batch_idx", "data_s", "forward_s", "rest_s", "batch_size",
                  "mem_allocated_peak", "mem_reserved_peak", "alloc_retries", "rss", "time")
RANK_COLUMNS = ("rank", "host", "status", "started_at", "ended_at", "gpu_index", "gpu_name", "gpu_uuid", "dp_rank",
               "slurm_node", "mesh")
ALERT_COLUMNS = ("seq", "kind", "rank", "key", "first_step", "step_seen", "seen_at", "value", "message", "detail")


def read_alerts(fetch_arrow: FetchArrow, run: RunRef | None) -> Any:
    """A run's alerts (what the watch raised during it), in the order raised: ``StoreReader.alerts``;
    None: every run's, by run, with ``run_id`` first."""
    if run is not None:
        stmt = sa.select(*(alerts.c[name] for name in ALERT_COLUMNS)).where(alerts.c.run_id == run.id).order_by(alerts.c.seq)
        return _frame(fetch_arrow, stmt, ALERT_COLUMNS)
    columns = ("run_id", *ALERT_COLUMNS)
    return _frame(fetch_arrow, sa.select(*(alerts.c[name] for name in columns)).order_by(alerts.c.run_id, alerts.c.seq), columns)


#: the columns of a run's kept verdict (the ``findings`` table; ``launch``: the launch that kept it)
FINDING_COLUMNS = ("run_id", "launch", "seq", "kind", "rank", "series", "first_step", "origin", "origin_step", "value",
                   "sentence", "found_at", "detail")


def read_findings(fetch_arrow: FetchArrow, run_ids: Iterable[int] | None = None) -> Any:
    """The verdicts kept at the runs' ends (of `run_ids`; None: every run), by run, origins first:
    ``StoreReader.findings``. A resumed run kept one per launch: its last launch's is its verdict."""
    f = findings.c
    stmt = sa.select(*(f[name] for name in FINDING_COLUMNS if name != "launch")).order_by(f.run_id, f.seq)
    if run_ids is not None:
        stmt = stmt.where(f.run_id.in_(list(run_ids)))
    df = fetch_arrow(stmt).to_pandas()
    if not len(df.columns):
        return df.reindex(columns=list(FINDING_COLUMNS))
    df["launch"] = df["seq"].astype("int64") // (1 << SEQ_ATTEMPT_SHIFT)
    last = df.groupby("run_id")["launch"].transform("max")
    df["origin"] = df["origin"].astype(bool)
    return df[df["launch"] == last][list(FINDING_COLUMNS)].reset_index(drop=True)


#: the callback whose stop `read_stops` reads (callbacks/stop_on_alert.py; this layer does not import it)
STOP_CALLBACK = "StopOnAlert"


def read_stops(fetch_arrow: FetchArrow, run_ids: Iterable[int] | None = None) -> dict[int, dict[str, Any]]:
    """The runs `StopOnAlert` ended (of `run_ids`; None: every run), each with the step and the alert it
    stopped for, from the stored rows: rank 0's alert of kind ``stop`` (the alert's kind, key,
    rank and first step), else the callback's ``decisions`` rows (every rank records one in each
    MultiRankLogger; rank 0's names the alert as its monitor, ``kind:key:rank N``).

    Returns:
        run id -> ``{"step", "alert_kind", "key", "rank", "first_step", "monitor"}`` (None where not known).
    """
    import json

    a, d = alerts.c, decisions.c
    by_alert = sa.select(a.run_id, a.step_seen, a.key, a.rank, a.first_step, a.detail).where(a.kind == "stop")
    by_decision = sa.select(d.run_id, d.step, d.monitor).where(d.callback == STOP_CALLBACK, d.decision.is_(True))
    if run_ids is not None:
        ids = [int(i) for i in run_ids]
        by_alert, by_decision = by_alert.where(a.run_id.in_(ids)), by_decision.where(d.run_id.in_(ids))
    out: dict[int, dict[str, Any]] = {}
    # each run's first stop (a later fit of the same run may stop again); rank 0's row names the alert
    for run_id, step, monitor in sorted(_rows(fetch_arrow(by_decision)), key=lambda r: (r[0], r[1], r[2] is None)):
        if run_id not in out:
            out[run_id] = {"step": step, "first_step": None, "monitor": monitor, **_monitored(monitor)}
    for run_id, step, key, rank, first_step, detail in sorted(_rows(fetch_arrow(by_alert)), key=lambda r: (r[0], r[1])):
        known = out.get(run_id)
        if known is not None and (known["first_step"] is not None or known["step"] != step):
            continue  # its first stop's alert is in already, or this alert is a later stop's
        kind = (json.loads(detail) if detail else {}).get("alert_kind")
        out[run_id] = {"step": step, "alert_kind": kind, "key": key, "rank": rank, "first_step": first_step,
                       "monitor": None if known is None else known["monitor"]}
    return out


def _monitored(monitor: str | None) -> dict[str, Any]:
    """The alert a StopOnAlert decision row names as its monitor (``kind:key:rank N``; the key may
    hold colons, ``timing:data_s``): its kind, key and rank, each None when the row names none."""
    head, sep, rank = (monitor or "").rpartition(":rank ")
    kind, colon, key = head.partition(":")
    if not (sep and colon and rank.isdigit()):
        return {"alert_kind": None, "key": None, "rank": None}
    return {"alert_kind": kind, "key": key, "rank": int(rank)}


def _rows(table: Any) -> list[tuple[Any, ...]]:
    return list(zip(*(table.column(i).to_pylist() for i in range(table.num_columns)))) if table.num_rows else []


def stop_text(stop: dict[str, Any]) -> str:
    """A `read_stops` entry in words: ``stopped by StopOnAlert at step 64 (departure alert: rank 1,
    train_loss, from step 60)``."""
    head = f"stopped by {STOP_CALLBACK} at step {stop['step']:,}"
    if stop["alert_kind"] is not None:
        first = "" if stop["first_step"] is None else f", from step {stop['first_step']:,}"
        return f"{head} ({stop['alert_kind']} alert: rank {stop['rank']}, {stop['key']}{first})"
    return f"{head} ({stop['monitor']})" if stop["monitor"] else head


def read_decisions(fetch_arrow: FetchArrow, run: RunRef) -> Any:
    """A run's decisions, one row per (decision, rank): ``StoreReader.decisions`` (its columns)."""
    stmt = (
        sa.select(*(decisions.c[name] for name in DECISION_COLUMNS))
        .where(decisions.c.run_id == run.id)
        .order_by(decisions.c.seq, decisions.c.rank)
    )
    df = _frame(fetch_arrow, stmt, DECISION_COLUMNS)
    for name in ("vote", "decision"):  # SQLite hands back 0/1
        df[name] = df[name].astype("boolean")
    return df


def read_logs(fetch_arrow: FetchArrow, run: RunRef, rank: int | None = None, level: int | str | None = None,
              limit: int | None = None) -> Any:
    """A run's log records, in time order (the first `limit`): ``StoreReader.logs`` (its columns and filters).

    Raises:
        ValueError: for a level name logging does not know.
    """
    stmt = sa.select(*(logs.c[name] for name in LOG_COLUMNS)).where(logs.c.run_id == run.id)
    if rank is not None:
        # past 64 bits no rank has it (and the driver would overflow binding it)
        stmt = stmt.where(logs.c.rank == int(rank) if fits_bigint(int(rank)) else sa.false())
    if level is not None:
        stmt = stmt.where(logs.c.levelno >= level_number(level))
    return _frame(fetch_arrow, stmt.order_by(logs.c.time, logs.c.rank, logs.c.seq).limit(limit), LOG_COLUMNS)


def read_step_timing(fetch_arrow: FetchArrow, run: RunRef) -> Any:
    """A run's StepTimer rows (``TIMING_COLUMNS``; NaN where not measured), in no order."""
    stmt = sa.select(*(step_timing.c[name] for name in TIMING_COLUMNS)).where(step_timing.c.run_id == run.id)
    return _frame(fetch_arrow, stmt, TIMING_COLUMNS)


#: StepTimer's measured columns, each a series ``timing:COLUMN`` (as the page and the report name them)
TIMING_MEASURES = ("data_s", "forward_s", "rest_s", "batch_size", "mem_allocated_peak", "mem_reserved_peak",
                   "alloc_retries", "rss")


def read_timing_columns(fetch_arrow: FetchArrow, run: RunRef, series: str, keys: list[str]) -> tuple[Any, ...]:
    """``timing:COLUMN`` of every rank as (rank, seq, step, value, dtype) columns, as a key's rows
    (``rank_spread.pivot_step_rank`` takes them); ``keys``: the run's, named when there is no such series.

    Raises:
        LookupFailed: for a column StepTimer does not measure, or one this run has no value of.
    """
    import numpy as np

    column = series.split(":", 1)[1]
    if column not in TIMING_MEASURES:
        raise LookupFailed("key", series, keys + [f"timing:{c}" for c in TIMING_MEASURES])
    stmt = (sa.select(step_timing.c.rank, step_timing.c.seq, step_timing.c.step, sa.cast(step_timing.c[column], sa.Float(53)))
            .where(step_timing.c.run_id == run.id, step_timing.c[column].is_not(None)))
    table = fetch_arrow(stmt)
    if not table.num_rows:
        raise LookupFailed("key", series, keys + ["(no StepTimer values in this run: add multirank_logger.StepTimer())"])
    rank, seq, step, value = (np.asarray(table.column(i).to_numpy(), dtype=t) for i, t in enumerate(("int64", "int64", "int64", "float64")))
    return rank, seq, step, value, np.zeros(len(rank), np.int8)


def read_timing_series(fetch_arrow: FetchArrow, run_id: int, among: Iterable[str]) -> list[str]:
    """The series of ``among`` (``timing:COLUMN``) the run holds a StepTimer value of, in that order."""
    among = list(among)
    if not among:
        return []
    counts = fetch_arrow(
        sa.select(*(sa.func.count(step_timing.c[s.split(":", 1)[1]]).label(s) for s in among)).where(step_timing.c.run_id == run_id)
    ).to_pylist()[0]
    return [s for s in among if counts[s]]


def read_rank_rows(fetch_arrow: FetchArrow, run: RunRef) -> Any:
    """The run's registered ranks (``RANK_COLUMNS``: rank, host, status, started_at, ended_at, the
    GPU's index, name and UUID, the data-parallel index)."""
    stmt = sa.select(*(ranks.c[name] for name in RANK_COLUMNS)).where(ranks.c.run_id == run.id).order_by(ranks.c.rank)
    return _frame(fetch_arrow, stmt, RANK_COLUMNS)


def read_rank_nodes(fetch_arrow: FetchArrow, run_id: int) -> list[dict[str, Any]]:
    """The run's registered ranks' ``rank``, ``node_rank``, ``host``, ``gpu_index``, ``gpu_name`` and
    ``mesh`` (None where not known), in no order."""
    stmt = sa.select(ranks.c.rank, ranks.c.node_rank, ranks.c.host, ranks.c.gpu_index, ranks.c.gpu_name,
                     ranks.c.mesh).where(ranks.c.run_id == run_id)
    return list(fetch_arrow(stmt).to_pylist())


def read_transport(fetch_arrow: FetchArrow, run: RunRef) -> str | None:
    """How the run's rows reached the store (``runs.transport``: ``direct``, ``gather``, ...)."""
    found = fetch_arrow(sa.select(runs.c.transport).where(runs.c.id == run.id)).column(0).to_pylist()
    return found[0] if found else None


def _frame(fetch_arrow: FetchArrow, stmt: sa.Select, columns: Iterable[str]) -> Any:
    df = fetch_arrow(stmt).to_pandas()
    return df[list(columns)] if len(df.columns) else df.reindex(columns=list(columns))


def disagreements(decided: Any) -> list[int]:
    """The decisions (``seq``) of a `StoreReader.decisions` frame where the ranks' votes differ
    (`judgement.ranks.votes_split`: the report's rule too)."""
    import pandas as pd

    out = []
    for seq, group in decided.groupby("seq", sort=True):
        votes = [None if pd.isna(v) else bool(v) for v in group["vote"]]
        if votes_split(str(group.iloc[0]["callback"]), votes):
            out.append(int(seq))
    return out


def group_alike(records: Any) -> Any:
    """Log records that several ranks logged alike, as one row with the ranks that logged it.

    The n-th time each rank logged one (level, logger, message) are taken as one message: a
    banner every rank prints once is one row with every rank; a line repeated is one row per
    repetition.

    Returns:
        Columns ``time`` (the earliest rank's), ``level``, ``levelno``, ``logger``,
        ``message``, ``ranks`` (a sorted list); in time order.
    """
    import pandas as pd

    if records.empty:
        return pd.DataFrame(columns=["time", "level", "levelno", "logger", "message", "ranks"])
    same = ["level", "levelno", "logger", "message"]
    df = records.assign(nth=records.groupby(["rank", *same]).cumcount())
    grouped = df.groupby([*same, "nth"], sort=False).agg(time=("time", "min"), ranks=("rank", lambda r: sorted(set(r))))
    out = grouped.reset_index().sort_values("time", kind="stable").reset_index(drop=True)
    return out[["time", "level", "levelno", "logger", "message", "ranks"]]
