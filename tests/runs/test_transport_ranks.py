"""RowChannel between real gloo processes: ranks ship rows to rank 0 in order, and a sender whose
rank 0 is killed fails fast, handing back every unacknowledged row (the channel alone, over a
TCPStore in this process, is tests/channel/test_transport.py)."""

from __future__ import annotations

import datetime
import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from multirank_logger.channel.row_channel import RowChannel
from multirank_logger.channel.tcpstore_client import CHUNK_ROWS
from multirank_logger.errors import ChannelError
from tests.helpers.launches import forkserver, spawn_ranks
from tests.helpers.row_batches import channel_batch

pytestmark = pytest.mark.timeout(120)


def _init(rank: int, world_size: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=60))


def _test_ranks_ship_to_rank0(rank: int, world_size: int, port: int, out: str) -> None:
    _init(rank, world_size, port)
    channel = RowChannel("ship", rank, world_size)  # MASTER_ADDR/PORT, as under Lightning
    if rank == 0:
        channel.publish("run", b"7 lightning_logs 3")
        got: dict[int, list[int]] = {}
        deadline = time.monotonic() + 60
        done: dict[int, str] = {}
        while len(done) < world_size - 1 and time.monotonic() < deadline:
            for batch in channel.receive():
                got.setdefault(batch.column("rank")[0].as_py(), []).extend(batch.column("seq").to_pylist())
            done = channel.done_ranks()
            time.sleep(0.01)
        channel.receive()  # acknowledges the last batches
        left = {r: channel._client().queue_len(f"rows/{r}") for r in range(1, world_size)}
        Path(out).write_text(json.dumps({"got": got, "done": done, "left": left}))
    else:
        identity = channel.fetch("run", 30)
        assert identity == b"7 lightning_logs 3", identity
        if rank == 1:  # many small batches, then one that must be cut into chunks
            for i in range(50):
                channel.send(channel_batch(rank, 3, first_seq=3 * i))
            channel.send(channel_batch(rank, CHUNK_ROWS, first_seq=150, keys=("a", "b", "c")))
        # rank 2 logs nothing at all: it must still finish
        channel.mark_done("success")
        assert channel.wait_delivered(30) == []
    dist.barrier()  # keeps rank 0's store alive until everyone is through (test only)
    dist.destroy_process_group()


def test_gloo_ranks_ship_rows_to_rank0_in_order(tmp_path: Path) -> None:
    """3 gloo ranks: rank 1's small and chunked big batches arrive whole and in order; silent rank 2 finishes."""
    out = tmp_path / "rank0.json"
    assert spawn_ranks(_test_ranks_ship_to_rank0, 3, str(out), ctx=forkserver("tests.runs.test_transport_ranks")) == [0, 0, 0]
    result = json.loads(out.read_text())
    expected = [s for s in range(150) for _ in "ab"] + [s for s in range(150, 150 + CHUNK_ROWS) for _ in "abc"]
    assert result["got"]["1"] == expected
    assert "2" not in result["got"]
    assert result["done"] == {"1": "success", "2": "success"}
    assert result["left"] == {"1": 0, "2": 0}  # rank 0 took everything: the store's memory is flat


def _test_rank0_dies(rank: int, world_size: int, port: int, out: str) -> None:
    _init(rank, world_size, port)
    channel = RowChannel("die", rank, world_size, timeout=10)
    if rank == 0:
        deadline = time.monotonic() + 30
        taken = 0
        while taken < 2 and time.monotonic() < deadline:
            taken += len(channel.receive())
            time.sleep(0.01)
        channel.receive()  # acknowledges those two
        channel.fetch("seen-acks", 30)  # once rank 1 saw them acknowledged, die like a killed rank
        os.kill(os.getpid(), signal.SIGKILL)
    sent, failed_at, undelivered = 0, None, []
    for i in range(2):
        channel.send(channel_batch(rank, 1, first_seq=i))
        sent += 1
    assert channel.wait_delivered(30) == []
    channel.publish("seen-acks", b"1")
    start = time.monotonic()
    for i in range(2, 10_000):
        try:
            channel.send(channel_batch(rank, 1, first_seq=i))
            sent += 1
            time.sleep(0.01)
        except ChannelError as exc:
            failed_at = time.monotonic() - start
            undelivered = [b.column("seq")[0].as_py() for b in exc.undelivered]
            break
    Path(out).write_text(json.dumps({"sent": sent, "failed_after_s": failed_at, "undelivered": undelivered}))


def test_send_fails_fast_when_rank0_is_gone(tmp_path: Path) -> None:
    """SIGKILL rank 0 (and its TCPStore): the sender's next sends fail and hand back every unacknowledged row."""
    out = tmp_path / "rank1.json"
    codes = spawn_ranks(_test_rank0_dies, 2, str(out), ctx=forkserver("tests.runs.test_transport_ranks"))
    assert codes == [-signal.SIGKILL, 0]
    result = json.loads(out.read_text())
    assert result["failed_after_s"] is not None
    # rows 0 and 1 were acknowledged; everything after them comes back for the spill file
    assert result["undelivered"] == list(range(2, result["sent"] + 1))
