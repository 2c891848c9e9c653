"""MultiRankLogger(capture_logs=...) and rank_aware_console() in one process, on real SQLite stores.

The 2-rank behaviour (every rank's records in one store, the banner once on the job's console)
is in tests/runs/test_audit_ddp.py; here: levels, the install/remove cycle, what the console shows.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from lightning.fabric.utilities.rank_zero import rank_zero_only

from multirank_logger import MultiRankLogger, open_store, rank_aware_console
from tests.helpers.logger_helpers import train_env

ROOT = Path(__file__).resolve().parents[2]


def _stored(db: Path) -> list[tuple[str, str, str]]:
    with open_store(db) as reader:
        return [(r.level, r.logger, r.message) for r in reader.logs().itertuples()]


def _logger(tmp_path: Path, **kwargs) -> MultiRankLogger:
    logger = MultiRankLogger(db=str(tmp_path / "runs.sqlite"), save_dir=str(tmp_path), flush_interval=0.1, **kwargs)
    _ = logger.experiment  # what Lightning does at setup: the run and its sink
    return logger


def test_records_and_warnings_kept_until_finalize(tmp_path: Path) -> None:
    """INFO+ records and shown warnings land in `logs`; after finalize nothing more is kept and
    warnings.showwarning is what it was."""
    before = warnings.showwarning
    logger = _logger(tmp_path)
    named = logging.getLogger("capture_test")
    named.setLevel(logging.DEBUG)
    named.debug("below the capture level")
    named.info("kept: %d", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("kept warning", UserWarning, stacklevel=1)
    logger.finalize("success")
    named.warning("after finalize")
    assert warnings.showwarning is before
    mine = [row for row in _stored(tmp_path / "runs.sqlite") if row[1] in ("capture_test", "py.warnings")]
    assert mine[0] == ("INFO", "capture_test", "kept: 1")
    assert mine[1][:2] == ("WARNING", "py.warnings") and mine[1][2].endswith(": UserWarning: kept warning")
    assert len(mine) == 2


def test_capture_level_and_off(tmp_path: Path) -> None:
    """capture_logs="WARNING" keeps WARNING and up only; False installs nothing."""
    logger = _logger(tmp_path, capture_logs="warning")
    named = logging.getLogger("capture_level_test")
    named.setLevel(logging.INFO)
    named.info("not kept")
    named.error("kept")
    logger.finalize("success")
    assert [row for row in _stored(tmp_path / "runs.sqlite") if row[1] == "capture_level_test"] == [
        ("ERROR", "capture_level_test", "kept")
    ]
    handlers, showwarning = list(logging.getLogger().handlers), warnings.showwarning
    off = MultiRankLogger(db=str(tmp_path / "off.sqlite"), save_dir=str(tmp_path), capture_logs=False)
    assert logging.getLogger().handlers == handlers and warnings.showwarning is showwarning
    off.finalize("success")


def test_unknown_capture_level_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"capture_logs='loud'; expected a logging level \(DEBUG, INFO"):
        MultiRankLogger(db=str(tmp_path / "runs.sqlite"), capture_logs="loud")


def test_non_propagating_logger_and_captured_warnings_kept_once(tmp_path: Path) -> None:
    """A logger that stops at itself (as Lightning's do) is kept; a warning that
    logging.captureWarnings turns into a record is kept once, not twice."""
    own = logging.getLogger("own_handler_test")
    own.propagate, own.level = False, logging.INFO
    own.addHandler(logging.NullHandler())
    logger = _logger(tmp_path)
    logging.captureWarnings(True)
    try:
        own.info("stops here")
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("once only", UserWarning, stacklevel=1)
    finally:
        logging.captureWarnings(False)
        logger.finalize("success")
    rows = _stored(tmp_path / "runs.sqlite")
    assert ("INFO", "own_handler_test", "stops here") in rows
    assert len([row for row in rows if "once only" in row[2]]) == 1


_LAST_RESORT = """
import logging, sys
from multirank_logger import MultiRankLogger
logger = MultiRankLogger(db=sys.argv[1], save_dir=sys.argv[2])
logging.getLogger("nobody_configured_me").warning("still printed")
logger.finalize("success")
logging.getLogger("nobody_configured_me").warning("printed after finalize too")
"""


def test_console_unchanged_where_logging_has_no_handler(tmp_path: Path) -> None:
    """With no logging set up, Python prints a WARNING through its last resort: the capture's
    handler must not silence it (a process of its own: pytest sets up handlers)."""
    env = {**train_env(), "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", _LAST_RESORT, str(tmp_path / "r.sqlite"), str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("still printed") == 1 and proc.stderr.count("printed after finalize too") == 1


# -- the rank-aware console ------------------------------------------------------------------


@pytest.fixture
def console_logger():
    """Makes a logger printing to stderr, as basicConfig would, with the rank's format. Called
    inside the test: a handler binds sys.stderr when made, and capsys replaces it for the call."""
    named = logging.getLogger("console_test")
    named.propagate, named.level = False, logging.INFO

    def make() -> logging.Logger:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        named.addHandler(handler)
        return named

    yield make
    for handler in list(named.handlers):
        named.removeHandler(handler)


def _as_rank(monkeypatch: pytest.MonkeyPatch, rank: int, world: int) -> None:
    # Lightning's rank, as its launcher sets it from the environment for each process
    monkeypatch.setattr(rank_zero_only, "rank", rank)
    monkeypatch.setenv("RANK", str(rank))  # what dist_env.current_rank trusts before the process group
    monkeypatch.setenv("WORLD_SIZE", str(world))
    # warnings printed as Python prints them outside pytest (which records them instead)
    monkeypatch.setattr(warnings, "showwarning", _print_warning)


def _print_warning(message, category, filename, lineno, file=None, line=None) -> None:
    (file or sys.stderr).write(warnings.formatwarning(message, category, filename, lineno, line))


def _print_all(named: logging.Logger) -> None:
    named.info("banner")
    named.warning("careful")
    named.error("broken")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("a warning", UserWarning, stacklevel=1)


def test_console_on_rank_1_hides_info_and_tags_warnings(console_logger, capsys, monkeypatch) -> None:
    _as_rank(monkeypatch, 1, 2)
    named = console_logger()
    with rank_aware_console():
        _print_all(named)
    err = capsys.readouterr().err
    assert "banner" not in err
    assert "[rank 1] WARNING console_test: careful\n" in err and "[rank 1] ERROR console_test: broken\n" in err
    assert ": UserWarning: a warning" in err and err.count("[rank 1] ") == 3
    assert next(line for line in err.splitlines() if "UserWarning" in line).startswith(f"[rank 1] {__file__}:")
    _print_all(named)  # removed: as before
    err = capsys.readouterr().err
    assert "INFO console_test: banner" in err and "[rank" not in err


def test_console_on_rank_0_shows_info_once_untagged(console_logger, capsys, monkeypatch) -> None:
    _as_rank(monkeypatch, 0, 2)
    named = console_logger()
    with rank_aware_console():
        _print_all(named)
    err = capsys.readouterr().err
    assert "INFO console_test: banner\n" in err and "[rank 0] INFO" not in err
    assert "[rank 0] WARNING console_test: careful" in err and "[rank 0] ERROR console_test: broken" in err


def test_console_with_one_rank_adds_no_tag(console_logger, capsys, monkeypatch) -> None:
    _as_rank(monkeypatch, 0, 1)
    named = console_logger()
    with rank_aware_console():
        _print_all(named)
    err = capsys.readouterr().err
    assert "INFO console_test: banner" in err and "WARNING console_test: careful" in err and "[rank" not in err
