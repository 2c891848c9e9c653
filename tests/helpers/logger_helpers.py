"""Helpers for the logger tests: run tests/scripts/logger_train.py as a real DDP launch, read the store."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

import tests
from multirank_logger.store.sql_store import Store

if TYPE_CHECKING:
    from multirank_logger import MultiRankLogger

TRAIN = Path(__file__).resolve().parents[1] / "scripts" / "logger_train.py"
_REPO = Path(tests.__file__).resolve().parents[1]  # where `tests` is a package, wherever this file lies


def train_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "MULTIRANK_LOGGER_"))}
    env.update(PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore")
    # a launched script imports tests.helpers (the one way into a logger's internals: helpers/internals.py)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_REPO), env.get("PYTHONPATH")]))
    return env


def train_cmd(db: Path, save_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, str(TRAIN), "--db", str(db), "--save-dir", str(save_dir), *extra]


def run_training(db: Path, save_dir: Path, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run one launch to its end; fail with its output when it fails."""
    proc = subprocess.run(
        train_cmd(db, save_dir, *extra), cwd=save_dir, env=train_env(), capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def query(db: Path, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    store = Store(db)
    try:
        with store.begin() as conn:
            return [tuple(r) for r in conn.execute(sa.text(sql), params)]
    finally:
        store.close()


def rank_reports(prefix: Path) -> dict[int, dict[str, Any]]:
    """What each rank said about its logger after fit (tests/scripts/logger_train.py --report)."""
    out = {}
    for path in prefix.parent.glob(prefix.name + ".*"):
        report = json.loads(path.read_text())
        out[report["rank"]] = report
    return out


def stderr_to_file(path: Path) -> None:
    """This process's stderr (fd 2) into `path`: a forkserver's children write to the stderr of the
    test that started the server, not to the current test's (its capfd sees nothing of them)."""
    with open(path, "w") as err:
        os.dup2(err.fileno(), 2)


def ranks_stderr(folder: Path) -> str:
    """What the ranks wrote to their ``rank*.err`` files in `folder` (`stderr_to_file`), rank by rank."""
    return "".join(path.read_text() for path in sorted(folder.glob("rank*.err")))


def spill_files_named(output: str) -> list[str]:
    """The spill files a run's output names in its import command(s)."""
    return sorted(set(re.findall(r"multirank-logger import \S+ (\S+\.mrspill)", output)))


def wait_for_steps(proc: subprocess.Popen[str], steps: int, timeout: float) -> str:
    """Read a 2-rank launch's output (lines "rank R step S") until both ranks printed `steps`.

    Both ranks write to one pipe, so two prints can share a line ("rank 1 step 5rank 0 step 5").

    Raises:
        AssertionError: with the output's end, when the launch ended or `timeout` passed first.
    """
    seen: dict[int, int] = {}
    out: list[str] = []
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        out.append(line)
        for rank, at in re.findall(r"rank (\d) step (\d+)", line):
            seen[int(rank)] = int(at)
        if len(seen) == 2 and min(seen.values()) >= steps:
            return "".join(out)
    raise AssertionError("the launch did not reach the step in time:\n" + "".join(out)[-3000:])


def held_logger(db: Path | str, **kwargs) -> MultiRankLogger:
    """A logger whose writer waits an hour: its rows reach the store at save() and finalize alone."""
    from multirank_logger import MultiRankLogger

    kwargs.setdefault("flush_interval", 3600)
    return MultiRankLogger(db=str(db), **kwargs)


def logged_launch(db: Path | str, steps: range, tag: float, **kwargs) -> MultiRankLogger:
    """One launch of a run: `tag` marks its values, so a test can tell launches apart."""
    logger = held_logger(db, name="job", **kwargs)
    for step in steps:
        logger.log_metrics({"loss": tag + step, "step_only": step}, step=step)
        logger.save()
    logger.finalize("success")
    return logger
