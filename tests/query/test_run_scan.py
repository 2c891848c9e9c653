"""The report's pass over a run's rows (query/run_scan.py) against the per-rank tables it replaces.

The findings of a run once came from ``departures(reader.per_rank(key))`` for each key and
from SQL over every row; the pass reads the rows a window of steps at a time and keeps only
per-step statistics and candidate rows. On real stores of each backend, with windows as small
as a few steps, it must find exactly what the tables give: the same outliers, NaN/inf and
ranks' steps, through repeated calls at a step, missing ranks and non-finite values.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import sqlalchemy as sa

from multirank_logger import open_store
from multirank_logger.judgement.ranks import DEPART_SPREADS, SPREAD_WINDOW
from multirank_logger.query.run_scan import scan_run
from multirank_logger.report.findings import departures, outliers
from multirank_logger.rows.schema import encode_value, metrics, ranks, runs
from multirank_logger.store.sql_store import Store
from tests.helpers.planted_rows import KEYS, RANKS, STEPS, planted_rows
from tests.helpers.stores import keep_summaries, new_postgres_database


@pytest.fixture
def scan_store(any_db):
    store = Store(any_db)
    now = time.time()
    with store.begin() as conn:
        conn.execute(sa.insert(runs), [{"id": 1, "name": "scan", "version": 0, "status": "success",
                                        "world_size": RANKS, "started_at": now}])
        conn.execute(sa.insert(ranks), [{"run_id": 1, "rank": r, "host": "h", "status": "success", "started_at": now}
                                        for r in range(RANKS)])
        conn.execute(sa.insert(metrics), planted_rows(0))
        keep_summaries(conn, 1)
    store.close()
    return any_db


@pytest.mark.parametrize("window_rows", [60, 1_000, 10**6])
def test_the_pass_finds_what_the_per_rank_tables_give(scan_store, window_rows: int) -> None:
    """Outliers, NaN/inf per key and rank, and each rank's steps: the same as from the tables and
    SQL over every row, whatever the window (60 rows: a few steps each)."""
    with open_store(scan_store) as reader:
        ref = reader.resolve_run()
        scan = scan_run(reader, ref, spread_window=SPREAD_WINDOW, depart_spreads=DEPART_SPREADS,
                        window_rows=window_rows)
        expected = [{"rank": item.pop("rank"), "key": key, **item}
                    for key in reader.keys() for item in departures(reader.per_rank(key))]
        rows = reader.metrics(all_attempts=True)
    assert [(o["key"], o["rank"]) for o in expected] == [("a_loss", 5), ("b_acc", 2)]
    assert [pytest.approx(o) for o in outliers(scan)] == expected
    bad = rows[~np.isfinite(rows["value"])].groupby(["key", "rank"])
    assert [(n["key"], n["rank"], n["first_step"], n["count"], n["nan"], n["inf"]) for n in scan.non_finite] == [
        (key, rank, int(g["step"].min()), len(g), int((g["dtype"] == 3).sum()), int((g["dtype"] != 3).sum()))
        for (key, rank), g in bad
    ]
    steps = rows.groupby("rank")["step"]
    assert scan.rank_steps == {int(r): (int(steps.nunique()[r]), int(steps.max()[r])) for r in steps.nunique().index}


def test_the_pass_keeps_per_step_statistics_only(scan_store) -> None:
    """Per key, what stays is per step (with 3 ranks or more) and a few candidate rows, not every row."""
    with open_store(scan_store) as reader:
        ref = reader.resolve_run()
        scan = scan_run(reader, ref, spread_window=SPREAD_WINDOW, depart_spreads=DEPART_SPREADS, window_rows=500)
        table = reader.per_rank("a_loss").to_numpy()
    steps = scan.per_key["a_loss"]
    assert len(steps.steps) == STEPS and len(steps.cand_pos) < table.size / 4
    finite = np.where(np.isfinite(table), table, np.nan)
    np.testing.assert_array_equal(steps.median, np.nanmedian(finite, axis=1))
    np.testing.assert_array_equal(steps.low, np.nanmin(finite, axis=1))
    np.testing.assert_array_equal(steps.high, np.nanmax(finite, axis=1))


@pytest.mark.parametrize("stride", [1, 50])
def test_the_pass_lays_out_steps_and_ranks_missing_from_a_window(any_db, stride: int) -> None:
    """Steps no rank logged (a gap inside a window), ranks absent from whole windows (the lowest
    too), and steps
    far apart (every 50th: the sparse lay-out): the per-step statistics and each rank's steps
    are those of the per-rank tables, whatever the window."""
    rows = [dict(row, step=row["step"] * stride) for row in planted_rows(1)
            if not (30 <= row["step"] < 40 and row["step"] != 35)  # a gap: only step 35 of 30-39
            and not (row["rank"] == 4 and 150 <= row["step"] < 200)  # rank 4 absent for 50 steps
            and not (row["rank"] == 0 and 200 <= row["step"] < 220)]  # and rank 0, the lowest, for 20
    store = Store(any_db)
    now = time.time()
    with store.begin() as conn:
        conn.execute(sa.insert(runs), [{"id": 1, "name": "gaps", "version": 0, "status": "success",
                                        "world_size": RANKS, "started_at": now}])
        conn.execute(sa.insert(metrics), rows)
        keep_summaries(conn, 1)
    store.close()
    with open_store(any_db) as reader:
        ref = reader.resolve_run()
        tables = {key: reader.per_rank(key) for key in KEYS}
        for window_rows in (60, 1_000):
            scan = scan_run(reader, ref, spread_window=SPREAD_WINDOW, depart_spreads=DEPART_SPREADS,
                            window_rows=window_rows)
            for key, table in tables.items():
                values = table.to_numpy()
                finite = np.where(np.isfinite(values), values, np.nan)
                counted = (~np.isnan(finite)).sum(axis=1) >= 3
                got = scan.per_key[key]
                np.testing.assert_array_equal(got.steps, table.index.to_numpy()[counted])
                np.testing.assert_array_equal(got.median, np.nanmedian(finite[counted], axis=1))
                np.testing.assert_array_equal(got.low, np.nanmin(finite[counted], axis=1))
            assert scan.rank_steps[4] == (STEPS - 9 - 50, (STEPS - 1) * stride)
            assert scan.rank_steps[0] == (STEPS - 9 - 20, (STEPS - 1) * stride)
            assert len(scan.per_key["a_loss"].steps) == STEPS - 9


def test_postgresql_windows_are_read_through_the_rank_step_index(postgres_server) -> None:
    """On PostgreSQL a range of steps alone is a scan of the whole table (no skip scan before 18):
    the pass names the run's ranks, found by a loose index scan, so each window is one descent of
    ix_metrics_run_rank_step per rank. A rank that logged without being registered, past the
    world size, is among them, and its rows are in the statistics."""
    url = new_postgres_database(postgres_server)
    store = Store(url)
    now = time.time()
    rows = planted_rows(0)
    extra = []
    for step in range(STEPS):  # rank 9: no `ranks` row, beyond world_size 7
        value, dtype = encode_value(1.0)
        extra.append({"run_id": 1, "rank": 9, "seq": step, "step": step, "key": "c_flat", "value": value,
                      "dtype": dtype, "time": 0.0})
    with store.begin() as conn:
        conn.execute(sa.insert(runs), [{"id": 1, "name": "scan", "version": 0, "status": "success",
                                        "world_size": RANKS, "started_at": now}])
        conn.execute(sa.insert(metrics), rows + extra)
        keep_summaries(conn, 1)
        conn.execute(sa.text("ANALYZE metrics"))
        named = store.backend.window_ranks(conn, 1)
        window = sa.select(metrics.c.rank, metrics.c.step, metrics.c.value).where(
            metrics.c.run_id == 1, metrics.c.rank.in_(named), metrics.c.step >= 100, metrics.c.step < 110)
        plan = "\n".join(conn.execute(sa.text("EXPLAIN " + str(window.compile(conn, compile_kwargs={"literal_binds": True})))).scalars())
    store.close()
    assert named == [*range(RANKS), 9]
    assert "ix_metrics_run_rank_step" in plan and "Seq Scan" not in plan, plan
    issued: list[str] = []
    with open_store(url) as reader:
        sa.event.listen(reader.store.engine, "before_cursor_execute", lambda *args: issued.append(args[2]))
        scan = scan_run(reader, reader.resolve_run(), spread_window=SPREAD_WINDOW, depart_spreads=DEPART_SPREADS,
                        window_rows=500)
    windows = [sql for sql in issued if "metrics.step >=" in sql]
    assert len(windows) > 5 and all("metrics.rank IN" in sql for sql in windows), windows[:1]
    assert 9 in scan.rank_steps and scan.rank_steps[9] == (STEPS, STEPS - 1)
