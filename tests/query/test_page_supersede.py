"""The page's buckets of a resumed run follow `per_rank`'s supersede rule: where the resumed launch
logged a step again, the page's mean, min, max and NaN/inf marks are those of its value alone,
on every backend, from the rows (a short run) and from the step summaries (a long one)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multirank_logger import MultiRankLogger
from multirank_logger.query import relogged_steps
from multirank_logger.query.reader import open_store
from multirank_logger.query.step_buckets import summarize
from multirank_logger.rows.schema import SUMMARY_STEPS, step_summaries
from multirank_logger.store.sql_store import Store

#: the first launch logs steps 0-399, is resumed from step 250 and logs 250-599 again, other values
FIRST, RESUMED = range(400), range(250, 600)
#: non-finite values: a NaN the resumed launch replaces, a +inf it logs, a -inf it replaces by a NaN
ODD = {(0, 300): math.nan, (1, 500): math.inf, (0, 320): -math.inf, (1, 320): math.nan}


def _value(launch: int, step: int) -> float:
    return ODD.get((launch, step), (100.0 if launch == 0 else -5000.0) + step * (1 + launch))


def _launch(db: str, save_dir: Path, launch: int, steps: range, **kwargs) -> None:
    """One launch through the real logger, flushed every 37 calls (buckets cut by flushes)."""
    logger = MultiRankLogger(db=db, save_dir=str(save_dir), name="job", flush_logs_every_n_steps=37,
                             flush_interval=3600, **kwargs)
    for step in steps:
        logger.log_metrics({"loss": _value(launch, step), "other": float(step)}, step=step)
        logger.save()
    logger.finalize("success")


@pytest.fixture
def resumed(any_db: str, tmp_path: Path) -> str:
    _launch(any_db, tmp_path, 0, FIRST)
    _launch(any_db, tmp_path, 1, RESUMED, version=0, resume="must")
    return any_db


def _expected(values: np.ndarray) -> tuple[float, float, float, bool]:
    """A cell as the page has it: the mean (NaN where an inf fell), min, max of the finite values
    (NaN where a -inf, +inf fell) and whether a NaN or inf fell."""
    finite = values[np.isfinite(values)]
    pos, neg = bool((values == np.inf).any()), bool((values == -np.inf).any())
    mean = math.nan if pos or neg or not len(finite) else float(finite.mean())
    lo = math.nan if neg or not len(finite) else float(finite.min())
    hi = math.nan if pos or not len(finite) else float(finite.max())
    return mean, lo, hi, bool((~np.isfinite(values)).any())


def test_page_buckets_equal_per_rank_after_a_resume(resumed: str) -> None:
    """Each bucket's mean, min, max and mark equal those of `per_rank`'s values (the resumed
    launch's where both logged), read from the rows (2,000 buckets: one step each, as the page
    asks) and from the summaries (10 buckets of 64 steps)."""
    with open_store(resumed) as reader:
        (run,) = reader.runs()["id"].tolist()
        table = reader.per_rank("loss", run)
        assert table[0].loc[300] == _value(1, 300)  # per_rank applies the rule
        steps, values = table.index.to_numpy(), table[0].to_numpy()
        served = reader.bucket_summary(run, "loss")  # what the page's API hands over
        for summary in (served, summarize(reader.fetch_arrow, run, "loss", 10)):
            for j, first in enumerate(summary.steps):
                mean, lo, hi, bad = _expected(values[(steps >= first) & (steps < first + summary.width)])
                got = summary.mean[0, j], summary.lo[j], summary.hi[j], bool(summary.non_finite[0, j])
                np.testing.assert_allclose(got[:3], (mean, lo, hi), rtol=1e-12, err_msg=f"bucket at step {first}")
                assert got[3] == bad, f"bucket at step {first}"
            assert summary.steps[-1] + summary.width > RESUMED[-1]
        assert (served.width, summary.width) == (1, 64)  # the rows' path, then the summaries'
        assert reader.bucket_summary(run, "other").mean[0, 390] == 390.0  # the same value twice: as it was


def test_rows_read_again_in_bounded_statements(resumed: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second resume (from step 550) makes two overlaps; with one range a statement, they are
    read in two statements, never as one range over both, and the page's cells still follow
    `per_rank`."""
    _launch(resumed, tmp_path, 2, range(550, 700), version=0, resume="must")
    monkeypatch.setattr(relogged_steps, "_MAX_RANGES", 1)
    with open_store(resumed) as reader:
        (run,) = reader.runs()["id"].tolist()
        spans = relogged_steps.LatestWins(reader.fetch_arrow, run, "loss")._spans(0, 1, 700)
        assert [(lo, hi) for _, lo, hi in spans] == [(240, 399), (544, 607)]  # whole summary buckets
        issued: list[sa.Select] = []
        fetch = reader.store.backend.fetch_arrow  # every read of the page's series (on one connection) goes through it
        monkeypatch.setattr(reader.store.backend, "fetch_arrow", lambda conn, stmt: issued.append(stmt) or fetch(conn, stmt))
        served = reader.bucket_summary(run, "loss")
        assert sum("seq" in stmt.selected_columns for stmt in issued) == len(spans)  # the rows' reads
        table = reader.per_rank("loss", run)
        steps, values = table.index.to_numpy(), table[0].to_numpy()
        assert values[steps == 560][0] == _value(2, 560)
        for j, first in enumerate(served.steps):
            mean, lo, hi, bad = _expected(values[steps == first])
            got = served.mean[0, j], served.lo[j], served.hi[j], bool(served.non_finite[0, j])
            np.testing.assert_allclose(got[:3], (mean, lo, hi), rtol=1e-12, err_msg=f"step {first}")
            assert got[3] == bad, f"step {first}"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(buckets=st.lists(st.lists(st.lists(st.integers(0, SUMMARY_STEPS - 1), min_size=1, max_size=6), min_size=1, max_size=4),
                        min_size=1, max_size=6))
def test_relogged_buckets_found_in_sql(any_db: str, buckets: list[list[list[int]]]) -> None:
    """The store's condition names exactly the buckets whose partial summaries (any split of a
    bucket's calls among summaries, a step repeated within one or across several) hold a step
    more than once, on every backend."""
    run = 10_000 + len(buckets) * 10 + len(buckets[0])  # a run id of its own per example shape
    rows, expected = [], set()
    for b, partials in enumerate(buckets):
        steps = [step for partial in partials for step in partial]
        if len(steps) > len(set(steps)):
            expected.add(b * SUMMARY_STEPS)
        for partial in partials:
            mask = sum(1 << step for step in set(partial))
            rows.append({"run_id": run, "rank": 0, "key": "k", "step": b * SUMMARY_STEPS, "steps_mask": mask,
                         "n_finite": len(partial), "total": 0.0, "lo": 0.0, "hi": 0.0, "n_nan": 0,
                         "n_pos_inf": 0, "n_neg_inf": 0, "last_time": 0.0})
    store = Store(any_db)
    try:
        with store.begin() as conn:
            conn.execute(step_summaries.delete().where(step_summaries.c.run_id == run))
            conn.execute(step_summaries.insert(), rows)
    finally:
        store.close()
    with open_store(any_db) as reader:
        found = relogged_steps.LatestWins(reader.fetch_arrow, run, "k")._relogged(0, len(buckets) * SUMMARY_STEPS)
    assert set(found[1].tolist()) == expected and set(found[0].tolist()) <= {0}
