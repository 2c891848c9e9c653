"""Memory over a long run: does the process's resident memory stay flat while a logger logs?

Each sample logs `calls` calls of 10 keys (``log_metrics`` + ``save``, as in the hot-path
section) in `chunks` equal chunks. After each chunk it waits until the logger's writer has
written what is pending (a training logs far slower than this loop, so its writer is
never behind for long) and reads the process's current RSS. The figure is the growth
over the second half of the calls, from the middle chunk to the last: a buffer that kept
its rows, or a store that cached them, grows with the calls all along (the calls' dicts
alone take ~0.9 KiB each); a drained one stays flat. The first half is the warm-up: the
allocators (glibc's arenas, pyarrow's mimalloc pool, DuckDB's own) reach the working size
they then reuse. Its growth is reported beside (``warmup_growth_mib``). With DuckDB, one
3M-call run (60 chunks) rose ~15 MiB over the first 200k calls and ~8 MiB more by 1M
calls, then not at all over the next 2M: a plateau, not a leak; a 1M-call sample still
catches the end of that rise. CSVLogger is shown beside it: it keeps each call's dict
until its next save (every 100 calls), then writes and forgets it.

``finalize_peak_rise_mib`` is how far ``finalize`` (the last flush, then the export of
every call to metrics.csv) raised the process's peak: the export streams from the store,
so it stays near the same for any run length (it read a rank's rows whole before: +~1 GiB
for these 10M rows).

The loggers run with ``flush_interval=0.5``, so that a DuckDB writer (which otherwise waits
up to 5 s between writes) does not make each chunk wait; the buffer and the writer are the
ones a default logger uses.
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from typing import Any

from benchmarks._harness import Case, Goal, Sizes, Unavailable

SECTION = "memory"
_KINDS = {
    "CSVLogger": "lightning.pytorch CSVLogger (reference)",
    "MultiRankLogger SQLite": "transport=direct, 1 process",
    "MultiRankLogger DuckDB": "transport=direct, 1 process",
}
#: growth over 500k calls that still counts as flat (~34 bytes a call; the calls' dicts alone
#: would be hundreds of MiB)
FLAT_MIB = 16.0
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _peak_rss_mib() -> float:
    """This process's peak resident memory so far."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rss_mib() -> float:
    """This process's resident memory now (Linux), not its peak."""
    with open("/proc/self/statm") as fp:
        return int(fp.read().split()[1]) * _PAGE / 2**20


def _make_logger(kind: str, root: str) -> Any:
    if kind == "CSVLogger":
        from lightning.pytorch.loggers import CSVLogger

        return CSVLogger(root, name="bench")
    try:
        from multirank_logger.logger.multi_rank_logger import MultiRankLogger
    except ImportError as exc:
        raise Unavailable(f"multirank_logger.logger.multi_rank_logger: {exc}") from exc
    suffix = ".sqlite" if "SQLite" in kind else ".duckdb"
    return MultiRankLogger(db=f"{root}/runs{suffix}", name="bench", save_dir=root, flush_interval=0.5)


def _wait_written(logger: Any, timeout_s: float = 120.0) -> None:
    run = getattr(logger, "_run", None)  # MultiRankLogger's RankRun; CSVLogger has none
    writer = run.logged.writer if run is not None else None  # its BackgroundWriter
    deadline = time.monotonic() + timeout_s
    while writer is not None and writer.pending and time.monotonic() < deadline:
        time.sleep(0.05)


def measure(kind: str, calls: int, keys: int, chunks: int) -> dict[str, Any]:
    """One sample: RSS growth (MiB) over the second half of the chunks (after the middle one)."""
    rng = random.Random(0)
    names = [f"metric_{i}" for i in range(keys)]
    rows = [tuple(rng.random() for _ in names) for _ in range(1000)]
    per_chunk = max(1, calls // chunks)
    samples: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-mem-") as root:
        logger = _make_logger(kind, root)
        _ = logger.experiment
        log_metrics, save = logger.log_metrics, logger.save
        step = 0
        for _ in range(chunks):
            for _ in range(per_chunk):
                log_metrics(dict(zip(names, rows[step % 1000])), step)
                save()
                step += 1
            _wait_written(logger)
            samples.append(_rss_mib())
        peak_before = _peak_rss_mib()
        logger.finalize("success")  # the last flush, and metrics.csv exported from the store
        finalize_rise = _peak_rss_mib() - peak_before
    middle = samples[len(samples) // 2 - 1]  # the end of the first half
    return {
        "value": samples[-1] - middle,
        "warmup_growth_mib": middle - samples[0],
        "rss_first_chunk_mib": samples[0],
        "rss_middle_chunk_mib": middle,
        "rss_last_chunk_mib": samples[-1],
        "rss_max_between_mib": max(samples),
        "finalize_peak_rise_mib": finalize_rise,
        "calls": step,
    }


def cases(sizes: Sizes) -> list[Case]:
    out = []
    for kind, note in _KINDS.items():
        goals: tuple[Goal, ...] = ()
        if kind.startswith("MultiRankLogger"):
            goals = (Goal("value", "<=", FLAT_MIB, f"<= {FLAT_MIB:.0f} MiB growth over the second half (flat)"),)
        out.append(
            Case(
                SECTION,
                kind,
                "benchmarks.bench_memory:measure",
                "MiB",
                kwargs={"kind": kind, "calls": sizes.memory_calls, "keys": sizes.hot_keys, "chunks": sizes.memory_chunks},
                goals=goals,
                note=f"{note}; RSS growth over the second half (chunk {sizes.memory_chunks // 2} to "
                f"{sizes.memory_chunks}) of {sizes.memory_calls:,} calls x {sizes.hot_keys} keys in "
                f"{sizes.memory_chunks} chunks, the writer drained before each reading",
                # one sample's growth varies by +-10 MiB (allocator arenas; seen 4-17 MiB for the
                # same code): the median of three
                rounds=3,
                inner=1,
            )
        )
    return out
