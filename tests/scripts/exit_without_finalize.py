"""Processes that exit without `finalize`, for tests/runs/test_exit_paths.py.

Usage:
    python tests/scripts/exit_without_finalize.py fabric DB STEPS   a 2-rank Fabric run (Lightning's launcher
                                                            re-runs this script for rank 1) that never
                                                            calls finalize: the script just ends
    python tests/scripts/exit_without_finalize.py fork DB N         a logger on DB, then N plain os.fork()s one
                                                            after the other, each child logging and ending
                                                            with sys.exit(0); prints the children's exit
                                                            codes ("hung" for one killed) as JSON

Both log with a short flush interval, so that the writer thread is inside a store or TCPStore call
most of the time, as it may be at any exit.
"""

from __future__ import annotations

import json
import os
import sys
import time

FLUSH_INTERVAL = 0.01
CHILD_WAIT_S = 15


def fabric(db: str, steps: int) -> None:
    from lightning.fabric import Fabric

    from multirank_logger import MultiRankLogger

    logger = MultiRankLogger(db=db, name="fabric", flush_interval=FLUSH_INTERVAL)
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp", loggers=[logger])
    fabric.launch()
    for step in range(steps):
        fabric.log_dict({"rank_value": float(1000 * fabric.global_rank + step)}, step=step)
    fabric.barrier()
    # no logger.finalize: the script ends here


def fork(db: str, children: int) -> None:
    from multirank_logger import MultiRankLogger

    logger = MultiRankLogger(db=db, flush_interval=FLUSH_INTERVAL)
    for i in range(10):
        logger.log_metrics({"a": float(i)}, step=i)
    assert logger.flush(10)
    outcomes = []
    for child in range(children):
        pid = os.fork()
        if pid == 0:
            for i in range(10):
                logger.log_metrics({"a": float(i)}, step=100 * (child + 1) + i)
            time.sleep(0.05)
            sys.exit(0)  # the interpreter's own exit: atexit hooks and teardown run
        deadline = time.monotonic() + CHILD_WAIT_S
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        if done[0] == 0:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            outcomes.append("hung")
        else:
            outcomes.append(os.waitstatus_to_exitcode(done[1]))
    logger.finalize("success")
    print(json.dumps({"children": outcomes}))


if __name__ == "__main__":
    if sys.argv[1] == "fabric":
        fabric(sys.argv[2], int(sys.argv[3]))
    else:
        fork(sys.argv[2], int(sys.argv[3]))
