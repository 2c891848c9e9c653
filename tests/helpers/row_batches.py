"""Metric batches as a rank's writer drains them, for the channel's tests: `channel_batch` holds
`calls` log calls of `keys` from seq `first_seq` on, each value naming its rank and seq."""

from __future__ import annotations

import pyarrow as pa

from multirank_logger.write.buffer import RecordBuffer


def channel_batch(rank: int, calls: int, first_seq: int = 0, keys: tuple[str, ...] = ("loss", "acc")) -> pa.RecordBatch:
    """Run 7's rows of `rank`: value 1000 * rank + seq under each key."""
    buf = RecordBuffer()
    buf._next_seq = first_seq
    for i in range(calls):
        buf.append(first_seq + i, {k: float(1000 * rank + first_seq + i) for k in keys})
    return buf.drain(run_id=7, rank=rank)
