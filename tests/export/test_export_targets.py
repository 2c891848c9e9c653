"""`export -o PATH` writes only what is its own (export/destination.py's `LocalFile`, `Destination`).

Real FIFOs (a reader thread), a symlink, /dev/null and /dev/stdout, a directory, /proc: a regular
file is replaced atomically; a FIFO or a character device is written through and stays what it
was; a symlink is followed to its target and said; what cannot hold a file is one clear error
line (exit code 1, no traceback). fsspec URLs: credentials never become a local path, and
memory:// (gone at the command's exit) is refused.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from multirank_logger.cli import main
from tests.helpers.logged_calls import store_calls, trainer_calls


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "runs.sqlite"
    store_calls(path, {0: trainer_calls(0), 1: trainer_calls(1)})
    return path


def _export(db: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["export", str(db), *args])
    return result.exit_code, result.output


def _expected(db: Path, tmp_path: Path) -> bytes:
    plain = tmp_path / "plain.csv"
    assert _export(db, "-o", str(plain))[0] == 0
    return plain.read_bytes()


def test_a_fifo_is_written_through_not_replaced(db: Path, tmp_path: Path) -> None:
    expected = _expected(db, tmp_path)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    code, out = _export(db, "-o", str(fifo))
    reader.join(30)
    assert code == 0, out
    assert got == [expected]  # the reader got the CSV, byte for byte
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # still a FIFO
    assert f"Wrote {len(trainer_calls(0))} rows of rank 0" in out


def test_dev_null_stays_a_device(db: Path) -> None:
    code, out = _export(db, "-o", "/dev/null")
    assert code == 0, out
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert "Wrote" in out


def test_dev_stdout_is_written_through(db: Path, tmp_path: Path) -> None:
    """A subprocess whose standard output is a pipe: the CSV arrives there, the lines on stderr."""
    expected = _expected(db, tmp_path)
    done = subprocess.run([sys.executable, "-m", "multirank_logger.cli", "export", str(db), "-o", "/dev/stdout"],
                          capture_output=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected
    assert b"Wrote" in done.stderr


def test_a_symlink_is_followed_and_said(db: Path, tmp_path: Path) -> None:
    expected = _expected(db, tmp_path)
    target = tmp_path / "real.csv"
    target.write_text("old\n")
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    code, out = _export(db, "-o", str(link))
    assert code == 0, out
    assert link.is_symlink() and os.readlink(link) == str(target)  # the link kept
    assert target.read_bytes() == expected  # its target written
    assert f"{link} is a symlink to {target}: written there" in out
    dangling = tmp_path / "dangling.csv"
    dangling.symlink_to(tmp_path / "nowhere.csv")
    code, out = _export(db, "-o", str(dangling))
    assert code == 1 and out.startswith(f"Error: Cannot export to {dangling}: it is a symlink to") and "Traceback" not in out
    assert not (tmp_path / "nowhere.csv").exists()


def test_a_regular_file_is_replaced(db: Path, tmp_path: Path) -> None:
    out_file = tmp_path / "m.csv"
    out_file.write_text("old\n")
    inode = os.stat(out_file).st_ino
    assert _export(db, "-o", str(out_file))[0] == 0
    assert out_file.read_bytes() == _expected(db, tmp_path) and os.stat(out_file).st_ino != inode  # a new file moved in


@pytest.mark.parametrize("where", ["dir", "proc", "under_a_file"])
def test_a_path_that_cannot_hold_a_file_is_one_error(db: Path, tmp_path: Path, where: str) -> None:
    (tmp_path / "afile").write_text("x")
    path = {"dir": str(tmp_path), "proc": "/proc/no-such-dir/m.csv", "under_a_file": str(tmp_path / "afile" / "m.csv")}[where]
    code, out = _export(db, "-o", path)
    assert code == 1, out
    assert out.startswith(f"Error: Cannot export to {path}: ") and len(out.strip().splitlines()) == 1, out
    assert "Traceback" not in out and "Wrote" not in out


def test_all_ranks_into_a_file_is_one_error(db: Path, tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    code, out = _export(db, "--all-ranks", "-o", str(tmp_path / "afile"))
    assert code == 1 and out.startswith("Error: --all-ranks writes one file per rank into a directory"), out


def test_url_credentials_never_become_a_path(db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out = _export(db, "--format", "parquet", "-o", f"file://user:s3cr3t@{tmp_path}/lake")
    assert code == 1, out
    assert "s3cr3t" not in out and "credentials" in out and "Traceback" not in out
    assert not list(tmp_path.glob("user*"))  # nothing written to ./user:s3cr3t@/...


def test_memory_url_is_refused(db: Path) -> None:
    code, out = _export(db, "--format", "parquet", "-o", "memory://lake")
    assert code == 2 and "ends with this command's process" in out, out


@pytest.mark.parametrize("fmt", ["parquet", "tensorboard"])
@pytest.mark.parametrize("where", ["fifo", "file", "dev_null", "under_a_file", "symlink_to_a_file"])
def test_a_directory_format_into_what_is_no_directory_is_one_error(db: Path, tmp_path: Path, fmt: str, where: str) -> None:
    """`--format parquet|tensorboard -o DIR` where DIR is a FIFO, a regular file, /dev/null, under a
    file or a symlink to a file: one line that says what it is, exit 1, nothing written anywhere."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "notes.txt").write_text("kept")
    if where == "fifo":
        os.mkfifo(out_dir / "pipe")
    target = {"fifo": out_dir / "pipe", "file": out_dir / "notes.txt", "dev_null": Path("/dev/null"),
              "under_a_file": out_dir / "notes.txt" / "lake", "symlink_to_a_file": out_dir / "link"}[where]
    if where == "symlink_to_a_file":
        target.symlink_to(out_dir / "notes.txt")
    before = sorted(os.listdir(out_dir))
    code, out = _export(db, "--format", fmt, "-o", str(target))
    what = {"fifo": "it is a FIFO", "file": "it is a regular file", "dev_null": "it is a character device",
            "under_a_file": f"{out_dir / 'notes.txt'} is a regular file", "symlink_to_a_file": "it is a regular file"}[where]
    assert code == 1
    assert out == (f"Error: Cannot export to {target}: {what}, and this format writes a directory of files. "
                   "Pass a directory's path (made when missing); nothing was written.\n")
    assert sorted(os.listdir(out_dir)) == before and (out_dir / "notes.txt").read_text() == "kept"
    if where == "fifo":
        assert stat.S_ISFIFO(os.lstat(target).st_mode)
