"""Hosts that share no disk, simulated on one machine: each node runs under `unshare -m` with its own tmpfs
on the store's directory (DESIGN.md), so only host 0 can see the store, and rows travel over the channel.

The spill test runs its two nodes on one disk instead (rank 0 is killed, so its store must outlive it)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from multirank_logger.store import Store
from tests.conftest import free_port

pytestmark = pytest.mark.timeout(240)
SCRIPT = Path(__file__).with_name("shared_nothing_train.py")
REPO = SCRIPT.parent.parent
_NODE_TIMEOUT_S = 150


def _can_unshare() -> str | None:
    """Why mount namespaces cannot be used here, or None when they can."""
    if shutil.which("unshare") is None:
        return "the unshare command is not installed"
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs none /mnt"], capture_output=True, text=True, timeout=30
    )
    if probe.returncode != 0:
        return f"mount namespaces are not permitted here (unshare -m: {probe.stderr.strip() or probe.returncode})"
    return None


_NO_UNSHARE = _can_unshare() if sys.platform == "linux" else "mount namespaces are Linux-only"
_needs_unshare = pytest.mark.skipif(_NO_UNSHARE is not None, reason=str(_NO_UNSHARE))


def _run_hosts(
    tmp_path: Path, db_name: str, devices: int, *extra: str, shared_disk: bool = False
) -> tuple[dict[int, dict], list[int], Path]:
    """Start 2 simulated hosts of `devices` ranks each; returns the rank reports, exit codes, out dir."""
    store_dir, out = tmp_path / "store", tmp_path / "out"
    store_dir.mkdir()
    out.mkdir()
    db = store_dir / db_name
    port = free_port()
    cmd = f"exec {sys.executable} {SCRIPT} --db {db} --out {out} --num-nodes 2 --devices {devices} {' '.join(extra)}"
    if not shared_disk:
        cmd = f"mount -t tmpfs none {store_dir} && {cmd}"
    procs = []
    for node in (0, 1):
        env = dict(os.environ, NODE_RANK=str(node), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONPATH=str(REPO))
        env.pop("WORLD_SIZE", None)
        log = open(out / f"host{node}.log", "w")
        argv = ["sh", "-c", cmd] if shared_disk else ["unshare", "-m", "sh", "-c", cmd]
        procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT))
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(_NODE_TIMEOUT_S))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(p.wait(10))
    reports = {}
    for f in out.glob("rank*.json"):
        report = json.loads(f.read_text())
        reports[report["rank"]] = report
    return reports, codes, out


def _rows(db: Path, sql: str) -> list[tuple]:
    store = Store(db, readonly=True)
    try:
        with store.begin() as conn:
            return [tuple(r) for r in conn.exec_driver_sql(sql).all()]
    finally:
        store.close()


def _logs(out: Path) -> str:
    return "\n".join(f.read_text()[-3000:] for f in sorted(out.glob("host*.log")))


@_needs_unshare
@pytest.mark.parametrize("db_name", ["runs.duckdb", "runs.sqlite"])
def test_two_hosts_one_rank_each(tmp_path: Path, db_name: str) -> None:
    """num_nodes=2, devices=1: host 0's store holds both ranks' own values; host 1 has no store."""
    reports, codes, out = _run_hosts(tmp_path, db_name, 1, "--steps", "6", "--sleep", "0.05")
    assert codes == [0, 0], _logs(out)
    assert reports[0]["transport"] == reports[1]["transport"] == "gather"
    db = out / f"host0-{db_name}"
    rows = _rows(db, "SELECT rank, step, value FROM metrics WHERE key = 'rank_value' ORDER BY rank, step")
    assert rows == [(r, s, float(1000 * r + s)) for r in (0, 1) for s in range(6)]
    assert _rows(db, "SELECT transport, status, world_size FROM runs") == [("gather", "success", 2)]
    assert _rows(db, "SELECT rank, status FROM ranks ORDER BY rank") == [(0, "success"), (1, "success")]
    assert not reports[1]["store_exists"], reports[1]["files"]


@_needs_unshare
def test_two_hosts_two_ranks_each(tmp_path: Path) -> None:
    """2 nodes x 2 devices: the 4 ranks' rows all reach host 0's store; host 1's ranks see no store."""
    reports, codes, out = _run_hosts(tmp_path, "runs.duckdb", 2, "--steps", "4")
    assert codes == [0, 0], _logs(out)
    assert {r["transport"] for r in reports.values()} == {"gather"}
    assert [reports[r]["store_exists"] for r in range(4)] == [True, True, False, False]
    db = out / "host0-runs.duckdb"
    rows = _rows(db, "SELECT rank, step, value FROM metrics WHERE key = 'rank_value' ORDER BY rank, step")
    assert rows == [(r, s, float(1000 * r + s)) for r in range(4) for s in range(4)]
    assert _rows(db, "SELECT rank, node_rank, status FROM ranks WHERE rank = 0") == [(0, 0, "success")]
    assert _rows(db, "SELECT count(*) FROM ranks WHERE status = 'success'") == [(4,)]
    # ranks that only send publish their facts: rank 0 records every rank's host, pid and place
    facts = _rows(db, "SELECT rank, node_rank, local_rank, host IS NOT NULL, pid FROM ranks ORDER BY rank")
    assert [f[:4] for f in facts] == [(0, 0, 0, True), (1, 0, 1, True), (2, 1, 0, True), (3, 1, 1, True)]
    assert len({f[4] for f in facts}) == 4 and None not in {f[4] for f in facts}


@_needs_unshare
def test_asymmetric_logging_in_gather_mode_finishes(tmp_path: Path) -> None:
    """Ranks log different keys, different counts, or nothing at all, in gather mode: the run ends, rows kept."""
    reports, codes, out = _run_hosts(tmp_path, "runs.sqlite", 1, "--steps", "6", "--mode", "asym", "--transport", "gather")
    assert codes == [0, 0], _logs(out)
    db = out / "host0-runs.sqlite"
    keys = _rows(db, "SELECT DISTINCT rank, key FROM metrics WHERE key <> 'epoch' ORDER BY rank, key")
    assert keys == [(0, "rank_value"), (0, "zero_only"), (1, "rank_value")]
    # Lightning repeats a rank's last step value when it logs nothing new: compare distinct values
    values = _rows(db, "SELECT DISTINCT value FROM metrics WHERE rank = 1 AND key = 'rank_value' ORDER BY value")
    assert values == [(1000.0,), (1002.0,), (1004.0,)]
    assert _rows(db, "SELECT count(*) FROM metrics WHERE rank = 0 AND key = 'zero_only'") == [(6,)]
    assert _rows(db, "SELECT status FROM runs") == [("success",)]


@_needs_unshare
def test_killed_rank_is_recorded_missing(tmp_path: Path) -> None:
    """SIGKILL rank 1 mid-run: rank 0 ends within its bound, keeps what it received, and marks rank 1 missing."""
    reports, codes, out = _run_hosts(
        tmp_path, "runs.duckdb", 1, "--steps", "20", "--mode", "kill", "--kill-rank", "1", "--kill-step", "8",
        "--sleep", "0.1", "--timeout", "5",
    )
    assert codes[1] != 0 and codes[0] != 0, _logs(out)  # both fail: rank 0's next collective breaks
    assert 1 not in reports
    db = out / "host0-runs.duckdb"
    assert _rows(db, "SELECT rank, status FROM ranks ORDER BY rank") == [(0, "failed"), (1, "missing")]
    assert _rows(db, "SELECT status FROM runs") == [("failed",)]
    # what rank 1 sent before it died arrived whole and in order: a prefix of its steps
    steps = [s for (s,) in _rows(db, "SELECT step FROM metrics WHERE rank = 1 AND key = 'rank_value' ORDER BY step")]
    assert steps == list(range(len(steps))) and 0 < len(steps) <= 8
    rank0 = [s for (s,) in _rows(db, "SELECT step FROM metrics WHERE rank = 0 AND key = 'rank_value' ORDER BY step")]
    assert rank0 == list(range(len(rank0))) and len(rank0) >= 8


def test_rank0_killed_rows_spilled_then_imported_once(tmp_path: Path) -> None:
    """SIGKILL rank 0 mid-run (gather): rank 1 ends within its bound, spills what rank 0 did not take, prints
    the import command; running that command merges the file once, and rank 1's rows are whole."""
    reports, codes, out = _run_hosts(
        tmp_path, "runs.duckdb", 1, "--steps", "30", "--mode", "kill", "--kill-rank", "0", "--kill-step", "8",
        "--sleep", "0.1", "--timeout", "5", shared_disk=True,
    )
    assert codes[0] == -signal.SIGKILL and codes[1] != 0, _logs(out)  # rank 1's next collective breaks
    spills = sorted(out.glob("*.mrspill"))
    assert len(spills) == 1 and spills[0].name.startswith("sn-version_0-rank1-"), _logs(out)
    host1 = (out / "host1.log").read_text()
    assert host1.count("could not deliver its rows to rank 0") == 1, host1[-3000:]
    db = tmp_path / "store" / "runs.duckdb"
    spilled = tmp_path / "store" / spills[0].name  # where rank 1 wrote it: next to the store
    command = re.search(r"^ +(multirank-logger import .*)$", host1, re.MULTILINE)
    assert command is not None, host1[-3000:]
    argv = shlex.split(command.group(1))
    assert argv[2:] == [str(db), str(spilled)]
    sql = "SELECT step, value FROM metrics WHERE rank = 1 AND key = 'rank_value' ORDER BY step"
    before = _rows(db, sql)

    cli = [str(Path(sys.executable).with_name("multirank-logger")), *argv[1:]]
    first = subprocess.run(cli, check=False, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0 and "added" in first.stdout, first.stdout + first.stderr
    after = _rows(db, sql)
    assert len(after) > len(before)
    steps = [s for s, _ in after]
    # every step rank 1 logged, once, in order (the file and the store may overlap: no duplicate)
    assert steps == list(range(len(steps))) and len(steps) >= 8
    assert after == [(s, float(1000 + s)) for s in steps]
    again = subprocess.run(cli, check=False, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "already imported" in again.stdout, again.stdout + again.stderr
    assert _rows(db, sql) == after
