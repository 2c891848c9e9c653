"""Metric rows in flight: one Arrow record batch, the one type from `RecordBuffer.drain` to the store.

A drained batch goes as it is to the store (DuckDB reads it in place, SQLite and PostgreSQL
take its columns as lists), over the wire to rank 0 and into spill files (rows/wire.py: Arrow
IPC), and to the live metrics.csv. `METRICS_SCHEMA`, its Arrow schema, is derived here from
`rows.schema.metrics`, so the column names, order and widths are spelled once.

Arrays are built from NumPy buffers (`numeric`): ``pyarrow.array`` on Python lists, or even
on a NumPy array, imports pandas, which would land in the writer thread in the middle of
training.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import sqlalchemy as sa

from multirank_logger.rows.schema import metrics

__all__ = [
    "METRICS_SCHEMA",
    "arrow_schema",
    "column_lists",
    "column_numpy_copy",
    "concat_batches",
    "empty_batch",
    "halves",
    "metrics_batch",
    "numeric",
    "take_rows",
    "with_run_id",
]


def _arrow_type(column: sa.Column[Any]) -> pa.DataType:
    kind = column.type
    # subclasses before their base: BigInteger and SmallInteger are Integers
    if isinstance(kind, sa.SmallInteger):
        return pa.int16()
    if isinstance(kind, sa.BigInteger):
        return pa.int64()
    if isinstance(kind, sa.Integer):
        return pa.int32()
    if isinstance(kind, sa.Float):
        return pa.float64()
    if isinstance(kind, sa.String):
        # a batch names few keys many times: each row holds an index into the batch's key list
        return pa.dictionary(pa.int32(), pa.string())
    raise TypeError(f"no Arrow type for column {column.name!r} of type {kind!r}")


def arrow_schema(table: sa.Table) -> pa.Schema:
    """The Arrow schema of `table`'s rows: its columns in order, nullable where the column is."""
    return pa.schema([pa.field(c.name, _arrow_type(c), nullable=bool(c.nullable)) for c in table.columns])


#: the Arrow schema of a batch of `metrics` rows
METRICS_SCHEMA = arrow_schema(metrics)
# the NumPy dtype of each column's values (a key column: its int32 dictionary indices)
_NUMPY_OF = {pa.int16(): np.int16, pa.int32(): np.int32, pa.int64(): np.int64, pa.float64(): np.float64}
_NUMPY = {
    f.name: np.dtype(_NUMPY_OF[f.type.index_type if pa.types.is_dictionary(f.type) else f.type]) for f in METRICS_SCHEMA
}


def numeric(kind: pa.DataType, data: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    """An Arrow array of `kind` over a NumPy array's buffer (no copy when contiguous);
    `valid` is False where the value is NULL, or None (no NULL)."""
    bits = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(kind, len(data), [bits, pa.py_buffer(np.ascontiguousarray(data))])


def strings(values: Sequence[str]) -> pa.Array:
    """An Arrow string array of `values` (no NULL), built from its buffers, as `numeric`."""
    encoded = [v.encode() for v in values]
    offsets = np.zeros(len(encoded) + 1, np.int32)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    return pa.Array.from_buffers(pa.string(), len(encoded), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))])


def metrics_batch(
    *,
    run_id: np.ndarray,
    rank: np.ndarray,
    seq: np.ndarray,
    step: np.ndarray,
    codes: np.ndarray,
    keys: list[str],
    value: np.ndarray,
    valid: np.ndarray | None,
    dtype: np.ndarray,
    time: np.ndarray,
) -> pa.RecordBatch:
    """A batch of `metrics` rows from NumPy columns (cast to the schema's widths if need be).

    ``codes`` index ``keys`` (a code of -1 is a NULL key: the store's NOT NULL then refuses
    the batch as a whole); ``valid`` is False where the value is NULL (a NaN), or None.
    """
    dictionary = strings(keys)
    codes = codes.astype(_NUMPY["key"], copy=False)
    key_valid = codes >= 0 if len(codes) and codes.min() < 0 else None
    columns = {"run_id": run_id, "rank": rank, "seq": seq, "step": step, "value": value, "dtype": dtype, "time": time}
    arrays = []
    for field in METRICS_SCHEMA:
        if field.name == "key":
            arrays.append(pa.DictionaryArray.from_arrays(numeric(pa.int32(), codes, key_valid), dictionary))
        else:
            data = columns[field.name].astype(_NUMPY[field.name], copy=False)
            arrays.append(numeric(field.type, data, valid if field.name == "value" else None))
    return pa.RecordBatch.from_arrays(arrays, schema=METRICS_SCHEMA)


def empty_batch() -> pa.RecordBatch:
    """A batch of no rows."""
    none = np.zeros(0, np.int64)
    return metrics_batch(
        run_id=none, rank=none, seq=none, step=none, codes=none, keys=[], value=none, valid=None, dtype=none, time=none
    )


def concat_batches(batches: Sequence[pa.RecordBatch]) -> pa.RecordBatch:
    """One batch of the rows of `batches`, in order (their key dictionaries merged)."""
    if len(batches) == 1:
        return batches[0]
    if not batches:
        return empty_batch()
    return pa.concat_batches(batches)


def with_run_id(batch: pa.RecordBatch, run_id: int) -> pa.RecordBatch:
    """`batch` with every row under `run_id`: rank 0 files what it receives, and an import what
    it reads, under the store's id of the run, whatever id the sender knew."""
    index = METRICS_SCHEMA.get_field_index("run_id")
    column = numeric(METRICS_SCHEMA.field(index).type, np.full(batch.num_rows, run_id, _NUMPY["run_id"]))
    return batch.set_column(index, METRICS_SCHEMA.field(index), column)


def take_rows(batch: pa.RecordBatch, keep: np.ndarray) -> pa.RecordBatch:
    """The rows of `batch` where the boolean NumPy mask `keep` is True, in order."""
    if keep.all():
        return batch
    return batch.take(numeric(pa.int64(), np.flatnonzero(keep).astype(np.int64)))


def column_numpy_copy(column: pa.Array | pa.ChunkedArray, dtype: Any, null: Any = None) -> np.ndarray:
    """A fixed-width Arrow column as a NumPy array of its own (a copy, writable), read from its
    buffers; NULLs become `null`. Where a read-only view will do (no NULLs), ``_util/arrow_numpy.py``'s
    `column_numpy` avoids the copy.

    Raises:
        ValueError: when the column holds NULLs and `null` is None.
    """
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    n = len(array)
    if n == 0:
        return np.zeros(0, dtype)
    out = np.frombuffer(array.buffers()[1], dtype=dtype, count=n, offset=array.offset * np.dtype(dtype).itemsize).copy()
    nulls = _nulls(array)
    if nulls is not None:
        if null is None:
            raise ValueError(f"unexpected NULLs in a {array.type} column")
        out[nulls] = null
    return out


def _nulls(array: pa.Array) -> np.ndarray | None:
    """True where `array` is NULL; None when nothing is."""
    if not array.null_count:
        return None
    bits = np.unpackbits(np.frombuffer(array.buffers()[0], np.uint8), bitorder="little")
    return ~bits[array.offset : array.offset + len(array)].astype(bool)


def column_lists(batch: pa.RecordBatch, names: Sequence[str]) -> list[list[Any]]:
    """The columns `names` as Python lists, for a driver that takes rows of Python values
    (SQLite, PostgreSQL): keys as str, NULL (a NaN value) as None.

    Through NumPy's ``tolist``: pyarrow's own ``to_pylist`` makes a scalar object per value,
    several times slower, in the writer thread that holds the GIL the training thread waits for.
    """
    out = []
    for name in names:
        array = batch.column(name)
        if isinstance(array, pa.DictionaryArray):
            keys = array.dictionary.to_pylist()
            codes = column_numpy_copy(array.indices, _NUMPY_OF[array.indices.type], null=0)
            values = list(map(keys.__getitem__, codes.tolist())) if keys else [None] * len(array)
        elif pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
            values = array.to_pylist()  # a key not dictionary-encoded (a batch built by hand, a copy of rows)
        else:  # any table's columns (metrics, step_summaries), by their Arrow type
            values = column_numpy_copy(array, _NUMPY_OF[array.type], null=0).tolist()
        nulls = _nulls(array.indices if isinstance(array, pa.DictionaryArray) else array)
        if nulls is not None:
            for i in np.flatnonzero(nulls).tolist():
                values[i] = None
        out.append(values)
    return out


def halves(batch: pa.RecordBatch) -> list[pa.RecordBatch]:
    """`batch` cut in two (views, no copy)."""
    half = len(batch) // 2
    return [batch.slice(0, half), batch.slice(half)]
