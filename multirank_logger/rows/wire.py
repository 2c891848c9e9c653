"""The byte encoding of a batch of metric rows (version 2 of the wire, the current one): an Arrow
IPC stream, shared by the rank-to-rank channel (channel/row_channel.py) and the metric payloads
of spill files (store/spill_file.py, format version 3).

One stream per payload: the schema, the key dictionary, one record batch, the end-of-stream
marker. No pickle: these bytes cross the network and sit in files, and unpickling them
could run code. `decode_batch` accepts only a whole stream of `rows.batch.METRICS_SCHEMA` rows
and validates it (dictionary indices, string offsets) before a store reads it.

Spill files written before issue 18 (format versions 1 and 2) hold the first encoding
(``MRB1``): rows/wire_v1.py reads it.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.ipc

from multirank_logger.rows.batch import METRICS_SCHEMA

__all__ = ["decode_batch", "encode_batch"]

# the 8 bytes that end an Arrow IPC stream (continuation marker, zero length)
_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"


def encode_batch(batch: pa.RecordBatch) -> bytes:
    """`batch` (of `METRICS_SCHEMA`) as one Arrow IPC stream; a slice writes only its rows."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, METRICS_SCHEMA) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def decode_batch(data: bytes | memoryview) -> pa.RecordBatch:
    """The batch that `encode_batch` encoded, its columns over `data`'s bytes (no copy, but
    where `data` is not 8-byte aligned).

    Raises:
        ValueError: when `data` is not one whole stream of metric rows (foreign bytes, cut
            short, damaged, or another schema).
    """
    buffer = pa.py_buffer(data)
    if buffer.address % 8:
        # a payload cut out of a bigger buffer (a spill file read whole) at any offset: the
        # columns of an Arrow array must be aligned, or DuckDB's scan warns and slows down
        buffer = pa.py_buffer(buffer.to_pybytes())
    if buffer.size < len(_END_OF_STREAM) or buffer[-len(_END_OF_STREAM) :].to_pybytes() != _END_OF_STREAM:
        raise ValueError(
            f"row batch truncated or not a multirank_logger row batch ({buffer.size} bytes, no Arrow "
            "end-of-stream marker at the end)"
        )
    try:
        reader = pa.ipc.open_stream(buffer)
        batches = list(reader)
        if reader.schema != METRICS_SCHEMA:
            raise ValueError(f"a row batch of another schema ({reader.schema.names}; expected {METRICS_SCHEMA.names})")
        if len(batches) != 1:
            raise ValueError(f"a row batch holds one record batch, this one {len(batches)}")
        batches[0].validate(full=True)
    except pa.ArrowException as exc:
        raise ValueError(f"row batch damaged or not a multirank_logger row batch ({buffer.size} bytes): {exc}") from exc
    return batches[0]
