"""Summaries kept at ingest (store/step_summaries.py) never disagree with the rows.

Random runs (ranks, keys, steps below 0 and repeated, NaN/inf among the values) are written as
a logger's writers do: batches to the store, some retried after a commit their writer never saw,
some to a spill file instead (or as well) and imported later, twice; a second launch (a resume)
logs again over steps the first logged. After each, every (run, rank, key, bucket)'s summaries,
merged as a reader merges them, equal what the stored rows give; the runs list's steps, keys
and last value equal what the rows give; and the page's per-bucket answer read from the
summaries equals the one read from the rows at the same buckets. The migration to 0009 gives
a store's rows the same summaries as the write path does.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multirank_logger.query import run_list
from multirank_logger.query.reader import open_store
from multirank_logger.query.step_buckets import _rows_grid, _summaries_grid, summarize
from multirank_logger.rows.batch import metrics_batch
from multirank_logger.rows.schema import SEQ_ATTEMPT_SHIFT, SUMMARY_STEPS, metrics, step_summaries
from multirank_logger.store.spill_file import SpillWriter
from multirank_logger.store.spill_import import import_spill
from multirank_logger.store.sql_store import Store
from tests.helpers.stores import BACKEND_SUFFIXES

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "default"))

KEYS = ("loss", "acc", "lr")
SPECIAL = (math.nan, math.inf, -math.inf, 0.0, -0.0)
values = st.one_of(st.sampled_from(SPECIAL), st.floats(-1e6, 1e6, allow_nan=False), st.integers(-5, 5).map(float))
# one log call: a step (below 0, repeated, across bucket edges) and some keys' values
calls = st.tuples(st.integers(-40, 80), st.dictionaries(st.sampled_from(KEYS), values, min_size=1))
# where a batch goes: the store, the store twice (a retry), a spill file, or both (imported later)
routes = st.sampled_from(["store", "store", "retry", "spill", "both"])
_SHARED: dict[str, str] = {}
launch = st.lists(st.tuples(st.integers(0, 2), st.lists(calls, min_size=1, max_size=12), routes), min_size=1, max_size=6)


def _batch(run_id: int, rank: int, attempt: int, first_seq: int, batch_calls: list[Any]) -> Any:
    rows = [(first_seq + i, step, k, v) for i, (step, metrics_) in enumerate(batch_calls) for k, v in sorted(metrics_.items())]
    seq, step, key, value = (np.array(c) for c in zip(*rows))
    nan = np.isnan(value.astype(float))
    return metrics_batch(
        run_id=np.full(len(rows), run_id), rank=np.full(len(rows), rank), seq=(attempt << SEQ_ATTEMPT_SHIFT) + seq,
        step=step, codes=np.array([KEYS.index(k) for k in key]), keys=list(KEYS), value=np.where(nan, 0.0, value),
        valid=~nan, dtype=np.where(nan, 3, 0), time=1.7e9 + seq * 0.5 + attempt * 100,
    )


def _write_run(store: Store, spill_dir: Path, launches: list[list[Any]]) -> int:
    """Write `launches` (a resume after the first) as the writers would; import the spill files twice."""
    run = store.create_run("prop", world_size=3, transport="gather")
    spills: dict[tuple[int, int], SpillWriter] = {}
    for attempt, batches in enumerate(launches):
        counters: dict[int, int] = defaultdict(int)
        for rank, batch_calls, route in batches:
            batch = _batch(run.id, rank, attempt, counters[rank], batch_calls)
            counters[rank] += len(batch_calls)
            if route in ("store", "retry", "both"):
                store.write(batch)
            if route == "retry":
                store.write(batch)  # its commit was not seen: the same rows again
            if route in ("spill", "both"):
                if (attempt, rank) not in spills:
                    spills[(attempt, rank)] = SpillWriter(spill_dir, run_id=run.id, name="prop", version=run.version,
                                                          rank=rank, attempt=attempt, run_uuid=run.uuid)
                spills[(attempt, rank)].write([batch])
    for _ in range(2):
        for spill in spills.values():
            import_spill(store, spill.path)
    return run.id


def _from_rows(conn: sa.Connection) -> dict[tuple[Any, ...], list[Any]]:
    """Per (run, rank, key, bucket): mask, finite count, sum, min, max, NaN, +inf, -inf, last time, from the rows."""
    m = metrics.c
    out: dict[tuple[Any, ...], list[Any]] = {}
    for run_id, rank, key, step, value, time in conn.execute(sa.select(m.run_id, m.rank, m.key, m.step, m.value, m.time)):
        first = step - step % SUMMARY_STEPS
        item = out.setdefault((run_id, rank, key, first), [0, 0, 0.0, None, None, 0, 0, 0, -math.inf])
        item[0] |= 1 << (step - first)
        v = math.nan if value is None else value
        if math.isfinite(v):
            item[1] += 1
            item[2] += v
            item[3] = v if item[3] is None else min(item[3], v)
            item[4] = v if item[4] is None else max(item[4], v)
        else:
            item[5 if math.isnan(v) else 6 if v > 0 else 7] += 1
        item[8] = max(item[8], time)
    return out


def _from_summaries(conn: sa.Connection) -> dict[tuple[Any, ...], list[Any]]:
    """The same, from `step_summaries`, its partial rows merged (SUM, MIN, MAX, OR) as readers merge them."""
    s = step_summaries.c
    out: dict[tuple[Any, ...], list[Any]] = {}
    cols = (s.steps_mask, s.n_finite, s.total, s.lo, s.hi, s.n_nan, s.n_pos_inf, s.n_neg_inf, s.last_time)
    for run_id, rank, key, step, *agg in conn.execute(sa.select(s.run_id, s.rank, s.key, s.step, *cols)):
        assert step % SUMMARY_STEPS == 0
        item = out.setdefault((run_id, rank, key, step), [0, 0, 0.0, None, None, 0, 0, 0, -math.inf])
        item[0] |= agg[0]
        for i in (1, 2, 5, 6, 7):
            item[i] += agg[i]
        item[3] = agg[3] if item[3] is None else item[3] if agg[3] is None else min(item[3], agg[3])
        item[4] = agg[4] if item[4] is None else item[4] if agg[4] is None else max(item[4], agg[4])
        item[8] = max(item[8], agg[8])
    return out


def _assert_agree(store: Store) -> None:
    with store.begin() as conn:
        rows, summaries = _from_rows(conn), _from_summaries(conn)
    assert rows.keys() == summaries.keys()
    for cell, want in rows.items():
        got = summaries[cell]
        assert got[2] == pytest.approx(want[2], rel=1e-9, abs=1e-6), cell
        assert got[:2] + got[3:] == want[:2] + want[3:], cell


def _assert_runs_list(store: Store, db: str, run_id: int) -> None:
    m = metrics.c
    with store.begin() as conn:
        steps = conn.execute(sa.select(sa.func.count(sa.distinct(m.step))).where(m.run_id == run_id, m.rank == 0)).scalar()
        keys = conn.execute(sa.select(sa.func.count(sa.distinct(m.key))).where(m.run_id == run_id)).scalar()
        last = conn.execute(sa.select(sa.func.max(m.time)).where(m.run_id == run_id)).scalar()
        last_step = conn.execute(sa.select(sa.func.max(m.step)).where(m.run_id == run_id)).scalar()
    with open_store(db) as reader:
        assert run_list.read_last_step(reader.fetch_arrow, run_id) == (last_step, pytest.approx(last))  # the page's list
        listed = reader.runs()
        saved, run_list.PER_RUN_READS = run_list.PER_RUN_READS, 0  # one GROUP BY for every run, as past 32 runs
        try:
            grouped = reader.runs()
        finally:
            run_list.PER_RUN_READS = saved
    row = listed.set_index("id").loc[run_id]
    assert (row["steps"], row["keys"], row["last_value"].timestamp()) == (steps, keys, pytest.approx(last))
    pd.testing.assert_frame_equal(listed, grouped)


def _assert_page_agrees(db: str, run_id: int) -> None:
    """The page's per-bucket answer from the summaries equals the one from the rows, at the same buckets."""
    with open_store(db) as reader:
        m = metrics.c
        low = reader.fetch_arrow(sa.select(sa.func.min(m.step).label("a"), sa.func.max(m.step).label("b"))
                                  .where(m.run_id == run_id)).to_pylist()[0]
        first = low["a"] - low["a"] % SUMMARY_STEPS
        for key in reader.keys(run_id):
            for width in (SUMMARY_STEPS, 2 * SUMMARY_STEPS, 8 * SUMMARY_STEPS):  # laid out in NumPy, and SQL's GROUP BY
                a = _rows_grid(reader.fetch_arrow, run_id, key, first, low["b"], width)
                b = _summaries_grid(reader.fetch_arrow, run_id, key, first, width)
                assert b is not None and (a.ranks, a.steps, a.width) == (b.ranks, b.steps, b.width)
                np.testing.assert_allclose(b.mean, a.mean, rtol=1e-9, atol=1e-6)
                np.testing.assert_array_equal(b.lo, a.lo)
                np.testing.assert_array_equal(b.hi, a.hi)
                np.testing.assert_array_equal(b.non_finite, a.non_finite)


@pytest.mark.parametrize("suffix", sorted(BACKEND_SUFFIXES.values()))
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(launches=st.lists(launch, min_size=1, max_size=2))
def test_summaries_and_rows_never_disagree(tmp_path_factory: pytest.TempPathFactory, suffix: str,
                                           launches: list[list[Any]]) -> None:
    """Over random runs, resumed, retried, spilled and imported twice: the summaries equal the rows',
    the runs list is the rows', and the page's buckets from either agree."""
    root = tmp_path_factory.mktemp("summaries")
    # one store for every example (a new run each): its schema is made once
    db = _SHARED.setdefault(suffix, str(tmp_path_factory.mktemp("shared") / f"s{suffix}"))
    store = Store(db)
    with store.writing():  # one connection for the example's writes (DuckDB opens its file per transaction)
        run_id = _write_run(store, root / "spill", launches)
        _assert_agree(store)
    _assert_runs_list(store, db, run_id)
    store.close()
    _assert_page_agrees(db, run_id)


def test_the_upgrade_summarizes_the_rows_already_stored(tmp_path: Path, any_db: str) -> None:
    """A store at 0007 with rows (NaN, inf, steps below 0, a step logged twice) gets at 0009 the
    summaries the write path would have kept, on every backend (its SQL is the same on each)."""
    store = Store(any_db)
    launches = [[(0, [(-17, {"loss": math.nan, "acc": 1.0}), (15, {"loss": math.inf}), (16, {"loss": 2.5})], "store"),
                 (1, [(3, {"lr": -math.inf}), (3, {"lr": 4.0}), (40, {"acc": -0.0})], "store")]]
    _write_run(store, tmp_path / "spill", launches)
    with store.begin() as conn:
        written = _from_summaries(conn)
    store.downgrade("0007")
    store.upgrade()
    with store.begin() as conn:
        assert _from_summaries(conn) == written
    _assert_agree(store)
    store.close()


def test_a_long_run_is_drawn_from_its_summaries(any_db: str) -> None:
    """Past 8,000 steps the page's buckets come from the summaries (a width of whole summaries), and
    they equal the rows' at that width; a shorter run's come from its rows, at its own width."""
    db = any_db
    store = Store(db)
    run = store.create_run("long", world_size=2)
    n = 20_000
    step = np.repeat(np.arange(n), 2)
    rank = np.tile([0, 1], n)
    value = np.sin(step / 500.0) + rank
    value[1001] = math.nan
    valid = ~np.isnan(value)
    store.write(metrics_batch(run_id=np.full(2 * n, run.id), rank=rank, seq=step, step=step, codes=np.zeros(2 * n),
                              keys=["loss"], value=np.where(valid, value, 0.0), valid=valid, dtype=np.where(valid, 0, 3),
                              time=1.7e9 + step))
    store.close()
    with open_store(db) as reader:
        page = summarize(reader.fetch_arrow, run.id, "loss")
        assert page.width == 16 and len(page.steps) == 1250  # the rows alone would give width 10
        rows = _rows_grid(reader.fetch_arrow, run.id, "loss", 0, n - 1, 16)
        np.testing.assert_allclose(page.mean, rows.mean, rtol=1e-12)
        assert page.non_finite[1, 500 // 16] and page.non_finite.sum() == 1  # value 1001: rank 1 at step 500
        short = summarize(reader.fetch_arrow, run.id, "loss", columns=20_000)
        assert short.width == 1 and len(short.steps) == n  # from the rows: the summaries are too coarse here
