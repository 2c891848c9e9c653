"""MultiRankLogger in one process: layout, hot path, values, errors, pickling, a busy store."""

from __future__ import annotations

import math
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer

from multirank_logger import MultiRankLogger
from multirank_logger.errors import DirNotWritable, InvalidMetric, MultiRankLoggerError, StoreNotWritable
from multirank_logger.logger.core import MultiRankLoggerCore
from multirank_logger.write.writer_thread import SELDOM_MAX_CALLS
from tests.helpers.internals import run_of, writer_of
from tests.helpers.logger_helpers import query
from tests.helpers.stores import BACKEND_SUFFIXES


def _logger(db: Path, **kwargs) -> MultiRankLogger:
    kwargs.setdefault("flush_interval", 3600)  # only explicit flushes, so tests see each step
    return MultiRankLogger(db=str(db), **kwargs)


def test_layout_matches_csvlogger(db_path: Path) -> None:
    """save_dir defaults to the db's directory; root_dir and log_dir follow CSVLogger's layout."""
    logger = _logger(db_path, name="exp")
    assert logger.save_dir == str(db_path.parent)
    assert logger.root_dir == str(db_path.parent / "exp")
    assert logger.log_dir == str(db_path.parent / "exp" / "version_0")
    logger.finalize("success")


def test_versions_take_the_next_free_one_per_name(db_path: Path) -> None:
    """version=None takes the next free version for the name in the store."""
    versions = [_logger(db_path, name=n).version for n in ("a", "a", "b", "a")]
    assert versions == [0, 1, 0, 2]


def test_trainer_log_dir_is_the_version_dir(db_path: Path, tmp_path: Path) -> None:
    """Trainer.log_dir (where LightningCLI writes config.yaml) is our log_dir, not save_dir."""
    logger = _logger(db_path, save_dir=str(tmp_path / "logs"))
    trainer = Trainer(logger=logger, accelerator="cpu", devices=1, enable_progress_bar=False)
    assert trainer.log_dir == logger.log_dir == str(tmp_path / "logs" / "lightning_logs" / "version_0")


def test_log_metrics_writes_nothing_until_a_flush(db_path: Path) -> None:
    """log_metrics and save only buffer; finalize writes every row."""
    logger = _logger(db_path)
    for step in range(3):
        logger.log_metrics({"a": float(step), "b": step}, step=step)
        logger.save()
    assert query(db_path, "SELECT COUNT(*) FROM metrics") == [(0,)]
    logger.finalize("success")
    assert query(db_path, "SELECT COUNT(*) FROM metrics") == [(6,)]
    assert query(db_path, "SELECT status FROM runs") == [("success",)]


def _rows_written_after(logger: MultiRankLogger, calls: range, wait_s: float, want: int | None = None) -> int:
    """Log `calls` (one key each, Lightning's log_metrics + save), then give the writer `wait_s`."""
    for step in calls:
        logger.log_metrics({"a": float(step)}, step=step)
        logger.save()
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and writer_of(logger).rows_written != want:
        time.sleep(0.02)
    return writer_of(logger).rows_written


def test_flush_every_n_calls_paces_by_backend(db_path: Path, backend: str) -> None:
    """SQLite is written every flush_logs_every_n_steps calls; a DuckDB store, which each write
    opens (~20 ms of CPU beside the training), only once per flush_interval after the first."""
    logger = _logger(db_path, flush_logs_every_n_steps=4)
    # the first 4 calls wake the writer on either backend (it learns the sink's pace then)
    assert _rows_written_after(logger, range(4), 30, want=4) == 4
    if backend == "sqlite":
        assert _rows_written_after(logger, range(4, 8), 30, want=8) == 8
    else:
        # 40 more calls are far below SELDOM_MAX_CALLS: they wait for the interval (an hour)
        assert _rows_written_after(logger, range(4, 44), 1.0) == 4
    logger.finalize("success")
    assert query(db_path, "SELECT COUNT(*) FROM metrics") == [(8 if backend == "sqlite" else 44,)]


def test_a_slow_store_still_flushes_when_many_calls_are_pending(tmp_path: Path) -> None:
    """A DuckDB writer that waits for its interval still writes once SELDOM_MAX_CALLS are pending."""
    db = tmp_path / "runs.duckdb"
    logger = _logger(db, flush_logs_every_n_steps=4)
    _rows_written_after(logger, range(4), 30, want=4)
    total = 4 + SELDOM_MAX_CALLS
    assert _rows_written_after(logger, range(4, total), 30, want=total) == total
    logger.finalize("success")


def test_prefix_is_joined_with_a_dash(db_path: Path) -> None:
    """prefix='train' stores 'train-loss', as CSVLogger names it."""
    logger = _logger(db_path, prefix="train")
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.finalize("success")
    assert query(db_path, "SELECT key FROM metrics") == [("train-loss",)]


def test_nan_inf_and_odd_keys_are_stored_verbatim(db_path: Path) -> None:
    """NaN and ±inf survive; keys with quotes, spaces, unicode or SQL are stored as given."""
    keys = ["it's \"q\"", "a b", "ünï 中文", "x'); DROP TABLE metrics; --"]
    values = [math.nan, math.inf, -math.inf, 1.5]
    logger = _logger(db_path)
    logger.log_metrics(dict(zip(keys, values)), step=0)
    logger.finalize("success")
    rows = dict(query(db_path, "SELECT key, value FROM metrics"))
    assert sorted(rows) == sorted(keys)
    assert rows[keys[0]] is None  # NaN is NULL with dtype 3 (schema.py)
    assert rows[keys[1]] == math.inf and rows[keys[2]] == -math.inf and rows[keys[3]] == 1.5
    assert query(db_path, "SELECT dtype FROM metrics WHERE value IS NULL") == [(3,)]


def test_non_scalar_value_names_the_key_and_keeps_earlier_rows(db_path: Path) -> None:
    """A 2-element tensor raises InvalidMetric naming the key; what was logged before is kept."""
    logger = _logger(db_path)
    logger.log_metrics({"ok": 1.0}, step=0)
    with pytest.raises(InvalidMetric, match="'bad'"):
        logger.log_metrics({"fine": 2.0, "bad": torch.tensor([1.0, 2.0])}, step=1)
    with pytest.raises(InvalidMetric, match="'listy'"):
        logger.log_metrics({"listy": [1, 2]}, step=2)
    # an int past float64's range: refused here, not in the writer thread (which lost every row)
    with pytest.raises(InvalidMetric, match=r"'huge' \(logged at step 3\) is an int of 1329 bits, too large"):
        logger.log_metrics({"fine": 2.0, "huge": 10**400}, step=3)
    logger.log_metrics({"big": 2**1000}, step=4)  # large, and still a float64
    logger.finalize("success")
    assert query(db_path, "SELECT key, step, value FROM metrics ORDER BY step") == [("ok", 0, 1.0), ("big", 4, 2.0**1000)]


def test_a_key_that_is_not_a_string_is_stored_as_its_str(db_path: Path) -> None:
    """Fabric's log_dict passes any key through: an int key is stored as its str, not a crash
    of the writer (which lost every row with it)."""
    logger = _logger(db_path)
    logger.log_metrics({1: 1.0, "a": 2.0}, step=0)
    logger.log_metrics({"1": 3.0}, step=1)
    logger.finalize("success")
    assert query(db_path, "SELECT key, step, value FROM metrics ORDER BY step, key") == [
        ("1", 0, 1.0), ("a", 0, 2.0), ("1", 1, 3.0)
    ]


def test_two_keys_of_one_call_that_print_alike_keep_the_later_value(db_path: Path) -> None:
    """{1: a, "1": b} names one column "1": b is stored (as a dict {"1": a, "1": b} would keep),
    and the batch around it is written whole (SQLite's key (run, key, rank, seq) takes one row)."""
    logger = _logger(db_path)
    logger.log_metrics({"b": 0.5}, step=0)
    logger.log_metrics({1: 1.0, "1": 2.0, "b": 3.0}, step=1)
    logger.log_metrics({"b": 4.0}, step=2)
    logger.finalize("success")
    assert query(db_path, "SELECT key, step, value FROM metrics ORDER BY step, key") == [
        ("b", 0, 0.5), ("1", 1, 2.0), ("b", 1, 3.0), ("b", 2, 4.0)
    ]


def test_the_writer_outlives_a_batch_it_cannot_encode(db_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """Fault injection: the encoder fails on one call. The writer cuts that call out, counts its
    value lost and says so; the calls of the same batch and later ones are written, and the run is
    not a success (issue 38 point 1: one bad call never takes another call's values with it)."""
    logger = _logger(db_path)
    buffer = run_of(logger).logged.buffer
    encode = buffer.encode

    def broken(calls, run_id: int, rank: int):
        if any(step == 1 for _, step, _, _ in calls):
            raise RuntimeError("cannot encode")
        return encode(calls, run_id, rank)

    logger.log_metrics({"a": 1.0}, step=0)
    assert logger.flush(5)  # sets the sink up, writes step 0
    monkeypatch.setattr(buffer, "encode", broken)
    for step in (1, 2, 3):
        logger.log_metrics({"a": float(step + 1)}, step=step)
    logger.flush(5)
    assert "could not be encoded (RuntimeError: cannot encode): 1 value(s) are LOST" in capsys.readouterr().err
    logger.log_metrics({"a": 5.0}, step=4)
    logger.finalize("success")
    assert query(db_path, "SELECT step, value FROM metrics ORDER BY step") == [(0, 1.0), (2, 3.0), (3, 4.0), (4, 5.0)]
    assert query(db_path, "SELECT status, values_lost FROM runs") == [("incomplete", 1)]


def test_unwritable_db_path_fails_at_construction(tmp_path: Path, backend: str) -> None:
    """A db whose directory cannot be created fails in the constructor, naming the path."""
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("")
    with pytest.raises(StoreNotWritable, match="not_a_dir"):
        MultiRankLogger(db=str(blocker / f"runs.{'sqlite' if backend == 'sqlite' else 'duckdb'}"))


@pytest.mark.parametrize("argument", ["save_dir", "spill_dir"])
def test_unwritable_save_or_spill_dir_fails_at_construction_and_creates_nothing(tmp_path: Path, argument: str) -> None:
    """A save_dir or spill_dir under a file fails in the constructor, naming the argument and
    what goes there; no directory is created for it (the probe leaves nothing behind)."""
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("")
    kwargs = {"save_dir": str(tmp_path / "logs"), argument: str(blocker / "sub")}
    with pytest.raises(DirNotWritable, match=rf"Cannot write {argument}='.*not_a_dir/sub'.*is not a directory"):
        MultiRankLogger(db=str(tmp_path / "store" / "runs.sqlite"), **kwargs)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not_a_dir", "store"]  # logs/ is made when first needed


def test_a_rank_other_than_0_does_not_judge_rank_0s_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On another host, rank 0's save_dir may not exist at all: rank 1 checks nothing there."""
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("")
    monkeypatch.setenv("RANK", "1")
    MultiRankLogger(str(blocker / "logs"), db=str(blocker / "runs.sqlite"), spill_dir=str(blocker / "spill"))
    assert [p.name for p in tmp_path.iterdir()] == ["not_a_dir"]


@pytest.mark.parametrize(("front_end", "advice"), [
    (MultiRankLogger, "Read MultiRankLogger.version after fit starts, or pass version=N."),
    (MultiRankLoggerCore, "under a launcher that gives it MASTER_ADDR and MASTER_PORT (torchrun, or srun with them "
                          "exported), or pass version=N."),
], ids=["lightning", "plain"])
def test_a_rank_that_cannot_learn_the_version_is_told_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, front_end: type, advice: str
) -> None:
    """Rank 1 asked for the version with no launcher's variables (no TCPStore to learn it from):
    the error says what fits its front-end, Lightning's (after fit starts) or the plain API's (a
    launcher), never the other's."""
    for var in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    logger = front_end(db=str(tmp_path / "runs.sqlite"), start_timeout=1)
    with pytest.raises(MultiRankLoggerError, match="^Rank 1 cannot know the run's version yet") as caught:
        _ = logger.version
    assert str(caught.value).endswith(advice)
    assert not (tmp_path / "runs.sqlite").exists()  # a rank > 0 allocates nothing

def test_save_dir_on_a_read_only_mount_fails_at_construction(tmp_path: Path) -> None:
    """Root ignores mode bits: only a real file tells a read-only mount (unshare -m, ro tmpfs)."""
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"mount namespaces are not permitted here: {probe.stderr.decode().strip()}")
    ro = tmp_path / "ro"
    ro.mkdir()
    script = (
        "from multirank_logger import MultiRankLogger\n"
        "from multirank_logger.errors import DirNotWritable\n"
        "try:\n"
        f"    MultiRankLogger({str(ro / 'logs')!r}, db={str(tmp_path / 'runs.sqlite')!r})\n"
        "except DirNotWritable as exc:\n"
        "    print(exc)\n"
    )
    shell = f"mount -t tmpfs -o ro none {ro} && exec {sys.executable} -c \"$0\""
    result = subprocess.run(["unshare", "-m", "sh", "-c", shell, script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"Cannot write save_dir='{ro}/logs' (metrics.csv, hparams.yaml and checkpoints "
                                    f"go there): {ro}: Read-only file system."), result.stdout + result.stderr


@pytest.mark.parametrize("argument", ["flush_interval", "timeout"])
@pytest.mark.parametrize("seconds", [0, -1.0, math.inf, math.nan, "5", True])
def test_seconds_that_are_not_a_positive_number_are_refused(db_path: Path, argument: str, seconds: object) -> None:
    """flush_interval or timeout of 0, negative, infinite, not a number or a bool (True is 1 to
    Python): a clear error, no run."""
    with pytest.raises(ValueError, match=rf"{argument}=.*: pass a number of seconds greater than 0"):
        MultiRankLogger(db=str(db_path), **{argument: seconds})
    assert not db_path.exists()


@pytest.mark.parametrize("writers", [0, -1, 1.5, "2", True])
def test_max_writers_that_is_not_a_whole_number_of_processes_is_refused(db_path: Path, writers: object) -> None:
    """max_writers of 0, negative, a fraction, a string or a bool: a clear error, no run."""
    with pytest.raises(ValueError, match=r"max_writers=.*: pass a whole number of processes, 1 or more"):
        MultiRankLogger(db=str(db_path), max_writers=writers)
    assert not db_path.exists()


def test_pickled_logger_keeps_its_run(db_path: Path) -> None:
    """A pickled logger (ddp_spawn) keeps the run identity and allocates no new run."""
    logger = _logger(db_path, name="p")
    clone = pickle.loads(pickle.dumps(logger))
    assert (clone.version, clone.run_id, clone.log_dir) == (logger.version, logger.run_id, logger.log_dir)
    clone.log_metrics({"a": 1.0}, step=0)
    clone.finalize("success")
    assert query(db_path, "SELECT COUNT(*) FROM runs") == [(1,)]
    assert query(db_path, "SELECT COUNT(*) FROM metrics") == [(1,)]


def test_log_hyperparams_stored_with_the_run(db_path: Path) -> None:
    """Nested hyperparameters (a Namespace inside a dict) are stored as JSON with the run."""
    from argparse import Namespace

    logger = _logger(db_path)
    logger.log_hyperparams(Namespace(lr=0.1, opt={"name": "sgd", "inner": Namespace(m=0.9)}))
    logger.log_metrics({"a": 1.0}, step=0)
    logger.finalize("success")
    (hparams,) = query(db_path, "SELECT hparams FROM runs")[0]
    assert hparams == '{"lr": 0.1, "opt": {"inner": {"m": 0.9}, "name": "sgd"}}'


@pytest.mark.parametrize(
    ("ending", "status"),
    [("raise RuntimeError('before fit')", "failed"), ("raise KeyboardInterrupt", "interrupted"), ("pass", "success")],
)
def test_a_script_that_dies_before_finalize_ends_its_run(tmp_path: Path, ending: str, status: str) -> None:
    """A crash outside Lightning's loops (no finalize) records the run as failed or interrupted,
    its logged rows kept; a normal exit without finalize ends it as finalize("success") would
    (issue 38 point 7: it stayed "running" forever). One script logs to a store of each embedded
    backend, a logger each: every run this process logged to is ended."""
    stores = [tmp_path / f"runs{suffix}" for suffix in BACKEND_SUFFIXES.values()]
    script = (
        "from multirank_logger import MultiRankLogger\n"
        f"loggers = [MultiRankLogger(db=db, flush_interval=3600) for db in {[str(db) for db in stores]!r}]\n"
        "for logger in loggers:\n"
        "    logger.log_metrics({'a': 1.0}, step=0)\n"
        f"{ending}\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert (proc.returncode == 0) == (ending == "pass"), proc.stderr[-2000:]
    for db in stores:
        assert query(db, "SELECT status FROM runs") == [(status,)], db.name
        assert query(db, "SELECT rank, status FROM ranks") == [(0, status)], db.name
        assert query(db, "SELECT key, value FROM metrics") == [("a", 1.0)], db.name


def test_rows_that_cannot_be_written_are_reported_at_exit(db_path: Path) -> None:
    """A launched rank (WORLD_SIZE=2) that logs but never starts its process group cannot learn
    its run: at exit it says how many calls are lost and why, instead of dropping them silently."""
    script = (
        "from multirank_logger import MultiRankLogger\n"
        f"logger = MultiRankLogger(db={str(db_path)!r}, flush_interval=3600)\n"
        "logger.log_metrics({'a': 1.0}, step=0)\n"
        "logger.log_metrics({'a': 2.0}, step=1)\n"
    )
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "exiting with 2 log call(s) and 0 row(s) not written" in proc.stderr
    assert "process group never started" in proc.stderr


def _two_ranks_crash_after_logging(db: Path, port: int, transport: str, before_crash: str = "") -> None:
    """Two ranks (a gloo group, no Lightning) log one value each, run `before_crash`, then
    raise outside any Lightning loop; both must die with that error."""
    script = (
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "from multirank_logger import MultiRankLogger\n"
        f"logger = MultiRankLogger(db={str(db)!r}, flush_interval=3600, transport={transport!r})\n"
        "logger.log_metrics({'a': float(dist.get_rank())}, step=0)\n"
        f"{before_crash}"
        "raise RuntimeError('after logging')\n"
    )
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2"}
        env.update(LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, "-c", script], env=env, stderr=subprocess.PIPE, text=True))
    errors = [proc.communicate(timeout=120)[1] for proc in procs]
    assert all("after logging" in err for err in errors), errors


def test_every_direct_rank_that_dies_before_finalize_ends_its_row(tmp_path: Path, port: int) -> None:
    """Two ranks writing the store themselves crash after logging, outside Lightning's loops:
    the run and both ranks' rows end as failed, each rank's rows kept."""
    db = tmp_path / "runs.sqlite"
    # both ranks learn the run before either dies: a rank 0 gone first takes the launch's
    # TCPStore with it, and rank 1 can then only wait out its identity timeout and spill
    _two_ranks_crash_after_logging(db, port, "direct", before_crash="_ = logger.experiment\ndist.barrier()\n")
    assert query(db, "SELECT status, transport FROM runs") == [("failed", "direct")]
    assert query(db, "SELECT rank, status FROM ranks ORDER BY rank") == [(0, "failed"), (1, "failed")]
    assert query(db, "SELECT rank, value FROM metrics ORDER BY rank") == [(0, 0.0), (1, 1.0)]


def test_a_gather_run_that_dies_before_finalize_ends_every_ranks_row(tmp_path: Path, port: int) -> None:
    """Gather mode, both ranks crash after logging, outside Lightning's loops: rank 0 writes
    every row, so at exit it ends the run and its own row as failed, and rank 1's, which it
    never heard end from, as missing (none stays "running"). Rank 0's rows are kept."""
    db = tmp_path / "runs.duckdb"
    # the sink set up, as Lightning does before the first step; both ranks past that
    _two_ranks_crash_after_logging(db, port, "gather", before_crash="_ = logger.experiment\ndist.barrier()\n")
    assert query(db, "SELECT status, transport FROM runs") == [("failed", "gather")]
    assert query(db, "SELECT rank, status FROM ranks ORDER BY rank") == [(0, "failed"), (1, "missing")]
    assert (0, 0.0) in query(db, "SELECT rank, value FROM metrics ORDER BY rank")


def test_a_crash_after_a_finished_run_leaves_its_status(db_path: Path) -> None:
    """The exit hook only ends runs still running: a run another process finished (a ddp_spawn
    worker, while this parent never finalizes) keeps its status."""
    script = (
        "from multirank_logger import MultiRankLogger\n"
        "from multirank_logger.store.sql_store import Store\n"
        f"logger = MultiRankLogger(db={str(db_path)!r}, flush_interval=3600)\n"
        f"Store({str(db_path)!r}).update_run(logger.run_id, status='success')  # as a worker's finalize\n"
        "raise RuntimeError('after fit')\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "after fit" in proc.stderr
    assert query(db_path, "SELECT status FROM runs") == [("success",)]


def test_finalize_leaves_no_connection_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After finalize nothing of the run stays open: no descriptor of the store file (its engine
    disposed) and no connection to the launch's TCPStore (the identity channel closed); both
    stayed open for the life of the process before."""
    import datetime

    import psutil
    import torch.distributed as dist

    from tests.helpers.launches import free_port

    server = dist.TCPStore("127.0.0.1", free_port(), None, True, datetime.timedelta(seconds=10), wait_for_workers=False)
    # the launch's store, as torchrun's agent offers it to its workers
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    db = tmp_path / "runs.sqlite"
    me = psutil.Process()

    def open_now() -> tuple[list[str], set[int]]:
        files = [f.path for f in me.open_files() if f.path.startswith(str(db))]
        return files, {c.laddr.port for c in me.net_connections("tcp") if c.raddr and c.raddr.port == server.port}

    server_own = open_now()[1]  # the server object's own client
    logger = MultiRankLogger(db=db)
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.log_hyperparams({"lr": 0.1})  # the run is set up: the identity published
    files, connections = open_now()
    assert files and connections - server_own  # the test sees what it looks for
    logger.finalize("success")
    assert open_now() == ([], server_own)
    assert query(db, "SELECT key, value FROM metrics") == [("loss", 1.0)]


def test_start_timeout_bounds_the_wait_for_rank_0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 of a launch whose rank 0 never opens the run: it waits `start_timeout`, not the
    general `timeout`, and the error names the argument to raise."""
    import datetime

    import torch.distributed as dist

    from multirank_logger.errors import IdentityTimeout
    from tests.helpers.launches import free_port

    server = dist.TCPStore("127.0.0.1", free_port(), None, True, datetime.timedelta(seconds=10), wait_for_workers=False)
    for name, value in {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(server.port),
                        "TORCHELASTIC_USE_AGENT_STORE": "True"}.items():
        monkeypatch.setenv(name, value)
    logger = MultiRankLogger(db=tmp_path / "runs.sqlite", timeout=600, start_timeout=1)
    with pytest.raises(IdentityTimeout, match=r"waited 1 s for rank 0 .* raise the logger's start_timeout"):
        _ = logger.version
    with pytest.raises(ValueError, match="start_timeout=0"):
        MultiRankLogger(db=tmp_path / "runs.sqlite", start_timeout=0)


def test_side_rows_spilled_at_the_end_leave_the_run_incomplete_until_imported(tmp_path: Path) -> None:
    """Another process holds the DuckDB file as the run ends: the end's side-table rows (the
    watch's verdict) go to the spill file, and the run's end is recorded once the file is free. The
    run is "incomplete" (it lacks those rows, as the spill message says), not "success"; importing
    the file makes it a success. Found by test_nothing_lost_properties' lock fault at the end."""
    from tests.helpers.nothing_lost import hold_store

    db = tmp_path / "runs.duckdb"
    logger = MultiRankLogger(db=str(db), save_dir=str(tmp_path / "logs"), spill_dir=str(tmp_path / "spill"),
                             flush_interval=0.02, timeout=1.0, finalize_timeout=5.0)
    _ = logger.experiment
    logger.log_metrics({"loss": 1.0}, step=0)
    assert logger.flush(10)
    holder = None
    for _ in range(100):  # the writer holds the file while it writes: take it between two writes
        holder = hold_store(db, 1.5, tmp_path)
        if holder is not None:
            break
        time.sleep(0.02)
    assert holder is not None, "no moment the logger's writer left the DuckDB file free"
    logger.finalize("success")
    holder.wait(30)
    spills = sorted((tmp_path / "spill").glob("*.mrspill"))
    assert len(spills) == 1
    assert query(db, "SELECT status FROM runs") == [("incomplete",)]
    assert query(db, "SELECT key, value FROM metrics") == [("loss", 1.0)]
    (side,) = query(db, "SELECT side_rows_spilled FROM ranks WHERE rank = 0")[0]
    assert side >= 1  # what the run lacks, counted: `runs` says why it is incomplete
    listed = subprocess.run([sys.executable, "-m", "multirank_logger.cli", "runs", str(db)], capture_output=True,
                            text=True, timeout=120)
    assert f"incomplete ({side} side-table row(s) in spill files)" in listed.stdout, listed.stdout + listed.stderr
    imported = subprocess.run([sys.executable, "-m", "multirank_logger.cli", "import", str(db), str(spills[0])],
                              capture_output=True, text=True, timeout=120)
    assert imported.returncode == 0, imported.stderr
    assert query(db, "SELECT status FROM runs") == [("success",)]
    assert query(db, "SELECT side_rows_spilled FROM ranks") == [(0,)]
