"""Hot path: per-call cost of ``log_metrics`` + ``save`` as the Trainer calls them, 10 keys.

Each logger gets the same stream of calls: a fresh dict of `keys` full-precision
floats per call (as Lightning builds one per step), ``log_metrics(metrics, step)``
then ``save()``, and at the end ``finalize("success")``, whose flush is included in
the per-call figure. As in the Trainer's setup hook, ``logger.experiment`` is read
once before the timed loop (that is where every logger opens its file or store).
A logger that does nothing gives the floor of this harness. ``cpu_us`` is the CPU time
of the whole process (all threads, so a background writer's too) per call; ``loop_us`` the
loop's wall time per call, ``thread_us`` the training thread's own CPU time in it (loop_us
also counts the time the thread waited for the GIL while the writer thread held it, and for
a core on a shared machine).
"""

from __future__ import annotations

import gc
import random
import resource
import tempfile
import time
from typing import Any

from benchmarks._harness import Case, Goal, Sizes, Unavailable

SECTION = "hotpath"

# peers: name -> (note)
_PEERS = {
    "no-op Logger (harness floor)": "lightning Logger subclass whose methods do nothing",
    "CSVLogger": "lightning.pytorch CSVLogger; save() appends to metrics.csv every call",
    "TensorBoardLogger": "lightning.pytorch TensorBoardLogger on torch.utils.tensorboard (tensorboard package)",
    "RecordBuffer.append (component)": "the library's buffer alone, no logger, no flush",
    "MultiRankLogger SQLite": "transport=direct, 1 process (rank 0); save() appends to metrics.csv every call, as "
    "CSVLogger's (export_csv=True, default)",
    "MultiRankLogger DuckDB": "transport=direct, 1 process (rank 0); save() appends to metrics.csv every call, as "
    "CSVLogger's (export_csv=True, default)",
    "MultiRankLogger SQLite, export_csv=False": "as above without metrics.csv (save() is a counter check, as on rank > 0)",
    "MultiRankLogger DuckDB, export_csv=False": "as above without metrics.csv (save() is a counter check, as on rank > 0)",
}

_SLOW = ("TensorBoardLogger", "MultiRankLogger SQLite")


def _make_logger(kind: str, root: str) -> Any:
    if kind == "no-op Logger (harness floor)":
        from lightning.pytorch.loggers.logger import DummyLogger

        return DummyLogger()
    if kind == "CSVLogger":
        from lightning.pytorch.loggers import CSVLogger

        return CSVLogger(root, name="bench")
    if kind == "TensorBoardLogger":
        from lightning.pytorch.loggers import TensorBoardLogger

        return TensorBoardLogger(root, name="bench")
    if kind == "RecordBuffer.append (component)":
        from multirank_logger.write.buffer import RecordBuffer

        return _BufferOnly(RecordBuffer())
    if kind.startswith("MultiRankLogger"):
        try:
            from multirank_logger.logger.multi_rank_logger import MultiRankLogger
        except ImportError as exc:
            raise Unavailable(f"multirank_logger.logger.multi_rank_logger: {exc}") from exc
        suffix = ".sqlite" if "SQLite" in kind else ".duckdb"
        export = not kind.endswith("export_csv=False")
        return MultiRankLogger(db=f"{root}/runs{suffix}", name="bench", save_dir=root, export_csv=export)
    raise ValueError(kind)


class _BufferOnly:
    """The logger-shaped wrapper the component row needs: append, nothing else."""

    def __init__(self, buffer: Any) -> None:
        self._buffer = buffer

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self._buffer.append(step, metrics)

    @property
    def experiment(self) -> Any:
        return self._buffer

    def save(self) -> None:
        pass

    def finalize(self, status: str) -> None:
        pass


def measure(kind: str, calls: int, keys: int) -> dict[str, Any]:
    """One sample: microseconds per (log_metrics + save), final flush included."""
    rng = random.Random(0)
    names = [f"metric_{i}" for i in range(keys)]
    rows = [tuple(rng.random() for _ in names) for _ in range(1000)]
    with tempfile.TemporaryDirectory(prefix="bench-hot-") as root:
        logger = _make_logger(kind, root)
        # the Trainer reads `experiment` in its setup hook, before any step: so do we, untimed
        _ = logger.experiment
        log_metrics, save = logger.log_metrics, logger.save
        # a fresh process's first full collection (~0.2 s with torch loaded) lands wherever the
        # gen-2 counter first crosses its threshold: take it here, out of every logger's loop
        gc.collect()
        cpu0 = _cpu_s()
        t0 = time.perf_counter()
        thread0 = time.thread_time()
        for step in range(calls):
            log_metrics(dict(zip(names, rows[step % 1000])), step)
            save()
        thread1 = time.thread_time()
        t1 = time.perf_counter()
        logger.finalize("success")
        t2 = time.perf_counter()
        cpu = _cpu_s() - cpu0
    return {
        "value": (t2 - t0) / calls * 1e6,
        "loop_us": (t1 - t0) / calls * 1e6,
        # the training thread's own CPU in the loop: not the time it waited for the GIL (a background
        # writer holding it) or for a core (a shared machine), which loop_us counts
        "thread_us": (thread1 - thread0) / calls * 1e6,
        "final_flush_ms": (t2 - t1) * 1e3,
        # every thread of the process: a background writer's work shows here, not in loop_us
        "cpu_us": cpu / calls * 1e6,
    }


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cases(sizes: Sizes) -> list[Case]:
    out = []
    kw = {"calls": sizes.hot_calls, "keys": sizes.hot_keys}
    for kind, note in _PEERS.items():
        goals: tuple[Goal, ...] = ()
        if kind.startswith("MultiRankLogger"):
            goals = (
                # issue 37: the whole cost (both threads, the end's flush too) and the training thread's
                Goal("ratio", "<=", 0.6, "<= 0.6x CSVLogger"),
                Goal("extra:loop_us", "<=", 5.0, "<= 5 us/call in the training loop"),
                Goal("extra:thread_us", "<=", 5.0, "<= 5 us/call of the training thread's CPU"),
            )
        out.append(
            Case(
                SECTION,
                kind,
                "benchmarks.bench_hotpath:measure",
                "us/call",
                kwargs={"kind": kind, **kw},
                peer=None if kind == "CSVLogger" else "CSVLogger",
                goals=goals,
                note=f"{note}; {sizes.hot_calls:,} calls x {sizes.hot_keys} keys",
                # 10-15 s a sample at full size: one per process, still one per round
                inner=1 if kind in _SLOW and sizes.mode == "full" else None,
                extra_ratios=("cpu_us",),
            )
        )
    return out
