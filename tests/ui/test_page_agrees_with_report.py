"""The page and the report name the same ranks, for every series, on the runs the report's tests use.

The page once judged departures on its own (8 spreads in 5% of its buckets) and disagreed with
the report: "ranks departing: 0, 1, 2" under ``timing:forward_s`` where the report found no
straggler. Both now take the one judgement (``judgement/ranks.py``) through the report's findings.
The real DDP runs (tests/scripts/report_train.py) are compared in tests/runs/test_report_ddp.py.
"""

from __future__ import annotations

import sqlalchemy as sa

from tests.helpers.built_stores import fill_side_store, ragged_store
from tests.helpers.page_agreement import page_and_report
from tests.helpers.planted_rows import RANKS, planted_rows
from tests.helpers.stores import keep_summaries
from tests.helpers.ui_store import build_store


def _disagreements(db: str, run: int | str | None = None) -> list[tuple[str, object, object]]:
    compared = page_and_report(db, run)
    assert compared
    return [item for item in compared if list(item[1]) != list(item[2])]


def test_the_side_tables_run(any_db: str) -> None:
    """The 3-rank side store (helpers/built_stores.py): rank 0's memory under timing:rss, NaN/inf on
    loss and grad."""
    fill_side_store(any_db)
    compared = page_and_report(any_db)
    assert ("timing:rss", [0], [0]) in compared
    assert [item for item in compared if list(item[1]) != list(item[2])] == []


def test_the_run_scan_run(any_db: str) -> None:
    """The run scan's 7-rank run (helpers/planted_rows.py): rank 5 on a_loss, rank 2 on b_acc, a
    rank's later call winning."""
    import time

    from multirank_logger.rows.schema import metrics, runs
    from multirank_logger.store.sql_store import Store

    store = Store(any_db)
    with store.begin() as conn:
        conn.execute(sa.insert(runs), [{"id": 1, "name": "scan", "version": 0, "status": "success",
                                        "world_size": RANKS, "started_at": time.time()}])
        conn.execute(sa.insert(metrics), planted_rows(0))
        keep_summaries(conn, 1)
    store.close()
    compared = page_and_report(any_db)
    assert ("a_loss", [5], [5]) in compared and ("b_acc", [2], [2]) in compared
    assert _disagreements(any_db) == []


def test_the_ragged_run(any_db: str) -> None:
    """The ragged 5-rank run (helpers/built_stores.py): ranks and steps missing, NaN and +-inf, rank 2
    off on "a"."""
    run_id = ragged_store(any_db)
    assert _disagreements(any_db, run_id) == []


def test_the_ui_run(tmp_path) -> None:
    """The ui's 16-rank DuckDB run (tests/helpers/ui_store.py) on two nodes: rank 11 on loss, rank 4's NaN."""
    db = str(build_store(tmp_path / "runs.duckdb"))
    compared = page_and_report(db)
    assert ("loss", [11], [11]) in compared and ("loss NaN/inf", [4], [4]) in compared
    assert [item for item in compared if list(item[1]) != list(item[2])] == []
