"""Version 1 of the wire, read only: the ``MRB1`` encoding of a batch of metric rows.

The metric payloads of spill files of format versions 1 and 2 (written before issue 18) are
in it: a fixed header (magic, rows, distinct keys), a key table, then one little-endian packed
array per column. Nothing writes it any more: the channel and new spill files (format version
3) carry rows/wire.py's Arrow IPC streams. This keeps the files ranks spilled before that
importable (store/spill_file.py picks the decoder by the file's format version).
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa

from multirank_logger.rows.batch import metrics_batch
from multirank_logger.rows.schema import DTYPE_NAN

__all__ = ["decode_batch_v1"]

_MAGIC = b"MRB1"
_HEADER = struct.Struct("<4sII")  # magic, rows, distinct keys
# (column, little-endian NumPy type) in payload order; keys are indexes into the key table
_COLUMNS = (
    ("run_id", "<i4"),
    ("rank", "<i4"),
    ("seq", "<i8"),
    ("step", "<i8"),
    ("key", "<u4"),
    ("value", "<f8"),
    ("dtype", "<i1"),
    ("time", "<f8"),
)


def decode_batch_v1(data: bytes | memoryview) -> pa.RecordBatch:
    """The rows of one ``MRB1`` payload as a batch (NaN values a NULL, as the schema stores them).

    Raises:
        ValueError: when `data` is not an ``MRB1`` payload (wrong magic, truncated, trailing bytes).
    """
    view = memoryview(data)
    if len(view) < _HEADER.size:
        raise ValueError(f"a row batch needs at least {_HEADER.size} bytes, got {len(view)}")
    magic, n, nkeys = _HEADER.unpack_from(view)
    if magic != _MAGIC:
        raise ValueError(f"not a multirank_logger row batch (magic {bytes(magic)!r}, expected {_MAGIC!r})")
    pos = _HEADER.size
    if pos + 4 * nkeys > len(view):
        raise ValueError(f"row batch truncated in its key table ({len(view)} bytes)")
    lengths = np.frombuffer(view[pos : pos + 4 * nkeys], "<u4")
    pos += 4 * nkeys
    names = []
    for length in lengths.tolist():
        names.append(bytes(view[pos : pos + length]).decode())
        pos += length
    col = {}
    for name, kind in _COLUMNS:
        size = np.dtype(kind).itemsize * n
        if pos + size > len(view):
            raise ValueError(f"row batch truncated in column {name!r} ({len(view)} bytes)")
        # copied into native, aligned arrays: a column sits at any offset in the payload
        col[name] = np.frombuffer(view[pos : pos + size], kind).astype(np.dtype(kind).newbyteorder("="))
        pos += size
    if pos != len(view):
        raise ValueError(f"row batch has {len(view) - pos} trailing bytes")
    nan = col["dtype"] == DTYPE_NAN
    return metrics_batch(
        run_id=col["run_id"],
        rank=col["rank"],
        seq=col["seq"],
        step=col["step"],
        codes=col["key"],
        keys=names,
        value=col["value"],
        valid=~nan if nan.any() else None,
        dtype=col["dtype"],
        time=col["time"],
    )
