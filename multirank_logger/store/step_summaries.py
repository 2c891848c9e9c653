"""Summaries kept at ingest: per (run, rank, key, bucket of ``SUMMARY_STEPS`` steps), what the rows hold.

Every insert of metric rows (`seq_spans.insert_metrics_once`: a flush, rank 0 writing what it
received, a spill file's import) adds, in the same transaction, one ``step_summaries`` row per
(run, rank, key, bucket) of the rows it inserted: the finite values' count, sum, min and max,
the NaN, +inf and -inf counts, a mask of the steps logged and the latest call's time. Those
are *partial* aggregates: a bucket cut by two flushes, re-logged by a resumed run or filled by
an import has several rows, and a reader merges them (SUM of the counts and sums, MIN, MAX, OR
of the masks). The rows a retried batch or a second import leaves out (already stored) are
left out here too, so the summaries and the rows never disagree
(tests/store/test_step_summaries.py checks it over random runs).

Beside them, the same inserts keep a coarser level, ``coarse_summaries`` (per ``COARSE_STEPS``
steps, merged from the 16-step rows of the same insert: `coarse_batch`), so that a page bucket
of a long run is one summary to read, not four or more (``query/step_buckets.py``).

Readers: the page's per-bucket answer for a long run (``query/step_buckets.py``), the runs
list (``query/run_list.py``), a run's keys (``Backend.run_keys``, but SQLite's) and ``per_rank``'s
extent: a read of about 1/``SUMMARY_STEPS`` of the rows of a key, or of the run.

The cost on the write path is a sort of the batch's rows by (run, key, rank, bucket) and one
INSERT of about (rows / keys / SUMMARY_STEPS) x keys rows (benchmarks/RESULTS.md, ingest).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import sqlalchemy as sa

from multirank_logger._util.arrow_numpy import column_numpy
from multirank_logger.rows.batch import arrow_schema, numeric, strings
from multirank_logger.rows.schema import COARSE_STEPS, SUMMARY_STEPS, coarse_summaries, step_summaries

__all__ = ["SUMMARIES_SCHEMA", "backfill", "backfill_coarse", "coarse_batch", "insert_summaries", "summary_batch"]

#: the Arrow schema of a batch of `step_summaries` rows
SUMMARIES_SCHEMA = arrow_schema(step_summaries)
#: the largest finite double, as SQL text: past it, +inf
_LARGEST = "1.7976931348623157e+308"
#: the order an insert's summaries are stored in (both levels, `summary_batch` as the SQL below):
#: a key's summaries side by side, so that DuckDB's scan of one key skips the other keys' stretches
#: (benchmarks/RESULTS.md, "one key's summaries side by side")
_BY_KEY = "ORDER BY run_id, key, rank, b"


def insert_summaries(conn: sa.Connection, backend: Any, batch: pa.RecordBatch) -> None:
    """Add the summaries of `batch` (metric rows just inserted) on the open transaction, both levels."""
    if len(batch):
        fine = summary_batch(batch)
        backend.insert_metrics(conn, step_summaries, fine)
        backend.insert_metrics(conn, coarse_summaries, coarse_batch(fine))


def _numpy(column: Any, dtype: Any) -> np.ndarray:
    # not pyarrow's to_numpy (it imports pandas); a NULL of a float column (lo, hi) as NaN
    null = np.nan if pa.types.is_floating(column.type) else None
    return np.asarray(column_numpy(column, null=null), dtype=dtype)


def _key_codes(column: Any) -> tuple[np.ndarray, pa.Array]:
    """Each row's key as a code into a dictionary of distinct keys (a batch's dictionary may repeat one)."""
    if not isinstance(column, pa.DictionaryArray):
        column = column.dictionary_encode()
    names = np.asarray(column.dictionary.to_pylist(), dtype=object)
    distinct, first_of = np.unique(names, return_inverse=True)
    codes = np.asarray(first_of, np.int64)[_numpy(column.indices, np.int64)]
    return codes, strings(distinct.tolist())  # not pa.array: it imports pandas


def summary_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The `step_summaries` rows of a batch of metric rows (``batch.METRICS_SCHEMA``): one per
    (run, rank, key, bucket) among them."""
    run_id, rank = _numpy(batch.column("run_id"), np.int64), _numpy(batch.column("rank"), np.int64)
    step, time = _numpy(batch.column("step"), np.int64), _numpy(batch.column("time"), np.float64)
    value = batch.column("value")
    values = np.asarray(column_numpy(value, null=np.nan), np.float64)  # NULL (a NaN) as NaN
    codes, keys = _key_codes(batch.column("key"))
    first = step - np.mod(step, SUMMARY_STEPS)  # the bucket's first step (floor: also below 0)
    order = np.lexsort((first, rank, codes, run_id))  # run, key, rank, bucket: `_BY_KEY`
    run_id, rank, codes, first = run_id[order], rank[order], codes[order], first[order]
    bit = np.left_shift(1, (step[order] - first)).astype(np.int64)
    time, values = time[order], values[order]
    changed = np.zeros(len(order), bool)
    changed[0] = True
    for col in (run_id, rank, codes, first):
        changed[1:] |= col[1:] != col[:-1]
    starts = np.flatnonzero(changed)
    finite = np.isfinite(values)
    n_finite = np.add.reduceat(finite.astype(np.int64), starts)
    with np.errstate(invalid="ignore"):
        total = np.add.reduceat(np.where(finite, values, 0.0), starts)
        lo = np.fmin.reduceat(np.where(finite, values, np.nan), starts)
        hi = np.fmax.reduceat(np.where(finite, values, np.nan), starts)
    columns: dict[str, tuple[np.ndarray, np.ndarray | None]] = {
        "run_id": (run_id[starts], None),
        "rank": (rank[starts], None),
        "step": (first[starts], None),
        "steps_mask": (np.bitwise_or.reduceat(bit, starts), None),
        "n_finite": (n_finite, None),
        "total": (total, None),
        "lo": (lo, n_finite > 0),
        "hi": (hi, n_finite > 0),
        "n_nan": (np.add.reduceat(np.isnan(values).astype(np.int64), starts), None),
        "n_pos_inf": (np.add.reduceat((values == np.inf).astype(np.int64), starts), None),
        "n_neg_inf": (np.add.reduceat((values == -np.inf).astype(np.int64), starts), None),
        "last_time": (np.maximum.reduceat(time, starts), None),
    }
    return _summaries_of(columns, pa.DictionaryArray.from_arrays(numeric(pa.int32(), codes[starts].astype(np.int32)), keys))


def coarse_batch(fine: pa.RecordBatch) -> pa.RecordBatch:
    """The `coarse_summaries` rows of `fine` (`summary_batch`'s rows, in its order: run, key, rank,
    step), in the same order: its summaries merged per ``COARSE_STEPS`` steps (SUM, MIN, MAX, the
    latest time), the mask one bit per ``SUMMARY_STEPS`` steps that hold a row. From the fine
    rows, not the metric rows: about 1/16 of them to merge."""
    if not len(fine):
        return fine
    run_id, rank = _numpy(fine.column("run_id"), np.int64), _numpy(fine.column("rank"), np.int64)
    keys = fine.column("key")
    codes = _numpy(keys.indices, np.int64)
    step = _numpy(fine.column("step"), np.int64)
    first = step - np.mod(step, COARSE_STEPS)
    changed = np.zeros(len(step), bool)
    changed[0] = True
    for col in (run_id, codes, rank, first):  # `fine` is sorted by them: a group is a stretch
        changed[1:] |= col[1:] != col[:-1]
    starts = np.flatnonzero(changed)

    def summed(name: str) -> np.ndarray:
        return np.add.reduceat(_numpy(fine.column(name), np.float64 if name == "total" else np.int64), starts)

    n_finite = summed("n_finite")
    with np.errstate(invalid="ignore"):
        lo = np.fmin.reduceat(_numpy(fine.column("lo"), np.float64), starts)  # NULL as NaN: fmin skips it
        hi = np.fmax.reduceat(_numpy(fine.column("hi"), np.float64), starts)
    bit = np.left_shift(1, (step - first) // SUMMARY_STEPS).astype(np.int64)
    columns: dict[str, tuple[np.ndarray, np.ndarray | None]] = {
        "run_id": (run_id[starts], None), "rank": (rank[starts], None), "step": (first[starts], None),
        "steps_mask": (np.bitwise_or.reduceat(bit, starts), None), "n_finite": (n_finite, None),
        "total": (summed("total"), None), "lo": (lo, n_finite > 0), "hi": (hi, n_finite > 0),
        "n_nan": (summed("n_nan"), None), "n_pos_inf": (summed("n_pos_inf"), None),
        "n_neg_inf": (summed("n_neg_inf"), None),
        "last_time": (np.maximum.reduceat(_numpy(fine.column("last_time"), np.float64), starts), None),
    }
    return _summaries_of(columns, pa.DictionaryArray.from_arrays(
        numeric(pa.int32(), codes[starts].astype(np.int32)), keys.dictionary))


def _summaries_of(columns: dict[str, tuple[np.ndarray, np.ndarray | None]], keys: pa.DictionaryArray) -> pa.RecordBatch:
    """A batch of summaries (either level: one schema) from its columns' (data, valid) and its keys."""
    arrays = []
    for field in SUMMARIES_SCHEMA:
        if field.name == "key":
            arrays.append(keys)
            continue
        data, valid = columns[field.name]
        kind = {pa.int32(): np.int32, pa.int64(): np.int64, pa.float64(): np.float64}[field.type]
        if valid is not None and valid.all():
            valid = None
        arrays.append(numeric(field.type, np.ascontiguousarray(data, dtype=kind), valid))
    return pa.RecordBatch.from_arrays(arrays, schema=SUMMARIES_SCHEMA)


def backfill_coarse(where: str = "", bit_or: bool = False) -> str:
    """The SQL (every engine) that makes `coarse_summaries` from `step_summaries` already stored:
    what the migration to the coarse level ran, and a bulk-loaded benchmark store runs after
    `backfill` (`where`: over the fine rows; `bit_or` as `backfill`'s). Each fine row becomes
    part of one coarse row (the coarse level of rows the fine level holds, merged as a reader
    merges them); the same partial rows `coarse_batch` would keep need not be: readers merge."""
    s, c = SUMMARY_STEPS, COARSE_STEPS
    bit = f"1 << CAST((step - b) / {s} AS INTEGER)"
    mask = f"BIT_OR({bit})" if bit_or else f"SUM(DISTINCT {bit})"
    return (
        "INSERT INTO coarse_summaries (run_id, rank, key, step, steps_mask, n_finite, total, lo, hi, "
        "n_nan, n_pos_inf, n_neg_inf, last_time) "
        f"SELECT run_id, rank, key, b, CAST({mask} AS INTEGER), SUM(n_finite), SUM(total), MIN(lo), MAX(hi), "
        "SUM(n_nan), SUM(n_pos_inf), SUM(n_neg_inf), MAX(last_time) "
        f"FROM (SELECT *, step - ((step % {c}) + {c}) % {c} AS b FROM step_summaries {where}) AS f "
        f"GROUP BY run_id, rank, key, b {_BY_KEY}"
    )


def backfill(metrics_table: str = "metrics", summaries_table: str = "step_summaries", where: str = "",
             bit_or: bool = False) -> str:
    """The SQL (SQLite, DuckDB and PostgreSQL alike) that summarizes rows already stored: what
    the migration to schema 0009 ran, and a bulk-loaded benchmark store runs.

    The mask is the OR of the bucket's distinct steps' bits: ``BIT_OR`` where the engine has one
    (`bit_or`: DuckDB, PostgreSQL), else a SUM of the distinct bits (a distinct power of two each: their
    OR); on DuckDB the SUM of DISTINCT took 3.7x BIT_OR's time (41M rows: 8.3 against 2.3 s). A
    modulo here truncates toward zero on every engine, so ``((step % S) + S) % S`` is the step's
    place in its bucket also below 0."""
    s = SUMMARY_STEPS
    finite = f"(value IS NOT NULL AND value <= {_LARGEST} AND value >= -{_LARGEST})"
    bit = "1 << CAST(step - b AS INTEGER)"
    mask = f"BIT_OR({bit})" if bit_or else f"SUM(DISTINCT {bit})"
    return (
        f"INSERT INTO {summaries_table} (run_id, rank, key, step, steps_mask, n_finite, total, lo, hi, "
        "n_nan, n_pos_inf, n_neg_inf, last_time) "
        f"SELECT run_id, rank, key, b, CAST({mask} AS INTEGER), "
        f"SUM(CASE WHEN {finite} THEN 1 ELSE 0 END), SUM(CASE WHEN {finite} THEN value ELSE 0.0 END), "
        f"MIN(CASE WHEN {finite} THEN value END), MAX(CASE WHEN {finite} THEN value END), "
        "SUM(CASE WHEN value IS NULL THEN 1 ELSE 0 END), "
        f"SUM(CASE WHEN value > {_LARGEST} THEN 1 ELSE 0 END), "
        f"SUM(CASE WHEN value < -{_LARGEST} THEN 1 ELSE 0 END), MAX(time) "
        f"FROM (SELECT run_id, rank, key, step, value, time, step - ((step % {s}) + {s}) % {s} AS b "
        f"FROM {metrics_table} {where}) AS m GROUP BY run_id, rank, key, b {_BY_KEY}"
    )
