"""``multirank-logger runs DB``: the runs as a table (without pandas: its import was most of the
command's time), CSV or JSON, with the hyperparameters asked for (``--show-params``) as columns."""

from __future__ import annotations

import datetime
import math
import time
from typing import Any

from multirank_logger._util.readable import duration_text, number_text, text_table
from multirank_logger.query.run_filter import param_text
from multirank_logger.rows.param_path import param_at, split_path

__all__ = ["runs_data_text", "runs_table_text", "status_text", "utc_seconds"]


def status_text(status: str, started_at: float, last_time: float | None, stopped_by: str | None, spilled: int,
                lost: int, unknown: int, side_spilled: int) -> str:
    """A running run with how long it has been silent: one killed outright (SIGKILL, the OOM
    killer) never records its end, and only its silence tells it from a live one. Any other
    run with why it stopped early (StopOnAlert) and what it lacks (an incomplete one: why it is
    not a success)."""
    if status != "running":
        lacks = [f"{spilled} value(s) in spill files" if spilled else "", f"{lost} lost" if lost else "",
                 f"{unknown} rank end(s) never heard" if unknown else "",
                 f"{side_spilled} side-table row(s) in spill files" if side_spilled else ""]
        lacks = [text for text in lacks if text]
        status = f"{status}, {stopped_by}" if stopped_by else status
        return f"{status} ({', '.join(lacks)})" if lacks else status
    now = time.time()
    if last_time is None:  # nothing stored yet
        return f"running (no value yet, started {duration_text(now - started_at)} ago)"
    return f"running (last value {duration_text(now - last_time)} ago)"


def lost_text(hours: float | None, unit: str | None) -> str:
    """A run's lost device time as the runs table shows it: "-" where its kept verdict names no
    straggler (or none was kept), "(CPU)" after rank-hours of CPU ranks."""
    if hours is None or hours != hours:
        return "-"
    return number_text(hours) + ("" if unit == "GPU-hours" else " (CPU)")


def utc_seconds(seconds: float) -> str:
    """Unix seconds as ``2026-11-26 22:58:41`` (UTC, the second it falls in)."""
    return datetime.datetime.fromtimestamp(math.floor(seconds), datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _shown(params: dict[int, dict[str, Any]], run_id: int, key: str) -> str:
    """A run's hyperparameter `key` as a column shows it; "-" where the run has none."""
    found, value = param_at(params.get(run_id, {}), split_path(key))
    return param_text(value) if found else "-"


def runs_table_text(rows: list[dict[str, Any]], params: dict[int, dict[str, Any]] | None = None,
                    shown: tuple[str, ...] = ()) -> str:
    """`StoreReader.run_rows` as one line per run (the uuid, 36 characters, only in CSV and JSON:
    the table stays one readable line per run); each key of `shown` a column of `params`' values."""
    columns: dict[str, list[Any]] = {
        "id": [r["id"] for r in rows],
        "run": [r["run"] for r in rows],
        "status": [status_text(r["status"], r["started_at"], r["last_time"], r["stopped_by"], r["values_spilled"],
                               r["values_lost"], r["ends_unknown"], r["side_rows_spilled"]) for r in rows],
        "ranks": [r["world_size"] for r in rows],
        "started (UTC)": [utc_seconds(r["started_at"]) for r in rows],
        "duration": [duration_text(r["duration_s"]) for r in rows],
        "steps": [r["steps"] for r in rows],
        "keys": [r["keys"] for r in rows],
        # what its stragglers cost, from its kept verdict (query/run_list.read_lost_hours); "(CPU)": rank-hours
        "lost GPU-h": [lost_text(r.get("lost_hours"), r.get("lost_hours_unit")) for r in rows],
    }
    for key in shown:
        columns[key if key not in columns else f"param {key}"] = [_shown(params or {}, r["id"], key) for r in rows]
    return text_table(columns)


def runs_data_text(df: Any, fmt: str, params: dict[int, dict[str, Any]] | None = None, shown: tuple[str, ...] = ()) -> str:
    """`runs --format csv|json`: every column of `StoreReader.runs`, times as ISO 8601 UTC, then each
    key of `shown` as a column ``param.KEY`` (its value as JSON in JSON, as `param_text` in CSV)."""
    for column in ("started", "last_value"):
        df[column] = [None if t is None or t != t else t.isoformat() for t in df[column]]
    for key in shown:
        held = [param_at((params or {}).get(int(i), {}), split_path(key)) for i in df["id"]]
        df[f"param.{key}"] = [(value if fmt == "json" else param_text(value)) if found else None
                              for found, value in held]
    if fmt == "csv":
        return str(df.to_csv(index=False, lineterminator="\n"))
    return str(df.to_json(orient="records", force_ascii=False)) + "\n"
