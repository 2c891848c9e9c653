"""The row encoding off the hot path: a gather sender's drain + encode, rank 0's decode, and
spill files (write with fsync, read, import into SQLite and DuckDB), in rows per second.

Rows are 10-key log calls drained from a `RecordBuffer`, as the writer drains them. Every
figure goes through public names that the code before and after issue 18 both have
(`RecordBuffer.drain`, `wire.encode_batch`/`decode_batch`, `SpillWriter`, `read_spill`,
`import_spill`), so that one run can compare two source trees, case by case, in turns:

    python benchmarks/bench_spill.py --quick --against /path/to/old/tree

runs each case in a fresh process per tree (``PYTHONPATH`` set to the tree), alternating,
and prints the medians and the ratio this tree / the other (> 1: this tree is faster).
Without ``--against`` it measures this tree alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

KEYS = [f"metric_{i}" for i in range(10)]
CASES = ("drain+encode", "decode", "spill write", "spill read", "import sqlite", "import duckdb")


def _batches(frames: int, calls: int) -> list[Any]:
    from multirank_logger.write.buffer import RecordBuffer

    out = []
    buf = RecordBuffer()
    for f in range(frames):
        for i in range(calls):
            step = f * calls + i
            buf.append(step, {k: step + j / 7 for j, k in enumerate(KEYS)})
        out.append(buf.drain(run_id=1, rank=1))
    return out


def _fill(calls: int) -> Any:
    from multirank_logger.write.buffer import RecordBuffer

    buf = RecordBuffer()
    for step in range(calls):
        buf.append(step, {k: step + j / 7 for j, k in enumerate(KEYS)})
    return buf


def measure(case: str, frames: int, calls: int) -> float:
    """Rows per second of one case, in this process (the tree on sys.path)."""
    from multirank_logger.rows import wire
    from multirank_logger.store.spill_file import SpillWriter, read_spill
    from multirank_logger.store.spill_import import import_spill
    from multirank_logger.store.sql_store import Store

    rows = frames * calls * len(KEYS)
    # the code before issue 18 decoded to Arrow for DuckDB (decode_table) and to lists for
    # SQLite (decode_batch): rank 0's DuckDB path is the one the gather benchmarks run
    decode = getattr(wire, "decode_table", wire.decode_batch)
    with tempfile.TemporaryDirectory(prefix="bench-spill-") as tmp:
        if case == "drain+encode":
            buffers = [_fill(calls) for _ in range(frames)]
            t0 = time.perf_counter()
            for buf in buffers:
                wire.encode_batch(buf.drain(run_id=1, rank=1))
            return rows / (time.perf_counter() - t0)
        batches = _batches(frames, calls)
        if case == "decode":
            payloads = [wire.encode_batch(b) for b in batches]
            t0 = time.perf_counter()
            for payload in payloads:
                decode(payload)
            return rows / (time.perf_counter() - t0)
        spill = SpillWriter(Path(tmp) / "spill", run_id=1, name="bench", version=0, rank=1)
        t0 = time.perf_counter()
        for batch in batches:
            spill.write([batch])  # one fsynced frame per writer cycle, as a sender spills
        write_s = time.perf_counter() - t0
        if case == "spill write":
            return rows / write_s
        if case == "spill read":
            t0 = time.perf_counter()
            read_spill(spill.path)
            return rows / (time.perf_counter() - t0)
        store = Store(Path(tmp) / ("runs.sqlite" if case == "import sqlite" else "runs.duckdb"))
        store.create_run("bench", world_size=2)
        t0 = time.perf_counter()
        report = import_spill(store, spill.path)
        seconds = time.perf_counter() - t0
        store.close()
        assert report.rows_added == rows, report
        return rows / seconds


def _child(tree: Path, case: str, frames: int, calls: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}  # the package from `tree`...
    # ...and this very file as the benchmark, loaded by path
    code = (
        f"import importlib.util as u; s = u.spec_from_file_location('bench_spill', {__file__!r}); "
        f"m = u.module_from_spec(s); s.loader.exec_module(m); print(m.measure({case!r}, {frames}, {calls}))"
    )
    cmd = [sys.executable, "-c", code]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tree, check=False)
    if out.returncode:
        raise RuntimeError(f"{case} in {tree} failed:\n{out.stderr}")
    return float(out.stdout.strip().splitlines()[-1])


def run(quick: bool, against: Path | None = None) -> dict[str, Any]:
    """Medians of rows/s per case; with `against`, the other tree's too and the ratio."""
    frames, calls, rounds = (20, 1_000, 3) if quick else (50, 2_000, 5)
    here = Path(__file__).resolve().parent.parent
    trees = {"this": here} if against is None else {"this": here, "against": against.resolve()}
    out: dict[str, Any] = {"frames": frames, "rows_per_frame": calls * len(KEYS), "rounds": rounds}
    for case in CASES:
        samples: dict[str, list[float]] = {name: [] for name in trees}
        for _ in range(rounds):
            for name, tree in trees.items():  # in turns: the machine's load hits both alike
                samples[name].append(_child(tree, case, frames, calls))
        row = {name: round(statistics.median(v)) for name, v in samples.items()}
        if against is not None:
            row["ratio_this_over_against"] = round(row["this"] / row["against"], 3)
        out[case] = row
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--against", type=Path, help="another source tree (its multirank_logger is compared)")
    args = parser.parse_args()
    print(json.dumps(run(args.quick, args.against), indent=2))
