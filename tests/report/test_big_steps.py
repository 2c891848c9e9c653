"""Steps anywhere in int64 (issue 38 point 8): a microsecond timestamp as step (past 2**45 the
report's windows passed int64 on SQLite), and a run from -2**63 to 2**63-1 (``step - first``
overflowed in SQL and NumPy): the report, its HTML page and the page's views read them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from multirank_logger import MultiRankLogger
from multirank_logger.cli import main as cli
from multirank_logger.query.reader import open_store
from multirank_logger.query.step_buckets import HEATMAP_COLUMNS
from multirank_logger.ui import views

TIMESTAMP_US = 1_764_000_000_000_000  # 2025-11-24 in microseconds since 1970
STEPS = {
    "timestamps": [TIMESTAMP_US + i * 1000 for i in range(20)],
    "from 0 past 2**62": [0, 1, 2**62 + 5],
    "all of int64": [-(2**63), -5, 0, 7, 2**63 - 1],
}


def _run(db: Path, steps: list[int]) -> None:
    logger = MultiRankLogger(db=str(db), flush_interval=3600, save_dir=str(db.parent))
    for i, step in enumerate(steps):
        logger.log_metrics({"loss": float(i), "acc": 0.5}, step=step)
    logger.finalize("success")


@pytest.mark.parametrize("steps", list(STEPS.values()), ids=list(STEPS))
def test_report_and_its_page_read_steps_anywhere_in_int64(db_path: Path, tmp_path: Path, steps: list[int]) -> None:
    """`report` and `report -o` end 0 and name the run, whatever int64 steps it logged."""
    _run(db_path, steps)
    for args in ([], ["-o", str(tmp_path / "report.html")]):
        result = CliRunner().invoke(cli, ["report", str(db_path), *args])
        assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    assert (tmp_path / "report.html").stat().st_size > 0


@pytest.mark.parametrize("steps", list(STEPS.values()), ids=list(STEPS))
def test_the_page_buckets_every_value_of_a_run_of_any_steps(db_path: Path, steps: list[int]) -> None:
    """The page's per-bucket summary holds each logged value in the bucket of its step, in at most
    HEATMAP_COLUMNS buckets; its findings are read too."""
    _run(db_path, steps)
    reader = open_store(db_path)
    try:
        summary = views.summary(reader, 1, "loss")
        views.findings_view(reader, 1)
    finally:
        reader.close()
    assert len(summary.steps) <= HEATMAP_COLUMNS
    expected: dict[int, list[float]] = {}
    for i, step in enumerate(steps):  # in Python's ints: exact
        expected.setdefault((step - steps[0]) // summary.width, []).append(float(i))
    shown = {int(c): float(summary.mean[0][c]) for c in np.flatnonzero(np.isfinite(summary.mean[0]))}
    exact = {c: sum(v) / len(v) for c, v in expected.items()}
    if steps[-1] - steps[0] <= 2**63 - 1:
        assert shown == exact
    else:  # steps spanning past int64 are bucketed in float: a step near an edge may land beside it
        assert sorted(shown.values()) == sorted(exact.values())
        assert all(any(abs(c - s) <= 1 and shown[s] == m for s in shown) for c, m in exact.items())
