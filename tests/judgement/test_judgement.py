"""The one judgement of a rank (multirank_logger/judgement/ranks.py), on arrays alone.

Its smoothing once ran through pandas (``rolling``): the NumPy forms must give the same numbers,
and the judgement fed a window at a time (as the report's pass and a live watch feed it) must
decide as over the whole table.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multirank_logger.judgement.non_finite import FirstNonFinite, non_finite_kinds
from multirank_logger.judgement.ranks import (
    MIN_STEPS,
    DepartureWindows,
    departures,
    judge_departures,
    memory_outliers,
    non_finite_ranks,
    persistent,
    rolling_median,
)


def _pandas_persistent(depart: np.ndarray, min_steps: int) -> np.ndarray:
    """The stretch rule as report/findings.py computed it with pandas before the judgement moved."""
    most = pd.Series(depart.astype(float)).rolling(5, center=True, min_periods=1).mean().to_numpy() > 0.5
    keep = np.zeros(len(depart), bool)
    edges = np.flatnonzero(np.diff(np.r_[0, most.astype(np.int8), 0]))
    stretches = list(zip(edges[::2], edges[1::2]))
    for i, (start, stop) in enumerate(stretches):
        if stop - start < min_steps:
            continue
        first = i
        while first > 0 and stretches[first][0] - stretches[first - 1][1] < MIN_STEPS:
            first -= 1
        keep[stretches[first][0] : stop] = True
    return keep & depart


@pytest.mark.parametrize("seed", range(20))
def test_numpy_smoothing_is_pandas_rolling(seed: int) -> None:
    """The rolling median of spreads and the stretch rule: exactly pandas' centred rolling
    windows (fewer values at the ends), on random spreads and departing flags of any length."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    spreads = np.abs(rng.standard_normal(n)) * rng.choice([1e-6, 1.0, 1e6])
    for half in (1, 5):
        want = pd.Series(spreads).rolling(2 * half + 1, center=True, min_periods=1).median().to_numpy()
        np.testing.assert_array_equal(rolling_median(spreads, half), want)
    flags = rng.random(n) < rng.uniform(0.1, 0.9)
    np.testing.assert_array_equal(persistent(flags, MIN_STEPS), _pandas_persistent(flags, MIN_STEPS))


@pytest.mark.parametrize("window", [7, 40, 1000])
def test_fed_a_window_at_a_time_it_decides_as_over_the_whole_table(window: int) -> None:
    """A 9-rank table fed in windows of `window` steps (some ranks absent from a window, some
    steps with fewer than 3 values): the same departures as over the whole table."""
    rng = np.random.default_rng(7)
    steps, ranks = np.arange(300), np.arange(9)
    values = 1.0 + 0.1 * rng.standard_normal((300, 9))
    values[120:, 4] += 2.0  # rank 4 departs from step 120
    values[200:260, 7] *= 4  # rank 7 for a stretch
    values[::13, 2] *= 30  # spikes: no finding
    values[50:60, 3:] = np.nan  # steps with 3 ranks only
    values[90:95, :7] = np.nan  # steps with too few ranks
    fed = DepartureWindows()
    for start in range(0, 300, window):
        part = values[start : start + window]
        present = ~np.isnan(part).all(axis=0)
        fed.add(steps[start : start + window], ranks[present], part[:, present])
    stats = fed.result()
    assert stats is not None and len(stats.cand_pos) < values.size / 4
    found = judge_departures(stats)
    assert [(f["rank"], f["first_step"]) for f in found] == [(4, 120), (7, 200)]
    assert [pytest.approx(f) for f in found] == departures(steps, ranks, values)


def test_memory_and_non_finite() -> None:
    """A peak 1.25x the others' median stands out, a writer's RSS less its allowance, a CUDA
    allocation retry always; a rank with any NaN/inf cell is named."""
    mib = 2**20
    found = memory_outliers(np.array([0, 1, 2, 3]), np.array([900, 400, 420, 500]) * mib, "rss", writers={0})
    assert [m["rank"] for m in found] == []  # 900 - 384 = 516 MiB < 1.25 x 420
    found = memory_outliers(np.array([0, 1, 2, 3]), np.array([400, 400, 600, 410]) * mib, "mem_reserved_peak",
                            retries=np.array([0, 2, 0, 0]), writers={0})
    assert [(m["rank"], m["alloc_retries"]) for m in found] == [(1, 2), (2, 0)]
    assert non_finite_ranks([3, 5, 8], np.array([[False, False], [False, True], [True, True]])) == [5, 8]
    assert non_finite_ranks([0, 1], np.array([0, 0])) == []


# -- the non-finite finding: one rule, whatever order the rows come in ---------------------------


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 3), st.integers(0, 20),
                               st.sampled_from([1.0, math.nan, math.inf, -math.inf])), max_size=60),
       cuts=st.lists(st.integers(0, 60), max_size=4), shuffle_seed=st.integers(0, 2**16))
def test_first_non_finite_is_the_same_in_any_order_and_chunks(rows, cuts, shuffle_seed) -> None:
    """The report's pass (all rows, by window) and the watch (rows as they arrive, late ones too)
    feed `FirstNonFinite`: per (key, rank) the least step with a NaN/inf, its word (NaN before inf
    before -inf at one step) and the counts, whatever the order and however the rows are cut."""
    expected: dict[tuple[str, int], dict] = {}
    for key, rank, step, value in rows:
        if math.isfinite(value):
            continue
        word = "NaN" if math.isnan(value) else "inf" if value > 0 else "-inf"
        e = expected.setdefault((key, rank), {"rank": rank, "key": key, "first_step": step, "value": word, "count": 0,
                                              "nan": 0, "inf": 0})
        e["count"] += 1
        e["nan" if word == "NaN" else "inf"] += 1
        order = ["NaN", "inf", "-inf"]
        if (step, order.index(word)) < (e["first_step"], order.index(e["value"])):
            e["first_step"], e["value"] = step, word
    shuffled = list(rows)
    random.Random(shuffle_seed).shuffle(shuffled)
    found = FirstNonFinite()
    for part in np.split(np.arange(len(shuffled)), sorted(c for c in cuts if c <= len(shuffled))):
        chunk = [shuffled[i] for i in part]
        values = np.array([v for *_, v in chunk], float)
        bad, kinds = non_finite_kinds(values)
        found.add([chunk[i][0] for i in bad], [chunk[i][1] for i in bad], [chunk[i][2] for i in bad], kinds)
    assert found.items() == sorted(expected.values(), key=lambda e: (e["key"], e["rank"]))
    for (key, rank), e in expected.items():
        assert found.first(key, rank) == (e["first_step"], e["value"])
        assert found.firsts(key)[rank] == e["first_step"]
