"""The Parquet export (issue 41): bytes per row and write speed against DuckDB's own
``COPY ... TO`` of the same rows, each in a fresh process, at two store sizes (the export's
memory must not grow with the store).

The store: ``bench_query.build_scale_store`` (ranks x steps x 10 keys, values uniform in [0, 1):
8 bytes of a double each, the part no encoding removes). Cases, each a child of the worker:

- peer, ``DuckDB COPY``: ``COPY (SELECT key, step, rank, value, dtype, seq, time FROM metrics
  WHERE run_id = 1) TO DIR (FORMAT parquet, COMPRESSION zstd)``: DuckDB's own writer, in the
  store's order;
- ``DuckDB COPY sorted``: the same ``ORDER BY key, step, rank, seq`` (the order the export writes);
- ``export parquet``: ``multirank-logger export DB --format parquet -o DIR``.

Reported: wall seconds from start to exit (imports included), the child's peak RSS, and bytes
per row (the metric files' size over the rows; the export's side tables left out, a few KB).

Usage: python benchmarks/run.py --only export [--quick]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._harness import Case, Goal, Sizes

SECTION = "export"
ROOT = Path(__file__).resolve().parent.parent
#: (ranks, steps, keys) per mode: the store of the targets, and a quarter of it (memory vs size)
SIZES_BY_MODE = {
    "full": ((256, 20_000, 10), (64, 20_000, 10)),
    "quick": ((256, 2_000, 10), (64, 2_000, 10)),
    "tiny": ((16, 200, 3), (8, 200, 3)),
}
_COLUMNS = "key, step, rank, value, dtype, seq, time"
_COPY = ("import duckdb; c = duckdb.connect({db!r}, read_only=True); c.execute('SET enable_progress_bar = false'); "
         "c.execute(\"COPY (SELECT " + _COLUMNS + " FROM metrics WHERE run_id = 1{order}) TO '{out}' "
         "(FORMAT parquet, COMPRESSION zstd)\")")  # fmt: skip


def _timed(argv: list[str]) -> tuple[float, float]:
    """Run `argv` as a child; (seconds, the child's peak RSS in MiB)."""
    with tempfile.TemporaryFile() as stderr:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
        stderr.seek(0)
        err = stderr.read().decode(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{argv[1:4]} failed: {err[-2000:]}")
    return seconds, usage.ru_maxrss / 1024


def write(what: str, ranks: int, steps: int, keys: int) -> dict[str, Any]:
    """One writer of the run's rows to Parquet, in a fresh process: seconds, RSS, bytes per row."""
    from benchmarks.bench_query import build_scale_store

    db = str(build_scale_store(ranks, steps, keys))
    rows = ranks * steps * keys
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="bench-export-") as root:
        out = Path(root) / "out"
        argv = {
            "copy": [py, "-c", _COPY.format(db=db, order="", out=f"{out}.parquet")],
            "copy sorted": [py, "-c", _COPY.format(db=db, order=" ORDER BY key, step, rank, seq", out=f"{out}.parquet")],
            "export": [py, "-m", "multirank_logger.cli", "export", db, "--format", "parquet", "-o", str(out)],
        }[what]
        seconds, rss = _timed(argv)
        files = [out.with_suffix(".parquet")] if what != "export" else list((out / "metrics").rglob("*.parquet"))
        size = sum(p.stat().st_size for p in files)
    return {"value": seconds, "rss_mib": rss, "peak_MiB": rss, "B_per_row": size / rows, "rows_M": rows / 1e6}


def cases(sizes: Sizes) -> list[Case]:
    big, small = SIZES_BY_MODE[sizes.mode]
    rounds = 1 if sizes.mode == "tiny" else 3  # one sample moves by 2x on this shared host: the ratio per round is what holds
    out = []
    for shape in (big, small):
        kw = dict(zip(("ranks", "steps", "keys"), shape))
        label = f"{shape[0]}x{shape[1]:,}x{shape[2]} ({shape[0] * shape[1] * shape[2] / 1e6:g}M rows)"
        peer = f"DuckDB COPY {label}"
        goals = (Goal("extra:B_per_row", "<=", 8, "<= 8 B/row"), Goal("ratio", "<=", 1.0, "as fast as COPY")) \
            if shape == big and sizes.mode != "tiny" else ()  # fmt: skip
        for what, name in (("copy", peer), ("copy sorted", f"DuckDB COPY sorted {label}"),
                           ("export", f"export parquet {label}")):  # fmt: skip
            out.append(Case(SECTION, name, "benchmarks.bench_export:write", "s", {"what": what, **kw},
                            peer=None if what == "copy" else peer, goals=goals if what == "export" else (),
                            rounds=rounds, inner=1, timeout_s=900, note="a fresh process; RSS is its own"))  # fmt: skip
    return out


NOTES = [
    "export: each writer is a child of the worker; its time is wall seconds from start to exit (imports "
    "included), its RSS its own peak (os.wait4); B_per_row: the metric files over the rows. 2 cores shared.",
]
