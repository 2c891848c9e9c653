"""Arrow columns as NumPy arrays without pyarrow's ``to_numpy``, which imports pandas."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["column_numpy"]


def column_numpy(column: pa.ChunkedArray | pa.Array, null: Any = None) -> np.ndarray:
    """A column of numbers as a NumPy array: a read-only view of a single chunk's buffer (no
    copy), else the chunks concatenated. For an array of its own with NULLs filled in, see
    ``rows/batch.py``'s `column_numpy_copy`.

    pyarrow's own ``to_numpy`` (26.0, on an Array too) imports pandas first: 0.3-0.5 s on 2
    cores, in the middle of a read that had no other use for it (``per_rank`` imports pandas on
    another thread meanwhile). A column with nulls, or not of numbers, goes through ``to_numpy``,
    unless `null` is given: a column of numbers with nulls is then a copy with `null` there.
    """
    dtype = _numpy_dtype(column.type)
    if dtype is None or (column.null_count and null is None):
        return np.asarray(column.to_numpy(zero_copy_only=False))
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    views = [_filled(chunk, dtype, null) if chunk.null_count else _view(chunk, dtype) for chunk in chunks if len(chunk)]
    if len(views) == 1:
        return views[0]
    return np.concatenate(views) if views else np.zeros(0, dtype)


def _view(chunk: pa.Array, dtype: np.dtype[Any]) -> np.ndarray:
    # buffers(): [validity, values]; an array sliced from a larger one starts at its offset
    return np.frombuffer(chunk.buffers()[1], dtype, count=len(chunk), offset=chunk.offset * dtype.itemsize)


def _filled(chunk: pa.Array, dtype: np.dtype[Any], null: Any) -> np.ndarray:
    out = _view(chunk, dtype).copy()
    bits = np.unpackbits(np.frombuffer(chunk.buffers()[0], np.uint8), bitorder="little")
    out[~bits[chunk.offset : chunk.offset + len(chunk)].astype(bool)] = null
    return out


def _numpy_dtype(arrow_type: pa.DataType) -> np.dtype[Any] | None:
    for is_kind, kind in ((pa.types.is_floating, "f"), (pa.types.is_signed_integer, "i"), (pa.types.is_unsigned_integer, "u")):
        if is_kind(arrow_type):
            return np.dtype(f"{kind}{arrow_type.bit_width // 8}")
    return None
