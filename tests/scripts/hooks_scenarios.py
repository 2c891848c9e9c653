"""Scenarios for tests/runs/test_process_hooks.py, each run as its own process (forks and signals
must not touch pytest's). Usage: python tests/scripts/hooks_scenarios.py fork|unused-fork|release|sigterm-in-setup DB"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

from multirank_logger import MultiRankLogger
from multirank_logger.store.sql_store import Store
from tests.helpers.internals import run_of, writer_cycle_held

CHILD_WAIT_S = 60


def fork(db: str) -> None:
    """ddp_notebook-style: fork while the parent's writer thread and store connection are live
    and another thread holds the logger's set-up lock and the writer's I/O lock."""
    logger = MultiRankLogger(db=db, flush_interval=0.05, timeout=30)
    for i in range(50):
        logger.log_metrics({"a": float(i)}, step=i)
    assert logger.experiment is not None and logger.flush(10)  # rows 0..49 stored
    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # a writer cycle in progress at the moment of the fork
        # in the writer's order (its cycle takes the I/O lock, then the set-up lock in SinkHolder.setup):
        # the other order deadlocks with a cycle that starts meanwhile
        with writer_cycle_held(logger), run_of(logger).lock:
            held.set()
            release.wait(30)

    threading.Thread(target=hold, daemon=True).start()
    assert held.wait(10), "the holding thread never got the locks"
    for i in range(50, 60):  # the parent's, still buffered at the fork: written once, by the parent
        logger.log_metrics({"a": float(i)}, step=i)
    pid = os.fork()
    if pid == 0:
        try:
            for i in range(100, 130):
                logger.log_metrics({"a": float(i)}, step=i)
            logger.finalize("success")
            os._exit(0)
        except BaseException:  # noqa: BLE001
            import traceback

            traceback.print_exc()
            os._exit(3)
    release.set()
    deadline = time.monotonic() + CHILD_WAIT_S
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    child_hung = done[0] == 0
    if child_hung:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    logger.finalize("success")
    store = Store(db)
    with store.begin() as conn:
        seqs = [r[0] for r in conn.exec_driver_sql("SELECT seq FROM metrics WHERE key = 'a' ORDER BY seq")]
        values = sorted(r[0] for r in conn.exec_driver_sql("SELECT value FROM metrics WHERE key = 'a'"))
        check = conn.exec_driver_sql("PRAGMA integrity_check").scalar()
    print(
        json.dumps(
            {
                "child_hung": child_hung,
                "child_status": None if child_hung else done[1],
                "seqs": seqs,
                "values": values,
                "integrity": check,
            }
        )
    )


def sigterm_in_setup(db: str, marker: str) -> None:
    """SIGTERM while the main thread is inside the logger's set-up (waiting for a DuckDB file
    another process holds, under the logger's lock). The previous handler writes `marker`;
    the holder lets the file go when it sees the marker, or after its own 20 s."""
    chained: list[int] = []

    def previous(signum: int, frame: object) -> None:  # as Lightning's would: note it, go on
        chained.append(signum)
        open(marker, "w").close()

    signal.signal(signal.SIGTERM, previous)
    logger = MultiRankLogger(db=db, flush_interval=3600, timeout=60)
    for i in range(10):
        logger.log_metrics({"a": float(i)}, step=i)  # our handler now outermost, chaining to `previous`
    hold = (
        "import duckdb, os, sys, time\n"
        "c = duckdb.connect(sys.argv[1]); print('held', flush=True)\n"
        "end = time.monotonic() + 20\n"
        "while not os.path.exists(sys.argv[2]) and time.monotonic() < end: time.sleep(0.05)\n"
        "print('marker' if os.path.exists(sys.argv[2]) else 'own timeout', flush=True)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", hold, db, marker], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
    logger.experiment  # noqa: B018 - the set-up: registering the rank waits for the holder
    released_by = holder.stdout.readline().strip()
    holder.wait(30)
    logger.finalize("failed")
    store = Store(db)
    with store.begin() as conn:
        rows = conn.exec_driver_sql("SELECT count(*) FROM metrics WHERE key = 'a'").scalar()
    print(json.dumps({"chained": chained, "released_by": released_by, "rows": rows}))


def unused_fork(db: str) -> None:
    """A logger built and never used, then a fork that is no launch (a DataLoader worker's, a
    pool's): the before-fork hook allocates its run, and the exit removes it again."""
    logger = MultiRankLogger(db=db, flush_interval=3600)
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    with Store(db).begin() as conn:
        runs = conn.exec_driver_sql("SELECT count(*) FROM runs").scalar()
    print(json.dumps({"runs_after_the_fork": runs, "run_id": run_of(logger).identity and run_of(logger).identity.run.id}))


def release(db: str) -> None:
    """The handler from before ours is back after finalize, once no writer runs."""
    from multirank_logger.write import process_hooks

    def mine(signum: int, frame: object) -> None:
        pass

    signal.signal(signal.SIGTERM, mine)
    logger = MultiRankLogger(db=db, flush_interval=3600)
    logger.log_metrics({"a": 1.0}, step=0)
    during = signal.getsignal(signal.SIGTERM) is process_hooks._on_sigterm
    logger.finalize("success")
    after = signal.getsignal(signal.SIGTERM) is mine
    print(json.dumps({"ours_during_the_run": during, "previous_back_after_finalize": after}))


if __name__ == "__main__":
    if sys.argv[1] == "fork":
        fork(sys.argv[2])
    elif sys.argv[1] == "unused-fork":
        unused_fork(sys.argv[2])
    elif sys.argv[1] == "release":
        release(sys.argv[2])
    else:
        sigterm_in_setup(sys.argv[2], sys.argv[3])
