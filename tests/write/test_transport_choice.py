"""The transport's choice (write/transport_choice.py): choices refused, forced choices decided
locally, and rank 0's decision reaching every rank through a real TCPStore: direct or gather by
whether every rank sees the store's file; for a server, direct or node writers by its free
connections and max_writers, and which rank writes for which (pure)."""

from __future__ import annotations

import datetime
import socket
import threading
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from multirank_logger.channel.row_channel import RowChannel
from multirank_logger.errors import InvalidTransport
from multirank_logger.store.backends import backend_for, resolve_url
from multirank_logger.write.buffer import RecordBuffer
from multirank_logger.write.transport_choice import _plan, choose_transport, filesystem_type
from tests.helpers.launches import free_port

pytestmark = pytest.mark.timeout(60)
SERVER_URL = "postgresql+psycopg://trainer@db-host/runs"  # never connected to: choose_transport only reads its kind


def test_plan_cuts_nodes_into_writer_groups_written_by_their_lowest_rank() -> None:
    """Two nodes of four ranks: one writer each, or rank 0 for all; ranks spread over nodes
    cyclically (SLURM's cyclic distribution) still go to a writer on their own node's group."""
    blocks = {r: f"h{r // 4}|0" for r in range(8)}
    assert _plan(blocks, ["h0|0", "h1|0"], 2, 8) == [0, 0, 0, 0, 4, 4, 4, 4]
    assert _plan(blocks, ["h0|0", "h1|0"], 1, 8) == [0] * 8
    cyclic = {r: f"h{r % 3}|0" for r in range(8)}
    assert _plan(cyclic, ["h0|0", "h1|0", "h2|0"], 3, 8) == [0, 1, 2, 0, 1, 2, 0, 1]
    assert _plan(cyclic, ["h0|0", "h1|0", "h2|0"], 2, 8) == [0, 0, 2, 0, 0, 2, 0, 0]


def _decide(
    world: int, room: tuple[int, str] | None = None, max_writers: int | None = None, channels: list | None = None,
    *, db: str | Path = SERVER_URL, requested: str = "auto", answering: int | None = None, timeout: float = 10,
) -> list:
    """Ranks 0 to `answering` - 1 (every rank by default) decide at once, each on its own channel to
    one TCPStore: each rank's (choice, reason, channel); None for a rank that never answers. `room`:
    the server's free connections as rank 0 reads them. `channels` gets each rank's channel, the
    launch's store kept alive with them."""
    server = dist.TCPStore("127.0.0.1", free_port(), None, True, datetime.timedelta(seconds=10), wait_for_workers=False)
    backend = backend_for(resolve_url(str(db)))
    out: list = [None] * world

    def decide(rank: int) -> None:
        channel = RowChannel("n", rank, world, host="127.0.0.1", port=server.port)
        choice, reason = choose_transport(
            requested, backend, world, rank=rank, channel=channel, timeout=timeout, max_writers=max_writers,
            free_connections=(lambda: room) if rank == 0 and room is not None else None,
        )
        out[rank] = (choice, reason, channel)
        if channels is not None:
            channels[rank] = channel

    if channels is not None:
        channels[:] = [None] * world + [server]  # the launch's store, alive while the list is
    threads = [threading.Thread(target=decide, args=(r,)) for r in range(world if answering is None else answering)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def _writers(out: list) -> list:
    """Each rank's choice, the rank it sends to and the ranks that send to it."""
    return [(choice, channel.writer, channel.senders) for choice, _, channel in out]


def test_unknown_transport_is_refused() -> None:
    """A typo in transport= is an error that lists the choices."""
    backend = backend_for(resolve_url("x.sqlite"))
    with pytest.raises(InvalidTransport, match="transport='gahter' is not one of 'auto', 'direct', 'gather'"):
        choose_transport("gahter", backend, 2)


def test_direct_with_duckdb_and_several_ranks_is_refused() -> None:
    """DuckDB takes one writing process: forcing direct with 2 ranks says to use gather."""
    with pytest.raises(InvalidTransport, match="takes one writing process per file"):
        choose_transport("direct", backend_for(resolve_url("x.duckdb")), 2)


def test_forced_choices_need_no_channel() -> None:
    """transport='gather' or 'direct' is decided locally, the same on every rank."""
    backend = backend_for(resolve_url("x.sqlite"))
    assert choose_transport("gather", backend, 4, rank=3)[0] == "gather"
    assert choose_transport("direct", backend, 4, rank=3)[0] == "direct"


def test_auto_gathers_for_duckdb(tmp_path: Path) -> None:
    """auto + DuckDB: both ranks get gather, with the reason."""
    out = _decide(2, db=tmp_path / "runs.duckdb")
    assert out[0][:2] == out[1][:2]
    assert out[0][0] == "gather" and "one writing process" in out[0][1]


def test_auto_writes_directly_to_sqlite_every_rank_sees(tmp_path: Path) -> None:
    """auto + SQLite on a local disk both ranks see: direct on both, and the probe file is gone."""
    out = _decide(2, db=tmp_path / "runs.sqlite")
    assert out[0][:2] == out[1][:2]
    assert out[0][0] == "direct"
    assert not list(tmp_path.glob(".multirank-probe-*"))


def test_auto_gathers_when_a_rank_does_not_answer(tmp_path: Path) -> None:
    """A rank that never answers rank 0's probe must not write directly: rank 0 picks gather within its bound."""
    out = _decide(2, db=tmp_path / "runs.sqlite", answering=1, timeout=0.5)
    assert out[0][0] == "gather" and "rank(s) 1 cannot see" in out[0][1]


def test_filesystem_type_reads_the_deepest_mount(tmp_path: Path) -> None:
    """The deepest mount holding the path gives its type: an NFS mount inside a local disk is NFS."""
    mounts = tmp_path / "mounts"
    mounts.write_text("/dev/sda1 / ext4 rw 0 0\nserver:/vol /shared nfs4 rw 0 0\n")
    assert filesystem_type("/shared/runs/x.sqlite", str(mounts)) == "nfs4"
    assert filesystem_type("/sharedother", str(mounts)) == "ext4"


def test_auto_writes_directly_while_the_server_has_room_for_every_rank() -> None:
    assert [c for c, _, _ in _decide(4, (100, "max_connections=100, 1 in use"))] == ["direct"] * 4


def test_auto_ships_to_node_writers_when_the_ranks_outnumber_free_connections() -> None:
    """4 ranks on one host, 2 connections free: rank 0 writes for its node; the others send to it."""
    out = _writers(_decide(4, (2, "max_connections=10, 8 in use")))
    assert out == [("node", 0, (1, 2, 3))] + [("node", 0, ())] * 3


def test_max_writers_bounds_the_writers_whatever_the_room() -> None:
    assert [c for c, _, _ in _decide(3, (100, "max_connections=100"), max_writers=1)] == ["node"] * 3


def test_node_with_a_one_writer_store_is_refused() -> None:
    with pytest.raises(InvalidTransport, match="transport='node' needs a store that several processes can write"):
        choose_transport("node", backend_for(resolve_url("x.duckdb")), 2)


def test_a_node_writer_carries_its_ranks_rows_on_a_store_of_its_own_and_stops_it_at_the_end() -> None:
    """The writer hosts a TCPStore on a port of its own; its sender's rows, acknowledgements and
    end go there (the launch's store holds none of them), the small values stay on the launch's.
    At the end the writer waits for its sender to let go, then stops its store: the port is closed."""
    channels: list = []
    out = _writers(_decide(2, (0, "max_connections=10, 10 in use"), channels=channels))
    assert out == [("node", 0, (1,)), ("node", 0, ())]
    writer, sender, _ = channels
    launch = sender._launch
    assert sender.address == writer.address != launch.address and sender.address.startswith("127.0.0.1:")
    buffer = RecordBuffer()
    for step in range(5):
        buffer.append(step, {"loss": float(step)})
    sender.send(buffer.drain(run_id=1, rank=1))
    got, deadline = [], time.monotonic() + 10
    while sum(map(len, got)) < 5 and time.monotonic() < deadline:
        got += writer.receive()
    writer.receive()  # acknowledges them
    sender.mark_done("success")
    assert sender.wait_delivered(5.0) == [] and writer.done_ranks() == {1: "success"}
    assert [b.column("value").to_pylist() for b in got] == [[0.0, 1.0, 2.0, 3.0, 4.0]]
    in_launch = dist.PrefixStore("multirank_logger/n/", launch._client())
    assert not in_launch.check(["done/1"]) and in_launch.add("ack/1", 0) == 0
    assert sender.fetch("transport/choice", 1.0).startswith(b"node")  # small values: the launch's store
    port = int(writer.address.rpartition(":")[2])
    sender.close()
    writer.close()
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def test_a_writer_publishes_loopback_for_its_own_host_and_a_routable_address_across_hosts() -> None:
    """Its ranks all on its host: loopback. Ranks on other hosts: the address of the interface that
    reaches the launch's master (never a loopback one, which those hosts cannot reach)."""
    from multirank_logger.channel.node_rows import reachable_host

    assert reachable_host(False) == "127.0.0.1"
    assert reachable_host(True, master="127.0.0.1") == socket.getfqdn()  # the master is local: no route to read
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: the route a remote master would take
            outward = probe.getsockname()[0]
    except OSError:
        outward = "127.0.0.1"  # no route at all: the host's name
    assert reachable_host(True, master="192.0.2.1") == (outward if not outward.startswith("127.") else socket.getfqdn())
