"""This rank's logged rows and their writer (write/logged_rows.py, write/writer_thread.py): the
public flush stores every row logged so far or says it could not, never dropping one; the writer
asks the run above it once a cycle (`WriterOwner.destination`)."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

import multirank_logger
from multirank_logger import MultiRankLogger
from multirank_logger.errors import RunFinished
from multirank_logger.store.sql_store import Store
from multirank_logger.write.buffer import RecordBuffer
from multirank_logger.write.sinks import DirectSink
from multirank_logger.write.writer_thread import BackgroundWriter, Destination
from tests.helpers.internals import run_of
from tests.helpers.logger_helpers import query


def _logger(db: Path) -> MultiRankLogger:
    return MultiRankLogger(db=str(db), flush_interval=3600, watch=False)  # only explicit flushes write


@contextlib.contextmanager
def _store_refusing_writes(db: Path, backend: str) -> Iterator[None]:
    """Another process's hold on the store, as a user's: a DuckDB connection that writes, or an
    SQLite transaction holding the write lock."""
    if backend == "duckdb":
        holder = duckdb.connect(str(db))
        try:
            yield
        finally:
            holder.close()
        return
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        con.execute("ROLLBACK")
        con.close()


@pytest.mark.parametrize("timeout", [0, -1.0, float("nan"), float("inf"), "5", None, True])
def test_flush_refuses_a_timeout_that_is_no_finite_wait_and_loses_nothing(tmp_path: Path, timeout: object) -> None:
    """flush(timeout=...) takes a number of seconds > 0 and finite: anything else (a wait with no
    end, a NaN that never compares, True, which Python counts as 1) is refused at the call with one
    line saying what to pass, and the rows logged before it are stored by the next flush."""
    db = tmp_path / "runs.sqlite"
    logger = _logger(db)
    logger.log_metrics({"a": 1.0}, step=0)
    with pytest.raises(ValueError, match=r"timeout=.*: pass a number of seconds greater than 0 \(and finite\)"):
        logger.flush(timeout=timeout)  # type: ignore[arg-type]
    assert logger.flush(timeout=30)
    assert query(db, "SELECT key, step, value FROM metrics") == [("a", 0, 1.0)]
    logger.finalize("success")


def test_flush_stores_every_row_logged_so_far(tmp_path: Path, backend: str) -> None:
    """After flush() returns True, a reader of the store sees every call logged so far, mid-run."""
    db = tmp_path / f"runs.{backend}"
    logger = _logger(db)
    for step in range(25):
        logger.log_metrics({"a": float(step), "b": 1.0}, step=step)
    assert logger.flush(timeout=30)
    assert query(db, "SELECT count(*), count(DISTINCT step) FROM metrics") == [(50, 25)]
    logger.finalize("success")


def test_flush_says_false_while_the_store_refuses_and_drops_no_row(tmp_path: Path, backend: str) -> None:
    """A store another process holds: flush() returns False at its timeout, keeps the rows, and a
    later flush stores each of them once."""
    db = tmp_path / f"runs.{backend}"
    logger = _logger(db)
    logger.log_metrics({"a": 0.0}, step=0)
    assert logger.flush(timeout=30)  # the sink set up, the store created
    for step in range(1, 10):
        logger.log_metrics({"a": float(step)}, step=step)
    with _store_refusing_writes(db, backend):
        assert not logger.flush(timeout=0.5)
        logger.log_metrics({"a": 10.0}, step=10)  # logging goes on meanwhile
    assert logger.flush(timeout=30)
    logger.finalize("success")
    assert query(db, "SELECT step, count(*) FROM metrics GROUP BY step ORDER BY step") == [(s, 1) for s in range(11)]
    assert query(db, "SELECT status, COALESCE(values_spilled, 0) + COALESCE(values_lost, 0) FROM runs") == [("success", 0)]


def test_plain_run_flush(tmp_path: Path) -> None:
    """The plain API's run.flush() stores what was logged; after finish() it refuses, clearly."""
    db = tmp_path / "runs.sqlite"
    run = multirank_logger.init(db=str(db), name="plain", watch=False)
    run.log({"loss": 1.0})
    run.log({"loss": 0.5})
    assert run.flush(timeout=30)
    assert query(db, "SELECT step, value FROM metrics ORDER BY step") == [(0, 1.0), (1, 0.5)]
    run.finish()
    with pytest.raises(RunFinished, match="run.flush: this run was finished"):
        run.flush()


def test_the_writer_asks_its_owner_once_a_cycle(tmp_path: Path) -> None:
    """One call up per cycle gives the sink and the watch's intake; the watch gets each new row once."""
    store = Store(tmp_path / "runs.sqlite")
    run = store.create_run("owner", world_size=1)
    seen: list[int] = []

    class Owner:
        calls = 0

        def destination(self, explicit: bool) -> Destination:
            self.calls += 1
            return Destination(DirectSink(store, run.id), run.id, 0, lambda batches, side: seen.append(sum(map(len, batches))))

    owner, buffer = Owner(), RecordBuffer()
    writer = BackgroundWriter(buffer, owner, flush_interval=3600, flush_every=10**9)
    for step in range(3):
        buffer.append(step, {"a": 1.0})
    assert writer.flush(30) and writer.flush(30)
    assert owner.calls == 2 and seen == [3]  # the second cycle had nothing new: the watch not called
    store.close()


def test_a_watch_that_raises_costs_no_row(tmp_path: Path) -> None:
    """The watch's intake raising: rows are stored as ever, and that intake is not handed rows again."""
    store = Store(tmp_path / "runs.sqlite")
    run = store.create_run("watch", world_size=1)
    calls: list[int] = []

    def broken(batches: list, side: list) -> None:
        calls.append(len(batches))
        raise RuntimeError("watch broke")

    destination = Destination(DirectSink(store, run.id), run.id, 0, broken)

    class Owner:
        def destination(self, explicit: bool) -> Destination:
            return destination

    buffer = RecordBuffer()
    writer = BackgroundWriter(buffer, Owner(), flush_interval=3600, flush_every=10**9)
    for step in range(4):
        buffer.append(step, {"a": float(step)})
        assert writer.flush(30)
    assert calls == [1] and writer.rows_written == 4
    store.close()


def test_the_run_sets_up_its_sink_for_the_writer_once_rows_wait(tmp_path: Path) -> None:
    """RankRun.destination: None while nothing was logged (the set-up is left to the main thread);
    then this rank's sink, and rank 0's metrics.csv takes the calls no save() wrote."""
    logger = MultiRankLogger(db=str(tmp_path / "runs.sqlite"), flush_interval=3600, watch=False)
    run = run_of(logger)
    assert run.destination(explicit=True) is None and run.sink_holder.sink is None
    logger.log_metrics({"a": 1.5}, step=0)
    destination = run.destination(explicit=True)
    assert destination is not None and destination.sink is run.sink_holder.sink
    assert (destination.run_id, destination.rank) == (logger.run_id, 0)
    assert (Path(logger.log_dir) / "metrics.csv").read_text().splitlines() == ["a,step", "1.5,0"]
    logger.finalize("success")
