"""Exported rows compared with the store's, whichever engine read them back (DuckDB, Polars,
pyarrow, Spark): each row by its value's bits and its time in microseconds; and the store the
export tests read (`build_two_runs`)."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from multirank_logger import open_store
from multirank_logger.store.sql_store import Store
from tests.helpers.logged_calls import store_calls, trainer_calls

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
COLUMNS = ("run_id", "rank", "seq", "step", "key", "value", "dtype", "time")


def micros(t: Any) -> int:
    """A time as microseconds since the epoch: a timezone-aware datetime (pyarrow, Polars, pandas),
    or Spark's ``unix_micros``; a naive datetime or a float fails (times are UTC timestamps)."""
    if isinstance(t, int):
        return t
    assert isinstance(t, datetime) and t.utcoffset() == timedelta(0), repr(t)
    return (t - EPOCH) // timedelta(microseconds=1)


def comparable_row(d: dict[str, Any]) -> tuple[Any, ...]:
    """A row comparable across engines: the value by its bits (NaN, -0.0, inf), the time in microseconds."""
    value = d["value"]
    return (int(d["run_id"]), int(d["rank"]), int(d["seq"]), int(d["step"]), d["key"],
            "nan" if value is None or math.isnan(value) else float(value).hex(), int(d["dtype"]), micros(d["time"]))


def comparable_rows(columns: dict[str, list[Any]]) -> list[tuple[Any, ...]]:
    return sorted(comparable_row(dict(zip(COLUMNS, values))) for values in zip(*(columns[c] for c in COLUMNS)))


def stored_rows(db: Path) -> list[tuple[Any, ...]]:
    """Every stored metric row of every run, through the reader's Arrow frame."""
    out: list[tuple[Any, ...]] = []
    with open_store(db) as reader:
        for run_id in reader.runs()["id"]:
            table = reader.metrics(int(run_id), all_attempts=True, frame="arrow").to_pydict()
            assert table["run_id"] == [int(run_id)] * len(table["rank"])
            out += comparable_rows(table)
    return sorted(out)


def build_two_runs(template: Path) -> Path:
    """Run 1: three ranks of trainer_calls (NaN, inf, -0.0, ints, bools, late and odd keys); run 2:
    one rank; run 3: no metric row."""
    store_calls(template, {0: trainer_calls(0), 1: trainer_calls(1), 2: trainer_calls(2)})
    store_calls(template, {0: trainer_calls(0, 10)}, name="second")
    store = Store(template)
    store.create_run("empty", world_size=2)  # no metric row: an empty file every engine still reads
    store.close()
    return template
