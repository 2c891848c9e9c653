"""A gather (or node) sender whose writer takes nothing keeps a bounded number of values in memory.

Past `sinks.SENDER_HELD_VALUES` unacknowledged values, new rows go to the sender's spill file
(before: every row stayed in the sender's memory, and in rank 0's TCPStore, until a 30 s
timeout; 128 saturating senders took 22 GiB). A real TCPStore server stands for rank 0's.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pyarrow as pa
import pytest
import torch.distributed as dist

from multirank_logger.channel.row_channel import RowChannel
from multirank_logger.store.spill_file import SpillWriter, read_spill
from multirank_logger.write.buffer import RecordBuffer
from multirank_logger.write.sinks import SENDER_HELD_VALUES, GatherSender
from multirank_logger.write.spiller import Spiller
from tests.helpers.launches import free_port

CALLS_PER_BATCH = 5_000  # 10,000 values: two keys
BATCHES = 30  # 300,000 values: past the bound


def _batch(first_seq: int) -> pa.RecordBatch:
    buf = RecordBuffer()
    buf._next_seq = first_seq
    for i in range(CALLS_PER_BATCH):
        buf.append(first_seq + i, {"loss": float(first_seq + i), "acc": 0.5})
    return buf.drain(run_id=7, rank=1)


def _seqs(batches: list[pa.RecordBatch]) -> list[tuple[int, str]]:
    return [(s, k) for b in batches for s, k in zip(b.column("seq").to_pylist(), b.column("key").to_pylist())]


@pytest.fixture
def server() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", free_port(), None, True, datetime.timedelta(seconds=10), wait_for_workers=False)


def test_sender_memory_stays_bounded_and_the_rest_is_spilled(
    server: dist.TCPStore, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Rank 0 takes nothing while 300,000 values are sent: the sender holds at most the bound,
    the rest is in its spill file (named on stderr); once rank 0 takes its rows, sending resumes,
    and every value is delivered or spilled, exactly once."""
    rank0 = RowChannel("b", 0, 2, host="127.0.0.1", port=server.port, timeout=60)
    rank0.receive()  # connected, taking nothing yet
    sender_channel = RowChannel("b", 1, 2, host="127.0.0.1", port=server.port, timeout=60)
    spiller = Spiller(SpillWriter(tmp_path, run_id=7, name="x", version=0, rank=1), "runs.sqlite", 1)
    sender = GatherSender(sender_channel, spiller)
    sent = [_batch(i * CALLS_PER_BATCH) for i in range(BATCHES)]
    for batch in sent:
        sender.write(batch)
        assert sender_channel.unacknowledged_values(refresh=False) <= SENDER_HELD_VALUES
    held = sender_channel.unacknowledged_values()
    total = BATCHES * 2 * CALLS_PER_BATCH
    assert held > 0 and spiller.values_spilled == total - held
    assert str(spiller.path) in capfd.readouterr().err  # the message names the file
    delivered = rank0.receive()
    rank0.receive()  # acknowledges them
    late = _batch(BATCHES * CALLS_PER_BATCH)
    sender.write(late)  # the writer caught up: this one is sent, not spilled
    delivered += rank0.receive()
    assert spiller.values_spilled == total - held
    _, spilled = read_spill(spiller.path)
    got = _seqs(delivered) + _seqs(spilled)
    assert sorted(got) == sorted(_seqs([*sent, late])) and len(set(got)) == len(got)
