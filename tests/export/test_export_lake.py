"""One Parquet lake and one TensorBoard directory shared by many stores and jobs (issue 48): runs
keyed by their UUID, so two stores' run 1 never meet; a re-export replaces exactly its run.

Real store files, real exports through the command, read back by DuckDB with Hive partitioning
and by TensorBoard's own event reader."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from multirank_logger import open_store
from multirank_logger.cli import main
from multirank_logger.export.parquet import export_parquet
from multirank_logger.export.run_identity import legacy_uuid, run_identity
from tests.helpers.logged_calls import store_calls, trainer_calls

TABLES = ("metrics", "runs", "attempts", "ranks", "decisions", "logs", "step_timing", "alerts", "findings", "verdicts")


def _export(db: Path, *args: str) -> str:
    result = CliRunner().invoke(main, ["export", str(db), *args])
    assert result.exit_code == 0, result.output
    return result.output


def _store(path: Path, ranks: int, steps: int) -> Path:
    """A store of one run, lightning_logs/version_0 (run id 1): what every new store holds."""
    store_calls(path, {rank: trainer_calls(rank, steps) for rank in range(ranks)})
    return path


def _uuid(db: Path, run_id: int = 1) -> str:
    with open_store(db) as reader:
        found = reader.resolve_run(run_id).uuid
    assert found is not None
    return found


def _stored_rows(db: Path, run_id: int = 1) -> int:
    with open_store(db) as reader:
        return len(reader.metrics(run_id, all_attempts=True))


def _lake_counts(lake: Path) -> dict[str, int]:
    """Metric rows per run UUID, as DuckDB reads the lake with Hive partitioning."""
    import duckdb

    rows = duckdb.sql(f"SELECT run_uuid, count(*) FROM read_parquet('{lake}/metrics/**/*.parquet', hive_partitioning = true) "
                      "GROUP BY run_uuid").fetchall()
    return {str(u): int(n) for u, n in rows}


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_two_stores_run_1_share_a_lake(tmp_path: Path) -> None:
    """Store A's run 1 and store B's run 1 (same id, same label, different UUIDs) in one lake:
    both there, each under its UUID in every table, read by DuckDB, Polars and pyarrow; B
    exported again replaces B's files only (row count unchanged, A's files byte for byte)."""
    import duckdb
    import polars as pl
    import pyarrow.dataset as ds

    a = _store(tmp_path / "a.duckdb", ranks=3, steps=40)
    b = _store(tmp_path / "b.duckdb", ranks=2, steps=25)
    lake = tmp_path / "lake"
    _export(a, "--format", "parquet", "-o", str(lake))
    _export(b, "--format", "parquet", "-o", str(lake))
    uuid_a, uuid_b = _uuid(a), _uuid(b)
    assert uuid_a != uuid_b
    assert _lake_counts(lake) == {uuid_a: _stored_rows(a), uuid_b: _stored_rows(b)}
    for table in TABLES:
        assert sorted(p.name for p in (lake / table).iterdir()) == sorted([f"run_uuid={uuid_a}", f"run_uuid={uuid_b}"])
    # the lake's runs merge by UUID: one row each, the store's id kept as `run_id` for joins within a store
    runs = duckdb.sql(f"SELECT run_uuid, run_id, name, world_size FROM read_parquet('{lake}/runs/**/*.parquet', "
                      "hive_partitioning = true) ORDER BY world_size").fetchall()
    assert runs == [(uuid_b, 1, "lightning_logs", 2), (uuid_a, 1, "lightning_logs", 3)]
    # Polars and pyarrow find the same runs under the same partition key
    lazy = pl.scan_parquet(f"{lake}/metrics/**/*.parquet", hive_partitioning=True)
    assert dict(lazy.group_by("run_uuid").len().collect().iter_rows()) == _lake_counts(lake)
    table = ds.dataset(lake / "metrics", format="parquet", partitioning="hive").to_table(columns=["run_uuid"])
    assert {u: table.column("run_uuid").to_pylist().count(u) for u in (uuid_a, uuid_b)} == _lake_counts(lake)
    ranks = duckdb.sql(f"SELECT run_uuid, count(*) FROM read_parquet('{lake}/ranks/**/*.parquet', hive_partitioning = true) "
                       "GROUP BY run_uuid").fetchall()
    assert dict(ranks) == {uuid_a: 3, uuid_b: 2} or not ranks  # registered ranks, when the store has them

    a_before = {table: _files(lake / table / f"run_uuid={uuid_a}") for table in TABLES}
    b_before = _files(lake / "metrics" / f"run_uuid={uuid_b}")
    _export(b, "--format", "parquet", "--since", "1", "-o", str(lake))
    assert _lake_counts(lake) == {uuid_a: _stored_rows(a), uuid_b: _stored_rows(b)}  # replaced, not doubled
    assert {table: _files(lake / table / f"run_uuid={uuid_a}") for table in TABLES} == a_before
    b_after = _files(lake / "metrics" / f"run_uuid={uuid_b}")
    assert len(b_after) == len(b_before) and not set(b_after) & set(b_before)  # new files, the old ones gone
    assert not [p for p in lake.rglob("*") if p.name.startswith(".")]  # nothing hidden left


def test_a_store_made_again_keeps_the_first_ones_rows(tmp_path: Path) -> None:
    """A store deleted and made again (its run 1 a new run, a new UUID) exported with --since 1
    into the same lake: the first store's run 1 stays, the new one is added beside it."""
    path = tmp_path / "runs.duckdb"
    lake = tmp_path / "lake"
    _store(path, ranks=2, steps=30)
    first, first_rows = _uuid(path), _stored_rows(path)
    _export(path, "--format", "parquet", "--since", "1", "-o", str(lake))
    for leftover in tmp_path.glob("runs.duckdb*"):
        leftover.unlink()
    _store(path, ranks=1, steps=12)
    _export(path, "--format", "parquet", "--since", "1", "-o", str(lake))
    assert _lake_counts(lake) == {first: first_rows, _uuid(path): _stored_rows(path)}


def test_a_run_without_uuid_has_one_stable_folder(tmp_path: Path) -> None:
    """A run whose row has no run_uuid (from before UUIDs) is filed under a UUID derived from
    its row: the same at every export (a re-export replaces it), another store's run 1 apart."""
    a = _store(tmp_path / "a.sqlite", ranks=2, steps=20)
    b = _store(tmp_path / "b.sqlite", ranks=1, steps=10)
    for db in (a, b):
        with sqlite3.connect(db) as con:
            con.execute("UPDATE runs SET run_uuid = NULL")
    lake = tmp_path / "lake"
    for db in (a, b, a):
        _export(db, "--format", "parquet", "-o", str(lake))
    with open_store(a) as reader:
        ref_a = reader.resolve_run(1)
    with open_store(b) as reader:
        ref_b = reader.resolve_run(1)
    assert ref_a.uuid is None and run_identity(ref_a) == legacy_uuid(ref_a) == legacy_uuid(ref_a)
    assert _lake_counts(lake) == {legacy_uuid(ref_a): _stored_rows(a), legacy_uuid(ref_b): _stored_rows(b)}


def test_a_lake_of_the_old_layout_is_refused(tmp_path: Path) -> None:
    """A lake written before UUIDs (runs/run=1/) is not mixed with run_uuid= folders (two
    partition keys break every reader): one Error line, nothing written."""
    db = _store(tmp_path / "a.duckdb", ranks=1, steps=5)
    lake = tmp_path / "lake"
    (lake / "runs" / "run=1").mkdir(parents=True)
    result = CliRunner().invoke(main, ["export", str(db), "--format", "parquet", "-o", str(lake)])
    assert result.exit_code == 1 and result.output.startswith("Error: Cannot export to"), result.output
    assert "run=1" in result.output and "Traceback" not in result.output
    assert sorted(p.name for p in lake.iterdir()) == ["runs"]


def test_a_failed_re_export_leaves_the_run_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """New files first, old ones removed last: an export that fails midway leaves the earlier
    export of the run whole, and nothing hidden."""
    import multirank_logger.export.parquet as parquet

    db = _store(tmp_path / "a.duckdb", ranks=2, steps=30)
    lake = tmp_path / "lake"
    _export(db, "--format", "parquet", "-o", str(lake))
    before = _files(lake)

    def failing(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(parquet, "_write_file", failing)
    with open_store(db) as reader, pytest.raises(OSError):
        export_parquet(reader, [reader.resolve_run(1)], str(lake))
    monkeypatch.undo()
    assert _files(lake) == before  # the metric files it had written removed again: the run not doubled
    assert not [p for p in lake.rglob("*") if p.name.startswith(".")]
    _export(db, "--format", "parquet", "-o", str(lake))  # the next export replaces both
    assert _lake_counts(lake) == {_uuid(db): _stored_rows(db)}


def _points(folder: Path) -> int:
    """Every scalar point under `folder`'s event directories, read by TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    total = 0
    for events in sorted({p.parent for p in folder.rglob("events.out.tfevents*")}):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        total += sum(len(acc.Scalars(tag)) for tag in acc.Tags()["scalars"])
    return total


def test_tensorboard_runs_that_clean_alike_get_a_folder_each(tmp_path: Path) -> None:
    """Two runs named '.hidden' and '_hidden' (both clean to the folder '_hidden') and two
    stores' lightning_logs/version_0 in one directory: a folder each, named with the run's
    short UUID; each holds its own run's points only."""
    db = tmp_path / "runs.duckdb"
    store_calls(db, {0: trainer_calls(0, 10)}, name=".hidden")
    store_calls(db, {0: trainer_calls(0, 20), 1: trainer_calls(1, 20)}, name="_hidden")
    other = _store(tmp_path / "other.duckdb", ranks=1, steps=15)
    store_calls(db, {0: trainer_calls(0, 5)})  # lightning_logs/version_0 in this store too
    tb = tmp_path / "tb"
    _export(db, "--format", "tensorboard", "--all-runs", "-o", str(tb))
    _export(other, "--format", "tensorboard", "-o", str(tb))
    hidden = sorted(p.name for p in (tb / "_hidden").iterdir())
    assert len(hidden) == 2 and all(name.startswith("version_0-") for name in hidden), hidden
    assert len(list((tb / "lightning_logs").iterdir())) == 2
    with open_store(db) as reader:
        refs = [reader.resolve_run(i) for i in reader.run_ids()]
    with open_store(other) as reader:
        refs.append(reader.resolve_run(1))
    folders = {p.parent for p in tb.rglob("run_uuid")}
    assert {(f / "run_uuid").read_text().strip() for f in folders} == {r.uuid for r in refs}
    for folder in folders:
        mine = next(r for r in refs if r.uuid == (folder / "run_uuid").read_text().strip())
        assert folder.name == f"version_0-{run_identity(mine).replace('-', '')[:8]}"
        assert _points(folder / "rank_0") > 0
    assert not [p for p in tb.rglob("*") if p.name.startswith(".")]


def test_tensorboard_re_export_replaces(tmp_path: Path) -> None:
    """A run exported twice into one directory has the points it had once (not twice), in
    one folder; a folder of its name that holds something else is left alone."""
    db = _store(tmp_path / "a.duckdb", ranks=2, steps=30)
    tb = tmp_path / "tb"
    _export(db, "--format", "tensorboard", "-o", str(tb))
    once = _points(tb)
    assert once > 0
    _export(db, "--format", "tensorboard", "-o", str(tb))
    assert _points(tb) == once
    (folder,) = (tb / "lightning_logs").iterdir()
    # a folder of the run's short name that holds something else: kept, the run goes beside it
    (folder / "run_uuid").write_text("someone else's\n")
    before = _files(folder)
    out = _export(db, "--format", "tensorboard", "-o", str(tb))
    assert _files(folder) == before
    whole = folder.with_name(f"version_0-{_uuid(db)}")
    assert str(whole) in out and _points(whole) == once


