"""`query/step_buckets.summarize` on every backend: the ui's per-rank, per-bucket summary of a key,
with a NaN, a +inf and a -inf among the values, against the same numbers computed here."""

from __future__ import annotations

import math

import numpy as np
import pytest
import sqlalchemy as sa

from multirank_logger.model.schema import encode_value, metrics
from multirank_logger.query.reader import open_store
from multirank_logger.query.step_buckets import summarize
from multirank_logger.store.sql_store import Store

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
                             "value": v, "dtype": dtype, "time": 0.0})  # fmt: skip
    with store.begin() as conn:
        conn.execute(sa.insert(metrics), rows)
    store.close()

    reader = open_store(any_db)
    try:
        s = summarize(reader._fetch_arrow, run.id, "a", columns=5)
    finally:
        reader.close()
    assert s.ranks == [0, 1, 2] and s.width == 2 and s.steps == [0, 2, 4, 6, 8]
    for r in range(RANKS):
        for j, first in enumerate(s.steps):
            values = [logged(r, step) for step in (first, first + 1)]
            finite = [v for v in values if math.isfinite(v)]
            has_inf = any(math.isinf(v) for v in values)
            assert s.non_finite[r, j] == (len(finite) < 2), (r, j)
            # a NaN is left out of the bucket's mean; an inf leaves no finite mean (the cell is marked)
            expect = math.nan if has_inf else sum(finite) / len(finite)
            np.testing.assert_allclose(s.mean[r, j], expect, err_msg=f"rank {r} bucket {j}")
            if not has_inf:
                assert s.lo[r, j] == min(finite) and s.hi[r, j] == max(finite)
    assert s.with_non_finite() == [0, 1, 2]
    band = s.band()
    # bucket 0: the ranks' means 0.05, 1.05, 2.05; bucket 1: rank 0's -inf leaves 1.25 and 2.25
    assert band["median"][:2] == pytest.approx([1.05, 1.75])
    assert all(v is not None and v < 100 for v in band["hi"])  # key "b" is not in key "a"'s summary
