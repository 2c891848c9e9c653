"""How many ranks one rank 0 can absorb: many senders pushing rows through the gather channel.

No Lightning, no process group: each sender process is what a rank > 0 runs underneath the
logger, for real (a `RecordBuffer`, a `BackgroundWriter`, a `GatherSender` over a
`RowChannel` to the TCPStore), appending log calls as fast as it can for a bounded time.
Rank 0 is the same code on the receiving side: a `GatherReceiver` with a real DuckDB store,
drained by its `BackgroundWriter`, finishing as `finalize` does (`sink.finish`). The
TCPStore server lives in rank 0's process, as in a launch.

Then every row is checked to be stored exactly once: for each sender, as many rows as it
appended, ``seq`` 0..n-1 each with every key, no duplicate (run, rank, seq, key), nothing
undelivered or spilled. Reported:

- ``rank0_rows_per_s``: rows in the store / time from the start until rank 0's finish
  returned (rank 0's sustained intake, end to end);
- ``offered_rows_per_s``: rows the senders appended / the sending window (what was asked);
- ``lag_s``: from the last sender's last append to rank 0's finish (every row stored).

Usage: python benchmarks/bench_gather_load.py [--senders 32] [--seconds 10]
       (or `cases(sizes)` from benchmarks/run.py, section ``gather_load``)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from benchmarks._harness import Case, Sizes, free_port, peak_rss_mib, raise_if_any_failed

SECTION = "gather_load"
KEYS = [f"metric_{i}" for i in range(10)]
FLUSH_EVERY = 100  # MultiRankLogger's flush_logs_every_n_steps default
FLUSH_INTERVAL = 5.0  # MultiRankLogger's flush_interval default
FINISH_TIMEOUT = 300.0  # rank 0's bounded wait for every sender (finalize's timeout)


def _sender(rank: int, world: int, port: int, run_id: int, seconds: float, start_at: float, out: str) -> None:
    from multirank_logger.channel.row_channel import RowChannel
    from multirank_logger.write.buffer import RecordBuffer
    from multirank_logger.write.sinks import GatherSender
    from multirank_logger.write.writer_thread import BackgroundWriter, ToSink

    channel = RowChannel("load", rank, world, host="127.0.0.1", port=port, timeout=FINISH_TIMEOUT)
    # unbounded here: this measures what the channel delivers, exactly once, under saturation;
    # the sender's memory bound and its spill are bench_scale.py --past-ceiling's subject
    sink = GatherSender(channel, max_held_values=sys.maxsize)
    buffer = RecordBuffer()
    writer = BackgroundWriter(
        buffer, ToSink(sink, run_id, rank), flush_interval=FLUSH_INTERVAL, flush_every=FLUSH_EVERY
    )
    writer.start()
    while time.time() < start_at:
        time.sleep(0.01)
    end = time.monotonic() + seconds
    calls = 0
    while time.monotonic() < end:
        for _ in range(100):  # check the clock once per 100 calls
            buffer.append(calls, {k: float(calls + i) for i, k in enumerate(KEYS)})
            calls += 1
            writer.maybe_wake()  # save(), as Lightning calls it after each log_metrics
    last_append = time.time()
    writer.stop(FINISH_TIMEOUT)
    flushed = writer.flush(FINISH_TIMEOUT)
    sink.finish("success", FINISH_TIMEOUT, lambda: None)
    sink.close()
    result = {"rank": rank, "calls": calls, "last_append": last_append, "flushed": flushed,
              "undelivered": sum(len(b) for b in sink.undelivered)}
    Path(out, f"sender{rank}.json").write_text(json.dumps(result))


def _receiver(
    world: int, port: int, db: str, run_id: int, start_box: Path, seconds: float, out: str, ready: Any
) -> None:
    import torch.distributed as dist

    from multirank_logger.channel.row_channel import RowChannel
    from multirank_logger.store.sql_store import Store
    from multirank_logger.write.buffer import RecordBuffer
    from multirank_logger.write.sinks import GatherReceiver
    from multirank_logger.write.writer_thread import BackgroundWriter, ToSink

    server = dist.TCPStore("127.0.0.1", port, world, True, timedelta(seconds=FINISH_TIMEOUT), wait_for_workers=False)
    ready.set()
    store = Store(db)
    channel = RowChannel("load", 0, world, host="127.0.0.1", port=port, timeout=FINISH_TIMEOUT)
    sink = GatherReceiver(store, run_id, channel)
    # rank 0 logs nothing of its own here: its writer drains the others every flush_interval,
    # as during training; at the end of the sending window it finishes as `finalize` does
    writer = BackgroundWriter(
        RecordBuffer(), ToSink(sink, run_id, 0), flush_interval=FLUSH_INTERVAL, flush_every=FLUSH_EVERY
    )
    writer.start()
    end = _start_time(start_box) + seconds
    while time.time() < end:
        time.sleep(0.05)
    finished_at, done = finish_receiver(writer, sink, store, FINISH_TIMEOUT)
    Path(out, "receiver.json").write_text(json.dumps({"finished_at": finished_at, "done": done}))
    keep_server_for_senders(server, out, world, FINISH_TIMEOUT)


def finish_receiver(writer: Any, sink: Any, store: Any, timeout: float) -> tuple[float, int]:
    """Rank 0's end, as `finalize` does it: its writer stopped (this thread writes from here on),
    every sender waited for (bounded), the channel and store closed. When it ended, and how many
    senders were done."""
    writer.stop(timeout)
    writer.flush(timeout)
    done = sink.finish("success", timeout, lambda: writer.flush(timeout))
    writer.flush(timeout)
    finished_at = time.time()
    sink.close()
    store.close()
    return finished_at, len(done)


def keep_server_for_senders(server: Any, out: str, world: int, timeout: float) -> None:
    """Keep the TCPStore `server` as long as the launch would: until every sender wrote its
    ``sender{rank}.json`` (it has its acknowledgements), or `timeout`."""
    deadline = time.monotonic() + timeout
    while len(list(Path(out).glob("sender*.json"))) < world - 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    del server


def run_load(senders: int, seconds: float, db: str) -> dict[str, Any]:
    """One load run: `senders` processes for `seconds`, into the DuckDB store `db`. Checks exactly-once.

    Raises:
        AssertionError: when a row is missing, duplicated, or was not delivered.
    """
    from multirank_logger.store.sql_store import Store

    store = Store(db)
    run_id = store.create_run("load", world_size=senders + 1).id
    store.close()
    world = senders + 1
    port = free_port()
    # fork: 33 processes share one copy of torch's pages (spawn would load it 33 times)
    ctx = mp.get_context("fork")
    with tempfile.TemporaryDirectory() as out:
        ready = ctx.Event()
        start_box = Path(out, "start")  # the common start time, written once every process exists
        receiver = ctx.Process(target=_receiver, args=(world, port, db, run_id, start_box, seconds, out, ready))
        receiver.start()
        if not ready.wait(120):
            receiver.kill()
            raise RuntimeError("rank 0's TCPStore did not start in 120 s")
        procs = [
            ctx.Process(target=_sender_main, args=(r, world, port, run_id, seconds, start_box, out))
            for r in range(1, world)
        ]
        for p in procs:
            p.start()
        start_at = time.time() + 2.0 + 0.05 * senders  # every process connected by then
        # written aside and renamed: a process that sees the file must never read it empty
        start_box.with_suffix(".tmp").write_text(str(start_at))
        start_box.with_suffix(".tmp").replace(start_box)
        for p in [*procs, receiver]:
            p.join(FINISH_TIMEOUT + seconds + 120)
        raise_if_any_failed([*procs, receiver])
        sent = [json.loads(Path(out, f"sender{r}.json").read_text()) for r in range(1, world)]
        recv = json.loads(Path(out, "receiver.json").read_text())
    assert recv["done"] == senders, f"rank 0 heard the end of {recv['done']} of {senders} senders"
    calls = {s["rank"]: s["calls"] for s in sent}
    stats = _stored(db, run_id)
    rows = sum(calls.values()) * len(KEYS)
    _check_exactly_once(calls, stats, sent)
    last_append = max(s["last_append"] for s in sent)
    return {
        "senders": senders,
        "seconds": seconds,
        "keys_per_call": len(KEYS),
        "rows": rows,
        "offered_rows_per_s": round(rows / (last_append - start_at), 1),
        "rank0_rows_per_s": round(rows / (recv["finished_at"] - start_at), 1),
        "lag_s": round(recv["finished_at"] - last_append, 3),
        "calls_per_sender_min": min(calls.values()),
        "calls_per_sender_max": max(calls.values()),
    }


def _sender_main(rank: int, world: int, port: int, run_id: int, seconds: float, start_box: Path, out: str) -> None:
    _sender(rank, world, port, run_id, seconds, _start_time(start_box), out)


def _start_time(start_box: Path) -> float:
    deadline = time.monotonic() + 120
    while not start_box.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return float(start_box.read_text())


def _stored(db: str, run_id: int) -> dict[int, tuple[int, int, int, int, int]]:
    """Per rank: rows, distinct (seq, key), distinct seq, min seq, max seq.

    Through DuckDB itself, with its own memory limit, not a `Store` reader's: a reader caches little
    (64 MB on 2 cores), and a per-rank COUNT(DISTINCT) cannot spill: over the ~3M rows 6 unpaced
    senders store in 2 s on an idle machine it ran out of memory there (tests/runs/test_gather_load.py)."""
    import duckdb

    con = duckdb.connect(db, read_only=True)
    try:
        result = con.execute(
            "SELECT rank, count(*), count(DISTINCT (seq, key)), count(DISTINCT seq), min(seq), max(seq) "
            f"FROM metrics WHERE run_id = {int(run_id)} GROUP BY rank"
        ).fetchall()
        return {r[0]: tuple(r[1:]) for r in result}
    finally:
        con.close()


def _check_exactly_once(calls: dict[int, int], stats: dict[int, tuple[int, ...]], sent: list[dict]) -> None:
    keys = len(KEYS)
    assert all(s["flushed"] and s["undelivered"] == 0 for s in sent), f"a sender kept rows: {sent}"
    assert set(stats) == set(calls), f"ranks stored {sorted(stats)}, expected {sorted(calls)}"
    for rank, n in calls.items():
        rows, distinct, seqs, low, high = stats[rank]
        expected = (n * keys, n * keys, n, 0, n - 1)
        assert (rows, distinct, seqs, low, high) == expected, f"rank {rank}: stored {stats[rank]}, expected {expected}"


def measure(senders: int, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        result = run_load(senders, seconds, str(Path(tmp) / "load.duckdb"))
    return {"value": result.pop("rank0_rows_per_s"), "rss_mib": peak_rss_mib(), **result}


def cases(sizes: Sizes) -> list[Case]:
    seconds = {"full": 20.0, "quick": 5.0}.get(sizes.mode, 2.0)
    senders = 32 if sizes.mode != "tiny" else 4
    return [
        Case(SECTION, f"gather load: {senders} senders into one rank 0 (DuckDB), as fast as they can",
             "benchmarks.bench_gather_load:measure", "rows/s", {"senders": senders, "seconds": seconds},
             rounds=1, inner=1, timeout_s=900,
             note=f"rank 0's sustained intake over {seconds:g} s of sending; every row checked stored once; "
                  "extras: offered_rows_per_s, lag_s (last append to every row stored)")
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--senders", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(run_load(args.senders, args.seconds, str(Path(tmp) / "load.duckdb")), indent=2))
