"""Which store should ``MultiRankLogger("logs")`` create: the measurement behind the default.

Issue 15 asks for the backend that never blocks a reader and lets every rank of a node
write. Two facts decide it, both measured here with the library's own code on real files:

1. Readers during training: a child process trains (log_metrics + save in a loop, the
   writer thread flushing every ``flush_interval``); this process meanwhile opens the store
   read-only and counts the run's rows, over and over, as a notebook or
   ``multirank-logger sql`` would. We report each read's latency, and reads that failed.
2. Several ranks of one node writing one file: ``--writers`` processes each write batches
   straight into the store (what ``transport="direct"`` does), at once.

    .venv/bin/python benchmarks/default_store.py [--seconds 6] [--writers 2]

Numbers go to stdout as a Markdown table (see README "Which store by default").
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SUFFIX = {"sqlite": ".sqlite", "duckdb": ".duckdb"}


def _train(db: str, seconds: float, ready: Any) -> None:
    from multirank_logger import MultiRankLogger

    logger = MultiRankLogger(db=db, flush_interval=0.2, transport="direct")
    ready.set()
    end, step = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        logger.log_metrics({f"m{i}": step * 0.1 + i for i in range(10)}, step)
        logger.save()
        step += 1
        time.sleep(0.0005)  # a training step's own work
    logger.finalize("success")


def readers_during_training(backend: str, seconds: float) -> dict[str, Any]:
    """Latency of read-only queries while another process trains into the store."""
    from multirank_logger import open_store
    from multirank_logger.errors import StoreError

    with tempfile.TemporaryDirectory(prefix="default-store-") as root:
        db = str(Path(root) / f"runs{SUFFIX[backend]}")
        ctx = mp.get_context("spawn")
        ready = ctx.Event()
        child = ctx.Process(target=_train, args=(db, seconds, ready))
        child.start()
        ready.wait(60)
        time.sleep(0.5)
        latencies, failures = [], 0
        end = time.monotonic() + seconds - 1.0
        while time.monotonic() < end:
            t0 = time.perf_counter()
            try:
                with open_store(db, lock_timeout=5.0) as store:
                    store.sql("SELECT count(*) AS n FROM metrics")
                latencies.append((time.perf_counter() - t0) * 1e3)
            except StoreError:
                failures += 1
            time.sleep(0.01)
        child.join(60)
    latencies = sorted(latencies[1:])  # the first read imports pandas (the result is a DataFrame)
    return {
        "reads": len(latencies),
        "failed": failures,
        "median_ms": statistics.median(latencies),
        "p99_ms": latencies[int(0.99 * (len(latencies) - 1))],
        "max_ms": latencies[-1],
    }


def _write(db: str, batches: int, rank: int, start: Any, out: Any) -> None:
    from multirank_logger.store.sql_store import Store
    from multirank_logger.write.buffer import RecordBuffer

    try:
        store = Store(db)
    except Exception as exc:  # noqa: BLE001 - the measurement is whether this works
        out.put((rank, 0, f"{type(exc).__name__}: {str(exc)[:90]}"))
        return
    buffer = RecordBuffer()
    start.wait(60)
    written = 0
    try:
        for b in range(batches):
            for s in range(100):
                buffer.append(b * 100 + s, {f"m{i}": float(i) for i in range(10)})
            batch = buffer.drain(1, rank)
            store.write(batch)
            written += 1000
        out.put((rank, written, ""))
    except Exception as exc:  # noqa: BLE001
        out.put((rank, written, f"{type(exc).__name__}: {str(exc)[:90]}"))


def ranks_writing_one_file(backend: str, writers: int, batches: int = 50) -> dict[str, Any]:
    """`writers` processes write 1,000-row batches into one store at once."""
    from multirank_logger.store.sql_store import Store

    with tempfile.TemporaryDirectory(prefix="default-store-") as root:
        db = str(Path(root) / f"runs{SUFFIX[backend]}")
        store = Store(db)
        store.create_run("w", world_size=writers)
        store.close()
        ctx = mp.get_context("spawn")
        start, out = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_write, args=(db, batches, r, start, out)) for r in range(writers)]
        for p in procs:
            p.start()
        time.sleep(3)  # every writer has opened the store (or failed to)
        t0 = time.perf_counter()
        start.set()
        results = [out.get(timeout=120) for _ in procs]
        elapsed = time.perf_counter() - t0
        for p in procs:
            p.join(30)
        import sqlalchemy as sa

        store = Store(db)
        with store.begin() as conn:  # what landed, not what the writers believe they wrote
            stored = conn.execute(sa.text("SELECT count(*) FROM metrics")).scalar_one()
        store.close()
    claimed = sum(r[1] for r in results)
    errors = sorted({r[2] for r in results if r[2]})
    return {
        "rows": stored,
        "claimed": claimed,
        "of": writers * batches * 1000,
        "rows_per_s": stored / elapsed,
        "errors": "; ".join(errors) or "none",
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--writers", type=int, default=2)
    args = parser.parse_args()
    print(
        "| store | reads during training | failed | read median ms | p99 ms | max ms |"
        f" {args.writers} ranks writing one file: rows stored | rows/s | errors |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for backend in ("sqlite", "duckdb"):
        r = readers_during_training(backend, args.seconds)
        w = ranks_writing_one_file(backend, args.writers)
        print(
            f"| {backend} | {r['reads']} | {r['failed']} | {r['median_ms']:.1f} | {r['p99_ms']:.1f}"
            f" | {r['max_ms']:.1f} |"
            f" {w['rows']:,} of {w['of']:,} ({w['claimed']:,} claimed) | {w['rows_per_s']:,.0f} | {w['errors']} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
