"""The runs list (``StoreReader.runs``): one row per run, its steps, keys and last value read from the
step summaries kept beside the rows (store/step_summaries.py: about 1/16 of the rows), never a
scan of the metrics, so the list costs the same at 51M rows as at 1B. Also the page's list
(`read_run_headers`: each run's nodes and last step), which the page asks for every 2 s."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa

from multirank_logger._util.arrow_numpy import column_numpy
from multirank_logger.query.side_tables import read_stops, stop_text
from multirank_logger.rows.schema import SEQ_ATTEMPT_SHIFT, findings, ranks, runs, step_summaries
from multirank_logger.store.status import ends_unknown

__all__ = ["read_last_step", "read_lost_hours", "read_run_headers", "read_run_rows", "read_runs"]


#: up to this many runs, each run's keys and last time are read with ``WHERE run_id = ?`` (DuckDB
#: answers its latest time from statistics, its keys from its row groups alone: 0.05 s at 1B rows,
#: where one ``GROUP BY run_id`` over every run's summaries took 0.4-0.5 s); past it, one GROUP BY
PER_RUN_READS = 32


def _side_rows_spilled() -> Any:
    """SQL, for the ``runs`` row of the query: its ranks' side-table rows in spill files, not imported yet."""
    return (sa.select(sa.func.coalesce(sa.func.sum(ranks.c.side_rows_spilled), 0)).where(ranks.c.run_id == runs.c.id)
            .scalar_subquery().label("side_rows_spilled"))


def _runs_select(where: Sequence[Any] = ()) -> sa.Select:
    """The runs (those meeting `where`: query/run_filter.py), without what their summaries say (`_summary_facts`)."""
    return (
        sa.select(runs.c.id, runs.c.name, runs.c.version, runs.c.version_name, runs.c.status, runs.c.world_size,
                  runs.c.started_at, runs.c.ended_at, runs.c.values_spilled, runs.c.values_lost,
                  _side_rows_spilled(), ends_unknown().label("n_ends_unknown"), runs.c.run_uuid)
        .where(*where).order_by(runs.c.id)
    )


def _summary_facts(fetch_arrow: Callable[[sa.Select], Any], run_ids: list[int]) -> dict[int, tuple[int, float | None]]:
    """Per run of `run_ids`: its keys' count and its latest value's time, from the summaries kept
    beside the rows (store/step_summaries.py: about 1/16 of them); runs with none left out."""
    s = step_summaries.c
    n_keys, last_time = sa.func.count(sa.distinct(s.key)), sa.func.max(s.last_time)
    if len(run_ids) <= PER_RUN_READS:
        # a subquery each: together in one SELECT, DuckDB no longer takes the max from statistics (0.24-0.34 s)
        found = [fetch_arrow(sa.select(sa.select(n_keys).where(s.run_id == run_id).scalar_subquery().label("n_keys"),
                                       sa.select(last_time).where(s.run_id == run_id).scalar_subquery().label("last_time"))
                             ).to_pylist()[0] | {"run_id": run_id} for run_id in run_ids]
    else:
        found = fetch_arrow(sa.select(s.run_id, n_keys.label("n_keys"), last_time.label("last_time")).group_by(s.run_id)).to_pylist()
    return {int(f["run_id"]): (int(f["n_keys"]), float(f["last_time"])) for f in found if f["n_keys"]}


def read_last_step(fetch_arrow: Callable[[sa.Select], Any], run_id: int) -> tuple[int | None, float | None]:
    """A run's last logged step (any rank) and its latest value's time, from its summaries: the
    last bucket's masks give the step. The page's runs list asks every 2 s; from the rows it was a
    pass over every row of the run on SQLite and PostgreSQL (no index leads with the step)."""
    s = step_summaries.c
    last_bucket = sa.select(sa.func.max(s.step)).where(s.run_id == run_id).scalar_subquery()
    found = fetch_arrow(sa.select(s.step, s.steps_mask,
                                  sa.select(sa.func.max(s.last_time)).where(s.run_id == run_id).scalar_subquery().label("t"))
                        .where(s.run_id == run_id, s.step == last_bucket)).to_pylist()
    if not found:
        return None, None
    mask = 0
    for row in found:
        mask |= int(row["steps_mask"])
    return int(found[0]["step"]) + mask.bit_length() - 1, float(found[0]["t"])


def read_run_headers(fetch_arrow: Callable[[sa.Select], Any], only: int | None = None) -> list[dict[str, Any]]:
    """Each run's row as the page lists it, newest first (``only``: that run's, none if no such run):
    the ``runs`` columns it shows, ``n_nodes`` (None for a run with no ranks registered),
    ``last_step`` and ``last_time`` (`read_last_step`), ``stopped_by`` (`stop_text`, else None) and
    ``hparams`` (the stored JSON text, None where none)."""
    per_rank = (
        # a node is its host, else its node rank
        sa.select(ranks.c.run_id,
                  sa.func.count(sa.distinct(sa.func.coalesce(ranks.c.host, sa.cast(ranks.c.node_rank, sa.String)))).label("n_nodes"))
        .group_by(ranks.c.run_id).subquery()
    )
    stmt = (
        sa.select(runs.c.id, runs.c.name, runs.c.version, runs.c.version_name, runs.c.status, runs.c.world_size,
                  runs.c.transport, runs.c.started_at, runs.c.ended_at, per_rank.c.n_nodes, runs.c.run_uuid, runs.c.hparams)
        .select_from(runs.outerjoin(per_rank, per_rank.c.run_id == runs.c.id))
        .order_by(runs.c.id.desc())
    )
    if only is not None:
        stmt = stmt.where(runs.c.id == only)
    # of the one run a run's page asks for, only its stop
    stops = read_stops(fetch_arrow, None if only is None else [only])
    out = []
    for row in fetch_arrow(stmt).to_pylist():
        row["last_step"], row["last_time"] = read_last_step(fetch_arrow, row["id"])
        row["stopped_by"] = stop_text(stops[row["id"]]) if row["id"] in stops else None
        out.append(row)
    return out


def _steps_select() -> sa.Select:
    s = step_summaries.c
    return sa.select(s.run_id, s.step, s.steps_mask).where(s.rank == 0)


def read_runs(fetch_arrow: Callable[[sa.Select], Any], where: Sequence[Any] = ()) -> Any:
    """The runs (those meeting `where`), as ``StoreReader.runs`` documents them (a pandas DataFrame)."""
    import pandas as pd

    df = fetch_arrow(_runs_select(where)).to_pandas()
    facts = _summary_facts(fetch_arrow, [int(i) for i in df["id"]])
    df["n_keys"] = df["id"].map(lambda i: facts[i][0] if i in facts else None)
    df["last_time"] = df["id"].map(lambda i: facts[i][1] if i in facts else None).astype("float64")
    df["n_steps"] = df["id"].map(_rank0_steps(fetch_arrow(_steps_select())))
    stops, lost = _stops(fetch_arrow), read_lost_hours(fetch_arrow)
    end = df["ended_at"].astype("float64").fillna(df["last_time"].astype("float64"))
    out = pd.DataFrame(
        {
            "id": df["id"].astype("int64"),
            "run": [f"{n}/{vn}" if isinstance(vn, str) else f"{n}/version_{v}" for n, v, vn in zip(df["name"], df["version"], df["version_name"])],
            "name": df["name"],
            "version": df["version"].astype("int64"),
            "status": df["status"],
            "world_size": df["world_size"].astype("int64"),
            "started": pd.to_datetime(df["started_at"].astype("float64"), unit="s", utc=True),
            "duration_s": end - df["started_at"].astype("float64"),
            "steps": _counts(df["n_steps"]),
            "keys": _counts(df["n_keys"]),
            # a "running" run whose last value is hours old has likely died unrecorded (SIGKILL)
            "last_value": pd.to_datetime(df["last_time"].astype("float64"), unit="s", utc=True),
            "values_spilled": _counts(df["values_spilled"]),
            "values_lost": _counts(df["values_lost"]),
            "side_rows_spilled": _counts(df["side_rows_spilled"]),
            "ends_unknown": _counts(df["n_ends_unknown"]),
            # why the run ended before its end: StopOnAlert's stop (its step and alert), else None
            "stopped_by": pd.Series([stops.get(int(i)) for i in df["id"]], index=df.index, dtype="object"),
            # the device time its stragglers cost, from its kept verdict (read_lost_hours); None: none kept
            "lost_hours": pd.Series([lost.get(int(i), (None, None))[0] for i in df["id"]], index=df.index, dtype="float64"),
            "lost_hours_unit": pd.Series([lost.get(int(i), (None, None))[1] for i in df["id"]], index=df.index, dtype="object"),
            "uuid": df["run_uuid"].astype("object").where(df["run_uuid"].notna(), None),
        }
    )
    return out


def read_run_rows(fetch_arrow: Callable[[sa.Select], Any], where: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """`read_runs`' columns as one dict per run (those meeting `where`), without pandas (its import is most of the CLI's
    ``runs``): times as Unix seconds (``started_at``; ``last_time``, None if nothing stored),
    ``duration_s`` NaN where unknown, counts 0 where none."""
    steps, stops, lost = _rank0_steps(fetch_arrow(_steps_select())), _stops(fetch_arrow), read_lost_hours(fetch_arrow)
    listed = fetch_arrow(_runs_select(where)).to_pylist()
    facts = _summary_facts(fetch_arrow, [int(r["id"]) for r in listed])
    out = []
    for r in listed:
        r["n_keys"], r["last_time"] = facts.get(int(r["id"]), (0, None))
        end = r["ended_at"] if r["ended_at"] is not None else r["last_time"]
        out.append(
            {"id": int(r["id"]),
             "run": f"{r['name']}/{r['version_name']}" if isinstance(r["version_name"], str) else f"{r['name']}/version_{r['version']}",
             "name": r["name"], "version": int(r["version"]), "status": r["status"], "world_size": int(r["world_size"]),
             "started_at": float(r["started_at"]),
             "duration_s": math.nan if end is None else float(end) - float(r["started_at"]),
             "steps": steps.get(int(r["id"]), 0), "keys": int(r["n_keys"] or 0),
             "last_time": None if r["last_time"] is None else float(r["last_time"]),
             "values_spilled": int(r["values_spilled"] or 0), "values_lost": int(r["values_lost"] or 0),
             "side_rows_spilled": int(r["side_rows_spilled"] or 0), "ends_unknown": int(r["n_ends_unknown"] or 0), "stopped_by": stops.get(int(r["id"])), "uuid": r["run_uuid"],
             "lost_hours": lost.get(int(r["id"]), (None, None))[0], "lost_hours_unit": lost.get(int(r["id"]), (None, None))[1]}
        )
    return out


def read_lost_hours(fetch_arrow: Callable[[sa.Select], Any]) -> dict[int, tuple[float, str]]:
    """Per run whose kept verdict (the ``findings`` table, its last launch's) names a straggler:
    the device time its stragglers cost (judgement/cost.py's ``rank_hours``, which the watch keeps
    in each finding's detail) and its unit (GPU-hours, or rank-hours on CPU). The stragglers of one
    phase over the same steps (a whole host) each count those steps, so per phase the largest is
    taken, and the phases are added: at least what the run lost, and exactly that where one
    straggler (or one host's ranks together) straggled in a phase. One read of the straggler rows
    of every run, whatever the number of runs (no metric row)."""
    f = findings.c
    rows = fetch_arrow(sa.select(f.run_id, f.seq, f.series, f.detail).where(f.kind == "straggler")).to_pylist()
    last: dict[int, int] = {}
    for row in rows:
        run_id, launch = int(row["run_id"]), int(row["seq"]) >> SEQ_ATTEMPT_SHIFT
        last[run_id] = max(last.get(run_id, launch), launch)
    per_phase: dict[tuple[int, str], float] = {}
    units: dict[int, str] = {}
    for row in rows:
        run_id = int(row["run_id"])
        if int(row["seq"]) >> SEQ_ATTEMPT_SHIFT != last[run_id]:
            continue  # an earlier launch's verdict (a resumed run keeps its last)
        try:
            detail = json.loads(row["detail"] or "{}")
        except ValueError:
            continue
        hours = detail.get("rank_hours") if isinstance(detail, dict) else None
        if not isinstance(hours, (int, float)) or isinstance(hours, bool) or not math.isfinite(hours):
            continue  # kept before the watch said a cost
        at = (run_id, str(row["series"]))
        per_phase[at] = max(per_phase.get(at, 0.0), float(hours))
        units[run_id] = str(detail.get("hours_unit") or "rank-hours")
    out: dict[int, tuple[float, str]] = {}
    for (run_id, _), hours in per_phase.items():
        out[run_id] = (out.get(run_id, (0.0, ""))[0] + hours, units[run_id])
    return out


def _stops(fetch_arrow: Callable[[sa.Select], Any]) -> dict[int, str]:
    """Per run StopOnAlert ended: why, in words (``stopped_by``)."""
    return {run_id: stop_text(stop) for run_id, stop in read_stops(fetch_arrow).items()}


def _rank0_steps(cells: Any) -> dict[int, int]:
    """Per run, the distinct steps rank 0 logged, from its summaries (run_id, step, steps_mask):
    each bucket's masks OR-ed (a bucket written by several inserts has several rows), then counted."""
    import numpy as np

    if not cells.num_rows:
        return {}
    # (not pyarrow's to_numpy, which imports pandas)
    run_id, step, mask = (column_numpy(cells.column(c), null=0).astype(np.int64, copy=False)
                          for c in ("run_id", "step", "steps_mask"))
    order = np.lexsort((step, run_id))
    run_id, step, mask = run_id[order], step[order], mask[order]
    starts = np.flatnonzero(np.r_[True, (run_id[1:] != run_id[:-1]) | (step[1:] != step[:-1])])
    merged = np.bitwise_or.reduceat(mask, starts).astype("<u2")
    bits = np.unpackbits(merged.view(np.uint8)).reshape(len(merged), 16).sum(axis=1)
    runs_, first = np.unique(run_id[starts], return_index=True)
    return dict(zip(runs_.tolist(), np.add.reduceat(bits, first).tolist()))


def _counts(column: Any) -> Any:
    """A count column with NULL for none, as int64 0 for none. Numeric first: pandas 2.x warns
    (FutureWarning) when fillna downcasts an all-NULL object column."""
    import pandas as pd

    return pd.to_numeric(column).fillna(0).astype("int64")


def read_step_clock(fetch_arrow: Callable[[sa.Select], Any], run_id: int) -> tuple[list[int], list[float]]:
    """The run's clock, from its step summaries (no metric row): per bucket of ``SUMMARY_STEPS``
    steps, its first step and the latest unix time any rank logged a value in it, in step order.
    The compare page's wall-time axis reads a step's time from it (ui/views.clock_view)."""
    c = step_summaries.c
    found = fetch_arrow(sa.select(c.step, sa.func.max(c.last_time).label("t")).where(c.run_id == run_id)
                        .group_by(c.step).order_by(c.step))
    return [int(s) for s in found.column(0).to_pylist()], [float(t) for t in found.column(1).to_pylist()]
