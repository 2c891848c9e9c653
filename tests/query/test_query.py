"""The read-only query side on real SQLite and DuckDB files, against Lightning's real CSVLogger."""

from __future__ import annotations

import io
import math
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from multirank_logger import open_store
from multirank_logger.errors import LookupFailed, QueryFailed, ReadOnlyViolation, StoreLocked
from multirank_logger.rows.csv_layout import write_csv
from multirank_logger.store.backends import Backend, DuckDBBackend, SQLiteBackend, backend_for, resolve_url
from multirank_logger.store.sql_store import Store
from tests.helpers.logged_calls import ODD_KEYS, Call, csvlogger_file, store_calls, trainer_calls
from tests.helpers.stores import keep_summaries

_TEMPLATES: dict[str, Path] = {}


@pytest.fixture
def two_ranks(db_path: Path, backend: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store holding one run of trainer_calls on ranks 0 and 1: built once per backend, copied per test."""
    if backend not in _TEMPLATES:
        template = tmp_path_factory.mktemp("template") / db_path.name
        store_calls(template, {0: trainer_calls(0), 1: trainer_calls(1)})
        _TEMPLATES[backend] = template
    for suffix in ("", "-wal"):  # the -wal file, should one outlive the writer
        source = _TEMPLATES[backend].with_name(db_path.name + suffix)
        if source.exists():
            shutil.copyfile(source, db_path.with_name(db_path.name + suffix))
    return db_path


@pytest.mark.parametrize("prefix", ["", "fit"])
def test_rank0_export_is_csvloggers_file(db_path: Path, tmp_path: Path, prefix: str) -> None:
    """Rank 0's export equals CSVLogger's metrics.csv byte for byte (NaN, inf, -0.0, ints, bools, late keys)."""
    store_calls(db_path, {0: trainer_calls(0), 1: trainer_calls(1)}, prefix=prefix)
    out = tmp_path / "metrics.csv"
    with open_store(db_path) as reader:
        assert reader.export_csv(out) == len(trainer_calls(0))
    assert out.read_bytes() == csvlogger_file(tmp_path, trainer_calls(0), prefix=prefix)


def test_export_written_in_many_grids_is_the_same_file(db_path: Path, tmp_path: Path) -> None:
    """A file written a few CSV rows at a time (as a long run's is) equals CSVLogger's: no row
    lost or doubled at a chunk's edge, late keys and the rows at one step included."""
    store_calls(db_path, {0: trainer_calls(0)})
    with open_store(db_path) as reader:
        rows = reader._rank_rows(reader.resolve_run(None), 0)
    for chunk_rows in (1, 7, 64):
        out = io.StringIO(newline="")
        assert write_csv(out, rows.keys, [rows], chunk_rows=chunk_rows) == len(trainer_calls(0))
        assert out.getvalue().encode() == csvlogger_file(tmp_path / str(chunk_rows), trainer_calls(0))


@pytest.mark.parametrize("fetch_rows", [1, 2, 5, 64])
def test_export_streamed_a_few_rows_at_a_time_is_the_same_file(
    any_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fetch_rows: int
) -> None:
    """The export streams from the store a fetch at a time (merged across keys on SQLite,
    re-cut at call edges on DuckDB): with fetches of a few rows, every call still lands whole,
    once, in order, beside keys logged at other rates and another rank's rows."""
    monkeypatch.setattr(Backend, "fetch_rows", fetch_rows)
    monkeypatch.setattr(SQLiteBackend, "min_key_fetch_rows", fetch_rows)
    monkeypatch.setattr(DuckDBBackend, "sort_window_rows", 3 * fetch_rows)
    store_calls(any_db, {0: trainer_calls(0), 1: trainer_calls(1)})
    out = tmp_path / "metrics.csv"
    with open_store(any_db) as reader:
        assert reader.export_csv(out) == len(trainer_calls(0))
        frame = reader.rank_frame()
    assert out.read_bytes() == csvlogger_file(tmp_path, trainer_calls(0))
    assert len(frame) == len(trainer_calls(0))


def test_export_reads_one_state_of_a_store_still_written(any_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run still writing while its export streams: a call (with a key new to the run)
    committed between the export's first read and its row reads is not in the file, neither
    in part nor as a key its header lacks: the file is the store as the export found it."""
    import sqlalchemy as sa

    from multirank_logger.rows.schema import metrics

    if str(any_db).endswith(".duckdb"):
        pytest.skip("no one can write a DuckDB file while a reader holds it")
    run_id = store_calls(any_db, {0: trainer_calls(0)})
    writer = Store(any_db)
    backend_class = type(backend_for(resolve_url(any_db)))
    read_rows = backend_class.row_chunks

    def commit_then_read(*args: Any, **kwargs: Any) -> Any:
        if not getattr(commit_then_read, "done", False):  # once: a later call of the run
            commit_then_read.done = True  # type: ignore[attr-defined]
            new = [{"run_id": run_id, "rank": 0, "seq": 10_000, "step": 10_000, "key": k, "value": 1.0, "dtype": 0,
                    "time": 0.0} for k in ("train_loss", "zz_new_key")]
            with writer.engine.begin() as conn:
                conn.execute(sa.insert(metrics), new)
                keep_summaries(conn, run_id)
        return read_rows(*args, **kwargs)

    monkeypatch.setattr(backend_class, "row_chunks", commit_then_read)
    out = tmp_path / "metrics.csv"
    with open_store(any_db) as reader:
        assert reader.export_csv(out) == len(trainer_calls(0))
    assert getattr(commit_then_read, "done", False)  # the write did land mid-export
    writer.close()
    assert out.read_bytes() == csvlogger_file(tmp_path, trainer_calls(0))


def test_ints_past_int64_export_as_csvlogger_prints_them(db_path: Path, tmp_path: Path) -> None:
    """An int too wide for int64 (stored as the float64 it is exactly) prints as the int, and
    the rank frame keeps such a column as floats instead of overflowing an Int64 column."""
    calls: list[Call] = [({"samples": 2**70, "n": 3}, 0), ({"samples": -(2**1000), "n": 4}, 1), ({"n": 5}, 2)]
    store_calls(db_path, {0: calls})
    out = tmp_path / "metrics.csv"
    with open_store(db_path) as reader:
        reader.export_csv(out)
        frame = reader.rank_frame()
    assert out.read_bytes() == csvlogger_file(tmp_path, calls)
    assert str(frame["n"].dtype) == "Int64" and frame["samples"].tolist()[:2] == [2.0**70, -(2.0**1000)]


def test_other_rank_export_has_its_own_values(two_ranks: Path, tmp_path: Path) -> None:
    """Rank 1's export is what CSVLogger would write had it logged rank 1's calls."""
    out = tmp_path / "rank1.csv"
    with open_store(two_ranks) as reader:
        reader.export_csv(out, rank=1)
    assert out.read_bytes() == csvlogger_file(tmp_path, trainer_calls(1))
    assert b"\r\n1000,1000.5" not in out.read_bytes()  # sanity: not rank 0's file
    assert out.read_bytes() != csvlogger_file(tmp_path / "r0", trainer_calls(0))


def test_each_rank_export_has_only_the_keys_that_rank_logged(db_path: Path, tmp_path: Path) -> None:
    """A key only rank 1 logged is no column of rank 0's file, and the other way round."""
    calls = {
        0: [({"loss": 1.0, "zero_only": 7}, 0), ({"loss": 0.5}, 1)],
        1: [({"loss": 2.0}, 0), ({"loss": 1.5, "one_only": True}, 1)],
    }
    store_calls(db_path, calls)
    with open_store(db_path) as reader:
        for rank in (0, 1):
            out = tmp_path / f"rank{rank}.csv"
            reader.export_csv(out, rank=rank)
            assert out.read_bytes() == csvlogger_file(tmp_path / str(rank), calls[rank])


def test_logged_key_named_step_is_overridden_by_the_step(db_path: Path, tmp_path: Path) -> None:
    """CSVLogger sets row['step'] from the step argument, over a logged 'step' key: so do we."""
    calls: list[Call] = [({"step": 99.0, "a": 1}, 0), ({"a": 2}, 1)]
    store_calls(db_path, {0: calls})
    out = tmp_path / "m.csv"
    open_store(db_path).export_csv(out)
    assert out.read_bytes() == csvlogger_file(tmp_path, calls) == b"a,step\r\n1,0\r\n2,1\r\n"


def test_rank_frame_has_the_csv_layout(two_ranks: Path) -> None:
    """rank_frame: one row per call, sorted columns with step, ints and bools kept."""
    frame = open_store(two_ranks).rank_frame(rank=1)
    assert list(frame.columns) == sorted([*{k for m, _ in trainer_calls(1) for k in m}, "step"])
    assert len(frame) == len(trainer_calls(1))
    assert str(frame["rank_value"].dtype) == "Int64" and frame["rank_value"].iloc[5] == 1005
    assert str(frame["flag"].dtype) == "boolean"
    assert math.isnan(frame["train_loss"].iloc[11]) and math.copysign(1, frame["train_loss"].iloc[14]) < 0


def test_runs_lists_one_row_per_run(db_path: Path) -> None:
    """runs(): id, label, status, world size, steps and keys per run."""
    store_calls(db_path, {0: trainer_calls(0), 1: trainer_calls(1)})
    store_calls(db_path, {0: trainer_calls(0, steps=5)}, name="other")
    runs = open_store(db_path).runs()
    assert runs[["id", "run", "status", "world_size", "steps", "keys"]].values.tolist() == [
        [1, "lightning_logs/version_0", "running", 2, 60, 10],
        [2, "other/version_0", "running", 1, 5, 4],
    ]
    assert (runs["duration_s"] >= 0).all()


def test_run_is_chosen_by_id_label_or_name(db_path: Path) -> None:
    """run=None is the latest; ids, labels and bare names resolve too."""
    for _ in range(2):
        store_calls(db_path, {0: trainer_calls(0, steps=3)})
    reader = open_store(db_path)
    assert reader.resolve_run().label == "lightning_logs/version_1"
    assert reader.resolve_run(1).version == 0
    assert reader.resolve_run("lightning_logs/version_0").id == 1
    assert reader.resolve_run("lightning_logs/1").id == 2
    assert reader.resolve_run("lightning_logs").id == 2


def test_keys_are_each_runs_own_any_rank(db_path: Path) -> None:
    """keys(run) lists every key the run's ranks logged, and none of another run's
    (SQLite skips along its key from one key to the next, within the run)."""
    first = {0: [({"a": 1.0, ODD_KEYS[1]: 2.0}, 0)], 1: [({"only_rank1": 3.0}, 0)]}
    second = {0: [({"b": 1.0, ODD_KEYS[2]: 2.0, "": 0.5}, 0)]}
    one, two = store_calls(db_path, first), store_calls(db_path, second)
    reader = open_store(db_path)
    assert reader.keys(one) == sorted(["a", ODD_KEYS[1], "only_rank1"])
    assert reader.keys(two) == sorted(["b", ODD_KEYS[2], ""])


def test_unknown_run_lists_the_runs(two_ranks: Path) -> None:
    expected = r"No run 'nope/version_3' in this store\. Available: lightning_logs/version_0 \(id 1\)"
    with pytest.raises(LookupFailed, match=expected):
        open_store(two_ranks).export_csv("x.csv", run="nope/version_3")


def test_unknown_key_lists_the_keys(two_ranks: Path) -> None:
    with pytest.raises(LookupFailed, match=r"No key 'nope' in this store\. Available: .*epoch, .*train_loss"):
        open_store(two_ranks).per_rank("nope")


def test_unknown_rank_lists_the_ranks(two_ranks: Path) -> None:
    with pytest.raises(LookupFailed, match=r"No rank '5' in this store\. Available: 0, 1"):
        open_store(two_ranks).export_csv("x.csv", rank=5)


def test_per_rank_is_step_by_rank(two_ranks: Path) -> None:
    """per_rank: index step, a column per rank, each rank's own values."""
    table = open_store(two_ranks).per_rank("rank_value")
    assert list(table.columns) == [0, 1] and len(table) == 60
    assert table.loc[7].tolist() == [7.0, 1007.0]


def test_per_rank_has_the_ranks_that_logged_the_key_in_that_run(db_path: Path) -> None:
    """A key some ranks never logged: a column for each rank that did, in this run only, each
    with its own values and -0.0 and NaN kept."""
    store_calls(db_path, {0: [({"a": 1.0}, 0), ({"a": -0.0}, 1)], 1: [({"b": 5.0}, 0)],
                           2: [({"a": 3.0, "b": 1.0}, 0), ({"a": math.nan}, 1)], 3: [({"a": 4.0}, 1)]})
    store_calls(db_path, {0: [({"b": 9.0}, 0)], 1: [({"a": 7.0}, 0)]}, name="other")
    table = open_store(db_path).per_rank("a", run="lightning_logs")
    assert list(table.columns) == [0, 2, 3] and list(table.index) == [0, 1]
    assert table[0].tolist() == [1.0, 0.0] and math.copysign(1, table.loc[1, 0]) == -1
    assert table[2].tolist()[0] == 3.0 and math.isnan(table.loc[1, 2])
    assert math.isnan(table.loc[0, 3]) and table.loc[1, 3] == 4.0


def test_per_rank_keeps_a_ranks_later_call_at_one_step(db_path: Path) -> None:
    store_calls(db_path, {0: [({"a": 1.0}, 0), ({"a": 2.0}, 0), ({"a": 3.0}, 1)]})
    assert open_store(db_path).per_rank("a")[0].tolist() == [2.0, 3.0]


def test_per_rank_sorts_steps_that_went_back(db_path: Path) -> None:
    """Steps out of call order (a resumed loop, validation at an earlier step) come out by step,
    the later call still winning at a step logged twice."""
    calls = {
        0: [({"a": 1.0}, 5), ({"a": 2.0}, 3), ({"a": 3.0}, 5), ({"a": 4.0}, 4)],
        1: [({"a": 10.0}, 3), ({"a": 11.0}, 3)],
    }
    store_calls(db_path, calls)
    table = open_store(db_path).per_rank("a")
    assert table.index.tolist() == [3, 4, 5]
    assert table[0].tolist() == [2.0, 4.0, 3.0]
    assert table[1].fillna(-1).tolist() == [11.0, -1, -1]


def test_keys_with_quotes_and_sql_are_bound_not_spliced(two_ranks: Path) -> None:
    """A key holding quotes and SQL is matched verbatim, and the store is intact afterwards."""
    reader = open_store(two_ranks)
    key = "x; DROP TABLE metrics; --"
    logged = sum(key in m for m, _ in trainer_calls(0))
    assert logged > 0 and reader.per_rank(key).notna().sum().tolist() == [logged, logged]
    both = sum(key in m or ODD_KEYS[0] in m for m, _ in trainer_calls(1))
    assert len(reader.metrics(keys=[ODD_KEYS[0], key], ranks=[1])) == both
    assert reader.sql("SELECT count(*) AS n FROM metrics")["n"].tolist() == [sum(len(m) for m, _ in trainer_calls(0)) * 2]


def test_metrics_filters_by_rank_and_key(two_ranks: Path) -> None:
    df = open_store(two_ranks).metrics(ranks=[1], keys=["val_loss"])
    assert df["rank"].unique().tolist() == [1] and df["key"].unique().tolist() == ["val_loss"]
    assert df["step"].tolist() == [19, 39, 59]


@pytest.mark.parametrize(
    "statement",
    [
        "DELETE FROM metrics",
        "UPDATE metrics SET value = 0",
        "DROP TABLE runs",
        "CREATE TEMP TABLE t AS SELECT 1",
        "SELECT 1; DELETE FROM metrics",
        "ATTACH 'other.db' AS other",
    ],
)
def test_sql_refuses_writes_and_changes_nothing(two_ranks: Path, statement: str) -> None:
    """A write through sql() is refused with ReadOnlyViolation, and the data is unchanged."""
    reader = open_store(two_ranks)
    before = reader.sql("SELECT * FROM metrics ORDER BY rank, seq, key")
    with pytest.raises((ReadOnlyViolation, QueryFailed)) as info:
        reader.sql(statement)
    if "; " not in statement or two_ranks.suffix == ".duckdb":  # SQLite runs one statement per call
        assert info.type is ReadOnlyViolation
    after = open_store(two_ranks).sql("SELECT * FROM metrics ORDER BY rank, seq, key")
    assert after.equals(before)


def test_sql_error_carries_the_engines_message(two_ranks: Path) -> None:
    with pytest.raises(QueryFailed, match=r"rejected the query: .*nosuch"):
        open_store(two_ranks).sql("SELECT * FROM nosuch")


def test_sql_reads(two_ranks: Path) -> None:
    query = "SELECT rank, count(*) AS n FROM metrics WHERE key = 'val_loss' GROUP BY rank ORDER BY rank"
    df = open_store(two_ranks).sql(query)
    assert df.values.tolist() == [[0, 3], [1, 3]]


def test_reader_waits_for_a_duckdb_writer_then_reads(tmp_path: Path) -> None:
    """A DuckDB file held by a writer (a flush) is waited for, within lock_timeout."""
    db = tmp_path / "runs.duckdb"
    store_calls(db, {0: trainer_calls(0, steps=3)})
    hold = textwrap.dedent(
        f"""
        import duckdb, sys, time
        con = duckdb.connect({str(db)!r})
        print("locked", flush=True)
        time.sleep(float(sys.argv[1]))
        con.close()
        """
    )
    with subprocess.Popen([sys.executable, "-c", hold, "1.0"], stdout=subprocess.PIPE, text=True) as holder:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        with pytest.raises(StoreLocked, match="open for writing in another process"):
            open_store(db, lock_timeout=0.1)
        assert len(open_store(db, lock_timeout=30).runs()) == 1


@pytest.mark.parametrize("stride", [1, 3, 1000])
def test_the_step_rank_pivot_is_pandas_pivot_with_the_later_call_winning(stride: int) -> None:
    """`pivot_step_rank` against pandas' own pivot of the same rows: steps every `stride` (1 and
    3 laid out by offset, 1000 by the steps present), a rank between others that never logs
    (ranks 2, 3, 4, 6), a step no rank logged, a (rank, step) logged twice (the call with the
    larger seq wins), -0.0 stored as 0.0 and kept by its dtype code."""
    import numpy as np
    import pandas as pd

    from multirank_logger.query.rank_spread import pivot_step_rank
    from multirank_logger.rows.schema import DTYPE_NEG_ZERO

    rng = np.random.default_rng(stride)
    rows = [(rank, step * stride + 10**6, float(rng.standard_normal()))
            for step in range(50) if step != 17 for rank in (2, 3, 4, 6)]
    rows += [(3, 5 * stride + 10**6, 99.0), (6, 9 * stride + 10**6, -0.0)]  # later calls: larger seq
    rank = np.array([r for r, _, _ in rows], np.int32)
    step = np.array([s for _, s, _ in rows], np.int64)
    value = np.array([v for _, _, v in rows])
    seq = np.arange(len(rows), dtype=np.int64)
    dtype = np.where(np.signbit(value) & (value == 0), DTYPE_NEG_ZERO, 0).astype(np.int16)
    order = rng.permutation(len(rows))  # rows come in no order
    stored = np.where(dtype == DTYPE_NEG_ZERO, 0.0, value)  # SQLite drops the sign
    got = pivot_step_rank(rank[order], seq[order], step[order], stored[order], dtype[order])
    frame = pd.DataFrame({"rank": rank, "step": step, "value": value, "seq": seq}).sort_values("seq")
    expected = frame.drop_duplicates(["step", "rank"], keep="last").pivot(index="step", columns="rank", values="value")
    assert got.index.tolist() == expected.index.tolist() and got.columns.tolist() == [2, 3, 4, 6]
    np.testing.assert_array_equal(got.to_numpy(), expected.to_numpy())
    assert got.loc[5 * stride + 10**6, 3] == 99.0 and np.signbit(got.loc[9 * stride + 10**6, 6])
