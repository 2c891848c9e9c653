"""A DuckDB store damaged while the logger waits, for tests/runs/test_damaged_store.py.

Usage: python tests/scripts/damage_during_run.py DB SPILL_DIR

Logs 20,000 calls of 10 keys (several blocks of the metrics table), lets the writer store them,
overwrites 4 KB in the middle of one of the metrics table's data blocks (as a failing disk or
another program would), then finalizes; prints the run's status as the store records it
(or the error reading it) as JSON.
"""

from __future__ import annotations

import json
import random
import sys

import duckdb

from multirank_logger import MultiRankLogger
from tests.helpers.internals import writer_of

_DUCKDB_HEADER_BYTES = 3 * 4096


def _metrics_block_offset(path: str) -> int:
    con = duckdb.connect(path, read_only=True)
    try:
        blocks = sorted(b for (b,) in con.execute(
            "SELECT DISTINCT block_id FROM pragma_storage_info('metrics') WHERE block_id >= 0").fetchall())
        block_bytes = con.execute("SELECT block_size FROM pragma_database_size()").fetchone()[0]  # the file's own
    finally:
        con.close()
    assert blocks, "the metrics table has data blocks"
    return _DUCKDB_HEADER_BYTES + blocks[len(blocks) // 2] * block_bytes + 8192


def main(db: str, spill_dir: str) -> None:
    logger = MultiRankLogger(db=db, spill_dir=spill_dir, flush_interval=0.05)
    for i in range(20_000):
        logger.log_metrics({f"k{k}": i * 0.1 + k for k in range(10)}, step=i)
    assert logger.flush(60)
    writer_of(logger).stop(10)  # the file is closed between writes (DuckDB: opened per transaction)
    offset = _metrics_block_offset(db)
    with open(db, "r+b") as fh:  # damaged while the logger waits
        fh.seek(offset)
        fh.write(random.Random(38).randbytes(4096))
    logger.finalize("success")
    try:
        con = duckdb.connect(db, read_only=True)
        status = con.execute("SELECT status FROM runs").fetchall()
        con.close()
    except duckdb.Error as exc:
        status = f"unreadable: {exc}"
    print(json.dumps({"status": status if isinstance(status, str) else [s for (s,) in status]}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
