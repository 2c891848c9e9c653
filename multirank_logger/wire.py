"""The byte encoding of a MetricBatch, shared by the rank-to-rank channel and spill files.

A fixed header, a key table, then one little-endian packed array per column. No pickle:
these bytes cross the network and sit in files, and unpickling them could run code.
"""

from __future__ import annotations

import struct
import sys
from array import array
from typing import Any

from multirank_logger.buffer import MetricBatch, metrics_table
from multirank_logger.schema import DTYPE_NAN

__all__ = ["decode_batch", "decode_table", "encode_batch"]

_MAGIC = b"MRB1"
_HEADER = struct.Struct("<4sII")  # magic, rows, distinct keys
# (column, array typecode) in wire order; keys travel as indexes into the key table
_COLUMNS = (
    ("run_id", "i"),
    ("rank", "i"),
    ("seq", "q"),
    ("step", "q"),
    ("key", "I"),
    ("value", "d"),
    ("dtype", "b"),
    ("time", "d"),
)
_SWAP = sys.byteorder != "little"  # the wire is little-endian whatever the hosts are
# array typecode -> the native NumPy type decode_table reads it as
_NUMPY = {"i": "int32", "q": "int64", "I": "uint32", "d": "float64", "b": "int8"}


def _pack(typecode: str, values: list[Any]) -> bytes:
    arr = array(typecode, values)
    if _SWAP:
        arr.byteswap()
    return arr.tobytes()


def _unpack(typecode: str, data: memoryview) -> list[Any]:
    arr = array(typecode)
    arr.frombytes(data)
    if _SWAP:
        arr.byteswap()
    return arr.tolist()


def encode_batch(batch: MetricBatch) -> bytes:
    """Encode a batch as bytes: header, key table, then one packed array per column.

    NaN values (``value is None``) travel as NaN and come back as None from their dtype.
    """
    index: dict[str, int] = {}
    key_ids = [index.setdefault(k, len(index)) for k in batch.key]
    names = [k.encode() for k in index]
    nan = float("nan")
    columns = {
        "run_id": batch.run_id,
        "rank": batch.rank,
        "seq": batch.seq,
        "step": batch.step,
        "key": key_ids,
        "value": [nan if v is None else v for v in batch.value],
        "dtype": batch.dtype,
        "time": batch.time,
    }
    parts = [_HEADER.pack(_MAGIC, len(batch), len(names)), _pack("I", [len(n) for n in names]), *names]
    parts.extend(_pack(code, columns[name]) for name, code in _COLUMNS)
    return b"".join(parts)


def decode_batch(data: bytes) -> MetricBatch:
    """Rebuild the batch that `encode_batch` encoded.

    Raises:
        ValueError: when `data` is not an encoded batch (wrong magic, truncated).
    """
    names, columns = _parse(data)
    out = {name: _unpack(code, columns[name]) for name, code in _COLUMNS}
    out["key"] = [names[i] for i in out["key"]]
    if DTYPE_NAN in out["dtype"]:
        out["value"] = [None if d == DTYPE_NAN else v for v, d in zip(out["value"], out["dtype"])]
    return MetricBatch(**out)


def decode_table(data: bytes) -> Any:
    """The rows of `encode_batch`'s bytes as a pyarrow.Table (as ``decode_batch(data).to_arrow()``).

    Read straight from the byte buffers, with no Python object per row: rank 0 takes every
    other rank's rows this way into a store that inserts from Arrow (DuckDB), while the
    training thread waits on the GIL for anything done here in Python.

    Raises:
        ValueError: when `data` is not an encoded batch (wrong magic, truncated).
    """
    import numpy as np

    names, raw = _parse(data)
    # copied (a memcpy per column): a column's bytes sit at any offset in the payload, and an
    # unaligned Arrow buffer makes DuckDB's Arrow scan warn (and is slow on some hardware)
    col = {name: np.frombuffer(raw[name], f"<{code}").astype(_NUMPY[code]) for name, code in _COLUMNS}
    return metrics_table(
        run_id=col["run_id"],
        rank=col["rank"],
        seq=col["seq"],
        step=col["step"],
        codes=col["key"].astype(np.int32),
        keys=names,
        value=col["value"],
        valid=col["dtype"] != DTYPE_NAN if bool((col["dtype"] == DTYPE_NAN).any()) else None,
        dtype=col["dtype"].astype(np.int16),
        time=col["time"],
    )


def _parse(data: bytes) -> tuple[list[str], dict[str, memoryview]]:
    """Check the header and cut `data` into the key names and one byte view per column."""
    view = memoryview(data)
    if len(view) < _HEADER.size:
        raise ValueError(f"a row batch needs at least {_HEADER.size} bytes, got {len(view)}")
    magic, n, nkeys = _HEADER.unpack_from(view)
    if magic != _MAGIC:
        raise ValueError(f"not a multirank_logger row batch (magic {bytes(magic)!r}, expected {_MAGIC!r})")
    pos = _HEADER.size
    if pos + 4 * nkeys > len(view):
        raise ValueError(f"row batch truncated in its key table ({len(view)} bytes)")
    lengths = _unpack("I", view[pos : pos + 4 * nkeys])
    pos += 4 * nkeys
    names = []
    for length in lengths:
        names.append(bytes(view[pos : pos + length]).decode())
        pos += length
    columns: dict[str, memoryview] = {}
    for name, code in _COLUMNS:
        size = array(code).itemsize * n
        if pos + size > len(view):
            raise ValueError(f"row batch truncated in column {name!r} ({len(view)} bytes)")
        columns[name] = view[pos : pos + size]
        pos += size
    if pos != len(view):
        raise ValueError(f"row batch has {len(view) - pos} trailing bytes")
    return names, columns
