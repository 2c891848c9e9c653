"""A SQLite store in a directory this process cannot write (a colleague's results, a read-only
mount) reads without write access to it (issue 38 point 8): SQLite under WAL creates a -shm
beside the file to read, and failed with "unable to open database file" and a traceback.

The condition is made for real, also for root (CI runs as root, and root ignores a chmod): the
reader runs in a mount namespace of its own (`unshare -m`), where the store's directory is
bind-mounted read-only, as tests/runs/test_faults.py makes its full disk.
"""

from __future__ import annotations

import shlex
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.built_stores import LOSS_ROWS, fill_loss_rows


def _can_mount_read_only() -> str | None:
    if not sys.platform.startswith("linux"):
        return "mount namespaces are Linux-only"
    if shutil.which("unshare") is None:
        return "the unshare command is not installed"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount --bind /tmp /tmp && mount -o remount,bind,ro /tmp"],
                           capture_output=True, text=True, check=False)
    return None if probe.returncode == 0 else f"mount namespaces are not permitted here ({probe.stderr.strip()})"


_NO_MOUNT = _can_mount_read_only()
pytestmark = pytest.mark.skipif(_NO_MOUNT is not None, reason=str(_NO_MOUNT))


def _cli_on_read_only_dir(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`multirank-logger ARGS` with `folder` mounted read-only for it alone; proves the mount first."""
    command = shlex.join([sys.executable, "-m", "multirank_logger.cli", *args])
    probe = shlex.quote(str(folder / "probe"))
    where = shlex.quote(str(folder))
    script = (f"mount --bind {where} {where} && mount -o remount,bind,ro {where} && "
              f"if touch {probe} 2>/dev/null; then echo 'the folder is writable' >&2; exit 99; fi; exec {command}")
    return subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120, check=False)


def test_a_store_in_a_read_only_directory_reads(tmp_path: Path) -> None:
    """A store closed by its writer (no -wal), in a directory mounted read-only: runs and sql answer."""
    folder = tmp_path / "results"
    folder.mkdir()
    db = folder / "runs.sqlite"
    fill_loss_rows(str(db))
    assert not Path(f"{db}-wal").exists() and not Path(f"{db}-shm").exists()
    runs = _cli_on_read_only_dir(folder, "runs", str(db))
    assert runs.returncode == 0 and "lightning_logs/version_0" in runs.stdout, runs.stderr
    count = _cli_on_read_only_dir(folder, "sql", str(db), "SELECT count(*) AS n FROM metrics", "--format", "csv")
    assert count.returncode == 0 and count.stdout == f"n\n{LOSS_ROWS}\n", count.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["runs.sqlite"]


def test_a_log_that_needs_write_access_is_a_clear_error(tmp_path: Path) -> None:
    """A -wal holding rows not yet in the file, and no -shm, in a read-only directory: SQLite cannot
    read it; one `Error:` line says so and what to do (copy it, with its log), no traceback."""
    source, folder = tmp_path / "source", tmp_path / "results"
    source.mkdir()
    folder.mkdir()
    db = source / "runs.sqlite"
    fill_loss_rows(str(db))
    writer = sqlite3.connect(db)  # a writer still open: its last rows are in the -wal only
    writer.execute("PRAGMA wal_autocheckpoint = 0")
    writer.execute("UPDATE runs SET name = 'in_the_log'")
    writer.commit()
    shutil.copy(db, folder / db.name)
    shutil.copy(f"{db}-wal", folder / f"{db.name}-wal")
    writer.close()
    copy = folder / db.name
    done = _cli_on_read_only_dir(folder, "runs", str(copy))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"Error: Cannot read {copy} from here: its write-ahead log ({copy}-wal)"), done.stderr
    assert f"cp {copy} {copy}-wal DIR/" in done.stderr
