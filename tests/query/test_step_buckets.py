"""`query/step_buckets.summarize` on every backend: the ui's per-rank, per-bucket summary of a key,
with a NaN, a +inf and a -inf among the values, against the same numbers computed here."""

from __future__ import annotations

import math

import numpy as np
import pytest
import sqlalchemy as sa

from multirank_logger.judgement.ranks import non_finite_ranks
from multirank_logger.query.reader import open_store
from multirank_logger.query.step_buckets import summarize
from multirank_logger.rows.schema import encode_value, metrics
from multirank_logger.store.sql_store import Store
from tests.helpers.built_stores import ragged_store
from tests.helpers.stores import keep_summaries

RANKS, STEPS = 3, 10
BAD = {(1, 4): math.nan, (2, 7): math.inf, (0, 2): -math.inf}  # (rank, step): value


def logged(rank: int, step: int) -> float:
    return BAD.get((rank, step), rank + step * 0.1)


def test_summary_per_rank_and_bucket_marks_nan_and_inf(any_db: str) -> None:
    store = Store(any_db)
    run = store.create_run("buckets", world_size=RANKS)
    rows = []
    for rank in range(RANKS):
        for step in range(STEPS):
            for key, value in (("a", logged(rank, step)), ("b", 100.0)):  # "b" must not leak into "a"
                v, dtype = encode_value(value)
                rows.append({"run_id": run.id, "rank": rank, "seq": step * 2 + (key == "b"), "step": step, "key": key,
                             "value": v, "dtype": dtype, "time": 0.0})
    with store.begin() as conn:
        conn.execute(sa.insert(metrics), rows)
        keep_summaries(conn, run.id)
    store.close()

    reader = open_store(any_db)
    try:
        s = summarize(reader.fetch_arrow, run.id, "a", columns=5)
    finally:
        reader.close()
    assert s.ranks == [0, 1, 2] and s.width == 2 and s.steps == [0, 2, 4, 6, 8]
    for j, first in enumerate(s.steps):
        lows, highs = [], []
        for r in range(RANKS):
            values = [logged(r, step) for step in (first, first + 1)]
            finite = [v for v in values if math.isfinite(v)]
            has_inf = any(math.isinf(v) for v in values)
            assert s.non_finite[r, j] == (len(finite) < 2), (r, j)
            # a NaN is left out of the bucket's mean; an inf leaves no finite mean (the cell is marked)
            expect = math.nan if has_inf else sum(finite) / len(finite)
            np.testing.assert_allclose(s.mean[r, j], expect, err_msg=f"rank {r} bucket {j}")
            if finite and -math.inf not in values:  # a rank's min of -inf is no edge of the band
                lows.append(min(finite))
            if finite and math.inf not in values:
                highs.append(max(finite))
        assert s.lo[j] == min(lows) and s.hi[j] == max(highs), j  # the band's edges: every rank's envelope
    assert non_finite_ranks(s.ranks, s.non_finite) == [0, 1, 2]
    band = s.band()
    # bucket 0: the ranks' means 0.05, 1.05, 2.05; bucket 1: rank 0's -inf leaves 1.25 and 2.25
    assert band["median"][:2] == pytest.approx([1.05, 1.75])
    assert all(v is not None and v < 100 for v in band["hi"])  # key "b" is not in key "a"'s summary


@pytest.mark.parametrize("window_rows", [40, 10**6])
def test_the_report_pass_summarizes_each_key_as_sql_does(any_db: str, window_rows: int) -> None:
    """``report -o`` takes each key's summary from the report's own pass (``BucketBuilder``), not
    from a scan per key: the same ranks, buckets, means, mins, maxes and marked cells as
    ``summarize``, whether the pass reads all at once or a few steps at a time (windows of whole
    buckets, some missing a rank's step)."""
    from multirank_logger.query.run_scan import scan_run

    run_id = ragged_store(any_db)
    reader = open_store(any_db)
    try:
        ref = reader.resolve_run(run_id)
        scan = scan_run(reader, ref, spread_window=5, depart_spreads=8.0, window_rows=window_rows, bucket_columns=7)
        for key in ("a", "b", "c"):
            want, got = summarize(reader.fetch_arrow, run_id, key, columns=7), scan.buckets[key]
            assert (got.ranks, got.steps, got.width) == (want.ranks, want.steps, want.width), key
            for name in ("mean", "lo", "hi"):
                np.testing.assert_allclose(getattr(got, name), getattr(want, name), rtol=1e-6, err_msg=f"{key} {name}")
            np.testing.assert_array_equal(got.non_finite, want.non_finite, err_msg=key)
        assert scan.buckets["c"].ranks == [0, 1, 2, 3] and len(scan.buckets["b"].steps) < len(scan.buckets["a"].steps)
        assert scan.buckets["a"].non_finite.sum() == 3
    finally:
        reader.close()


def test_a_key_new_since_the_pass_began_is_left_out_not_taken_for_another(any_db: str) -> None:
    """A live run may log a new key between the pass's list of keys and its reads: its rows are
    left out (DuckDB names keys by a hash's low bits: they must be checked, not trusted)."""
    from multirank_logger.query.run_scan import scan_run

    run_id = ragged_store(any_db)
    reader = open_store(any_db)
    try:
        ref = reader.resolve_run(run_id)
        whole = scan_run(reader, ref, spread_window=5, depart_spreads=8.0, bucket_columns=7)
        reader.keys = lambda run_id: ["a", "c"]  # type: ignore[method-assign]  # "b" is logged later
        part = scan_run(reader, ref, spread_window=5, depart_spreads=8.0, bucket_columns=7)
    finally:
        reader.close()
    assert sorted(part.per_key) == ["a", "c"] and sorted(part.buckets) == ["a", "c"]
    for key in ("a", "c"):
        np.testing.assert_array_equal(part.per_key[key].median, whole.per_key[key].median)
        np.testing.assert_array_equal(part.buckets[key].mean, whole.buckets[key].mean)


def test_the_page_gets_each_value_at_float32_precision_in_its_shortest_digits() -> None:
    """A band's and a line's numbers reach the page as JSON: each the shortest decimal that is the
    same float32 (what the page draws), not float64's 17 digits; NaN as null; a value past
    float32's range as it is (not inf)."""
    import json

    from multirank_logger.query.step_buckets import BucketSummary

    rng = np.random.default_rng(7)
    values = np.r_[rng.standard_normal(500) * 10.0 ** rng.integers(-30, 30, 500), 1e39, -1e300, 0.0, -0.0, math.nan]
    s = BucketSummary("k", [0], list(range(len(values))), 1, values[None, :], values, values,
                      np.zeros((1, len(values)), bool))
    line, band = s.line(0), s.band()
    assert band["lo"] == line and band["hi"] == line
    assert line[-1] is None and [math.copysign(1, v) for v in line[-3:-1]] == [1.0, -1.0]  # type: ignore[arg-type]
    assert line[-5:-3] == [1e39, -1e300]
    for got, was in zip(line[:500], values[:500]):
        assert np.float32(got) == np.float32(was), (got, was)
        assert len(repr(got)) <= len(repr(float(np.float32(was)))), (got, was)  # never longer than before
    wide = json.dumps([float(np.float32(v)) for v in values[:500]])
    assert len(json.dumps(line[:500])) < 0.7 * len(wide)  # float32's digits: ~9 significant, not 17
