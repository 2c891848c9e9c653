"""MultiRankLogger where CSVLogger was: Lightning's own CSVLogger tests, ported, on SQLite and DuckDB.

Ported from lightning's tests/tests_pytorch/loggers/test_csv.py and
tests/tests_fabric/loggers/test_csv.py, with MultiRankLogger in CSVLogger's place and,
wherever a file is checked, Lightning's real CSVLogger fed the same calls beside it.
As with CSVLogger, the logger's own ``save()`` (which the Trainer calls after every
``log_metrics``) leaves rank 0's ``metrics.csv`` holding every call logged so far.
Versioning (existing version_N directories, named versions) is issue 15's items 1-2: tested
with them.
"""

from __future__ import annotations

import gc
import io
import math
import os
import random
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import fsspec
import pytest
import torch
from lightning.pytorch.core.saving import load_hparams_from_yaml
from lightning.pytorch.loggers import CSVLogger

from multirank_logger import MultiRankLogger
from multirank_logger.channel.identity import ENV_PREFIX, RunIdentity, children_environment
from multirank_logger.errors import RemoteStore
from multirank_logger.logger.experiment import RunExperiment
from multirank_logger.logger.live_csv import LiveCsv
from multirank_logger.rows.csv_layout import csv_columns, format_calls, write_header
from tests.helpers.internals import run_of
from tests.helpers.logged_calls import trainer_calls
from tests.helpers.logger_helpers import query

METRICS = {"float": 0.3, "int": 1, "FloatTensor": torch.tensor(0.1), "IntTensor": torch.tensor(1)}


def _pair(save_dir: Path, db: Path, **kwargs: Any) -> tuple[MultiRankLogger, CSVLogger]:
    """Ours (store `db`) and Lightning's CSVLogger, each in its own save_dir, same arguments."""
    kwargs.setdefault("flush_logs_every_n_steps", 100)
    ours = MultiRankLogger(save_dir / "ours", db=db, flush_interval=3600, **kwargs)
    return ours, CSVLogger(save_dir / "theirs", **kwargs)


def _both(loggers: tuple[MultiRankLogger, CSVLogger], metrics: dict[str, Any], step: int | None = None) -> None:
    for logger in loggers:
        logger.log_metrics(dict(metrics), step)
        logger.save()  # as the Trainer calls it


def _file(logger: MultiRankLogger | CSVLogger) -> bytes:
    return Path(logger.experiment.metrics_file_path).read_bytes()


# -- the signature ------------------------------------------------------------------------------


def test_csvloggers_positional_order(tmp_path: Path) -> None:
    """MultiRankLogger(save_dir, name, version, prefix, flush_logs_every_n_steps), as CSVLogger,
    with the store in save_dir (SQLite) when no db is given."""
    logger = MultiRankLogger(tmp_path, "exp", 3, "pre", 7)
    assert (logger.save_dir, logger.name, logger.version) == (str(tmp_path), "exp", 3)
    assert logger.log_dir == str(tmp_path / "exp" / "version_3")
    assert logger._prefix == "pre" and logger._flush_every == 7
    assert (tmp_path / "runs.sqlite").is_file() and run_of(logger).settings.url.get_backend_name() == "sqlite"
    logger.log_metrics({"a": 1.0}, step=0)
    logger.finalize("success")
    assert (tmp_path / "exp" / "version_3" / "metrics.csv").read_bytes() == b"pre-a,step\r\n1.0,0\r\n"
    assert query(tmp_path / "runs.sqlite", "SELECT name, version, status FROM runs") == [("exp", 3, "success")]


def test_db_keyword_alone_keeps_save_dir_beside_it(db_path: Path) -> None:
    """MultiRankLogger(db=...) works as before: save_dir is the db file's directory."""
    logger = MultiRankLogger(db=db_path)
    assert logger.save_dir == str(db_path.parent)
    assert db_path.is_file()
    logger.finalize("success")


def test_store_passed_where_save_dir_goes_says_db_is_a_keyword(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The old positional form MultiRankLogger('runs.duckdb') is refused, showing both new forms,
    and makes no directory named like the store."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError, match=r"db is a keyword now, as in MultiRankLogger\(db='runs.duckdb'\)"):
        MultiRankLogger("runs.duckdb")
    assert os.listdir(tmp_path) == []


def test_no_save_dir_and_no_db_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match="needs save_dir"):
        MultiRankLogger()


# -- Lightning's CSVLogger tests, ported ----------------------------------------------------------


@pytest.mark.parametrize("name", ["", None])
def test_no_name(tmp_path: Path, db_path: Path, name: str | None) -> None:
    """None or empty name: versions go straight under save_dir (test_csv.py::test_no_name)."""
    logger = MultiRankLogger(tmp_path, name=name, db=db_path)
    logger.log_metrics({"a": 1})
    logger.save()
    assert os.path.normpath(logger.root_dir) == str(tmp_path)
    assert os.listdir(tmp_path / "version_0") == ["metrics.csv"]
    logger.finalize("success")


@pytest.mark.parametrize("step_idx", [10, None])
def test_log_metrics(tmp_path: Path, db_path: Path, step_idx: int | None) -> None:
    """One call, tensors included: a header and one row, CSVLogger's bytes (test_csv.py::test_log_metrics)."""
    ours, theirs = _pair(tmp_path, db_path)
    _both((ours, theirs), METRICS, step_idx)
    lines = _file(ours).decode().splitlines()
    assert len(lines) == 2 and all(n in lines[0] for n in METRICS)
    assert _file(ours) == _file(theirs)
    ours.finalize("success")


def test_log_hyperparams(tmp_path: Path, db_path: Path) -> None:
    """hparams.yaml is written when they are logged, CSVLogger's bytes (test_csv.py::test_log_hyperparams)."""
    hparams = {
        "float": 0.3,
        "int": 1,
        "string": "abc",
        "bool": True,
        "dict": {"a": {"b": "c"}},
        "list": [1, 2, 3],
        "layer": torch.nn.BatchNorm1d,
    }
    ours, theirs = _pair(tmp_path, db_path)
    ours.log_hyperparams(hparams)
    theirs.log_hyperparams(hparams)
    path = Path(ours.log_dir) / "hparams.yaml"
    assert all(n in load_hparams_from_yaml(str(path)) for n in hparams)  # before any finalize
    assert path.read_bytes() == (Path(theirs.log_dir) / "hparams.yaml").read_bytes()
    ours.finalize("success")
    assert path.read_bytes() == (Path(theirs.log_dir) / "hparams.yaml").read_bytes()


def test_log_hyperparams_without_argument(tmp_path: Path, db_path: Path) -> None:
    """log_hyperparams() takes no argument, as CSVLogger's (params=None): an empty hparams.yaml."""
    ours, theirs = _pair(tmp_path, db_path)
    ours.log_hyperparams()
    theirs.log_hyperparams()
    assert (Path(ours.log_dir) / "hparams.yaml").read_bytes() == (Path(theirs.log_dir) / "hparams.yaml").read_bytes()
    ours.finalize("success")


def test_metrics_reset_after_save(tmp_path: Path, db_path: Path) -> None:
    """experiment.metrics holds the calls not written yet; log_metrics saves every
    flush_logs_every_n_steps calls, as CSVLogger's (test_csv.py::test_metrics_reset_after_save)."""
    logger = MultiRankLogger(tmp_path, db=db_path, flush_interval=3600, flush_logs_every_n_steps=2)
    logger.log_metrics({"test": 1}, step=0)
    assert logger.experiment.metrics == [{"test": 1, "step": 0}]
    logger.log_metrics({"test": 1}, step=1)  # flush triggered
    assert logger.experiment.metrics == []
    assert _file(logger) == b"step,test\r\n0,1\r\n1,1\r\n"
    logger.log_metrics({"test": 2}, step=2)
    logger.experiment.save()
    assert logger.experiment.metrics == []
    logger.finalize("success")


def test_flush_n_steps(tmp_path: Path, db_path: Path) -> None:
    """log_metrics calls save() every flush_logs_every_n_steps steps (test_csv.py::test_flush_n_steps)."""
    from unittest.mock import MagicMock

    logger = MultiRankLogger(tmp_path, db=db_path, flush_interval=3600, flush_logs_every_n_steps=2)
    logger.save = MagicMock()  # type: ignore[method-assign]
    logger.log_metrics({"float": 0.3, "int": 1, "FloatTensor": torch.tensor(0.1)}, step=0)
    logger.save.assert_not_called()
    logger.log_metrics({"float": 0.3, "int": 1, "FloatTensor": torch.tensor(0.1)}, step=1)
    logger.save.assert_called_once()
    logger.finalize("success")


def test_automatic_step_tracking(tmp_path: Path, db_path: Path) -> None:
    """Without a step, each call takes the count of unsaved calls, as CSVLogger (fabric test_csv.py)."""
    ours, theirs = _pair(tmp_path, db_path, flush_logs_every_n_steps=3)
    for _ in range(7):
        _both((ours, theirs), {"test": 0.1})
    ours.experiment.log_metrics({"direct": 1})
    theirs.experiment.log_metrics({"direct": 1})
    ours.save()
    theirs.save()
    assert _file(ours) == _file(theirs)
    ours.finalize("success")


def test_append_columns(tmp_path: Path, db_path: Path) -> None:
    """A new key rewrites the file with the wider header; a key that goes away stays a column
    (test_csv.py::test_append_columns), byte for byte CSVLogger's after each step."""
    ours, theirs = _pair(tmp_path, db_path, flush_logs_every_n_steps=1)
    for metrics in ({"a": 1, "b": 2}, {"a": 1, "b": 2, "c": 3}, {"a": 1, "c": 3}):
        _both((ours, theirs), metrics)
        assert _file(ours) == _file(theirs)
    assert _file(ours).split(b"\r\n")[0] == b"a,b,c,step"
    ours.finalize("success")


def test_log_metrics_column_order_sorted(tmp_path: Path, db_path: Path) -> None:
    """Columns are sorted by name, step among them (fabric test_csv.py::test_log_metrics_column_order_sorted)."""
    ours, theirs = _pair(tmp_path, db_path)
    for key, value in (("c", 0.1), ("c", 0.2), ("b", 0.3), ("a", 0.4)):
        _both((ours, theirs), {key: value})
    assert _file(ours) == _file(theirs)
    _both((ours, theirs), {"d": 0.5})
    assert _file(ours).split(b"\r\n")[0] == b"a,b,c,d,step"
    assert _file(ours) == _file(theirs)
    ours.finalize("success")


def test_csv_logger_remotefs(db_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A memory:// save_dir gets metrics.csv and hparams.yaml through fsspec, and no local
    'memory:' directory appears (test_csv.py::test_csv_logger_remotefs)."""
    monkeypatch.chdir(tmp_path)
    root = f"memory://{tmp_path.name}-remotefs"
    logger = MultiRankLogger(root, db=db_path, flush_interval=3600)
    fs, _ = fsspec.core.url_to_fs(root)
    exp = logger.experiment
    exp.log_metrics({"loss": 0.1})
    exp.save()
    logger.log_hyperparams({"lr": 0.1})
    metrics_file = os.path.join(logger.log_dir, "metrics.csv")
    assert fs.isfile(metrics_file) and fs.cat(metrics_file) == b"loss,step\r\n0.1,0\r\n"
    logger.log_metrics({"acc": 1.0}, step=1)  # a new key: the remote file is rewritten
    logger.finalize("success")
    assert fs.cat(metrics_file) == b"acc,loss,step\r\n,0.1,0\r\n1.0,,1\r\n"
    assert fs.isfile(os.path.join(logger.log_dir, "hparams.yaml"))
    assert not [p for p in os.listdir(tmp_path) if p.startswith("memory")]  # nothing named memory: here


def test_remote_db_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A db on a remote filesystem, or a remote save_dir with no db, says what to pass instead."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        RemoteStore, match=r"db='s3://bucket/runs.sqlite' is on a remote filesystem \(s3\).*db='runs.sqlite'"
    ):
        MultiRankLogger("logs", db="s3://bucket/runs.sqlite")
    with pytest.raises(RemoteStore, match=r"save_dir='memory://x' is on a remote filesystem.*pass db="):
        MultiRankLogger("memory://x")
    assert os.listdir(tmp_path) == []


# -- metrics.csv as the run goes ------------------------------------------------------------------


def test_live_file_is_csvloggers_through_rewrites(tmp_path: Path, db_path: Path) -> None:
    """Through a run whose keys arrive late (quoted keys, NaN, inf, -0.0, ints, bools), the file
    is CSVLogger's byte for byte after every save() (as the Trainer calls it), before any
    finalize; experiment.save() at random points too."""
    ours, theirs = _pair(tmp_path, db_path, flush_logs_every_n_steps=1000)
    rng = random.Random(15)
    for metrics, step in trainer_calls(0):
        _both((ours, theirs), metrics, step)
        assert _file(ours) == _file(theirs)
        if rng.random() < 0.15:
            ours.experiment.save()
            theirs.experiment.save()
            assert _file(ours) == _file(theirs)
    ours.finalize("success")
    theirs.finalize("success")
    assert _file(ours) == _file(theirs)


def test_written_every_n_steps_by_the_writer(tmp_path: Path) -> None:
    """With SQLite, flush_logs_every_n_steps calls (log_metrics + save, as the Trainer calls them)
    get metrics.csv written by the writer thread, without a flush interval passing."""
    logger = MultiRankLogger(tmp_path, flush_logs_every_n_steps=4, flush_interval=3600)
    for step in range(4):
        logger.log_metrics({"a": float(step)}, step=step)
        logger.save()
    path = Path(logger.log_dir) / "metrics.csv"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (path.exists() and path.read_bytes().count(b"\r\n") == 5):
        time.sleep(0.02)
    assert path.read_bytes() == b"a,step\r\n0.0,0\r\n1.0,1\r\n2.0,2\r\n3.0,3\r\n"
    logger.finalize("success")


def test_fast_path_lines_are_csv_layouts(tmp_path: Path) -> None:
    """The lines save() appends from kept templates (keys in any order, missing ones, a key
    "step", ints, bools, NaN, inf, -0.0, ints past int64) are csv_layout.format_calls' text."""
    keys = ["b", "a", "step", "c,d", 'e"f']
    live = LiveCsv(str(tmp_path / "metrics.csv"))
    rng = random.Random(3)
    values = [0.1, 1, True, False, math.nan, math.inf, -math.inf, -0.0, 2**70, 1e-5, 0.6931471824645996]
    calls: list[tuple[int, dict[str, Any]]] = [(0, {key: 1.5 for key in keys})]
    assert live.add_calls(calls)
    for step in range(1, 200):
        chosen = rng.sample(keys, rng.randint(1, len(keys)))
        call = (step, {key: rng.choice(values) for key in chosen})
        calls.append(call)
        assert live.add_calls([call])
        columns = csv_columns(keys)
        header = io.StringIO()
        write_header(header, columns)
        expected = header.getvalue() + format_calls(columns, calls)
        assert (tmp_path / "metrics.csv").read_bytes() == expected.encode()
    assert live.rows == len(calls) and len(live._templates) > 1  # the fast path ran, with several templates


def test_writer_writes_calls_no_save_wrote(tmp_path: Path) -> None:
    """Log calls that no save() follows (Fabric's between its saves) reach metrics.csv by the
    writer thread's next cycle."""
    logger = MultiRankLogger(tmp_path, flush_logs_every_n_steps=1000, flush_interval=0.05)
    for step in range(3):
        logger.log_metrics({"a": float(step)}, step=step)
    path = Path(logger.log_dir) / "metrics.csv"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (path.exists() and path.read_bytes().count(b"\r\n") == 4):
        time.sleep(0.02)
    assert path.read_bytes() == b"a,step\r\n0.0,0\r\n1.0,1\r\n2.0,2\r\n"
    logger.finalize("success")


def test_writer_leaves_the_file_to_save_while_saves_come(tmp_path: Path) -> None:
    """While save() comes (the Trainer's pattern), the writer's cycle leaves the queued calls to
    it, so the two threads never wait on each other's write; a cycle with no save since the
    last one, or an explicit flush, writes them."""
    logger = MultiRankLogger(tmp_path, flush_interval=3600)
    logger.log_metrics({"a": 0.0}, step=0)
    logger.save()
    files = run_of(logger).files
    files.catch_up(0, now=False)  # the writer's cycle, after that save
    logger.log_metrics({"a": 1.0}, step=1)
    logger.save()
    logger.log_metrics({"a": 2.0}, step=2)  # its save() is to come
    files.catch_up(0, now=False)
    assert len(files.calls) == 1  # left to the save() that comes
    files.catch_up(0, now=False)  # no save() since the last cycle: written now
    assert not files.calls
    logger.log_metrics({"a": 3.0}, step=3)
    logger.save()
    logger.log_metrics({"a": 4.0}, step=4)
    files.catch_up(0, now=True)  # an explicit flush writes whatever came
    assert Path(logger.log_dir, "metrics.csv").read_bytes().count(b"\r\n") == 6
    logger.finalize("success")


def test_left_in_place_after_a_failed_run(tmp_path: Path, db_path: Path) -> None:
    """finalize("failed") leaves every row logged in metrics.csv, as CSVLogger's save() there does."""
    ours, theirs = _pair(tmp_path, db_path)
    for metrics, step in trainer_calls(0, steps=30):
        _both((ours, theirs), metrics, step)
    ours.finalize("failed")
    theirs.finalize("failed")
    assert _file(ours) == _file(theirs)
    assert query(db_path, "SELECT status FROM runs") == [("failed",)]


def test_unwritable_file_keeps_its_rows_for_the_next_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write that fails (here: the directory is a file for a while) loses nothing: the rows go
    out with the next calls (tried again at once here: no pause between tries)."""
    from multirank_logger.logger import live_csv

    monkeypatch.setattr(live_csv, "RETRY_FIRST_S", 0.0)
    blocker = tmp_path / "dir"
    blocker.write_text("not a directory")
    live = LiveCsv(str(blocker / "metrics.csv"))
    assert not live.add_calls([(0, {"a": 1})])
    assert live.pending == 1
    blocker.unlink()
    assert live.add_calls([(1, {"b": 2.5})])
    assert live.pending == 0
    assert (blocker / "metrics.csv").read_bytes() == b"a,b,step\r\n1,,0\r\n,2.5,1\r\n"


def test_a_failing_file_is_tried_again_after_a_pause_not_at_every_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """save() runs at every log call: a file that cannot be written (a full disk) is tried again
    after a pause (RETRY_FIRST_S, doubling), not at each call, where each try formatted every
    kept call again (a 20,000-call run on a full disk took minutes); then it takes every row."""
    from multirank_logger.logger import live_csv

    monkeypatch.setattr(live_csv, "RETRY_FIRST_S", 3600.0)
    blocker = tmp_path / "dir"
    blocker.write_text("not a directory")
    live = LiveCsv(str(blocker / "metrics.csv"))
    tries: list[int] = []
    write_pending = live.write_pending
    monkeypatch.setattr(live, "write_pending", lambda: tries.append(live.pending) or write_pending())
    for step in range(1000):
        assert not live.add_calls([(step, {"a": 1.0})])
    assert (tries, live.pending) == ([1], 1000)
    blocker.unlink()
    assert write_pending() and live.rows == 1000  # the end's write (finalize) does not wait
    assert (blocker / "metrics.csv").read_text().count("\n") == 1001


def test_a_file_never_writable_keeps_a_bounded_number_of_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows kept for a file that cannot be written are bounded: past MAX_PENDING_CALLS the file
    gives up for the run (the end writes it from the store), even if it becomes writable."""
    from multirank_logger.logger import live_csv

    monkeypatch.setattr(live_csv, "MAX_PENDING_CALLS", 25)
    blocker = tmp_path / "dir"
    blocker.write_text("not a directory")
    live = LiveCsv(str(blocker / "metrics.csv"))
    for step in range(3):
        live.add_calls([(step * 10 + call, {"a": 1.0}) for call in range(10)])
    assert (live.pending, live.complete, live.gave_up) == (0, False, True)
    blocker.unlink()
    live.add_calls([(30, {"a": 1.0})])
    assert not blocker.exists() and live.pending == 0


def test_file_removed_during_the_run_is_whole_at_the_end(tmp_path: Path, db_path: Path) -> None:
    """metrics.csv deleted mid-run (by hand, a cleanup job): the next write starts a file with its
    header, not a headerless append, and the end writes CSVLogger's whole file from the store."""
    ours, theirs = _pair(tmp_path, db_path)
    calls = list(trainer_calls(0, steps=30))
    for metrics, step in calls[:15]:
        _both((ours, theirs), metrics, step)
    ours.experiment.save()
    path = Path(ours.log_dir) / "metrics.csv"
    path.unlink()
    for metrics, step in calls[15:]:
        _both((ours, theirs), metrics, step)
    ours.experiment.save()
    assert b"step" in path.read_bytes().split(b"\r\n")[0].split(b",")  # a header, not a data line
    ours.finalize("success")
    theirs.finalize("success")
    assert _file(ours) == _file(theirs)


def test_unfinalized_logger_at_exit_leaves_the_file_and_no_logging_error(tmp_path: Path) -> None:
    """A pytest run whose test never finalizes its logger: metrics.csv is written at exit, and
    nothing is logged onto pytest's closed streams ("--- Logging error ---")."""
    test = tmp_path / "test_leftover.py"
    test.write_text(
        textwrap.dedent(f"""
        from multirank_logger import MultiRankLogger

        def test_unfinalized():
            logger = MultiRankLogger({str(tmp_path / "logs")!r}, flush_interval=3600)
            logger.log_metrics({{"a": 1.0}}, step=0)
    """)
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", ENV_PREFIX))}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Logging error" not in proc.stdout + proc.stderr
    assert (tmp_path / "logs" / "lightning_logs" / "version_0" / "metrics.csv").read_bytes() == b"a,step\r\n1.0,0\r\n"


# -- experiment (on other ranks: the do-nothing one, seen in tests/runs/test_dropin_ddp.py) -------------


def test_experiment_is_csvloggers_on_rank_0(tmp_path: Path, db_path: Path) -> None:
    """Rank 0's experiment: log_metrics, log_hparams, save, metrics_file_path; and the run's id."""
    logger = MultiRankLogger(tmp_path, db=db_path, flush_interval=3600)
    exp = logger.experiment
    assert isinstance(exp, RunExperiment)
    assert exp.metrics_file_path == os.path.join(logger.log_dir, "metrics.csv")
    exp.log_hparams({"lr": 0.5})
    exp.log_metrics({"x": 2})
    exp.save()
    assert Path(exp.metrics_file_path).read_bytes() == b"step,x\r\n0,2\r\n"
    assert load_hparams_from_yaml(os.path.join(logger.log_dir, "hparams.yaml")) == {"lr": 0.5}
    assert exp.run_id == logger.run_id == 1 and exp.version == 0
    logger.finalize("success")


# -- leftovers ------------------------------------------------------------------------------------


def test_built_and_dropped_leaves_no_thread_and_no_variable(tmp_path: Path, db_path: Path) -> None:
    """A logger built and never used starts no thread, and once dropped leaves no variable."""
    before = set(threading.enumerate())
    logger = MultiRankLogger(tmp_path, db=db_path)
    assert set(threading.enumerate()) == before
    variable = run_of(logger).board.env_var
    del logger
    gc.collect()
    assert variable not in os.environ


def test_finalize_stops_the_writer_and_removes_the_variable(tmp_path: Path, db_path: Path) -> None:
    """After a run, the writer thread is gone and no MULTIRANK_LOGGER_RUN_N variable is left."""
    before = set(threading.enumerate())
    logger = MultiRankLogger(tmp_path, db=db_path)
    variable = run_of(logger).board.env_var
    logger.log_metrics({"a": 1.0}, step=0)
    assert logger.version == 0  # the run is allocated when first needed: now
    with children_environment():  # what Lightning's launcher gives the children it starts
        assert variable in os.environ
    assert {t.name for t in set(threading.enumerate()) - before} >= {"multirank-writer"}
    logger.finalize("success")
    # the SIGTERM watch thread is process-wide (issue 15's process hooks); the writer is ours
    assert "multirank-writer" not in {t.name for t in set(threading.enumerate()) - before}
    assert logger.log_dir.endswith("version_0")  # reading the identity again publishes nothing
    with children_environment():  # a later launch's children do not learn the finished run
        assert variable not in os.environ


def test_nan_step_values_survive_the_live_file(tmp_path: Path, db_path: Path) -> None:
    """NaN and infinities are written as CSVLogger writes them, in the live file too."""
    ours, theirs = _pair(tmp_path, db_path)
    _both((ours, theirs), {"a": math.nan, "b": math.inf, "c": -math.inf, "d": -0.0}, 0)
    assert _file(ours) == _file(theirs) == b"a,b,c,d,step\r\nnan,inf,-inf,-0.0,0\r\n"
    ours.finalize("success")


def _stop_left_threads(before: set[threading.Thread]) -> list[str]:
    """What Lightning's conftest (``thread_police_duuu_daaa_duuu_daaa``) does after each test: a
    daemon thread the test left must have ``stop()`` (or ``exit()``), and be gone after it."""
    stopped = []
    for thread in set(threading.enumerate()) - before:
        stop = getattr(thread, "stop", None) or getattr(thread, "exit", None)
        assert thread.daemon and callable(stop), f"Test left zombie thread: {thread}"
        stop()
        assert not thread.is_alive(), thread
        stopped.append(thread.name)
    return stopped


def test_logger_dropped_unfinalized_leaves_nothing_behind(tmp_path: Path, db_path: Path) -> None:
    """Lightning's own test harness after a test that logs, saves and never finalizes: the
    logger's variable is gone once the logger is (no gc.collect(): the harness does none), and
    the threads left have stop(), which flushes, then ends them."""
    from multirank_logger.write import process_hooks

    listener = process_hooks._state.listener
    if listener is not None:  # an earlier test's, in this process: the harness stopped it there
        listener.stop()  # type: ignore[attr-defined]
    env_before, threads_before = set(os.environ), set(threading.enumerate())
    logger = MultiRankLogger(tmp_path, db=db_path, flush_interval=3600)
    logger.log_metrics({"a": 1.0}, step=0)
    logger.save()
    assert logger.version == 0
    variable = run_of(logger).board.env_var
    del logger
    with children_environment():
        assert variable not in os.environ
    assert set(os.environ) - env_before == set()
    # the writer and rank 0's watch end by themselves once the logger is gone (either may not have yet)
    left = _stop_left_threads(threads_before)
    assert "multirank-sigterm-listener" in left and set(left) <= {"multirank-sigterm-listener", "multirank-writer",
                                                               "multirank-logger-watch"}, left
    assert query(db_path, "SELECT count(*) FROM metrics") == [(1,)]


def test_logger_kept_alive_leaves_no_variable_in_the_environment(tmp_path: Path, db_path: Path) -> None:
    """A logger used and kept alive, never finalized (a failed test's traceback holds it; a
    notebook): nothing in os.environ, so nothing in every subprocess started later (Lightning's
    harness fails the test on it). Rank 0's run is in the environment of the children Lightning's
    launcher starts, while it starts them, and only there (tests/runs/test_logger_ddp.py: a real launch)."""
    env_before = dict(os.environ)
    logger = MultiRankLogger(tmp_path, db=db_path, flush_interval=3600)
    logger.log_metrics({"a": 1.0}, step=0)
    logger.save()
    assert logger.version == 0 and logger.log_dir.endswith("version_0")
    assert dict(os.environ) == env_before
    with children_environment():
        identity = RunIdentity.from_json(os.environ[run_of(logger).board.env_var])
    assert identity.run.version == 0 and identity.pid == os.getpid()
    assert dict(os.environ) == env_before
    logger.finalize("success")


def test_threads_stopped_mid_run_write_every_row(tmp_path: Path, db_path: Path) -> None:
    """The harness stops the threads of a logger still in use: stop() writes what was logged
    first, and the next log call starts the writer again."""
    before = set(threading.enumerate())
    logger = MultiRankLogger(tmp_path, db=db_path, flush_interval=3600)
    logger.log_metrics({"a": 1.0}, step=0)
    assert "multirank-writer" in _stop_left_threads(before)
    assert query(db_path, "SELECT count(*) FROM metrics") == [(1,)]
    logger.log_metrics({"a": 2.0}, step=1)
    logger.finalize("success")
    assert query(db_path, "SELECT count(*) FROM metrics") == [(2,)]
