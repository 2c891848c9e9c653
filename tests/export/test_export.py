"""`export --format parquet|tensorboard` read back by clients no one here wrote: DuckDB's
read_parquet, Polars' scan_parquet, pyarrow.dataset, Spark (local mode), TensorBoard's own event
reader; a remote destination through fsspec's memory:// and a local S3 server (moto); and the
reader's Arrow and Polars frames."""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from multirank_logger import open_store
from multirank_logger.cli import main
from multirank_logger.export.destination import public_url
from multirank_logger.export.parquet import export_parquet
from multirank_logger.store.sql_store import Store
from tests.helpers.exported_rows import build_two_runs, comparable_rows, micros, stored_rows
from tests.helpers.launches import free_port
from tests.helpers.logged_calls import store_calls, trainer_calls


def _partitions(db: Path) -> dict[int, str]:
    """Each run's folder in the lake, by run id: ``run_uuid=<its UUID>``."""
    with open_store(db) as reader:
        return {int(i): f"run_uuid={reader.resolve_run(int(i)).uuid}" for i in reader.run_ids()}


def _run_folder(db: Path, run_id: int) -> str:
    """A run's TensorBoard folder under DIR: ``NAME/version_N-<8 hex digits of its UUID>``."""
    with open_store(db) as reader:
        ref = reader.resolve_run(run_id)
    assert ref.uuid is not None
    return f"{ref.label}-{ref.uuid.replace('-', '')[:8]}"


_TEMPLATES: dict[str, Path] = {}


@pytest.fixture
def two_runs(db_path: Path, backend: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run 1: three ranks of trainer_calls (NaN, inf, -0.0, ints, bools, late and odd keys); run 2: one
    rank; run 3: no metric row. Built once per backend, copied per test."""
    if backend not in _TEMPLATES:
        template = build_two_runs(tmp_path_factory.mktemp("export-template") / db_path.name)
        _TEMPLATES[backend] = template
    for suffix in ("", "-wal"):
        source = _TEMPLATES[backend].with_name(db_path.name + suffix)
        if source.exists():
            shutil.copyfile(source, db_path.with_name(db_path.name + suffix))
    return db_path


def test_parquet_dataset_read_back_by_duckdb_polars_pyarrow(two_runs: Path, tmp_path: Path) -> None:
    """Every stored row of every run, once, in each engine's Hive-partitioned read; sorted by key,
    step, rank within each window; side tables beside; run 2 exported again replaces its files."""
    import duckdb
    import polars as pl
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    dest = tmp_path / "lake"
    result = CliRunner().invoke(main, ["export", str(two_runs), "--format", "parquet", "--all-runs", "-o", str(dest)])
    assert result.exit_code == 0, result.output
    assert "run 1" in result.output and "run 2" in result.output and "run 3" in result.output and "zstd" in result.output
    expected = stored_rows(two_runs)
    assert len(expected) > 700

    con = duckdb.connect()
    rel = con.sql(f"SELECT * FROM read_parquet('{dest}/metrics/**/*.parquet', hive_partitioning = true)")
    assert comparable_rows(rel.to_arrow_table().to_pydict()) == expected
    lazy = pl.scan_parquet(f"{dest}/metrics/**/*.parquet", hive_partitioning=True)
    assert comparable_rows(lazy.collect().to_dict(as_series=False)) == expected
    dataset = ds.dataset(dest / "metrics", format="parquet", partitioning="hive")
    assert comparable_rows(dataset.to_table().to_pydict()) == expected
    # a key across ranks and steps reads by the row groups' min/max of key: the rows come sorted so
    for path in (dest / "metrics").rglob("*.parquet"):
        meta = pq.ParquetFile(path).metadata
        assert meta.row_group(0).column(0).compression == "ZSTD"
        keys = pq.read_table(path).column("key").to_pylist()
        assert keys == sorted(keys)  # one window here (a few hundred rows); windows: the next test
    runs = con.sql(f"SELECT run_id, name, world_size FROM read_parquet('{dest}/runs/**/*.parquet', hive_partitioning = true) "
                   "ORDER BY run_id").fetchall()
    assert runs == [(1, "lightning_logs", 3), (2, "second", 1), (3, "empty", 2)]
    partitions = _partitions(two_runs)
    for table in ("metrics", "attempts", "ranks", "decisions", "logs", "step_timing", "alerts", "findings", "verdicts"):
        assert sorted(p.name for p in (dest / table).iterdir()) == sorted(partitions.values())

    # the nightly append: run 2 again (it was running) and any later one; run 1 untouched
    before = sorted(p.name for p in (dest / "metrics" / partitions[1]).iterdir())
    again = CliRunner().invoke(main, ["export", str(two_runs), "--format", "parquet", "--since", "2", "-o", str(dest)])
    assert again.exit_code == 0, again.output
    assert "run 1)" not in again.output
    assert sorted(p.name for p in (dest / "metrics" / partitions[1]).iterdir()) == before
    assert comparable_rows(ds.dataset(dest / "metrics", format="parquet", partitioning="hive").to_table().to_pydict()) == expected
    assert not [p for p in dest.rglob("*") if p.name.startswith(".")]  # no hidden file left


def test_parquet_and_arrow_name_the_run_alike_and_keep_times_as_utc(two_runs: Path, tmp_path: Path) -> None:
    """One naming: the Parquet files and the reader's Arrow and Polars frames call the store's run
    id ``run_id`` (never ``run``); every time is a UTC timestamp to the microsecond, the stored
    unix seconds rounded (read from SQL here, not through the export's own conversion); a lake
    of the old naming is refused, not mixed."""
    import polars as pl
    import pyarrow as pa
    import pyarrow.dataset as ds

    from tests.helpers.logger_helpers import query

    dest = tmp_path / "lake"
    assert CliRunner().invoke(main, ["export", str(two_runs), "--format", "parquet", "--all-runs", "-o", str(dest)]).exit_code == 0
    utc = pa.timestamp("us", tz="UTC")
    metrics = ds.dataset(dest / "metrics", format="parquet", partitioning="hive").to_table()
    with open_store(two_runs) as reader:
        frame = reader.metrics(1, all_attempts=True, frame="arrow")
        polars = reader.metrics(1, all_attempts=True, frame="polars")
    assert "run" not in metrics.column_names and set(metrics.column_names) - {"run_uuid"} <= set(frame.column_names)
    assert metrics.schema.field("time").type == frame.schema.field("time").type == utc
    assert polars.schema["time"] == pl.Datetime("us", "UTC") and "run_id" in polars.columns
    stored = {(r, k, q): round(t * 1e6) for r, k, q, t in query(two_runs, "SELECT rank, key, seq, time FROM metrics WHERE run_id = 1")}
    got = {(r, k, q): micros(t) for r, k, q, t, i in zip(*(metrics.column(c).to_pylist()
                                                           for c in ("rank", "key", "seq", "time", "run_id"))) if i == 1}
    assert got == stored and len(got) > 300
    for table, column in (("runs", "started_at"), ("alerts", "seen_at"), ("step_timing", "time"), ("logs", "time")):
        schema = ds.dataset(dest / table, format="parquet", partitioning="hive").schema
        assert schema.field(column).type == utc and "run_id" in schema.names and "run" not in schema.names, table
    (started,) = query(two_runs, "SELECT started_at FROM runs WHERE id = 1")[0]
    runs = pl.scan_parquet(f"{dest}/runs/**/*.parquet", hive_partitioning=True).filter(pl.col("run_id") == 1).collect()
    assert micros(runs["started_at"][0]) == round(started * 1e6)
    # a lake of the naming before (a `run` column, float times): refused with one line, not mixed
    old = tmp_path / "old-lake"
    (old / "runs" / "run_uuid=0000").mkdir(parents=True)
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"run": pa.array([1], pa.int32()), "started_at": [1.5e9]}), old / "runs" / "run_uuid=0000" / "p.parquet")
    refused = CliRunner().invoke(main, ["export", str(two_runs), "--format", "parquet", "-o", str(old)])
    assert refused.exit_code == 1 and "exported before run_id" in refused.output and "new directory" in refused.output
    assert len(refused.output.strip().splitlines()) <= 2, refused.output


def test_parquet_windows_and_memory_url(two_runs: Path) -> None:
    """Windows of a few steps (memory bounded by the window) give the same rows, each window
    sorted by (key, step, rank, seq); to fsspec's memory:// (a remote filesystem), read back
    by pyarrow and DuckDB through fsspec."""
    import duckdb
    import fsspec
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    url = "memory://exports-test/lake"
    with open_store(two_runs) as reader:
        refs = [reader.resolve_run(1), reader.resolve_run(2)]
        done = export_parquet(reader, refs, url, window_rows=40)
    assert done.destination == url and done.rows[1] + done.rows[2] == len(stored_rows(two_runs))
    fs = fsspec.filesystem("memory")
    try:
        dataset = ds.dataset("/exports-test/lake/metrics", format="parquet", partitioning="hive", filesystem=fs)
        assert comparable_rows(dataset.to_table().to_pydict()) == stored_rows(two_runs)
        con = duckdb.connect()
        con.register_filesystem(fs)
        count = con.sql(f"SELECT count(*) FROM read_parquet('{url}/metrics/**/*.parquet', hive_partitioning = true)")
        assert count.fetchone() == (done.rows[1] + done.rows[2],)
        (path,) = fs.glob(f"/exports-test/lake/metrics/run_uuid={refs[0].uuid}/*.parquet")
        with fs.open(path, "rb") as fp:
            table = pq.read_table(fp)
        rows = list(zip(*(table.column(c).to_pylist() for c in ("step", "key", "rank", "seq"))))
        windows: dict[int, list[Any]] = {}
        for step, key, rank, seq in rows:
            windows.setdefault(len(windows) if not windows else max(windows), []).append((key, step, rank, seq))
        assert len(set(step for step, *_ in rows)) == 60
        # sorted by (key, step, rank, seq) within each run of rows whose steps fall in one window
        starts = [i for i in range(1, len(rows)) if (rows[i][1], rows[i][0], rows[i][2], rows[i][3])
                  < (rows[i - 1][1], rows[i - 1][0], rows[i - 1][2], rows[i - 1][3])]
        assert 2 < len(starts) + 1 <= 20  # several windows of 40 rows' steps
        pieces = [rows[a:b] for a, b in zip([0, *starts], [*starts, len(rows)])]
        assert all(max(p[0] for p in a) < min(p[0] for p in b) for a, b in zip(pieces, pieces[1:]))
    finally:
        fs.rm("/exports-test", recursive=True)


def test_parquet_from_postgresql(postgres_server: Any, tmp_path: Path) -> None:
    """A PostgreSQL store: its windows name the ranks (its index), its rows come as Python values
    (no Arrow from the driver): the same rows and types in the dataset as from a file store."""
    import pyarrow.dataset as ds

    from tests.helpers.stores import new_postgres_database

    url = new_postgres_database(postgres_server)
    store_calls(url, {0: trainer_calls(0), 1: trainer_calls(1)})  # a URL where a path is typed: Store takes either
    with open_store(url) as reader:
        done = export_parquet(reader, [reader.resolve_run(1)], str(tmp_path / "lake"), window_rows=100)
        expected = reader.metrics(1, all_attempts=True, frame="arrow").to_pydict()
    table = ds.dataset(tmp_path / "lake" / "metrics", format="parquet", partitioning="hive").to_table()
    assert comparable_rows(table.to_pydict()) == comparable_rows(expected) and done.rows[1] == len(expected["rank"])
    assert str(table.schema.field("rank").type) == "int32" and str(table.schema.field("dtype").type) == "int16"


@pytest.mark.parametrize("backend", ["duckdb"])  # the destination is under test here, not the store
def test_parquet_to_a_local_s3_server(two_runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """s3:// through s3fs to a real S3 API (moto's server on 127.0.0.1), credentials from the
    environment as on a cluster: every row read back from the bucket; the secret never printed."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        secret = "s3cr3t-" + os.urandom(6).hex()
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDTESTING")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
        import pyarrow.dataset as ds
        import s3fs

        fs = s3fs.S3FileSystem(skip_instance_cache=True)
        fs.mkdir("lake-bucket")
        result = CliRunner().invoke(main, ["export", str(two_runs), "--format", "parquet", "--all-runs", "-o",
                                           "s3://lake-bucket/nightly"])
        assert result.exit_code == 0, result.output
        assert "s3://lake-bucket/nightly" in result.output and secret not in result.output
        fs.invalidate_cache()
        dataset = ds.dataset("lake-bucket/nightly/metrics", format="parquet", partitioning="hive", filesystem=fs)
        assert comparable_rows(dataset.to_table().to_pydict()) == stored_rows(two_runs)
        assert not [p for p in fs.find("lake-bucket") if "/." in p]  # no hidden file left
    finally:
        server.stop()


def test_remote_url_secrets_never_printed(two_runs: Path) -> None:
    """A URL's user, password and query token stay out of every line; a missing filesystem
    package is a clear error."""
    assert public_url("s3://AKIAKEY:s3cr3t@bucket/lake?X-Amz-Signature=abc") == "s3://bucket/lake"
    assert public_url("/local/dir") == "/local/dir"
    result = CliRunner().invoke(main, ["export", str(two_runs), "--format", "parquet", "-o",
                                       "s3://AKIAKEY:s3cr3t@bucket/lake?token=tok123"])
    assert result.exit_code != 0
    for secret in ("s3cr3t", "AKIAKEY", "tok123"):
        assert secret not in result.output
    assert result.output.startswith("Error: Cannot export to s3://bucket/lake"), result.output  # not a traceback
    missing = CliRunner().invoke(main, ["export", str(two_runs), "--format", "parquet", "-o", "gs://me:pw0rd@b/l"])
    assert missing.exit_code == 1 and "gcsfs" in missing.output and "pw0rd" not in missing.output, missing.output
    wrong = CliRunner().invoke(main, ["export", str(two_runs), "--format", "parquet"])
    assert wrong.exit_code == 2 and "-o DIR" in wrong.output
    both = CliRunner().invoke(main, ["export", str(two_runs), "--format", "parquet", "--rank", "1", "-o", "x"])
    assert both.exit_code == 2 and "every rank" in both.output
    csv_runs = CliRunner().invoke(main, ["export", str(two_runs), "--all-runs", "-o", "x"])
    assert csv_runs.exit_code == 2 and "--format parquet or tensorboard" in csv_runs.output


def test_tensorboard_every_rank_every_step(two_runs: Path, tmp_path: Path) -> None:
    """TensorBoard's own event reader finds each rank's every key at every step it logged, in
    rank_K/, and in the run's own events (its one TensorBoard run) the ranks' median, min and max
    per key and step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    out = tmp_path / "tb"
    result = CliRunner().invoke(main, ["export", str(two_runs), "--format", "tensorboard", "--run", "1", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert f"tensorboard --logdir {out}" in result.output
    folder = _run_folder(two_runs, 1)  # one run: its own folder still, never shared with another's
    # the runs TensorBoard lists: the run and its ranks under it, nothing beside them
    listed = EventMultiplexer().AddRunsFromDirectory(str(out))
    assert sorted(listed.Runs()) == [folder, *(f"{folder}/rank_{r}" for r in (0, 1, 2))]
    out = out / folder
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith("events.")) == ["rank_0", "rank_1", "rank_2", "run_uuid"]
    with open_store(two_runs) as reader:
        stored = reader.metrics(1, all_attempts=True)
    for rank in (0, 1, 2):
        acc = EventAccumulator(str(out / f"rank_{rank}"), size_guidance={"scalars": 0})
        acc.Reload()
        mine = stored[stored["rank"] == rank]
        assert sorted(acc.Tags()["scalars"]) == sorted(mine["key"].unique())
        for key, group in mine.groupby("key"):
            events = acc.Scalars(key)
            assert sorted(e.step for e in events) == sorted(group["step"].tolist())
            # TensorBoard keeps a scalar as float32: compared as such
            got = sorted((e.step, e.value) for e in events if not math.isnan(e.value))
            want = sorted((s, float(v)) for s, v in zip(group["step"], group["value"].astype("float32")) if not math.isnan(v))
            assert got == want
    run = EventAccumulator(str(out), size_guidance={"scalars": 0})
    run.Reload()
    keys = set(stored["key"].unique())
    assert set(run.Tags()["scalars"]) == keys | {f"ranks_{s}/{k}" for s in ("min", "max") for k in keys}
    at = {e.step: e.value for e in run.Scalars("rank_value")}
    assert at[5] == pytest.approx(1005.0)  # ranks 0, 1, 2 logged 5, 1005, 2005: the run's line is their median
    assert {e.step: e.value for e in run.Scalars("ranks_max/rank_value")}[5] == pytest.approx(2005.0)
    assert {e.step: e.value for e in run.Scalars("ranks_min/rank_value")}[5] == pytest.approx(5.0)
    # several runs: a folder per run first; one rank's run has no spread (no events of its own)
    every = tmp_path / "tb-all"
    result = CliRunner().invoke(main, ["export", str(two_runs), "--format", "tensorboard", "--all-runs", "-o", str(every)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (every / _run_folder(two_runs, 2)).iterdir()) == ["rank_0", "run_uuid"]
    assert list((every / _run_folder(two_runs, 1)).glob("events.out.tfevents.*"))
    one = EventAccumulator(str(every / _run_folder(two_runs, 2) / "rank_0"), size_guidance={"scalars": 0})
    one.Reload()
    assert sorted(e.step for e in one.Scalars("train_loss")) == list(range(10))


def test_tensorboard_reads_a_windows_timing_rows_by_the_step_index(tmp_path: Path) -> None:
    """On SQLite, each window's read of StepTimer's rows is a search of the (run_id, step) index,
    never a walk of the run's rows: a scan per window made the export quadratic in the run's length."""
    import sqlite3

    from sqlalchemy.dialects import sqlite

    from multirank_logger.export.tensorboard import _timing_select

    db = tmp_path / "run.sqlite"
    store = Store(db)
    runs = [store.create_run(name, world_size=3) for name in ("a", "b")]
    store.close()
    with sqlite3.connect(db) as con:  # two runs' StepTimer rows: 3 ranks x 2,000 steps each
        con.executemany("INSERT INTO step_timing (run_id, rank, seq, step, data_s, time) VALUES (?, ?, ?, ?, 0.1, 1.7e9)",
                        [(run.id, rank, step, step) for run in runs for rank in range(3) for step in range(2_000)])
    for after, upto in ((None, 99), (99, 1_999), (1_999, None)):
        stmt = _timing_select(runs[1], after, upto).compile(dialect=sqlite.dialect(), compile_kwargs={"literal_binds": True})
        with sqlite3.connect(db) as con:
            plan = [row[-1] for row in con.execute(f"EXPLAIN QUERY PLAN {stmt}")]
            assert any("USING INDEX ix_step_timing_run_step" in step for step in plan), plan
            assert not any(step.startswith("SCAN") for step in plan), plan
            found = con.execute(str(stmt)).fetchall()
        low = -1 if after is None else after
        assert sorted(row[:2] for row in found) == [(r, s) for r in range(3) for s in range(low + 1, (upto or 1_999) + 1)]


def test_reader_frames_arrow_and_polars_without_pandas(two_runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """metrics() and per_rank() as a pyarrow Table and a Polars DataFrame equal the pandas frames,
    and are built without a pandas DataFrame on the way (no DataFrame can be made while they are)."""
    import pandas as pd
    import polars as pl
    import pyarrow as pa

    with open_store(two_runs) as reader:
        df = reader.metrics(1)
        with monkeypatch.context() as refused:
            def no_pandas(*args: Any, **kwargs: Any) -> Any:
                raise AssertionError("a copy through pandas")

            refused.setattr(pd.DataFrame, "__init__", no_pandas)
            refused.setattr(pd.DataFrame, "_from_mgr", classmethod(no_pandas))  # Arrow's to_pandas
            with pytest.raises(AssertionError, match="through pandas"):
                pa.table({"a": [1]}).to_pandas()  # the refusal bites
            table = reader.metrics(1, frame="arrow")
            polars_df = reader.metrics(1, frame="polars")
            wide = reader.per_rank("rank_value", 1, frame="arrow")
            wide_polars = reader.per_rank("train_loss", 1, frame="polars")
        grid = reader.per_rank("rank_value", 1)
        assert wide.column_names == ["step", "0", "1", "2"] and wide.column("step").to_pylist() == grid.index.tolist()
        for rank in (0, 1, 2):
            assert wide.column(str(rank)).to_pylist() == grid[rank].tolist()
        assert isinstance(wide_polars, pl.DataFrame) and wide_polars.to_pandas().set_index("step").rename(
            columns=int).rename_axis(columns="rank").equals(reader.per_rank("train_loss", 1))
        with pytest.raises(ValueError, match="frame="):
            reader.metrics(1, frame="numpy")
    assert isinstance(table, pa.Table) and table.column_names == list(df.columns)
    assert table.to_pandas().equals(df)
    assert isinstance(polars_df, pl.DataFrame) and polars_df.to_pandas().equals(df)


def test_device_stats_cuda_memory_in_the_report(tmp_path: Path) -> None:
    """Without StepTimer, DeviceStatsMonitor's per-rank CUDA peak (what it logs on a GPU: torch's
    memory_stats under its prefix) is the report's memory finding, named under that key's chart
    on the page; here the rows a 4-rank GPU run would store, rank 2's peak 3x the others'."""
    from multirank_logger.report import find
    from multirank_logger.report.findings import DEVICE_STATS_PEAK, DEVICE_STATS_RETRIES

    db = tmp_path / "gpu.duckdb"
    gib = 2**30
    per_rank = {rank: [({DEVICE_STATS_PEAK: float((3 if rank == 2 else 1) * gib + step), DEVICE_STATS_RETRIES: 0,
                         "train_loss": 1.0 / (step + 1)}, step) for step in range(20)] for rank in range(4)}
    store_calls(db, per_rank)
    with open_store(db) as reader:
        found = find(reader)
    assert [(m["rank"], m["measure"]) for m in found.memory] == [(2, DEVICE_STATS_PEAK)]
    assert found.memory[0]["ratio"] == pytest.approx(3.0, rel=1e-6)
    assert found.departing_by_series()[DEVICE_STATS_PEAK] == [2]
    assert found.departing(DEVICE_STATS_PEAK) == [2]
