"""Faults under one rank of several (issue 13): the others' rows are untouched, the run is not
"success", and the broken rank's rows are in a spill file its output names (import completes
the run) or counted as lost.

Plain processes over gloo (tests/scripts/fault_ranks.py) rather than Lightning ranks: the same channel
and store traffic, light enough for a 2-core machine.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from multirank_logger.cli import main as cli
from tests.helpers.launches import forkserver, join_ranks, start_ranks
from tests.helpers.logger_helpers import query, ranks_stderr, spill_files_named
from tests.helpers.processes import stop_process
from tests.scripts.fault_ranks import rank_main, value

pytestmark = pytest.mark.timeout(300)
JOIN_TIMEOUT_S = 120


def _start(world: int, db: Path, spill_dir: str, calls: int, sync: Path, transport: str, timeout: float,
           *fault: object) -> list:
    ctx = forkserver("tests.scripts.fault_ranks")
    return start_ranks(rank_main, world, str(db), spill_dir, calls, str(sync), transport, timeout, *fault, ctx=ctx)


def _wait_for(path: Path, procs: list, bound: float = 90) -> None:
    deadline = time.monotonic() + bound
    while not path.exists():
        codes = [p.exitcode for p in procs]
        assert time.monotonic() < deadline and all(c in (None, 0) for c in codes), f"no {path.name} (exit codes {codes})"
        time.sleep(0.02)


def _import(db: Path, files: list[str]) -> str:
    result = CliRunner().invoke(cli, ["import", str(db), *files])
    assert result.exit_code == 0, result.output
    return result.output


def test_gather_sender_that_cannot_reach_rank0_spills_and_the_run_is_not_success(
    tmp_path: Path
) -> None:
    """Rank 0 stopped (SIGSTOP: its TCPStore with it) while rank 1 logs and finalizes: rank 1's
    undelivered rows go to its spill file, named in its output; rank 0, resumed, never hears
    rank 1's end: the run is "incomplete", rank 1 "missing". Importing rank 1's file brings
    every one of its values (once) and completes the run."""
    db, sync, calls = tmp_path / "runs.duckdb", tmp_path / "sync", 400
    sync.mkdir()
    procs = _start(2, db, str(tmp_path / "spill{}"), calls, sync, "gather", timeout=2.0)
    try:
        _wait_for(sync / "ready0", procs)
        _wait_for(sync / "ready1", procs)
        os.kill(procs[0].pid, signal.SIGSTOP)  # a hung rank 0, as a swapped-out or debugged process
        (sync / "go").touch()
        _wait_for(sync / "done1.json", procs)  # rank 1 ran to its end against a silent rank 0
    finally:
        os.kill(procs[0].pid, signal.SIGCONT)
    assert join_ranks(procs, JOIN_TIMEOUT_S) == [0, 0]
    err = ranks_stderr(sync)
    assert query(db, "SELECT status FROM runs") == [("incomplete",)], err[-3000:]
    assert query(db, "SELECT rank, status FROM ranks ORDER BY rank") == [(0, "success"), (1, "missing")]
    assert query(db, "SELECT COUNT(*) FROM metrics WHERE rank = 0 AND key = 'value'") == [(calls,)]
    (stored1,), = query(db, "SELECT COUNT(*) FROM metrics WHERE rank = 1 AND key = 'value'")
    assert stored1 < calls
    files = spill_files_named(err)
    assert len(files) == 1 and "rank1" in files[0], err[-3000:]
    assert "could not deliver its rows to rank 0" in err
    # one rank's end unheard, counted once: rank 0 marks its row missing and keeps it in
    # unheard_ends for this launch (issue 38 point 6: "2 rank end(s) never heard")
    listed = CliRunner().invoke(cli, ["runs", str(db)])
    assert "(1 rank end(s) never heard)" in listed.output, listed.output
    output = _import(db, files)
    assert query(db, "SELECT status FROM runs") == [("success",)], output
    assert query(db, "SELECT rank, status FROM ranks ORDER BY rank") == [(0, "success"), (1, "success")]
    rows = query(db, "SELECT step, value FROM metrics WHERE rank = 1 AND key = 'value' ORDER BY seq")
    assert rows == [(c, value(1, c)) for c in range(calls)]



def test_gather_sender_unheard_in_fit_keeps_the_run_incomplete_after_a_clean_test_phase(
    tmp_path: Path
) -> None:
    """As above for the first phase (fit); then both ranks run a second phase (test) of the same
    run in the same processes, with nothing wrong. Rank 0 hears rank 1's second end, but rank 1's
    first-phase rows are still only in its spill file: the run must not say "success" until that
    file is imported."""
    db, sync, calls, more = tmp_path / "runs.duckdb", tmp_path / "sync", 400, 60
    sync.mkdir()
    procs = _start(2, db, str(tmp_path / "spill{}"), calls, sync, "gather", 2.0, -1, False, more)
    try:
        _wait_for(sync / "ready0", procs)
        _wait_for(sync / "ready1", procs)
        stop_process(procs[0].pid)
        (sync / "go").touch()
        _wait_for(sync / "done1.json", procs)
    finally:
        os.kill(procs[0].pid, signal.SIGCONT)
    _wait_for(sync / "done0.json", procs)
    assert query(db, "SELECT status FROM runs") == [("incomplete",)]
    (sync / "go2").touch()
    assert join_ranks(procs, JOIN_TIMEOUT_S) == [0, 0]
    err = ranks_stderr(sync)
    assert (sync / "done20.json").exists() and (sync / "done21.json").exists(), err[-3000:]
    assert query(db, "SELECT status FROM runs") == [("incomplete",)], err[-3000:]
    (stored1,), = query(db, "SELECT COUNT(*) FROM metrics WHERE rank = 1 AND key = 'value'")
    assert stored1 < calls + more
    files = spill_files_named(err)
    assert len(files) == 1 and "rank1" in files[0], err[-3000:]
    output = _import(db, files)
    assert query(db, "SELECT status, values_spilled, values_lost FROM runs") == [("success", 0, 0)], output
    rows = query(db, "SELECT step, value FROM metrics WHERE rank = 1 AND key = 'value' ORDER BY step")
    assert rows == [(c, value(1, c)) for c in range(calls + more)]


def _can_unshare() -> str | None:
    if sys.platform != "linux" or shutil.which("unshare") is None:
        return "needs Linux mount namespaces (the unshare command)"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs none /mnt"], capture_output=True, check=False)
    return None if probe.returncode == 0 else "mount namespaces are not permitted here"


_NO_UNSHARE = _can_unshare()


@pytest.mark.skipif(_NO_UNSHARE is not None, reason=str(_NO_UNSHARE))
# the 8 ranks with the spill on a full disk; the import path is the same with 4 (cheaper on 2 cores)
@pytest.mark.parametrize("world,spill_full", [(8, True), (4, False)], ids=["8-spill-on-full-disk", "4-spill-elsewhere"])
def test_direct_ranks_one_whose_store_turns_read_only(
    tmp_path: Path, world: int, spill_full: bool
) -> None:
    """8 (or 4) ranks write one SQLite store directly; mid-run the store's filesystem turns read-only for the last rank
    alone (its own mount namespace: a bind mount remounted ro), as when one node's mount goes bad.
    The others' rows are all stored. Its later rows are held, then spilled: onto its full disk
    they are counted LOST in its output; elsewhere the output names the file. It never records its
    end, so the run is "incomplete" (not "success"); importing its spill file completes it."""
    calls, faulty = 300, world - 1
    store_dir, sync = tmp_path / "store", tmp_path / "sync"
    store_dir.mkdir()
    sync.mkdir()
    db = store_dir / "runs.sqlite"
    procs = _start(world, db, str(tmp_path / "spill{}"), calls, sync, "direct", 10.0, faulty, spill_full)
    for r in range(world):
        _wait_for(sync / f"ready{r}", procs)
    (sync / "go").touch()
    assert join_ranks(procs, JOIN_TIMEOUT_S) == [0] * world
    err = ranks_stderr(sync)
    counts = dict(query(db, "SELECT rank, COUNT(*) FROM metrics WHERE key = 'value' GROUP BY rank"))
    assert {r: counts.get(r) for r in range(faulty)} == dict.fromkeys(range(faulty), calls)
    assert calls // 2 <= counts[faulty] < calls, err[-3000:]
    assert query(db, "SELECT status FROM runs") == [("incomplete",)], err[-3000:]
    assert query(db, f"SELECT status FROM ranks WHERE rank = {faulty}") == [("running",)]
    unstored = 2 * (calls - counts[faulty])  # two keys per call
    if spill_full:
        lost = [int(n) for n in re.findall(rf"rank {faulty}: the run is incomplete in the store: (\d+) value\(s\) are LOST", err)]
        assert lost == [unstored], err[-3000:]
        return
    files = spill_files_named(err)
    assert len(files) == 1 and f"rank{faulty}" in files[0], err[-3000:]
    _import(db, files)
    rows = query(db, f"SELECT step, value FROM metrics WHERE rank = {faulty} AND key = 'value' ORDER BY seq")
    assert rows == [(c, value(faulty, c)) for c in range(calls)]
    assert query(db, f"SELECT status FROM ranks WHERE rank = {faulty}") == [("success",)]
    assert query(db, "SELECT status FROM runs") == [("success",)]
