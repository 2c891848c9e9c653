"""What the launch's TCPStore (rank 0's process) carries under the node transport, with and without
node-local stores.

N ranks on K simulated nodes (NODE_RANK/LOCAL_RANK set as Lightning's launcher sets them) decide
``transport="node"`` through `choose_transport`, as MultiRankLogger does for a PostgreSQL store
with fewer free connections than ranks: each node's lowest rank receives its node's rows. Each
sender logs `RATE` calls/s of 10 keys (MultiRankLogger's default flush settings) for `seconds`
through a `GatherSender`; each writer receives (no store: the rows are counted, each (rank,
seq, key) once). The launch's TCPStore lives in a process of its own, so that what it costs is
that process's alone.

Two modes, the same ranks: ``node_local`` (each writer hosts a TCPStore of its own: this
package's default) and ``via_launch`` (`RowChannel.host_rows` made to fail, the fallback a writer
takes when it cannot start a server: every row travels through the launch's store, as before
node-local stores). Reported per mode: the bytes the launch's store received and sent
(``ss``: its sockets' counters, read before any rank disconnects), the CPU of its process per
second of wall time, and the latency of torch's own set/get/add on it in the middle of the run.

Usage: python benchmarks/bench_node_rows.py [--senders 32] [--nodes 4] [--seconds 15]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import subprocess
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from benchmarks._harness import Case, Sizes, free_port, kill_leftovers, raise_if_any_failed
from benchmarks.bench_gather_load import KEYS
from benchmarks.bench_scale import FLUSH_EVERY, FLUSH_INTERVAL, RATE, _latency_us

SECTION = "scale"
TIMEOUT = 120.0
SERVER_URL = "postgresql+psycopg://trainer@db-host/runs"  # never connected to: only its kind is read


def _launch_store(port: int, out: str, ready: Any, stop: Any) -> None:
    """The launch's TCPStore, alone in its process: its CPU is the store's."""
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", port, None, True, timedelta(seconds=TIMEOUT), wait_for_workers=False)
    ready.set()
    cpu0, wall0 = time.process_time(), time.time()
    stop.wait(TIMEOUT * 3)
    Path(out, "launch.json").write_text(json.dumps({"cpu_s": time.process_time() - cpu0, "wall_s": time.time() - wall0}))
    del server


def _rank(rank: int, world: int, per_node: int, port: int, seconds: float, out: str, via_launch: bool,
          start_at: float, sampled: Any) -> None:
    from multirank_logger.channel.row_channel import RowChannel
    from multirank_logger.store.backends import backend_for, resolve_url
    from multirank_logger.write.buffer import RecordBuffer
    from multirank_logger.write.sinks import GatherSender
    from multirank_logger.write.transport_choice import choose_transport
    from multirank_logger.write.writer_thread import BackgroundWriter, ToSink

    os.environ.update(NODE_RANK=str(rank // per_node), LOCAL_RANK=str(rank % per_node))
    if via_launch:
        RowChannel.host_rows = lambda self: None  # type: ignore[method-assign]
    channel = RowChannel("bench", rank, world, host="127.0.0.1", port=port, timeout=TIMEOUT)
    choose_transport("node", backend_for(resolve_url(SERVER_URL)), world, rank=rank, channel=channel, timeout=TIMEOUT)
    result: dict[str, Any] = {"rank": rank, "rows_at": channel.address}
    if channel.receives:
        seen: set[tuple[int, int, str]] = set()
        rows = 0
        while True:
            for batch in channel.receive():
                rows += len(batch)
                seen.update(zip(*(batch.column(c).to_pylist() for c in ("rank", "seq", "key")), strict=True))
            if set(channel.senders) <= channel.done_ranks().keys() or time.time() > start_at + seconds + TIMEOUT:
                break
            time.sleep(0.1)
        channel.receive()  # acknowledges the last
        result.update(rows=rows, distinct=len(seen), senders=len(channel.senders))
    else:
        sink = GatherSender(channel)
        buffer = RecordBuffer()
        writer = BackgroundWriter(buffer, ToSink(sink, 1, rank), flush_interval=FLUSH_INTERVAL, flush_every=FLUSH_EVERY)
        writer.start()
        calls = int(seconds * RATE)
        for call in range(calls):  # paced: call k at start + k / RATE
            time.sleep(max(start_at + call / RATE - time.time(), 0))
            buffer.append(call, {k: float(call + i) for i, k in enumerate(KEYS)})
            writer.maybe_wake()
        writer.stop(TIMEOUT)
        writer.flush(TIMEOUT)
        sink.finish("success", TIMEOUT, lambda: None)
        result.update(calls=calls, undelivered=sum(map(len, sink.undelivered)))
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    sampled.wait(TIMEOUT)  # connected until the launch's store's counters are read
    channel.close()


def _socket_bytes(port: int) -> tuple[int, int]:
    """(received, sent) bytes of the established sockets of the server on `port`."""
    text = subprocess.run(["ss", "-tinH", "state", "established", f"( sport = :{port} )"], capture_output=True,
                          text=True, check=True).stdout
    received = sum(int(n) for n in re.findall(r"bytes_received:(\d+)", text))
    sent = sum(int(n) for n in re.findall(r"bytes_acked:(\d+)", text))
    return received, sent


def run_mode(senders: int, nodes: int, seconds: float, via_launch: bool) -> dict[str, Any]:
    import torch.distributed  # noqa: F401 - imported once, before the fork

    import multirank_logger.write.sinks  # noqa: F401
    import multirank_logger.write.transport_choice  # noqa: F401

    world = senders + nodes
    if world % nodes:
        raise ValueError(f"{senders} senders do not make {nodes} equal nodes with one writer each")
    ctx, port = mp.get_context("fork"), free_port()
    with tempfile.TemporaryDirectory() as out:
        ready, stop, sampled = ctx.Event(), ctx.Event(), ctx.Event()
        launch = ctx.Process(target=_launch_store, args=(port, out, ready, stop))
        procs: list[Any] = []
        launch.start()
        try:
            if not ready.wait(60):
                raise RuntimeError("the launch's TCPStore did not start")
            start_at = time.time() + 2.0 + world * 0.05  # every rank set up by then (a late one catches up)
            procs = [ctx.Process(target=_rank, args=(r, world, world // nodes, port, seconds, out, via_launch,
                                                     start_at, sampled)) for r in range(world)]
            for p in procs:
                p.start()
            time.sleep(max(start_at + seconds / 2 - time.time(), 0))
            loaded = _latency_us(port)
            deadline = time.monotonic() + seconds + TIMEOUT
            while len(list(Path(out).glob("rank*.json"))) < world and time.monotonic() < deadline:
                if any(p.exitcode not in (None, 0) for p in procs):
                    break
                time.sleep(0.1)
            received, sent = _socket_bytes(port)
            sampled.set()
            for p in procs:
                p.join(TIMEOUT)
            stop.set()
            launch.join(60)
            raise_if_any_failed([*procs, launch])
        finally:
            kill_leftovers([*procs, launch])
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]
        cpu = json.loads(Path(out, "launch.json").read_text())
    writers = [r for r in ranks if "rows" in r]
    expected = sum(r["calls"] for r in ranks if "calls" in r) * len(KEYS)
    got, distinct = sum(w["rows"] for w in writers), sum(w["distinct"] for w in writers)
    assert got == distinct == expected, f"{got} rows received, {distinct} distinct, {expected} sent"
    assert not any(r.get("undelivered") for r in ranks)
    return {
        "mode": "via_launch" if via_launch else "node_local", "senders": senders, "writers": len(writers),
        "rows": expected, "received_once": True,
        "row_stores": len({r["rows_at"] for r in ranks}),
        "launch_store_bytes_in": received, "launch_store_bytes_out": sent,
        "launch_store_bytes_per_row": round((received + sent) / expected, 2),
        "launch_store_bytes_per_rank": round((received + sent) / world),
        "launch_store_cpu_per_wall_s": round(cpu["cpu_s"] / cpu["wall_s"], 4),
        "launch_store_loaded": loaded,
    }


def measure(senders: int, nodes: int, seconds: float) -> dict[str, Any]:
    local = run_mode(senders, nodes, seconds, via_launch=False)
    via = run_mode(senders, nodes, seconds, via_launch=True)
    value = via["launch_store_bytes_in"] + via["launch_store_bytes_out"]
    local_bytes = local["launch_store_bytes_in"] + local["launch_store_bytes_out"]
    return {"value": round(local_bytes / 1e6, 3), "via_launch_mb": round(value / 1e6, 3),
            "node_local": local, "via_launch": via}


def cases(sizes: Sizes) -> list[Case]:
    senders, nodes, seconds = {"full": (64, 8, 15.0), "quick": (32, 4, 10.0)}.get(sizes.mode, (4, 2, 2.0))
    return [
        Case(SECTION, f"scale: node transport, {senders} senders on {nodes} nodes: the launch's TCPStore's bytes",
             "benchmarks.bench_node_rows:measure", "MB", {"senders": senders, "nodes": nodes, "seconds": seconds},
             rounds=1, inner=1, timeout_s=600,
             note="bytes through rank 0's (the launch's) TCPStore with node-local stores; extras: via_launch_mb "
                  "(every row through it, as before), CPU and set/get/add latency of that store in each mode")
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--senders", type=int, default=32)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(json.dumps(measure(args.senders, args.nodes, args.seconds), indent=2))
