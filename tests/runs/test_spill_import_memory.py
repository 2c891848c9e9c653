"""A spill file larger than the memory its import may use imports completely: `multirank-logger
import` in a process of its own whose address space is capped (ulimit -v)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from multirank_logger.rows.batch import empty_batch
from multirank_logger.store.spill_file import SpillWriter
from multirank_logger.store.sql_store import Store


def _count(store: Store, run_id: int) -> int:
    with store.begin() as conn:
        return conn.exec_driver_sql(f"SELECT count(*) FROM metrics WHERE run_id = {run_id}").scalar_one()


def _write_big_spill(directory: Path, run_id: int, rows: int) -> Path:
    """A spill file of `rows` metric rows (frames of 50,000), written fast with Arrow."""
    import numpy as np

    spill = SpillWriter(directory, run_id=run_id, name="big", version=0, rank=1)
    schema, keys, frame = empty_batch().schema, pa.array(["loss", "acc"]), 50_000
    for first in range(0, rows, frame):
        seq = np.arange(first, min(first + frame, rows), dtype=np.int64)
        n = len(seq)
        arrays = [pa.array(np.full(n, run_id, np.int32)), pa.array(np.ones(n, np.int32)), pa.array(seq), pa.array(seq),
                  pa.DictionaryArray.from_arrays(pa.array(seq % 2, pa.int32()), keys), pa.array(seq.astype(float)),
                  pa.array(np.zeros(n, np.int16)), pa.array(np.full(n, 1.0))]
        spill.write([pa.RecordBatch.from_arrays(arrays, schema=schema)])
    return spill.path


def _import_under_limit(db: Path, spill: Path, limit_kb: int | None) -> tuple[int, str, int]:
    """`multirank-logger import db spill` in a process whose address space is capped at
    `limit_kb` (ulimit -v; None: not capped): its exit code, output, and peak address space (kB)."""
    import os
    import subprocess
    import sys

    code = ("import sys\nfrom multirank_logger.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
            "    c = e.code\nelse:\n    c = 0\nprint('VmPeak', open('/proc/self/status').read().split('VmPeak:')[1].split()[0])\n"
            "sys.exit(c)")
    ulimit = f"ulimit -v {limit_kb}; " if limit_kb else ""
    # the address space measures memory used only without the allocators' reservations: Arrow's
    # own pool (mimalloc, jemalloc) and glibc's per-thread arenas reserve far more than they use
    env = {**os.environ, "ARROW_DEFAULT_MEMORY_POOL": "system", "MALLOC_ARENA_MAX": "1"}
    proc = subprocess.run(["bash", "-c", f'{ulimit}exec "$0" -c "$1" import "$2" "$3"', sys.executable, code, str(db), str(spill)],
                          env=env, capture_output=True, text=True, timeout=300)
    peak = [int(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith("VmPeak")]
    return proc.returncode, proc.stdout + proc.stderr, peak[0] if peak else 0


def test_a_spill_file_larger_than_the_memory_allowed_imports_completely(tmp_path: Path) -> None:
    """A 90 MB spill file (2,000,000 rows) imported by a process allowed 64 MB more address space
    than importing a 1,000-row file takes: every row is stored (before: the whole file, its
    decoded batches and their concatenation were in memory at once, ~700 MB)."""
    store = Store(tmp_path / "runs.sqlite")
    run = store.create_run("big", world_size=2)
    store.close()
    small = _write_big_spill(tmp_path / "small", run.id, 1_000)
    code, output, baseline = _import_under_limit(tmp_path / "runs.sqlite", small, None)
    assert code == 0 and baseline, output
    big = _write_big_spill(tmp_path / "big", run.id, 2_000_000)
    allowed = 64 * 1024
    assert big.stat().st_size > allowed * 1024  # the file is larger than the memory allowed for it
    code, output, _ = _import_under_limit(tmp_path / "runs.sqlite", big, baseline + allowed)
    assert code == 0, output
    assert "added 1999000 rows" in output and "(1000 already in the store)" in output
    store = Store(tmp_path / "runs.sqlite")
    assert _count(store, run.id) == 2_000_000
    store.close()
