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
from collections.abc import Callable
from pathlib import Path

import pytest

from multirank_logger.store.sql_store import Store
from tests.helpers.launches import REPO, SCRIPTS, free_port

pytestmark = pytest.mark.timeout(240)
SCRIPT = SCRIPTS / "shared_nothing_train.py"
#: launcher variables a test's own environment must not leak into a simulated host
_LAUNCHER_PREFIXES = ("SLURM_", "TORCHELASTIC_", "MULTIRANK_LOGGER_", "NODE_RANK", "LOCAL_RANK", "GROUP_RANK",
                      "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
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
    tmp_path: Path,
    db_name: str,
    devices: int,
    *extra: str,
    shared_disk: bool = False,
    launcher_env: Callable[[int], dict[str, str]] | None = None,
    before: dict[int, str] | None = None,
) -> tuple[dict[int, dict], list[int], Path]:
    """Start 2 simulated hosts of `devices` ranks each; returns the rank reports, exit codes, out dir.

    `launcher_env(node)` replaces NODE_RANK with a launcher's own variables; `before[node]` is a
    shell command run on that host (inside its namespace) before training starts."""
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
        env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_PREFIXES)}
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONPATH=str(REPO))
        env.update(launcher_env(node) if launcher_env else {"NODE_RANK": str(node)})
        log = open(out / f"host{node}.log", "w")
        node_cmd = cmd if not before or node not in before else cmd.replace("exec ", f"{before[node]} && exec ", 1)
        argv = ["sh", "-c", node_cmd] if shared_disk else ["unshare", "-m", "sh", "-c", node_cmd]
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


# -- one identity: a host that is not rank 0 allocates nothing on its own disk (issue 14) ------------

#: each launcher's variables for host `node` of a 2-host job, 1 rank per host
_LAUNCHER_STYLES: dict[str, Callable[[int], dict[str, str]]] = {
    # the usual hand-launched recipe: no RANK
    "hand": lambda node: {"NODE_RANK": str(node), "LOCAL_RANK": "0", "WORLD_SIZE": "2"},
    # srun, one task per node: Lightning's SLURMEnvironment takes the ranks from these
    "slurm": lambda node: {
        "SLURM_NTASKS": "2", "SLURM_JOB_NAME": "train", "SLURM_PROCID": str(node), "SLURM_LOCALID": "0",
        "SLURM_NODEID": str(node), "SLURM_NTASKS_PER_NODE": "1", "SLURM_NNODES": "2", "SLURM_JOB_ID": "4242",
        "SLURMD_NODENAME": f"sn-node{node}",  # Slurm's name of the node (ranks.slurm_node)
    },
    # torchrun's variables (without its agent)
    "torchrun": lambda node: {
        "RANK": str(node), "LOCAL_RANK": "0", "GROUP_RANK": str(node), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1",
    },
}
_SEED_RUNS = 3


@_needs_unshare
# hand-launched on both backends; SLURM and torchrun variables on one backend each (the rank is
# decided before any backend is touched, so the other two pairs would repeat a launch for nothing)
@pytest.mark.parametrize(
    ("db_name", "style"),
    [("runs.duckdb", "hand"), ("runs.sqlite", "hand"), ("runs.sqlite", "slurm"), ("runs.duckdb", "torchrun")],
)
def test_host_1_with_its_own_store_allocates_nothing(tmp_path: Path, db_name: str, style: str) -> None:
    """One rank a host, host 1's disk holding a store with 3 runs of the name: it is left unchanged,
    and every row of both ranks lands in host 0's store under its one run (no orphan rows), sent
    over the channel (gather), both ranks' ends recorded. (A host 1 with no store at all, and
    NODE_RANK alone set: test_two_hosts_two_ranks_each.)"""
    db = tmp_path / "store" / db_name
    seed = (
        f"{sys.executable} -c \"from multirank_logger.store.sql_store import Store; s = Store('{db}'); "
        f"[s.create_run('sn') for _ in range({_SEED_RUNS})]; s.close()\" && "
        f"sha256sum {db} > {tmp_path / 'out' / 'host1-before.sha'}"
    )
    reports, codes, out = _run_hosts(
        tmp_path, db_name, 1, "--steps", "6", launcher_env=_LAUNCHER_STYLES[style], before={1: seed}
    )
    assert codes == [0, 0], _logs(out)
    before = (out / "host1-before.sha").read_text().split()[0]
    assert reports[1]["store_digest"] == before, _logs(out)
    assert reports[0]["transport"] == reports[1]["transport"] == "gather"
    host0 = out / f"host0-{db_name}"
    assert _rows(host0, "SELECT id, version, status, transport, world_size FROM runs") == [(1, 0, "success", "gather", 2)]
    assert _rows(host0, "SELECT rank, status FROM ranks ORDER BY rank") == [(0, "success"), (1, "success")]
    rows = _rows(host0, "SELECT run_id, rank, step, value FROM metrics WHERE key = 'rank_value' ORDER BY rank, step")
    assert rows == [(1, r, s, float(1000 * r + s)) for r in (0, 1) for s in range(6)]
    if style == "slurm":  # each host's rank said Slurm's name of its node; host 1's through its published facts
        assert _rows(host0, "SELECT rank, slurm_node FROM ranks ORDER BY rank") == [(0, "sn-node0"), (1, "sn-node1")]
