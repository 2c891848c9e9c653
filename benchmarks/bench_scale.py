"""Many senders at a training's pace into one rank 0: what rank 0 pays, and what the launch's TCPStore feels.

`bench_gather_load` measures senders appending as fast as they can (the saturation ceiling);
this one measures the case of a real job: N senders each logging `RATE` calls/s of 10 keys
(a training step every 100 ms), with MultiRankLogger's default flush settings, for `seconds`.
Each sender is what a rank > 0 runs under the logger (a `RecordBuffer`, a `BackgroundWriter`,
a `GatherSender` over a `RowChannel`); rank 0 is a `GatherReceiver` into a DuckDB store with
its writer, as during training, finishing as `finalize` does. The processes are forked from
this one after the imports, so that they share those pages.

Reported: every row stored once (checked as in bench_gather_load), rank 0's intake (rows/s),
its lag behind the senders during the window (steady: median and max over its receives) and at
the end (last append to every row stored, the end-of-run handshake of every sender included), rank 0's peak RSS and the CPU its process spent
(receiving and writing: seconds of CPU per second of wall time), the senders' memory (sum of
their PSS, and one sender's RSS, sampled mid-run), and the latency of the launch's own TCPStore
operations (set, get, add: median and p99, in microseconds) before the senders start and
during their load.

With ``--past-ceiling BOUND`` the senders append as fast as they can instead (bench_gather_load's
saturation), each with a spill file and at most BOUND unacknowledged values: what a sender does
past rank 0's ceiling. Checked: every row is in the store or a spill file, exactly once, and no
sender held more than BOUND.

Usage: python benchmarks/bench_scale.py [--senders 256] [--seconds 30] [--past-ceiling BOUND]
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import os
import resource
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from benchmarks._harness import Case, Sizes, free_port, kill_leftovers, raise_if_any_failed
from benchmarks.bench_gather_load import (
    KEYS,
    _check_exactly_once,
    _start_time,
    _stored,
    finish_receiver,
    keep_server_for_senders,
)

SECTION = "scale"
RATE = 10.0  # log calls per second per rank: a step every 100 ms
FLUSH_EVERY = 100  # MultiRankLogger's defaults
FLUSH_INTERVAL = 5.0
TIMEOUT = 300.0
PROBES = 200  # TCPStore operations of each kind per latency sample


def _sender(
    rank: int, world: int, port: int, run_id: int, seconds: float, start_box: Path, out: str, go: Any,
    bound: int | None = None,
) -> None:
    """A paced sender; with `bound`, an unpaced one (as fast as it can) with a spill file and that
    bound on its unacknowledged values (past the ceiling)."""
    from multirank_logger.channel.row_channel import RowChannel
    from multirank_logger.store.spill_file import SpillWriter
    from multirank_logger.write.buffer import RecordBuffer
    from multirank_logger.write.sinks import GatherSender
    from multirank_logger.write.spiller import Spiller
    from multirank_logger.write.writer_thread import BackgroundWriter, ToSink

    channel = RowChannel("scale", rank, world, host="127.0.0.1", port=port, timeout=TIMEOUT)
    if bound is None:
        sink = GatherSender(channel)
    else:
        spill = SpillWriter(Path(out, "spill"), run_id=run_id, name="scale", version=0, rank=rank)
        sink = GatherSender(channel, Spiller(spill, "scale.duckdb", rank), max_held_values=bound)
    held_max = 0
    write = sink.write

    def measured_write(batch: Any) -> None:
        nonlocal held_max
        write(batch)
        held_max = max(held_max, channel.unacknowledged_values(refresh=False))

    sink.write = measured_write  # type: ignore[method-assign]
    buffer = RecordBuffer()
    writer = BackgroundWriter(buffer, ToSink(sink, run_id, rank), flush_interval=FLUSH_INTERVAL, flush_every=FLUSH_EVERY)
    writer.start()
    with channel._lock:  # connected before the start: the idle latency is measured with all of them
        channel._client()
    Path(out, f"ready{rank}").touch()
    go.wait(300)  # asleep until the start (256 processes polling a file would load the CPU they share)
    start_at = _start_time(start_box)
    calls = int(seconds * RATE) if bound is None else 0
    for call in range(calls):  # paced: call k at start + k / RATE
        delay = start_at + call / RATE - time.time()
        if delay > 0:
            time.sleep(delay)
        buffer.append(call, {k: float(call + i) for i, k in enumerate(KEYS)})
        writer.maybe_wake()
    end = start_at + seconds
    while bound is not None and time.time() < end:  # unpaced: as fast as it can
        for _ in range(100):
            buffer.append(calls, {k: float(calls + i) for i, k in enumerate(KEYS)})
            calls += 1
            writer.maybe_wake()
    last_append = time.time()
    writer.stop(TIMEOUT)
    flushed = writer.flush(TIMEOUT)
    sink.finish("success", TIMEOUT, lambda: None)
    sink.close()
    result = {"rank": rank, "calls": calls, "last_append": last_append, "flushed": flushed,
              "undelivered": sum(len(b) for b in sink.undelivered), "held_max": held_max,
              "spilled": sink.spiller.values_spilled if sink.spiller is not None else 0,
              "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    Path(out, f"sender{rank}.json").write_text(json.dumps(result))


def _receiver(
    world: int, port: int, db: str, run_id: int, start_box: Path, seconds: float, out: str, ready: Any, go: Any
) -> None:
    import torch.distributed as dist

    from multirank_logger.channel.row_channel import RowChannel
    from multirank_logger.store.sql_store import Store
    from multirank_logger.write.buffer import RecordBuffer
    from multirank_logger.write.sinks import GatherReceiver
    from multirank_logger.write.writer_thread import BackgroundWriter, ToSink

    server = dist.TCPStore("127.0.0.1", port, world, True, timedelta(seconds=TIMEOUT), wait_for_workers=False)
    ready.set()
    store = Store(db)
    channel = RowChannel("scale", 0, world, host="127.0.0.1", port=port, timeout=TIMEOUT)
    sink = GatherReceiver(store, run_id, channel)
    intake: list[tuple[float, int]] = []  # (when, rows received so far): rank 0's lag behind the senders
    receive = sink.receive

    def counted_receive() -> Any:
        batches, side = receive()
        intake.append((time.time(), (intake[-1][1] if intake else 0) + sum(map(len, batches))))
        return batches, side

    sink.receive = counted_receive  # type: ignore[method-assign]
    writer = BackgroundWriter(RecordBuffer(), ToSink(sink, run_id, 0), flush_interval=FLUSH_INTERVAL, flush_every=FLUSH_EVERY)
    go.wait(300)
    start_at = _start_time(start_box)
    cpu0, wall0 = time.process_time(), time.time()  # the TCPStore server's thread is in this process too
    writer.start()
    while time.time() < start_at + seconds:
        time.sleep(0.05)
    finished_at, done = finish_receiver(writer, sink, store, TIMEOUT)
    cpu = time.process_time() - cpu0
    result = {"finished_at": finished_at, "done": done, "cpu_s": cpu, "wall_s": finished_at - wall0, "intake": intake,
              "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    Path(out, "receiver.json").write_text(json.dumps(result))
    keep_server_for_senders(server, out, world, TIMEOUT)


def _latency_us(port: int) -> dict[str, float]:
    """The launch's own TCPStore operations (outside our prefix), as torch's code makes them."""
    import torch.distributed as dist

    client = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=60), wait_for_workers=False)
    out: dict[str, float] = {}
    ops = {"set": lambda i: client.set(f"probe/{i}", b"x" * 64), "get": lambda i: client.get(f"probe/{i}"),
           "add": lambda i: client.add("probe/count", 1)}
    for name, op in ops.items():
        times = []
        for i in range(PROBES):
            t = time.perf_counter()
            op(i)
            times.append((time.perf_counter() - t) * 1e6)
        times.sort()
        out[f"{name}_median_us"] = round(statistics.median(times), 1)
        out[f"{name}_p99_us"] = round(times[int(len(times) * 0.99) - 1], 1)
    return out


def _steady_lags(intake: list[list[float]], start_at: float, offered_per_s: float, seconds: float) -> list[float]:
    """At each of rank 0's receives during the sending window: how far behind the senders' appends
    the rows it holds are (now, less the time by which the senders had appended that many rows).
    A sender's rows wait in its buffer for its flush (up to `FLUSH_INTERVAL`): that is in it."""
    return [when - (start_at + rows / offered_per_s) for when, rows in intake
            if start_at + FLUSH_INTERVAL < when < start_at + seconds and rows]


def _pss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def run_scale(senders: int, seconds: float, db: str, bound: int | None = None) -> dict[str, Any]:
    """One paced run into the DuckDB store `db`; checks every row stored once. With `bound`:
    unpaced senders, each holding at most `bound` unacknowledged values, the rest spilled;
    checks every row stored or spilled, once."""
    # every import the processes need, before the fork: they share these pages
    import torch.distributed  # noqa: F401

    import multirank_logger.write.sinks  # noqa: F401
    import multirank_logger.write.writer_thread  # noqa: F401
    from multirank_logger.store.sql_store import Store

    store = Store(db)
    run_id = store.create_run("scale", world_size=senders + 1).id
    store.close()
    world, port = senders + 1, free_port()
    gc.freeze()  # the collector never touches what is imported: those pages stay shared after the fork
    ctx = mp.get_context("fork")
    with tempfile.TemporaryDirectory() as out:
        ready, go = ctx.Event(), ctx.Event()
        start_box = Path(out, "start")
        receiver = ctx.Process(target=_receiver, args=(world, port, db, run_id, start_box, seconds, out, ready, go))
        procs: list[Any] = []
        receiver.start()
        try:
            if not ready.wait(120):
                raise RuntimeError("rank 0's TCPStore did not start in 120 s")
            procs = [ctx.Process(target=_sender, args=(r, world, port, run_id, seconds, start_box, out, go, bound))
                     for r in range(1, world)]
            for p in procs:
                p.start()
            deadline = time.monotonic() + 300
            while len(list(Path(out).glob("ready*"))) < senders and time.monotonic() < deadline:
                if any(p.exitcode not in (None, 0) for p in [*procs, receiver]):
                    break  # raise_if_any_failed names it below
                time.sleep(0.1)
            time.sleep(2.0)  # every sender connected and idle
            idle = _latency_us(port)  # no logging load yet
            start_at = time.time() + 1.0
            start_box.with_suffix(".tmp").write_text(str(start_at))
            start_box.with_suffix(".tmp").replace(start_box)
            go.set()
            time.sleep(max(start_at + seconds / 2 - time.time(), 0))
            loaded = _latency_us(port)  # mid-run, under the senders' flushes
            senders_pss = _pss_mib([p.pid for p in procs if p.pid is not None])
            for p in [*procs, receiver]:
                p.join(TIMEOUT + seconds + 120)
            raise_if_any_failed([*procs, receiver])
        finally:
            kill_leftovers([*procs, receiver])
        sent = [json.loads(Path(out, f"sender{r}.json").read_text()) for r in range(1, world)]
        recv = json.loads(Path(out, "receiver.json").read_text())
        calls = {s["rank"]: s["calls"] for s in sent}
        if bound is not None:
            return _past_ceiling(db, run_id, calls, sent, bound, Path(out, "spill"), start_at, recv)
    assert recv["done"] == senders, f"rank 0 heard the end of {recv['done']} of {senders} senders"
    _check_exactly_once(calls, _stored(db, run_id), sent)
    rows = sum(calls.values()) * len(KEYS)
    last_append = max(s["last_append"] for s in sent)
    lags = _steady_lags(recv["intake"], start_at, senders * RATE * len(KEYS), seconds)
    return {
        "senders": senders, "seconds": seconds, "calls_per_s_per_sender": RATE, "keys_per_call": len(KEYS),
        "rows": rows, "stored_once": True,
        "offered_rows_per_s": round(rows / (last_append - start_at), 1),
        "rank0_rows_per_s": round(rows / (recv["finished_at"] - start_at), 1),
        "steady_lag_s_median": round(statistics.median(lags), 2) if lags else None,
        "steady_lag_s_max": round(max(lags), 2) if lags else None,
        "end_lag_s": round(recv["finished_at"] - last_append, 3),
        "rank0_cpu_per_wall_s": round(recv["cpu_s"] / recv["wall_s"], 3),
        "rank0_cpu_us_per_row": round(recv["cpu_s"] / rows * 1e6, 2),
        "rank0_peak_rss_mib": round(recv["rss_mib"], 1),
        "senders_pss_mib_total": round(senders_pss, 1),
        "sender_peak_rss_mib_max": round(max(s["rss_mib"] for s in sent), 1),
        "tcpstore_idle": idle, "tcpstore_loaded": loaded,
    }


def _past_ceiling(
    db: str, run_id: int, calls: dict[int, int], sent: list[dict], bound: int, spill_dir: Path, start_at: float,
    recv: dict[str, Any],
) -> dict[str, Any]:
    """Unpaced senders: every (rank, seq, key) in the store or a spill file, exactly once."""
    import duckdb
    import pyarrow as pa

    from multirank_logger.store.spill_file import read_spill

    cols = ["rank", "seq", "key"]
    parts = [batch.select(cols) for path in sorted(spill_dir.glob("*")) for batch in read_spill(path)[1]]
    spill = pa.Table.from_batches(parts) if parts else pa.table({"rank": [0], "seq": [0], "key": ["x"]}).slice(0, 0)
    con = duckdb.connect(db, read_only=True)
    con.register("spill", spill)
    stored = con.execute(f"SELECT count(*) FROM metrics WHERE run_id = {int(run_id)}").fetchone()[0]
    total, distinct = con.execute(
        f"SELECT count(*), count(DISTINCT (rank, seq, key)) FROM (SELECT rank, seq, key FROM metrics "
        f"WHERE run_id = {int(run_id)} UNION ALL SELECT rank, seq, key FROM spill)"
    ).fetchone()
    con.close()
    expected = sum(calls.values()) * len(KEYS)
    assert total == expected and distinct == expected, f"{total} rows, {distinct} distinct, {expected} sent"
    assert all(s["held_max"] <= bound for s in sent), "a sender held more than its bound"
    return {
        "senders": len(calls), "rows": expected, "stored": stored, "spilled": total - stored,
        "offered_rows_per_s": round(expected / (max(s["last_append"] for s in sent) - start_at), 1),
        "rank0_rows_per_s": round(stored / (recv["finished_at"] - start_at), 1),
        "bound_values": bound, "sender_held_max": max(s["held_max"] for s in sent),
        "senders_that_spilled": sum(1 for s in sent if s["spilled"]), "stored_or_spilled_once": True,
    }


def measure(senders: int, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        result = run_scale(senders, seconds, str(Path(tmp) / "scale.duckdb"))
    return {"value": result.pop("rank0_rows_per_s"), "rss_mib": result["rank0_peak_rss_mib"], **result}


def cases(sizes: Sizes) -> list[Case]:
    from benchmarks.bench_node_rows import cases as node_cases  # it imports this module's settings

    senders, seconds = {"full": (256, 30.0), "quick": (64, 15.0)}.get(sizes.mode, (4, 3.0))
    return [
        Case(SECTION, f"scale: {senders} paced senders ({RATE:g} calls/s x 10 keys) into one rank 0 (DuckDB)",
             "benchmarks.bench_scale:measure", "rows/s", {"senders": senders, "seconds": seconds},
             rounds=1, inner=1, timeout_s=1200,
             note="rank 0's intake; every row checked stored once; extras: steady_lag_s_*, end_lag_s, rank0_cpu_per_wall_s, "
                  "rank0_peak_rss_mib, senders_pss_mib_total, tcpstore_idle/loaded (set/get/add latency)")
    ] + node_cases(sizes)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--senders", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--past-ceiling", type=int, default=None, metavar="BOUND",
                        help="unpaced senders, each holding at most BOUND unacknowledged values (the rest spilled)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        result = run_scale(args.senders, args.seconds, str(Path(tmp) / "scale.duckdb"), args.past_ceiling)
        print(json.dumps(result, indent=2))
