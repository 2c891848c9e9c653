"""RowChannel over a real TCPStore: the wire encoding, and the channel between senders and rank 0 in
one process (the same between real gloo processes: tests/runs/test_transport_ranks.py)."""

from __future__ import annotations

import datetime
import math
import pickle
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc
import pytest
import sqlalchemy as sa
import torch.distributed as dist

from multirank_logger.channel.row_channel import RowChannel
from multirank_logger.errors import ChannelError, ChannelTimeout
from multirank_logger.rows.batch import METRICS_SCHEMA, empty_batch
from multirank_logger.rows.wire import decode_batch, encode_batch
from multirank_logger.write.buffer import RecordBuffer
from tests.helpers.launches import free_port
from tests.helpers.processes import stop_process, stopped, tcpstore_server_process
from tests.helpers.row_batches import channel_batch

pytestmark = pytest.mark.timeout(120)


# -- encoding -------------------------------------------------------------------------------


def test_encoding_round_trips_every_kind_of_value() -> None:
    """NaN, infinities, ints, bools, -0.0 and non-ASCII keys come back exactly, as the same Arrow batch."""
    buf = RecordBuffer()
    buf.append(3, {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "int": 2**53, "bool": True})
    buf.append(4, {"zero": -0.0, "clé é ü 🙂": 1.5, "": 0.1})
    batch = buf.drain(run_id=12, rank=3)
    back = decode_batch(encode_batch(batch))
    assert back.schema == METRICS_SCHEMA
    assert back.equals(batch)  # dtype included: it is what keeps NaN, int, bool and -0.0 apart
    assert back.column("value").null_count == 1  # the NaN, a NULL as the schema stores it


def test_encoding_of_an_empty_batch() -> None:
    """An empty batch encodes and decodes to an empty batch of the metrics schema."""
    back = decode_batch(encode_batch(empty_batch()))
    assert back.num_rows == 0 and back.schema == METRICS_SCHEMA


def test_encoding_a_slice_sends_its_rows_only() -> None:
    """A slice (the channel's chunks of a big batch) encodes its own rows, not its parent's buffers."""
    batch = channel_batch(1, 10_000)
    part = batch.slice(5_000, 100)
    payload = encode_batch(part)
    assert decode_batch(payload).equals(part)
    assert len(payload) < len(encode_batch(batch)) / 50


def test_decoding_refuses_what_is_not_a_batch() -> None:
    """Foreign, truncated or damaged bytes raise a ValueError that says so; nothing is unpickled."""
    with pytest.raises(ValueError, match="not a multirank_logger row batch"):
        decode_batch(pickle.dumps({"a": 1}))
    payload = encode_batch(channel_batch(1, 10))
    for cut in (5, 8, 9, len(payload) // 2, len(payload) - 1):  # in the end marker, the body, the schema
        with pytest.raises(ValueError, match="truncated|damaged"):
            decode_batch(payload[:-cut])
    # an index past the key dictionary: validated before a store reads it
    damaged = bytearray(payload)
    codes = bytes(memoryview(channel_batch(1, 10).column("key").indices.buffers()[1]))
    at = bytes(damaged).index(codes)
    damaged[at : at + 4] = (1000).to_bytes(4, "little")
    with pytest.raises(ValueError, match="damaged"):
        decode_batch(bytes(damaged))


def test_decoding_refuses_another_schema() -> None:
    """An Arrow stream of other columns is not a row batch: the error names both column lists."""
    other = pa.RecordBatch.from_pydict({"run_id": [1], "loss": [0.5]})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, other.schema) as writer:
        writer.write_batch(other)
    with pytest.raises(ValueError, match=r"another schema \(\['run_id', 'loss'\]"):
        decode_batch(sink.getvalue().to_pybytes())


# -- one process, real TCPStore server ---------------------------------------------------


@pytest.fixture
def server() -> dist.TCPStore:
    """A TCPStore server on a free port, as rank 0's process (or torchrun's agent) runs one."""
    return dist.TCPStore("127.0.0.1", free_port(), None, True, datetime.timedelta(seconds=10), wait_for_workers=False)


def test_fetch_times_out_with_a_clear_error(server: dist.TCPStore) -> None:
    """fetch of a key nobody publishes ends after its timeout with ChannelTimeout."""
    channel = RowChannel("t", 1, 2, host="127.0.0.1", port=server.port)
    with pytest.raises(ChannelTimeout, match="waited 0.3 s for 'run' from rank 0"):
        channel.fetch("run", 0.3)


def test_sender_gives_up_when_rank0_takes_nothing(server: dist.TCPStore) -> None:
    """A sender whose rows rank 0 never takes fails after `timeout`, handing back every unacknowledged batch."""
    channel = RowChannel("t", 1, 2, host="127.0.0.1", port=server.port, timeout=0.5)
    first, second = channel_batch(1, 3), channel_batch(1, 3, first_seq=3)
    channel.send(first)
    time.sleep(0.6)
    with pytest.raises(ChannelError, match="Rank 0 has taken no rows from rank 1") as info:
        channel.send(second)
    assert info.value.undelivered == [first, second]
    with pytest.raises(ChannelError) as again:  # failed for good: only the new batch comes back
        channel.send(first)
    assert again.value.undelivered == [first]


def test_done_waits_for_every_row_to_be_received(server: dist.TCPStore) -> None:
    """A rank shows in done_ranks only once receive() returned every row it sent."""
    rank0 = RowChannel("t", 0, 2, host="127.0.0.1", port=server.port)
    rank1 = RowChannel("t", 1, 2, host="127.0.0.1", port=server.port)
    rank0.receive()  # connect first, as rank 0's writer does
    rank1.send(channel_batch(1, 2))
    rank1.mark_done("success")
    assert rank0.done_ranks() == {}
    assert [len(b) for b in rank0.receive()] == [4]
    assert rank0.done_ranks() == {1: "success"}


def test_a_peek_shows_rows_early_and_acknowledges_nothing(server: dist.TCPStore) -> None:
    """peek (rank 0's watch) hands each new batch once; the sender keeps it unacknowledged and
    the rank not done until receive() returned it and came back, as without the peek; a
    damaged payload is left for receive to count."""
    rank0 = RowChannel("t", 0, 2, host="127.0.0.1", port=server.port)
    rank1 = RowChannel("t", 1, 2, host="127.0.0.1", port=server.port)
    rank0.receive()
    first, second, last = channel_batch(1, 2), channel_batch(1, 3, first_seq=2), channel_batch(1, 1, first_seq=5)
    rank1.send(first)
    rank1._client().queue_push("rows/1", encode_batch(channel_batch(1, 4, first_seq=9))[:-20])
    rank1.send(second)
    assert [b.equals(w) for b, w in zip(rank0.peek(), [first, second])] == [True, True]
    assert rank0.peek() == []  # each batch once
    rank1.send(last)
    rank1.mark_done("success")
    assert [b.equals(last) for b in rank0.peek()] == [True]
    assert rank1.unacknowledged_values() == 12 and rank0.done_ranks() == {}  # looked at, not taken
    got = rank0.receive()
    assert [b.equals(w) for b, w in zip(got, [first, second, last])] == [True, True, True] and len(got) == 3
    assert rank0.damaged_batches == 1 and rank0.done_ranks() == {1: "success"}
    assert rank1.unacknowledged_values() == 12  # acknowledged at the writer's next receive, as ever
    assert rank0.receive() == [] and rank1.unacknowledged_values() == 0


def test_a_damaged_payload_is_reported_and_the_rest_arrives(
    server: dist.TCPStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A payload cut short on the way is an error naming the sender; the batches after it still arrive."""
    rank0 = RowChannel("t", 0, 2, host="127.0.0.1", port=server.port)
    rank1 = RowChannel("t", 1, 2, host="127.0.0.1", port=server.port)
    rank0.receive()
    first, last = channel_batch(1, 2), channel_batch(1, 3, first_seq=2)
    rank1.send(first)
    rank1._client().queue_push("rows/1", encode_batch(channel_batch(1, 4, first_seq=9))[:-20])
    rank1.send(last)
    with caplog.at_level("ERROR", logger="multirank_logger.channel.row_channel"):
        got = rank0.receive()
    assert [b.equals(want) for b, want in zip(got, [first, last])] == [True, True] and len(got) == 2
    assert rank0.damaged_batches == 1
    assert "dropped a row batch from rank 1 that it cannot read" in caplog.text and "truncated" in caplog.text


@pytest.mark.timeout(60)
def test_every_call_to_a_stopped_server_is_bounded(stopped_server: int) -> None:
    """A sender's first connect (in `send`), `send_side`, `fetch`, `publish` and `mark_done`, against
    a server that never answers, each fail within the channel's bound instead of waiting forever."""

    def fresh() -> RowChannel:
        return RowChannel("t", 1, 2, host="127.0.0.1", port=stopped_server, timeout=0.5)

    rows = channel_batch(1, 2)
    with pytest.raises(ChannelError) as info:
        fresh().send(rows)
    assert info.value.undelivered == [rows]  # handed back to be spilled
    with pytest.raises(ChannelError):
        fresh().send_side(b"side rows")
    with pytest.raises(ChannelError):  # ChannelTimeout is one
        fresh().fetch("identity", 0.5)
    with pytest.raises(ChannelError):
        fresh().publish("identity", b"{}")
    with pytest.raises(ChannelError):
        fresh().mark_done("success")


@pytest.fixture
def pausable_server() -> Iterator[tuple[int, subprocess.Popen[str]]]:
    """A TCPStore server in a child process (its port, and the process to SIGSTOP and SIGCONT)."""
    with tcpstore_server_process() as server:
        yield server


@pytest.fixture
def stopped_server(pausable_server: tuple[int, subprocess.Popen[str]]) -> int:
    """The port of a TCPStore server in a process stopped with SIGSTOP (a hung rank 0 or agent):
    its kernel accepts connections, nothing ever answers."""
    port, server = pausable_server
    stop_process(server.pid)
    return port


def _receive_until(rank0: RowChannel, rows: int, timeout: float = 10.0) -> list[pa.RecordBatch]:
    """What `rank0` receives until `rows` rows came (or `timeout` ran out), then once more (which acknowledges them)."""
    got: list[pa.RecordBatch] = []
    deadline = time.monotonic() + timeout
    while sum(map(len, got)) < rows and time.monotonic() < deadline:
        try:
            got += rank0.receive()
        except ChannelError:
            pass  # the store stopped answering for a while: the writer tries again at its next cycle
        time.sleep(0.05)
    got += rank0.receive()
    return got


def _reconnecting_pair(port: int, sender_timeout: float) -> tuple[RowChannel, RowChannel, list[pa.RecordBatch]]:
    """Rank 0 (1 s bound per call) and rank 1 on the pausable server, rank 0 connected, and the
    three batches rank 1 will send."""
    rank0 = RowChannel("t", 0, 2, host="127.0.0.1", port=port, timeout=1.0)
    rank1 = RowChannel("t", 1, 2, host="127.0.0.1", port=port, timeout=sender_timeout)
    rank0.receive()
    return rank0, rank1, [channel_batch(1, 2), channel_batch(1, 3, first_seq=2), channel_batch(1, 4, first_seq=5)]


@pytest.mark.timeout(60)
def test_a_sender_that_reconnects_keeps_its_count_of_acknowledgements(
    pausable_server: tuple[int, subprocess.Popen[str]],
) -> None:
    """A sender whose bounded call timed out (rank 0's store stopped, then went on) connects again
    and keeps numbering its batches as before: each row arrives once, every batch is acknowledged,
    and rank 0 sees the rank done (a reconnect that re-read the acknowledgement counter had left
    the sender waiting for acknowledgements that never come, spilling rows already stored)."""
    port, server = pausable_server
    rank0, rank1, sent = _reconnecting_pair(port, sender_timeout=1.0)
    rank1.send(sent[0])
    got = _receive_until(rank0, 4)  # taken and acknowledged
    rank1.send(sent[1])
    got += rank0.receive()  # taken, not yet acknowledged
    with stopped(server):
        assert rank1.unacknowledged_values() == 6  # its refresh times out: the client is dropped
        assert rank1._store is None
    got += rank0.receive()  # acknowledges the second batch
    rank1.send(sent[2])  # connects again
    got += _receive_until(rank0, 8)
    rank1.mark_done("success")
    assert rank1.wait_delivered(5.0) == [] and rank1.pending() == 0 and rank1.unacknowledged_values() == 0
    assert rank0.done_ranks() == {1: "success"}
    assert pa.Table.from_batches(got).equals(pa.Table.from_batches(sent))


@pytest.mark.timeout(60)
def test_a_receiver_that_reconnects_loses_and_repeats_nothing(
    pausable_server: tuple[int, subprocess.Popen[str]],
) -> None:
    """Rank 0's receive times out while its store is stopped, and the store goes on: the rows the
    timed-out call took still arrive (once), what rank 0 took before is still acknowledged, and the
    sender ends with nothing to spill."""
    port, server = pausable_server
    rank0, rank1, sent = _reconnecting_pair(port, sender_timeout=30.0)
    rank1.send(sent[0])
    got = rank0.receive()  # taken, to be acknowledged at the next call
    rank1.send(sent[1])
    with stopped(server), pytest.raises(ChannelError):
        rank0.receive()  # bounded: gives up on the stopped store, its call still waiting there
    rank1.send(sent[2])
    got += _receive_until(rank0, 9)
    rank1.mark_done("success")
    assert rank1.wait_delivered(5.0) == [] and rank1.pending() == 0
    assert rank0.done_ranks() == {1: "success"}
    assert pa.Table.from_batches(got).equals(pa.Table.from_batches(sent))


def test_a_damaged_payload_is_counted_lost_and_the_run_is_no_success(server: dist.TCPStore, tmp_path: Path) -> None:
    """Rank 0's gather sink over a real channel and store: a payload it cannot read is counted as
    lost, and the run's end recorded with that count is no success."""
    from multirank_logger.store.sql_store import Store
    from multirank_logger.store.status import record_rank_end
    from multirank_logger.write.sinks import GatherReceiver

    store = Store(tmp_path / "runs.sqlite")
    run = store.create_run("damaged", world_size=2)
    rank0 = GatherReceiver(store, run.id, RowChannel("t", 0, 2, host="127.0.0.1", port=server.port))
    rank1 = RowChannel("t", 1, 2, host="127.0.0.1", port=server.port)
    rank0.receive()
    rank1.send(channel_batch(1, 2))
    rank1._client().queue_push("rows/1", encode_batch(channel_batch(1, 4, first_seq=2))[:-20])  # cut short on the way
    rank1.mark_done("success")
    rank1.report_spilled_lost(0, 0)  # the sender believes everything went

    def cycle() -> bool:
        for batch in rank0.receive()[0]:
            store.write(batch)
        return True

    others = rank0.finish("success", 2.0, cycle)
    assert others == {1: "success"} and rank0.others_spilled_lost == (0, 1)
    record_rank_end(store, run.id, rank=0, gather_world=2, status="success", others=others, facts={},
                    values_lost=rank0.others_spilled_lost[1])
    with store.begin() as conn:
        row = conn.execute(sa.text("SELECT status, values_lost FROM runs")).one()
    store.close()
    assert tuple(row) == ("incomplete", 1)


def test_roles_are_checked(server: dist.TCPStore) -> None:
    """Rank 0 cannot send and the others cannot receive: a ValueError says which rank does what."""
    with pytest.raises(ValueError, match="rank 0 writes its own rows"):
        RowChannel("t", 0, 2, host="127.0.0.1", port=server.port).send(channel_batch(0, 1))
    with pytest.raises(ValueError, match="runs on rank 0 only"):
        RowChannel("t", 1, 2, host="127.0.0.1", port=server.port).receive()


def test_channel_pickles_without_its_connection(server: dist.TCPStore) -> None:
    """ddp_spawn pickles the logger: a used channel pickles to a fresh, unconnected one."""
    channel = RowChannel("t", 1, 2, host="127.0.0.1", port=server.port)
    channel.send(channel_batch(1, 1))
    clone = pickle.loads(pickle.dumps(channel))
    assert clone._store is None and clone.pending() == 0
    assert (clone.namespace, clone.rank, clone.world_size, clone.port) == ("t", 1, 2, server.port)


def test_missing_master_address_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside a launcher, the channel says which variables to set."""
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with pytest.raises(ChannelError, match="MASTER_ADDR and MASTER_PORT are not set"):
        RowChannel("t", 1, 2).send(channel_batch(1, 1))
