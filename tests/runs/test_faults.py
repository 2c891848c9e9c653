"""The store fails under a run: nothing lost, nothing claimed (issue 13).

Real faults only: another process holding the DuckDB file, a full tmpfs under `unshare -m`, the
store deleted mid-run, a row colliding with a stored one. After each: every value logged is in
the store or in the spill file the output names (import brings it in), or counted as lost; the
run is never recorded as "success" while the store lacks values.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from multirank_logger.cli import main as cli
from multirank_logger.store.sql_store import Store
from tests.helpers.launches import SCRIPTS, ForkedLaunch, run_script_forked, start_ranks_forked
from tests.helpers.logger_helpers import query, spill_files_named, train_cmd, train_env, wait_for_steps
from tests.helpers.processes import stop_process

SCRIPT = SCRIPTS / "fault_logger.py"
REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "MULTIRANK_LOGGER_"))}
    env.update(PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore", PYTHONPATH=str(REPO))
    return env


def _log_cmd(db: Path, spill: Path, *extra: str) -> list[str]:
    return [sys.executable, str(SCRIPT), *_log_args(db, spill, *extra)]


def _log_args(db: Path | str, spill: Path, *extra: str) -> list[str]:
    return ["--db", str(db), "--spill-dir", str(spill), *extra]


def _log_forked(db: Path | str, spill: Path, *extra: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    """fault_logger.py run to its end, forked (launches.run_script_forked): where the store, not the
    process's start or exit, is what a test is about. Its stdout holds stdout and stderr, in order."""
    return run_script_forked(SCRIPT, _log_args(db, spill, *extra), cwd=cwd, env=_env(), timeout=timeout)


def _expected(calls: int, keys: int = 10) -> tuple[int, float]:
    """(values, their sum) that fault_logger.py logs."""
    n = calls * keys
    return n, float(n * (n - 1) // 2)


def _stored(db: Path) -> tuple[int, float, str]:
    (count, total), = query(db, "SELECT COUNT(*), COALESCE(SUM(value), 0) FROM metrics")
    (status,), = query(db, "SELECT status FROM runs")
    return count, float(total), status


def _import(db: Path, files: list[str]) -> str:
    result = CliRunner().invoke(cli, ["import", str(db), *files])
    assert result.exit_code == 0, result.output
    return result.output


def _hold_duckdb(db: Path, seconds: float, ready: Path) -> subprocess.Popen:
    """A second process holding a read-only connection, as a notebook or the DuckDB CLI does.

    It opens the file as a person does: again, when the writer happens to hold it at that instant.
    """
    code = """
import duckdb, pathlib, sys, time
until = time.monotonic() + 30
while True:
    try:
        c = duckdb.connect(sys.argv[1], read_only=True)
        break
    except duckdb.IOException:  # the writer holds the file for the moment of a flush
        if time.monotonic() > until:
            raise
        time.sleep(0.01)
c.execute("SELECT COUNT(*) FROM metrics").fetchall()
pathlib.Path(sys.argv[2]).touch()
time.sleep(float(sys.argv[3]))
c.close()
"""
    proc = subprocess.Popen([sys.executable, "-c", code, str(db), str(ready), str(seconds)])
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the reader did not start"
        time.sleep(0.01)
    return proc


def _start_forked(db: Path | str, spill: Path, *extra: str, cwd: Path) -> ForkedLaunch:
    """fault_logger.py started, forked (as `_log_forked`), for a test that acts while it runs."""
    return start_ranks_forked(SCRIPT, _log_args(db, spill, *extra), nproc=1, cwd=cwd, env=_env(), launcher=False)


def _wait_for_file(path: Path, launch: ForkedLaunch, timeout: float = 120) -> None:
    """Return once `path` exists (the script's --ready); fail with its output if it ended first."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert launch.running and time.monotonic() < deadline, launch.wait(10).stdout[-4000:]
        time.sleep(0.01)


def _run_with_reader(tmp_path: Path, hold_s: float, timeout_s: float) -> tuple[subprocess.CompletedProcess, Path]:
    db, spill = tmp_path / "runs.duckdb", tmp_path / "spill"
    ready, go, held = tmp_path / "ready", tmp_path / "go", tmp_path / "held"
    with _start_forked(db, spill, "--calls", "4000", "--timeout", str(timeout_s), "--ready", str(ready), "--go", str(go),
                       cwd=tmp_path) as launch:
        _wait_for_file(ready, launch)
        reader = _hold_duckdb(db, hold_s, held)
        go.touch()
        try:
            done = launch.wait(240)
        finally:
            # the run is over with the reader still holding (when hold_s > timeout): end it, not wait it out
            reader.kill()
            reader.wait(30)
    assert done.returncode == 0 and "FINALIZED" in done.stdout, done.stdout[-4000:]
    return done, db


def test_reader_shorter_than_timeout_loses_nothing(tmp_path: Path) -> None:
    """A reader holding the DuckDB file across the run's end, for less than `timeout`: every row, success."""
    done, db = _run_with_reader(tmp_path, hold_s=4, timeout_s=30)
    assert _stored(db) == (*_expected(4000), "success"), done.stdout[-3000:]
    assert spill_files_named(done.stdout) == []


def test_preemption_while_a_notebook_holds_the_store_spills_and_import_completes(tmp_path: Path) -> None:
    """kill -TERM -PGID to a 2-rank DuckDB (gather) job while a reader holds the file to the end:
    rank 0 cannot write its own rows, rank 1's or the run's end. They go to the spill file the
    output names, said as a preemption; importing it brings every step of both ranks, and the
    run's end: interrupted, never success."""
    db, spill = tmp_path / "runs.duckdb", tmp_path / "spill"
    cmd = train_cmd(db, tmp_path, "--steps", "400", "--sleep", "0.1", "--flush-interval", "3600", "--timeout", "3",
                    "--spill-dir", str(spill))
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=train_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    reader = None
    try:
        wait_for_steps(proc, 1, timeout=90)  # the run is set up and registered
        reader = _hold_duckdb(db, 600, tmp_path / "held")
        wait_for_steps(proc, 2, timeout=60)
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if reader is not None:
            reader.kill()
            reader.wait(30)
    assert "SIGTERM came (a preemption) and the store has not taken these rows" in out, out[-3000:]
    files = spill_files_named(out)
    assert files, out[-3000:]
    assert "the run's end could not be recorded: the store still says 'running'" in out, out[-3000:]
    assert query(db, "SELECT status FROM runs") == [("running",)]
    _import(db, files)
    for rank in (0, 1):  # every step a rank logged, none missing in between
        steps = [int(s) for s, in query(db, f"SELECT step FROM metrics WHERE key = 'rank_value' AND rank = {rank}")]
        assert sorted(steps) == list(range(max(steps) + 1)) and max(steps) >= 2, (rank, sorted(steps), out[-3000:])
    assert query(db, "SELECT status FROM runs") == [("interrupted",)], out[-3000:]


@pytest.fixture(scope="module")
def spilled_end(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path]:
    """One launch with a reader holding its DuckDB store past `timeout` (until the launch exited):
    its last rows and its end only in its spill file. Shared: each test takes a copy (`_copy_of`)."""
    return _run_with_reader(tmp_path_factory.mktemp("spilled_end"), hold_s=120, timeout_s=3)


def _copy_of(spilled_end: tuple[subprocess.CompletedProcess, Path], tmp_path: Path) -> tuple[str, Path, list[str]]:
    """`spilled_end`'s directory copied into `tmp_path` (the store, its spill files, its logs): the
    launch's output, the copy's store, and the copy's spill files that output named."""
    done, db = spilled_end
    shutil.copytree(db.parent, tmp_path, dirs_exist_ok=True)
    files = [str(tmp_path / Path(f).relative_to(db.parent)) for f in spill_files_named(done.stdout)]
    return done.stdout, tmp_path / db.name, files


def test_reader_longer_than_timeout_spills_and_import_completes(
    spilled_end: tuple[subprocess.CompletedProcess, Path], tmp_path: Path
) -> None:
    """A reader holding the file past `timeout`: rows in the store or the named spill file, never success."""
    output, db, files = _copy_of(spilled_end, tmp_path)
    assert files, output[-3000:]
    count, _, status = _stored(db)
    assert status != "success"
    assert count < _expected(4000)[0]
    _import(db, files)
    count, total, _ = _stored(db)
    assert (count, total) == _expected(4000)


def _resume_after_a_spilled_end(
    spilled_end: tuple[subprocess.CompletedProcess, Path], tmp_path: Path, damage: bool
) -> tuple[subprocess.CompletedProcess, Path, list[bytes]]:
    """Launch 1 cannot write the store at its end (a reader holds it past `timeout`): rank 0's
    last rows, and the end itself, are only in its spill file; its metrics.csv is whole (fed
    before the store). Launch 2 resumes the run (version 0) before anyone imports anything."""
    output, db, files = _copy_of(spilled_end, tmp_path)
    assert len(files) == 1, output[-3000:]
    assert query(db, "SELECT status FROM runs") == [("running",)]  # its end could not be recorded either
    first = (tmp_path / "lightning_logs" / "version_0" / "metrics.csv").read_bytes().split(b"\r\n")
    assert len(first) == 4000 + 2  # header, 4000 calls, the last line's end
    if damage:  # a frame in the middle fails its checksum: the frames around it import
        data = bytearray(Path(files[0]).read_bytes())
        data[len(data) // 2] ^= 0xFF
        Path(files[0]).write_bytes(bytes(data))
    again = _log_forked(db, tmp_path / "spill", "--calls", "100", "--version", "0", cwd=tmp_path)
    assert again.returncode == 0 and "FINALIZED" in again.stdout, again.stdout[-4000:]
    return again, db, first


def test_a_resume_imports_what_the_earlier_launch_spilled_before_it_logs(
    spilled_end: tuple[subprocess.CompletedProcess, Path], tmp_path: Path
) -> None:
    """Launch 2 finds launch 1's spill file in its spill_dir and imports it first: every value of
    both launches is stored, the run is a success for it, launch 1 is recorded as ended (not
    vanished), and metrics.csv holds launch 1's rows, then launch 2's. Without the import the
    run said success with 20,000 values only in the file."""
    again, db, first = _resume_after_a_spilled_end(spilled_end, tmp_path, damage=False)
    assert "imported 20000 row(s) that launch 0 of this run (rank 0) had spilled to" in again.stdout, again.stdout[-3000:]
    assert _stored(db) == (40_000 + 1_000, float(sum(range(40_000)) + sum(range(1_000))), "success")
    assert query(db, "SELECT attempt, status FROM attempts ORDER BY attempt") == [(0, "success"), (1, "success")]
    lines = (tmp_path / "lightning_logs" / "version_0" / "metrics.csv").read_bytes().split(b"\r\n")
    assert lines[:4001] == first[:4001] and len(lines) == 4000 + 100 + 2
    # another store beside it, sharing the spill dir, with a run of the same name, version and
    # id: its resume imports only its own run's files (by then that one is imported, but the
    # file stays: it must never join a run it was not written for)
    other, other_logs = tmp_path / "other.duckdb", tmp_path / "other_logs"
    for extra in ((), ("--version", "0")):
        done = _log_forked(other, tmp_path / "spill", "--calls", "100", "--save-dir", str(other_logs), *extra,
                           cwd=tmp_path)
        assert done.returncode == 0 and "FINALIZED" in done.stdout, done.stdout[-3000:]
    assert "imported" not in done.stdout, done.stdout[-3000:]
    assert query(other, "SELECT id, name, version FROM runs") == [(1, "lightning_logs", 0)]
    assert _stored(other) == (2 * 1_000, float(2 * sum(range(1_000))), "success")


def test_a_resume_whose_earlier_spill_file_cannot_be_imported_is_no_success(
    spilled_end: tuple[subprocess.CompletedProcess, Path], tmp_path: Path
) -> None:
    """The same with launch 1's file damaged in one frame: the resume imports its intact frames and
    says the damaged one (its values, the import command for an intact copy); the run stays short
    of success until such a copy is imported, and no short metrics.csv passes for CSVLogger's
    (launch 1's rows are read back from a store that lacks some)."""
    import re

    again, db, _ = _resume_after_a_spilled_end(spilled_end, tmp_path, damage=True)
    said = re.search(r"an earlier launch's spill file is damaged: \S+: bytes \d+-\d+ are damaged \(frame \d+\): "
                     r"(\d+) value\(s\) not imported", again.stdout)
    assert said, again.stdout[-3000:]
    lost = int(said.group(1))
    assert 0 < lost < 20_000
    assert f"multirank-logger import {db} " in again.stdout
    assert query(db, "SELECT status FROM runs") == [("incomplete",)]
    assert query(db, "SELECT rank, attempt FROM unheard_ends") == [(0, 0)]
    assert query(db, "SELECT count(*) FROM metrics")[0][0] == 40_000 + 1_000 - lost  # every intact frame's
    version = tmp_path / "lightning_logs" / "version_0"
    assert not (version / "metrics.csv").exists() and (version / "metrics.partial.csv").exists()
    assert "metrics.csv was not written: the store lacks 0 value(s) kept in spill files and 0 lost, and what 1 rank" in (
        again.stdout
    )
    # the intact copy adds just the damaged frame's rows and settles the run
    [intact] = spill_files_named(spilled_end[0].stdout)  # the fixture's own file, never damaged
    _import(db, [intact])
    assert query(db, "SELECT count(*) FROM metrics")[0][0] == 40_000 + 1_000
    assert query(db, "SELECT rank, attempt FROM unheard_ends") == []
    assert query(db, "SELECT status FROM runs") == [("success",)]


def test_key_collision_is_isolated_and_later_batches_written(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    """A row colliding with a stored one on (run, rank, seq, key) is spilled alone; the rest and
    every later batch are stored; the run is incomplete until the spill is imported."""
    from multirank_logger import MultiRankLogger

    db = tmp_path / "runs.sqlite"
    logger = MultiRankLogger(db=str(db), spill_dir=str(tmp_path / "spill"), flush_interval=3600)
    logger.log_metrics({"a": 0.0}, step=0)
    assert logger.flush(5)
    store = Store(db)
    with store.begin() as conn:  # what a relaunch numbering its calls from 0 again would collide with
        conn.exec_driver_sql(
            "INSERT INTO metrics (run_id, rank, seq, step, key, value, dtype, time) VALUES (?, 0, 3, 3, 'a', -1, 0, 0)",
            (logger.run_id,),
        )
    for seq in range(1, 40):
        logger.log_metrics({"a": float(seq), "b": float(seq)}, step=seq)
    assert logger.flush(5)
    for seq in range(40, 50):
        logger.log_metrics({"a": float(seq)}, step=seq)
    assert logger.flush(5)
    logger.finalize("success")
    err = capfd.readouterr().err
    assert err.count("refused 1 value(s) for good") == 1, err
    (count,), = query(db, "SELECT COUNT(*) FROM metrics")
    assert count == 1 + 39 * 2 + 10  # the colliding call's "a" is the stored -1 (not overwritten)
    assert query(db, "SELECT status, values_spilled FROM runs") == [("incomplete", 1)]
    # metrics.csv was written as the run went, from every call rank 0 logged (not from the store):
    # whole, with the value logged at step 3 (3.0), not the stored -1
    lines = (tmp_path / "lightning_logs" / "version_0" / "metrics.csv").read_text().splitlines()
    assert len(lines) == 1 + 50 and lines[0] == "a,b,step" and lines[4] == "3.0,3.0,3"
    output = _import(db, spill_files_named(err))
    assert "1 already in the store" in output
    assert query(db, "SELECT status, values_spilled FROM runs") == [("success", 0)]
    store.close()


@pytest.mark.parametrize("suffix", [".sqlite", ".duckdb"])
def test_store_deleted_mid_run_spill_imports_into_its_own_run_only(tmp_path: Path, suffix: str) -> None:
    """Issue 38 points 2 and 3: run A's store is deleted mid-run (its later rows spilled), then run B
    is logged under the same name and version into a new store at that path. Importing A's spill
    there adds nothing to B (an error names both runs); into a fresh store, and by the very command
    A printed once B's store is gone too, it recreates A with every spilled value once."""
    db, spill = tmp_path / f"runs{suffix}", tmp_path / "spill"
    done = _log_forked(db, spill, "--calls", "2000", "--timeout", "2", "--delete", cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stdout[-4000:]
    # StoreGone, or (when the deletion lands between the writer's check and its open, and DuckDB
    # creates an empty file there) the missing tables: either way the rows are held, then spilled
    assert "was deleted or replaced" in done.stdout or "does not exist" in done.stdout, done.stdout[-3000:]
    assert "for good" not in done.stdout
    files = spill_files_named(done.stdout)
    assert len(files) == 1
    printed = re.findall(r"multirank-logger import (\S+) \S+\.mrspill", done.stdout)[0]
    values, total = _expected(2000)
    half = _expected(1000)
    spilled = (values - half[0], total - half[1])
    # run B: same name and version, a new store at the same path (its own save_dir: version_0 again)
    b = _log_forked(db, tmp_path / "spill-b", "--calls", "20", "--save-dir", str(tmp_path / "b"), cwd=tmp_path, timeout=180)
    assert b.returncode == 0, b.stdout[-4000:]
    assert query(db, "SELECT name, version, COUNT(*) FROM runs GROUP BY name, version") == [("lightning_logs", 0, 1)]
    refused = CliRunner().invoke(cli, ["import", str(db), *files])
    assert refused.exit_code == 1, refused.output
    assert _stored(db) == (*_expected(20), "success")  # B as it was: none of A's rows
    (b_uuid,), = query(db, "SELECT run_uuid FROM runs")
    assert "Error: " in refused.output and "holds rows of run lightning_logs/version_0 (uuid " in refused.output
    assert f"(uuid {b_uuid}, id 1)" in refused.output and "Nothing was imported" in refused.output
    fresh = tmp_path / f"fresh{suffix}"
    Store(fresh).close()
    output = _import(fresh, files)
    assert f"added {spilled[0]} rows" in output, output
    (count, summed), = query(fresh, "SELECT COUNT(*), SUM(value) FROM metrics")
    assert (count, summed) == spilled
    (a_uuid, status), = query(fresh, "SELECT run_uuid, status FROM runs WHERE name = 'lightning_logs' AND version = 0")
    assert a_uuid != b_uuid and status in ("incomplete", "success")
    assert "nothing added" in _import(fresh, files)  # once
    # the command A printed, once its store path holds nothing: the store and the run come back
    for leftover in tmp_path.glob(f"runs{suffix}*"):
        leftover.unlink()
    assert Path(printed) == db
    again = CliRunner().invoke(cli, ["import", printed, *files])
    assert again.exit_code == 0, again.output
    assert query(db, "SELECT COUNT(*), SUM(value) FROM metrics") == [spilled]
    assert query(db, "SELECT run_uuid FROM runs") == [(a_uuid,)]


# -- a full disk: a small tmpfs of this test's own, in a mount namespace ---------------------------------

def _can_unshare() -> str | None:
    if shutil.which("unshare") is None:
        return "the unshare command is not installed"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs none /mnt"], capture_output=True, text=True, check=False)
    return None if probe.returncode == 0 else f"mount namespaces are not permitted here ({probe.stderr.strip()})"


_NO_UNSHARE = _can_unshare() if sys.platform == "linux" else "mount namespaces are Linux-only"
_needs_unshare = pytest.mark.skipif(_NO_UNSHARE is not None, reason=str(_NO_UNSHARE))


def _on_full_disk(tmp_path: Path, suffix: str, size: str, spill_inside: bool, *extra: str):
    """Log into a store on a `size` tmpfs (in a mount namespace); copy the store (and its WAL) out afterwards."""
    disk, out = tmp_path / "disk", tmp_path / "out"
    disk.mkdir()
    out.mkdir()
    db = disk / f"runs{suffix}"
    spill = disk / "spill" if spill_inside else out / "spill"
    cmd = " ".join(_log_cmd(db, spill, *extra))
    script = f"mount -t tmpfs -o size={size} none {disk} && {cmd}; rc=$?; cp {db} {out}/; for w in {db}-wal {db}.wal; do [ -e $w ] && cp $w {out}/; done; exit $rc"
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], env=_env(), capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0 and "FINALIZED" in done.stdout, done.stderr[-4000:]
    return done, out / db.name


@_needs_unshare
# calls enough to fill the disk several times over (DuckDB compresses: a bigger disk, more calls)
@pytest.mark.parametrize("suffix,size,calls", [(".sqlite", "1m", 10_000), (".duckdb", "3m", 20_000)])
def test_full_disk_spills_elsewhere_and_import_recovers_every_value(
    tmp_path: Path, suffix: str, size: str, calls: int
) -> None:
    """A store on a full disk, spill_dir elsewhere: a message naming the spill, no success, and every
    value back once the copied store imports the spill files (some spilled mid-run: memory bound)."""
    done, copy = _on_full_disk(tmp_path, suffix, size, False, "--calls", str(calls), "--timeout", "3",
                               "--max-held", "40000")
    files = spill_files_named(done.stderr)
    assert files, done.stderr[-3000:]
    assert "No space left" in done.stderr or "full" in done.stderr, done.stderr[-3000:]
    count, _, status = _stored(copy)
    assert status != "success"
    assert count < calls * 10
    _import(copy, files)
    count, total, status = _stored(copy)
    assert (count, total) == _expected(calls)


@_needs_unshare
def test_full_disk_with_the_spill_on_it_counts_the_values_lost(tmp_path: Path) -> None:
    """spill_dir on the same full disk: the message counts the values lost, and the run is no success."""
    calls = 10_000
    done, copy = _on_full_disk(tmp_path, ".sqlite", "1m", True, "--calls", str(calls), "--timeout", "3")
    lost = re.findall(r"(\d+) value\(s\) are LOST", done.stderr)
    assert lost, done.stderr[-3000:]
    stored, _, status = _stored(copy)
    spilled = sum(int(n) for n in re.findall(r"(\d+) value\(s\) are in \S+\.mrspill", done.stderr))
    assert stored + spilled + int(lost[-1]) == calls * 10, done.stderr[-3000:]
    assert status != "success"


@_needs_unshare
def test_full_log_dir_leaves_no_short_metrics_csv_and_sets_the_rows_written_aside(tmp_path: Path) -> None:
    """The store on a disk with room, log_dir on a full one: the store holds every value (success),
    but no metrics.csv passes for CSVLogger's; the whole lines written so far are set aside under a
    name that says so, each once; the message gives the export command, which writes the whole file."""
    disk, out, store_dir = tmp_path / "disk", tmp_path / "out", tmp_path / "store"
    for d in (disk, out, store_dir):
        d.mkdir()
    db, calls, keys = store_dir / "runs.sqlite", 20_000, 5
    cmd = " ".join(_log_cmd(db, store_dir / "spill", "--calls", str(calls), "--keys", str(keys),
                            "--save-dir", str(disk)))
    script = f"mount -t tmpfs -o size=256k none {disk} && {cmd}; rc=$?; cp -r {disk}/lightning_logs {out}/; exit $rc"
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], env=_env(), capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0 and "FINALIZED" in done.stdout, done.stderr[-4000:]
    count, total, status = _stored(db)
    assert (count, total, status) == (*_expected(calls, keys), "success")
    version = out / "lightning_logs" / "version_0"
    assert not (version / "metrics.csv").exists(), done.stderr[-3000:]
    partial = (version / "metrics.partial.csv").read_bytes().decode().split("\r\n")
    assert partial[-1] == "" and partial[0] == "k0,k1,k2,k3,k4,step"
    steps = [int(line.split(",")[-1]) for line in partial[1:-1] if line.count(",") == keys]
    assert steps == list(range(len(partial) - 2)) and 0 < len(steps) < calls  # whole lines, each once, in order
    assert f"Its first {len(steps)} row(s) of rank 0 are in {disk}/lightning_logs/version_0/metrics.partial.csv" in (
        done.stderr
    ), done.stderr[-3000:]
    export = re.search(r"multirank-logger export (\S+) --run (\S+) -o (\S+)", done.stderr)
    assert export and export.group(1, 2) == (str(db), "1"), done.stderr[-3000:]
    whole = out / "metrics.csv"
    CliRunner().invoke(cli, ["export", str(db), "--run", "1", "-o", str(whole)])
    lines = whole.read_bytes().decode().split("\r\n")
    assert len(lines) == calls + 2 and lines[: len(partial) - 1] == partial[:-1]


def test_postgres_stopped_and_started_mid_run_writes_every_row(tmp_path: Path) -> None:
    """The PostgreSQL server stops under a running logger and comes back: every row is written once
    it is back (held in memory meanwhile), and the run is a success."""
    pgserver = pytest.importorskip("pgserver", reason="pgserver is not installed (pip install -e '.[test]')")
    from tests.helpers.stores import new_postgres_database

    # our own server (the test stops it), outside pytest's base directory: every pytest session
    # resets that to mode 0700, which shuts out the server's own user ("pgserver")
    pgdata = Path(tempfile.mkdtemp(prefix="multirank-pg-"))
    pgdata.chmod(0o755)
    server = pgserver.get_server(pgdata, cleanup_mode="stop")
    try:
        url = new_postgres_database(server)
        ready, go = tmp_path / "ready", tmp_path / "go"
        # a server URL puts save_dir (metrics.csv) in the working directory, as CSVLogger's "."
        with _start_forked(url, tmp_path / "spill", "--calls", "4000", "--timeout", "60", "--ready", str(ready),
                           "--go", str(go), cwd=tmp_path) as launch:
            _wait_for_file(ready, launch)
            postmaster = server.get_pid()
            os.kill(postmaster, signal.SIGINT)  # PostgreSQL's "fast" shutdown: clients are cut off
            while _alive(postmaster):
                time.sleep(0.05)
            go.touch()
            # the second half is logged and flushed against the stopped server until the writer says
            # its 5 failed flushes (with the connection's error: StoreUnreachable, the driver's
            # OperationalError with no statement, store/backends/postgresql.py); then the server is
            # back (once said, not after a sleep sized for some machine)
            launch.wait_for_output("5 flushes in a row failed (StoreUnreachable: Cannot connect to the store", 120)
            server.ensure_postgres_running()
            done = launch.wait(240)
        assert done.returncode == 0 and "FINALIZED" in done.stdout, done.stdout[-4000:]
        (count, total), = query(url, "SELECT COUNT(*), SUM(value) FROM metrics")
        assert (count, float(total)) == _expected(4000)
        assert query(url, "SELECT status, values_spilled FROM runs") == [("success", None)]
        assert spill_files_named(done.stdout) == []
        assert (tmp_path / "lightning_logs" / "version_0" / "metrics.csv").read_text().count("\n") == 4001
    finally:
        server.cleanup()
        shutil.rmtree(pgdata, ignore_errors=True)


def _server_processes(server) -> list[int]:
    """The postmaster and every process it started (the backends serving the clients)."""
    postmaster = server.get_pid()
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == postmaster:
            children.append(int(stat.parent.name))
    return [postmaster, *children]


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, FileNotFoundError):  # a process that ended meanwhile
            stop_process(pid) if sig == signal.SIGSTOP else os.kill(pid, sig)


@contextlib.contextmanager
def _own_postgres() -> Iterator[Any]:
    """A PostgreSQL server of the test's own (the test stops it), outside pytest's base directory
    (every pytest session resets that to mode 0700, shutting out the server's own user)."""
    pgserver = pytest.importorskip("pgserver", reason="pgserver is not installed (pip install -e '.[test]')")
    pgdata = Path(tempfile.mkdtemp(prefix="multirank-pg-"))
    pgdata.chmod(0o755)
    server = pgserver.get_server(pgdata, cleanup_mode="stop")
    try:
        yield server
    finally:
        _signal_all(_server_processes(server), signal.SIGCONT)
        server.cleanup()
        shutil.rmtree(pgdata, ignore_errors=True)


def _start_paused(server, tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, str, list[int]]:
    """fault_logger.py on a new database of `server`, which is stopped (SIGSTOP: every process of
    it, as a host cut off mid-call) once the first half is stored; the second half then runs."""
    from tests.helpers.stores import new_postgres_database

    url = new_postgres_database(server)
    ready, go = tmp_path / "ready", tmp_path / "go"
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--db", url, "--spill-dir", str(tmp_path / "spill"), "--calls", "2000",
         "--ready", str(ready), "--go", str(go), *extra],
        cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    stopped = _server_processes(server)
    _signal_all(stopped, signal.SIGSTOP)
    go.touch()
    return proc, url, stopped


def test_postgres_paused_during_finalize_ends_within_its_bound_with_the_rows_spilled(tmp_path: Path) -> None:
    """The server stops answering (SIGSTOP) mid-run, the writer inside a write: finalize still returns
    (finalize_timeout), the rows it could not store are in a spill file the message names with the
    run's end, and importing it once the server is back recovers every value and that end
    (before: the run stayed 'running' for good)."""
    with _own_postgres() as server:
        proc, url, stopped = _start_paused(server, tmp_path, "--timeout", "1", "--finalize-timeout", "6")
        try:
            out, err = proc.communicate(timeout=120)  # on a wait without bound: never
        finally:
            proc.kill()
            _signal_all(stopped, signal.SIGCONT)
        assert proc.returncode == 0 and "FINALIZED" in out, err[-4000:]
        assert "did not finish within 6 s" in err
        files = spill_files_named(err)
        assert files, err[-4000:]
        before_import = time.time()
        _import(url, files)
        (count, total), = query(url, "SELECT COUNT(*), SUM(value) FROM metrics")
        assert (count, float(total)) == _expected(2000)
        ended = "SELECT status, ended_at IS NOT NULL FROM {} WHERE ended_at IS NULL OR ended_at <= {}"
        for table in ("runs", "ranks", "attempts"):  # ended before the import, as the process did
            assert query(url, ended.format(table, before_import)) == [("success", True)], table


def test_postgres_paused_at_exit_without_finalize_the_process_still_ends_with_the_rows_spilled(tmp_path: Path) -> None:
    """A script that ends without finalize while the server does not answer (SIGSTOP): the exit
    hooks' flush is bounded (process_hooks.EXIT_FLUSH_TIMEOUT), so is the run's end they make
    (finalize_timeout: its default, 32 s here, only made the test wait), the process ends, and the
    rows the store did not take are in a spill file the message names, which imports every value."""
    with _own_postgres() as server:
        proc, url, stopped = _start_paused(
            server, tmp_path, "--timeout", "1", "--no-finalize", "--exit-flush-timeout", "4", "--finalize-timeout", "6"
        )
        try:
            out, err = proc.communicate(timeout=150)  # on a wait without bound: never
        finally:
            proc.kill()
            _signal_all(stopped, signal.SIGCONT)
        assert proc.returncode == 0 and "EXITING" in out, err[-4000:]
        assert "did not finish within 6 s" in err, err[-4000:]
        files = spill_files_named(err)
        assert files, err[-4000:]
        _import(url, files)
        (count, total), = query(url, "SELECT COUNT(*), SUM(value) FROM metrics")
        assert (count, float(total)) == _expected(2000)


def test_ctrl_c_during_a_flush_reaches_the_caller_and_loses_nothing(tmp_path: Path) -> None:
    """SIGINT while the main thread flushes into a server that does not answer: KeyboardInterrupt
    reaches the caller (it is no store refusal: the rows are not cut up or spilled), and once the
    server answers again every row is stored and the run is a success."""
    with _own_postgres() as server:
        proc, url, stopped = _start_paused(server, tmp_path, "--timeout", "60", "--interrupt-flush")
        try:
            assert proc.stdout is not None
            lines = [proc.stdout.readline() for _ in range(1)]
            assert lines == ["FLUSHING\n"], lines
            time.sleep(1.0)  # inside the flush: the server is stopped, it cannot end
            proc.send_signal(signal.SIGINT)
            interrupted = proc.stdout.readline()
            _signal_all(stopped, signal.SIGCONT)
            out, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
            _signal_all(stopped, signal.SIGCONT)
        assert interrupted == "INTERRUPTED\n", err[-4000:]
        assert proc.returncode == 0 and "FINALIZED" in out, err[-4000:]
        assert spill_files_named(err) == [] and "refused" not in err
        (count, total), = query(url, "SELECT COUNT(*), SUM(value) FROM metrics")
        assert (count, float(total)) == _expected(2000)
        assert query(url, "SELECT status FROM runs") == [("success",)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_gather_rank0_spills_its_own_and_received_rows_while_a_reader_holds_the_store(tmp_path: Path) -> None:
    """Gather transport (DuckDB, 2 DDP ranks) with a reader holding the file from mid-run past the end:
    rank 0 spills the rows it holds (its own and rank 1's), the run is not success, and the import
    adds every spilled value to the store."""
    from tests.helpers.logger_helpers import TRAIN, train_env

    db, spill = tmp_path / "runs.duckdb", tmp_path / "spill"
    args = ["--db", str(db), "--save-dir", str(tmp_path), "--steps", "60", "--sleep", "0.05", "--timeout", "3",
            "--spill-dir", str(spill)]
    # the ranks forked as torchrun starts them (launches.start_ranks_forked): the store held is what is tested
    with start_ranks_forked(TRAIN, args, nproc=2, cwd=tmp_path, env=train_env()) as training:
        training.wait_for_output("MultiRankLogger: run", 120)  # registered: the store exists, the reader can hold it
        reader = _hold_duckdb(db, 240, tmp_path / "held")
        try:
            done = training.wait(240)
        finally:
            reader.kill()  # it held the file from mid-run until the job had ended: past every timeout
            reader.wait(30)
    out = done.stdout
    assert done.returncode == 0, out[-4000:]
    files = spill_files_named(out)
    assert files, out[-4000:]
    spilled = sum(int(n) for n in re.findall(r"(\d+) value\(s\) are in \S+\.mrspill", out))
    (before,), = query(db, "SELECT COUNT(*) FROM metrics")
    (status,), = query(db, "SELECT status FROM runs")
    assert status != "success"
    from multirank_logger.store.spill_file import read_spill

    # rank 0's file holds its own rows and those rank 1 shipped; on a loaded machine rank 1 may also
    # spill a copy of rows rank 0 took but acknowledged past rank 1's wait: each is stored once
    spilled_rows = {row for f in files for batch in read_spill(f)[1]
                    for row in zip(*(batch.column(c).to_pylist() for c in ("rank", "seq", "key")))}
    stored_before = set(query(db, "SELECT rank, seq, key FROM metrics"))
    assert spilled > 0 and {rank for rank, _, _ in spilled_rows} == {0, 1}
    output = _import(db, files)
    (after,), = query(db, "SELECT COUNT(*) FROM metrics")
    assert after - before == len(spilled_rows - stored_before) > 0, output
    assert query(db, "SELECT COUNT(*) FROM (SELECT DISTINCT rank, seq, key FROM metrics) AS d") == [(after,)]
    # rank 1 ended well and rank 0 heard it, but could not write it: its spill file's end carries
    # it, and the import records it (it stayed "running", the run "incomplete": issue 38 point 6)
    assert query(db, "SELECT rank, status FROM ranks ORDER BY rank") == [(0, "success"), (1, "success")], output
    assert query(db, "SELECT status, values_spilled, values_lost FROM runs") == [("success", 0, 0)], output
    listed = CliRunner().invoke(cli, ["runs", str(db)])
    assert "never heard" not in listed.output and " success " in listed.output, listed.output


def test_sqlite_reader_holding_a_read_transaction_across_the_end_costs_nothing(tmp_path: Path) -> None:
    """A second process keeps a SQLite read transaction open (BEGIN; SELECT ...) from mid-run until
    after the logger exited, past its `timeout`: in WAL mode a reader never blocks the writer, so
    every value is stored and the run is a success, with no spill. What it costs: the WAL cannot be
    checkpointed past the reader's snapshot, so it holds the whole second half until the reader ends."""
    db, spill = tmp_path / "runs.sqlite", tmp_path / "spill"
    ready, go, held = tmp_path / "ready", tmp_path / "go", tmp_path / "held"
    calls = 4000
    launch = _start_forked(db, spill, "--calls", str(calls), "--timeout", "2", "--ready", str(ready), "--go", str(go),
                           cwd=tmp_path)
    with launch:
        _wait_for_file(ready, launch)
        done, wal_while_held = _hold_a_read_transaction_while(launch, db, go, held)
    assert done.returncode == 0 and "FINALIZED" in done.stdout, done.stdout[-4000:]
    assert _stored(db) == (*_expected(calls), "success"), done.stdout[-3000:]
    assert spill_files_named(done.stdout) == [] and "LOST" not in done.stdout
    # the second half's pages sit in the WAL while the snapshot is held (SQLite cannot reset it then)
    assert wal_while_held > 0
    wal = Path(f"{db}-wal")
    print(f"WAL while the reader held its snapshot: {wal_while_held} bytes; after: "
          f"{wal.stat().st_size if wal.exists() else 0} bytes")


def _hold_a_read_transaction_while(
    launch: ForkedLaunch, db: Path, go: Path, held: Path
) -> tuple[subprocess.CompletedProcess, int]:
    """A second process's SQLite read transaction, from now until `launch` (told to go on) ended:
    the launch's end, and the WAL's size then, the snapshot still held."""
    code = (
        "import sqlite3, sys, time, pathlib; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
        "c.execute('BEGIN'); print(c.execute('SELECT COUNT(*) FROM metrics').fetchone()[0], flush=True); "
        "pathlib.Path(sys.argv[2]).touch(); time.sleep(240)"
    )
    reader = subprocess.Popen([sys.executable, "-c", code, str(db), str(held)], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not held.exists():
            assert reader.poll() is None and time.monotonic() < deadline, "the reader did not start"
            time.sleep(0.01)
        go.touch()
        done = launch.wait(240)
        wal = Path(f"{db}-wal")
        return done, wal.stat().st_size if wal.exists() else 0
    finally:
        reader.kill()
        reader.wait(30)
