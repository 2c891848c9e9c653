"""What a finding cost (judgement/cost.py): a straggler's wait and hours lost, a NaN's steps after.

A hand-computed run: 4 ranks x 40 steps of StepTimer rows where rank 3's data wait is 0.2 s on
steps 10-29 (the others 0.010, 0.011, 0.012 s; rank 3 0.013 s elsewhere), and rank 1's loss NaN
from step 25 to the run's last step, 39. The figures are checked against their definition
computed here by hand, not against the code's own arithmetic.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from multirank_logger.judgement.cost import steps_after, straggler_cost
from tests.helpers.stores import keep_summaries

RANKS, STEPS = 4, 40
SLOW_FROM, SLOW_TO, SLOW_S = 10, 29, 0.2
NAN_RANK, NAN_FROM = 1, 25


def _data_s(rank: int, step: int) -> float:
    if rank == 3:
        return SLOW_S if SLOW_FROM <= step <= SLOW_TO else 0.013
    return 0.010 + 0.001 * rank


def _build(db: str) -> str:
    import time

    import sqlalchemy as sa

    from multirank_logger.rows.schema import encode_value, metrics, ranks, runs, step_timing
    from multirank_logger.store.sql_store import Store

    now = time.time()
    store = Store(db)
    try:
        with store.begin() as conn:
            conn.execute(sa.insert(runs), [{"id": 1, "name": "cost", "version": 0, "status": "success",
                                            "world_size": RANKS, "started_at": now}])
            conn.execute(sa.insert(ranks), [{"run_id": 1, "rank": r, "host": f"node{r // 2}", "status": "success",
                                             "started_at": now, "ended_at": now + 5} for r in range(RANKS)])
            conn.execute(sa.insert(step_timing), [
                {"run_id": 1, "rank": r, "seq": s, "step": s, "data_s": _data_s(r, s), "forward_s": 0.02,
                 "rest_s": 0.05, "batch_size": 8, "rss": 400 * 2**20, "time": now + s}
                for r in range(RANKS) for s in range(STEPS)
            ])
            conn.execute(sa.insert(metrics), [
                {"run_id": 1, "rank": r, "seq": s, "step": s, "key": "loss", "value": v, "dtype": dtype, "time": now}
                for r in range(RANKS) for s in range(STEPS)
                for v, dtype in [encode_value(math.nan if r == NAN_RANK and s >= NAN_FROM else 1.0 + 0.01 * r)]
            ])
            keep_summaries(conn, 1)
    finally:
        store.close()
    return db


def _by_hand() -> float:
    """Per step of rank 3's stretch: the slowest rank's data wait minus the median rank's (the
    mean of the two middle of four), summed."""
    total = 0.0
    for s in range(SLOW_FROM, SLOW_TO + 1):
        times = sorted(_data_s(r, s) for r in range(RANKS))
        total += times[-1] - (times[1] + times[2]) / 2
    return total


@pytest.mark.parametrize("suffix", [".sqlite", ".duckdb"])
def test_a_stragglers_cost_and_a_nans_steps_after_equal_their_definition(tmp_path, suffix: str) -> None:  # type: ignore[no-untyped-def]
    from multirank_logger import open_store
    from multirank_logger.report import find
    from multirank_logger.report.render import findings_text

    db = _build(str(tmp_path / f"runs{suffix}"))
    with open_store(db) as reader:
        found = find(reader)
    [straggler] = found.stragglers
    assert (straggler["rank"], straggler["phase"], straggler["first_step"], straggler["last_step"]) == (3, "data", 10, 29)
    waited = _by_hand()
    assert waited == pytest.approx(20 * (0.2 - 0.0115), rel=1e-12)  # the hand sum, in closed form
    assert straggler["waited_s"] == pytest.approx(waited, rel=1e-12, abs=0)
    assert straggler["cost_steps"] == 20
    assert straggler["rank_hours"] == pytest.approx(waited * RANKS / 3600, rel=1e-12, abs=0)
    assert straggler["hours_unit"] == "rank-hours"  # CPU ranks: no CUDA peak in the rows
    [nan] = found.non_finite
    assert (nan["rank"], nan["first_step"], nan["steps_after"]) == (NAN_RANK, NAN_FROM, STEPS - 1 - NAN_FROM)
    # the figures reach every surface: the JSON's items, their sentence (the page's), the text
    item = found.to_dict()["stragglers"][0]
    assert item["waited_s"] == straggler["waited_s"] and item["rank_hours"] == straggler["rank_hours"]
    assert "every rank waited 3.8s on it over 20 steps: 0.004189 rank-hours (CPU ranks) lost" == item["cost"]
    assert "waited" not in item["sentence"]  # said beside the sentence: the watch words the finding alike
    assert found.to_dict()["non_finite"][0]["steps_after"] == 14  # (said in the text, beside the sentence)
    text = findings_text(found)
    assert "0.004189 rank-hours (CPU ranks) lost" in text and "the run trained 14 steps past step 25" in text


def test_the_cost_on_cuda_is_gpu_hours_and_counts_only_the_stretch() -> None:
    """GPU-hours where the ranks ran on CUDA; steps outside the stretch, and steps timed by fewer
    than MIN_RANKS (3) ranks (not judged, and not counted by the watch), are not counted; a stretch
    with no rows costs nothing."""
    steps = np.array([0, 1, 2, 3, 4])
    values = np.array([[1.0, 1.0, 1.0], [1.0, 2.0, 4.0], [np.nan, np.nan, np.nan], [1.0, 1.5, np.nan], [9.0, 1.0, 1.0]])
    cost = straggler_cost(steps, values, 1, 3, world_size=1024, on_gpu=True)
    # step 1: 4 - 2; step 2: no time; step 3: two ranks' times (1.5 - 1.25 were it counted)
    assert cost == {"waited_s": 2.0, "cost_steps": 1, "rank_hours": 2.0 * 1024 / 3600, "hours_unit": "GPU-hours"}
    assert straggler_cost(steps, values, 7, 9, world_size=8)["waited_s"] == 0.0
    # the figure: 30 ms a step for 10,000 steps at 1,024 GPUs is about 85 GPU-hours
    many = np.zeros((10_000, 1024))
    many[:, 5] = 0.03
    assert straggler_cost(np.arange(10_000), many, 0, 9_999, 1024, True)["rank_hours"] == pytest.approx(85.33, abs=0.01)
    assert steps_after(25, 39) == 14 and steps_after(25, 25) == 0 and steps_after(25, None) is None
