"""The coarse summaries (per ``COARSE_STEPS`` steps, beside the 16-step ones: store/step_summaries.py)
draw what the 16-step summaries and the rows draw.

Over random runs (their length and first step, keys logged every step and every N steps, NaN,
+inf and -inf planted on some ranks, flushes of random lengths, a resumed launch that logs again
over steps its predecessor logged: the later call wins), written through the store's own write
path: the page's buckets read from the coarse level equal those read from the 16-step level and
from the rows, at the same buckets and several widths; the page of a long run is drawn from the
coarse level. The upgrade to the coarse level gives a store's runs the coarse summaries its writes
keep.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multirank_logger.query.reader import open_store
from multirank_logger.query.step_buckets import _rows_grid, _summaries_grid, summarize
from multirank_logger.rows.batch import metrics_batch
from multirank_logger.rows.schema import COARSE_STEPS, SUMMARY_STEPS, coarse_summaries, metrics
from multirank_logger.store.run_lifecycle import begin_attempt, seq_base
from multirank_logger.store.sql_store import Store, _script
from tests.helpers.stores import BACKEND_SUFFIXES, keep_summaries

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "default"))

KEYS = ("loss", "every")
ODD = (math.nan, math.inf, -math.inf)
_SHARED: dict[str, str] = {}

# one launch: its first and last step, and the flushes' lengths (in log calls)
runs_ = st.fixed_dictionaries({
    "ranks": st.integers(1, 3),
    "first": st.integers(-150, 150),
    "length": st.integers(1, 900),
    "every": st.integers(2, 9),  # "every" is logged at the steps divisible by it
    "odd": st.lists(st.tuples(st.integers(0, 2), st.integers(0, 899), st.sampled_from(ODD)), max_size=4),
    "resume": st.one_of(st.none(), st.tuples(st.integers(0, 899), st.integers(0, 300))),  # (from, more steps)
    "flush": st.integers(1, 300),
    "seed": st.integers(0, 2**16),
})


def _launch(store: Store, run_id: int, spec: dict[str, Any], steps: range, launch: int, flush: int) -> None:
    """One launch's log calls on every rank, through `Store.write` in flushes of `flush` calls."""
    attempt = begin_attempt(store, run_id, spec["ranks"])
    rng = np.random.default_rng(spec["seed"] + launch)
    odd = {(rank, spec["first"] + i): v for rank, i, v in spec["odd"]}
    for rank in range(spec["ranks"]):
        rows = [(s, k) for s in steps for k in range(len(KEYS)) if k == 0 or s % spec["every"] == 0]
        step = np.array([s for s, _ in rows], np.int64)
        code = np.array([k for _, k in rows], np.int64)
        value = rng.uniform(-1e3, 1e3, len(rows)) + 5000.0 * launch + 10.0 * rank
        for i, (s, k) in enumerate(rows):
            if k == 0 and (rank, s) in odd and launch == 0:
                value[i] = odd[(rank, s)]
        seq = seq_base(attempt) + np.arange(len(rows))
        for at in range(0, len(rows), flush):
            part = slice(at, at + flush)
            nan = np.isnan(value[part])
            store.write(metrics_batch(
                run_id=np.full(len(nan), run_id), rank=np.full(len(nan), rank), seq=seq[part], step=step[part],
                codes=code[part], keys=list(KEYS), value=np.where(nan, 0.0, value[part]), valid=~nan,
                dtype=np.where(nan, 3, 0), time=1.7e9 + launch * 1e4 + step[part] * 0.5))


def _write(store: Store, spec: dict[str, Any]) -> int:
    run = store.create_run("coarse", world_size=spec["ranks"], transport="gather")
    first, last = spec["first"], spec["first"] + spec["length"] - 1
    _launch(store, run.id, spec, range(first, last + 1), 0, spec["flush"])
    if spec["resume"] is not None:  # a resume from a checkpoint: steps logged again, other values
        at, more = spec["resume"]
        start = first + min(at, spec["length"] - 1)
        _launch(store, run.id, spec, range(start, last + more + 1), 1, max(1, spec["flush"] // 2))
    return run.id


def _assert_same(a: Any, b: Any, what: str) -> None:
    assert (a.ranks, a.steps, a.width) == (b.ranks, b.steps, b.width), what
    np.testing.assert_allclose(a.mean, b.mean, rtol=1e-9, atol=1e-6, err_msg=what)
    np.testing.assert_array_equal(a.lo, b.lo, err_msg=what)
    np.testing.assert_array_equal(a.hi, b.hi, err_msg=what)
    np.testing.assert_array_equal(a.non_finite, b.non_finite, err_msg=what)


@pytest.mark.parametrize("suffix", sorted(BACKEND_SUFFIXES.values()))
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(spec=runs_, widths=st.lists(st.integers(1, 6), min_size=1, max_size=2))
def test_coarse_pages_equal_the_fine_ones_and_the_rows(tmp_path_factory: pytest.TempPathFactory, suffix: str,
                                                      spec: dict[str, Any], widths: list[int]) -> None:
    """At widths of whole coarse buckets, the page's buckets from the coarse summaries equal
    those from the 16-step summaries and from the rows, the later call of a step logged twice
    winning in each; `summarize` draws a long enough run from the coarse level."""
    db = _SHARED.setdefault(suffix, str(tmp_path_factory.mktemp("coarse") / f"c{suffix}"))
    store = Store(db)
    with store.writing():
        run_id = _write(store, spec)
    store.close()
    with open_store(db) as reader:
        fetch = reader.fetch_arrow
        m = metrics.c
        span = fetch(sa.select(sa.func.min(m.step).label("a"), sa.func.max(m.step).label("b"))
                     .where(m.run_id == run_id)).to_pylist()[0]
        first = span["a"] - span["a"] % COARSE_STEPS
        for key in KEYS:
            for k in widths:
                width = k * COARSE_STEPS
                rows = _rows_grid(fetch, run_id, key, first, span["b"], width)
                fine = _summaries_grid(fetch, run_id, key, first, width, SUMMARY_STEPS)
                coarse = _summaries_grid(fetch, run_id, key, first, width, COARSE_STEPS)
                if fine is None:  # a key the run never logged ("every" in a run of one odd step)
                    assert coarse is None
                    continue
                assert coarse is not None
                _assert_same(coarse, rows, f"{key} at width {width}: coarse vs rows")
                _assert_same(coarse, fine, f"{key} at width {width}: coarse vs 16-step")
            # the page's own choice: a run whose buckets would be COARSE_STEPS // 2 or wider reads the coarse level
            columns = max(1, (span["b"] - span["a"] + 1) // (COARSE_STEPS // 2 + 3 * widths[0]))
            page = summarize(fetch, run_id, key, columns)
            if not page.steps:
                continue
            coarse_wide = page.width % COARSE_STEPS == 0 or page.width < COARSE_STEPS // 2  # else: the 16-step level
            assert coarse_wide and len(page.steps) <= columns, (page.width, columns)
            want = _rows_grid(fetch, run_id, key, page.steps[0], span["b"], page.width)
            _assert_same(page, want, f"{key}: the page vs the rows")


def _merged(conn: sa.Connection) -> dict[tuple[Any, ...], list[Any]]:
    """Per (run, rank, key, coarse bucket), the coarse summaries merged as a reader merges them."""
    c = coarse_summaries.c
    out: dict[tuple[Any, ...], list[Any]] = {}
    cols = (c.steps_mask, c.n_finite, c.total, c.lo, c.hi, c.n_nan, c.n_pos_inf, c.n_neg_inf, c.last_time)
    for run_id, rank, key, step, *agg in conn.execute(sa.select(c.run_id, c.rank, c.key, c.step, *cols)):
        assert step % COARSE_STEPS == 0
        item = out.setdefault((run_id, rank, key, step), [0, 0, 0.0, math.inf, -math.inf, 0, 0, 0, -math.inf])
        item[0] |= agg[0]
        for i in (1, 2, 5, 6, 7):
            item[i] += agg[i]
        item[3] = item[3] if agg[3] is None else min(item[3], agg[3])
        item[4] = item[4] if agg[4] is None else max(item[4], agg[4])
        item[8] = max(item[8], agg[8])
    return out


def _from_rows(conn: sa.Connection) -> dict[tuple[Any, ...], list[Any]]:
    """The same from the rows: the mask's bit i where a row lies in the bucket's i-th 16 steps."""
    m = metrics.c
    out: dict[tuple[Any, ...], list[Any]] = {}
    for run_id, rank, key, step, value, time in conn.execute(sa.select(m.run_id, m.rank, m.key, m.step, m.value, m.time)):
        first = step - step % COARSE_STEPS
        item = out.setdefault((run_id, rank, key, first), [0, 0, 0.0, math.inf, -math.inf, 0, 0, 0, -math.inf])
        item[0] |= 1 << ((step - first) // SUMMARY_STEPS)
        v = math.nan if value is None else value
        if math.isfinite(v):
            item[1] += 1
            item[2] += v
            item[3], item[4] = min(item[3], v), max(item[4], v)
        else:
            item[5 if math.isnan(v) else 6 if v > 0 else 7] += 1
        item[8] = max(item[8], time)
    return out


def _assert_agree(a: dict[tuple[Any, ...], list[Any]], b: dict[tuple[Any, ...], list[Any]]) -> None:
    assert a.keys() == b.keys()
    for cell, want in b.items():
        got = a[cell]
        assert got[2] == pytest.approx(want[2], rel=1e-9, abs=1e-6), cell
        assert got[:2] + got[3:] == want[:2] + want[3:], cell


def test_the_upgrade_keeps_the_coarse_summaries_the_writes_keep(tmp_path: Path, any_db: str) -> None:
    """A store from before the coarse level (its revision's predecessor, found in the scripts: the
    numbers may change at a merge) gets, at the head, the coarse summaries its writes would have
    kept (NaN, +inf, -inf, steps below 0, a resumed launch), on every backend."""
    spec = {"ranks": 2, "first": -70, "length": 300, "every": 3, "odd": [(0, 5, math.nan), (1, 80, math.inf),
            (1, 81, -math.inf)], "resume": (200, 40), "flush": 37, "seed": 7}
    store = Store(any_db)
    _write(store, spec)
    with store.begin() as conn:
        written = _merged(conn)
        _assert_agree(written, _from_rows(conn))
    (coarse,) = [r for r in _script().walk_revisions() if "coarse_summaries" in (r.doc or "")]
    store.downgrade(str(coarse.down_revision))
    store.upgrade()
    with store.begin() as conn:
        _assert_agree(_merged(conn), written)
    store.close()


@pytest.mark.parametrize("suffix", sorted(BACKEND_SUFFIXES.values()))
def test_an_insert_stores_each_keys_summaries_side_by_side(tmp_path: Path, suffix: str) -> None:
    """Both levels of an insert's summaries are stored ordered by (key, rank, step), from a flush
    that holds every rank's rows step after step (rank 0 writing what it gathered) and from the
    backfill a bulk-loaded store runs: DuckDB's scan of one key then skips the other keys' stretches
    (benchmarks/RESULTS.md). Storage order: the engine's rowid."""
    store = Store(tmp_path / f"order{suffix}")
    ranks, steps, keys = 3, np.arange(-40, 260), ["b", "c", "a"]  # a dictionary out of order
    rank, step, code = (a.ravel() for a in np.meshgrid(np.arange(ranks), steps, np.arange(len(keys)), indexing="ij"))
    value = np.linspace(-1.0, 1.0, len(rank))
    written = store.create_run("flush", world_size=ranks, transport="gather").id
    store.write(metrics_batch(run_id=np.full(len(rank), written), rank=rank, seq=np.arange(len(rank)), step=step,
                              codes=code, keys=keys, value=value, valid=np.ones(len(rank), bool),
                              dtype=np.zeros(len(rank), np.int64), time=1.7e9 + step * 0.5))
    filled = store.create_run("bulk", world_size=ranks, transport="gather").id
    with store.begin() as conn:
        conn.execute(metrics.insert(), [
            {"run_id": filled, "rank": int(r), "seq": i, "step": int(s), "key": keys[c], "value": float(v), "dtype": 0,
             "time": 1.7e9} for i, (r, s, c, v) in enumerate(zip(rank, step, code, value))])
        keep_summaries(conn, filled)
    with store.begin() as conn:
        for table in ("step_summaries", "coarse_summaries"):
            for run_id in (written, filled):
                stored = conn.execute(sa.text(f"SELECT key, rank, step FROM {table} WHERE run_id = {run_id} "
                                              "ORDER BY rowid")).all()
                assert len(stored) > len(keys) * ranks and stored == sorted(stored), (table, run_id)
    store.close()
