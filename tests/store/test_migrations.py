"""Alembic owns the schema: one head, every revision walks up and down, head equals schema.py."""

from __future__ import annotations

import math
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from click.testing import CliRunner

from multirank_logger._version import __version__
from multirank_logger.cli import main
from multirank_logger.errors import SchemaOutdated, SchemaTooNew, StoreError
from multirank_logger.rows.schema import metadata
from multirank_logger.store.backends import public_name
from multirank_logger.store.sql_store import SCHEMA_HEAD, Store, _script, head_revision

REPO = Path(__file__).resolve().parents[2]


def _created_on(item: object, dialect: str) -> bool:
    """Whether schema.py creates this index or constraint on `dialect` (its ``ddl_if``).

    Alembic's compare does not read ``ddl_if``; SQLAlchemy keeps it in ``_ddl_if``.
    """
    condition = getattr(item, "_ddl_if", None)
    if condition is None or condition.dialect is None:
        return True
    wanted = condition.dialect
    return dialect == wanted if isinstance(wanted, str) else dialect in wanted


def _revisions_base_first() -> list[str]:
    return [rev.revision for rev in reversed(list(_script().walk_revisions()))]


def test_exactly_one_head() -> None:
    """The migrations form one line: a single head."""
    assert len(_script().get_heads()) == 1


def test_the_codes_schema_head_is_the_newest_migration() -> None:
    """``SCHEMA_HEAD`` (what opening a store checks, without Alembic) names migrations' head: a new
    migration must move it, or every store would be refused or left behind."""
    assert _script().get_current_head() == SCHEMA_HEAD == head_revision()


def test_new_store_is_created_at_head(db_path: Path) -> None:
    """Opening a missing store for writing creates it at the head revision."""
    store = Store(db_path)
    assert store.current_revision() == head_revision()
    store.close()


def test_walk_every_revision_up_and_down(any_db: str) -> None:
    """Each revision upgrades and downgrades one step at a time on SQLite and DuckDB."""
    store = Store.for_upgrade(any_db)
    revisions = _revisions_base_first()
    for rev in revisions:
        store.upgrade(rev)
        assert store.current_revision() == rev
    for previous in [*reversed(revisions[:-1]), "base"]:
        store.downgrade(previous)
        assert store.current_revision() == (None if previous == "base" else previous)
    with store.begin() as conn:
        assert set(sa.inspect(conn).get_table_names()) <= {"alembic_version"}
    store.close()


def test_schema_at_head_equals_metadata_sqlite(tmp_path: Path) -> None:
    """On SQLite, upgrading to head gives exactly the tables, columns and indexes of schema.py."""
    store = Store(tmp_path / "runs.sqlite")
    with store.begin() as conn:
        ctx = MigrationContext.configure(
            conn,
            opts={
                "compare_type": True,
                # indexes schema.py makes on other backends only
                "include_object": lambda obj, name, kind, reflected, compare_to: reflected
                or _created_on(obj, "sqlite"),
            },
        )
        diff = compare_metadata(ctx, metadata)
    store.close()
    assert diff == []


def _duckdb_type(sql_type: str) -> str:
    # DuckDB's catalog spells the types it stores, not the ones we declared
    base = sql_type.split("(")[0]
    return {"FLOAT": "DOUBLE", "TEXT": "VARCHAR"}.get(base, base)


def test_schema_at_head_equals_metadata_duckdb(tmp_path: Path) -> None:
    """On DuckDB, head has schema.py's columns, types, nullability and keys.

    Alembic's compare_metadata cannot reflect DuckDB constraints (duckdb-engine queries
    pg_catalog casts DuckDB lacks), so this reads DuckDB's own catalog instead.
    """
    store = Store(tmp_path / "runs.duckdb")
    with store.begin() as conn:
        columns = conn.exec_driver_sql(
            "SELECT table_name, column_name, is_nullable = 'YES', data_type FROM information_schema.columns "
            "WHERE table_name <> 'alembic_version' ORDER BY table_name, ordinal_position"
        ).fetchall()
        keys = conn.exec_driver_sql(
            "SELECT table_name, constraint_type, constraint_column_names FROM duckdb_constraints() "
            "WHERE constraint_type IN ('PRIMARY KEY', 'UNIQUE') AND table_name <> 'alembic_version'"
        ).fetchall()
        expected_columns = [
            (t.name, c.name, c.nullable, _duckdb_type(c.type.compile(dialect=conn.dialect)))
            for t in sorted(metadata.sorted_tables, key=lambda t: t.name)
            for c in t.columns
        ]
    store.close()
    assert [tuple(row) for row in columns] == expected_columns
    expected_keys = set()
    for table in metadata.tables.values():
        for constraint in table.constraints:
            kind = {sa.PrimaryKeyConstraint: "PRIMARY KEY", sa.UniqueConstraint: "UNIQUE"}.get(type(constraint))
            if kind and constraint.columns and _created_on(constraint, "duckdb"):
                expected_keys.add((table.name, kind, tuple(c.name for c in constraint.columns)))
    assert {(t, k, tuple(cols)) for t, k, cols in keys} == expected_keys


def test_store_behind_head_is_refused(any_db: str) -> None:
    """A store at an older revision is refused with the upgrade command to run."""
    db_path = any_db
    revisions = _revisions_base_first()
    if len(revisions) < 2:
        pytest.skip("only one revision exists: no older schema to refuse yet")
    old = Store.for_upgrade(db_path)
    old.upgrade(revisions[-2])
    old.close()
    with pytest.raises(SchemaOutdated) as info:
        Store(db_path)
    message = str(info.value)
    assert f"is at schema {revisions[-2]}" in message
    assert f"needs {head_revision()}" in message
    # the command names the store without its password (an empty one included)
    assert f"multirank-logger db upgrade {public_name(db_path)}" in message


def test_upgrade_command_brings_an_old_store_to_head(db_path: Path) -> None:
    """`multirank-logger db upgrade DB` moves an older store to head; `db current` says so."""
    revisions = _revisions_base_first()
    old = Store.for_upgrade(db_path)
    old.upgrade(revisions[0])
    old.close()
    result = CliRunner().invoke(main, ["db", "upgrade", str(db_path)])
    assert result.exit_code == 0, result.output
    if len(revisions) > 1:
        assert result.output == f"Upgraded {public_name(db_path)} from {revisions[0]} to {head_revision()} (head).\n"
    result = CliRunner().invoke(main, ["db", "current", str(db_path)])
    assert result.exit_code == 0
    assert result.output == f"{head_revision()} (head)\n"
    Store(db_path).close()  # the schema check passes now


def test_store_ahead_of_code_is_refused(db_path: Path) -> None:
    """A store written by a newer version (unknown revision) is refused."""
    Store(db_path).close()
    raw = Store.for_upgrade(db_path)
    with raw.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = 'f00dfeed'"))
    raw.close()
    with pytest.raises(SchemaTooNew, match="is at schema f00dfeed.*written by a newer version"):
        Store(db_path)


def test_upgrade_of_a_newer_store_is_one_clear_error(db_path: Path) -> None:
    """`db upgrade` of a store a newer version wrote: one `Error:` line saying so and to upgrade
    the package, the store unchanged (it was Alembic's 36-frame traceback); `db current` says so too."""
    Store(db_path).close()
    raw = Store.for_upgrade(db_path)
    with raw.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = 'f00dfeed'"))
    raw.close()
    result = CliRunner().invoke(main, ["db", "upgrade", str(db_path)])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert result.output == (f"Error: Store {public_name(db_path)} is at schema f00dfeed, which multirank_logger "
                             f"{__version__} does not know: it was written by a newer version. "
                             "Upgrade the package (from an up-to-date clone: pip install -U ./multirank-logger)\n")
    result = CliRunner().invoke(main, ["db", "current", str(db_path)])
    assert result.output == f"f00dfeed (unknown to multirank_logger {__version__}: written by a newer version)\n"
    raw = Store.for_upgrade(db_path, newer_ok=True)
    assert raw.current_revision() == "f00dfeed"
    raw.close()


def test_wheel_ships_the_migrations(tmp_path: Path) -> None:
    """A pip-installed copy can still upgrade a store: migrations/ is inside the wheel."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(REPO)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("multirank_logger-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "multirank_logger/migrations/env.py" in names
    for script in (REPO / "migrations" / "versions").glob("*.py"):
        assert f"multirank_logger/migrations/versions/{script.name}" in names


def test_sqlite_metrics_is_clustered_on_its_key(tmp_path: Path) -> None:
    """On SQLite, head's metrics is a WITHOUT ROWID table keyed (run_id, key, rank, seq), no other index."""
    store = Store(tmp_path / "runs.sqlite")
    with store.begin() as conn:
        ddl = conn.exec_driver_sql("SELECT sql FROM sqlite_master WHERE name = 'metrics'").scalar_one()
        inspector = sa.inspect(conn)
        key = inspector.get_pk_constraint("metrics")["constrained_columns"]
        indexes = inspector.get_indexes("metrics")
    store.close()
    assert ddl.rstrip().endswith("WITHOUT ROWID")
    assert key == ["run_id", "key", "rank", "seq"]
    assert indexes == []


# rows as the 0002 schema holds them: (run_id, rank, seq, step, key, value, dtype, time)
_OLD_ROWS = [
    (1, rank, seq, seq * 10, key, None if math.isnan(value) else value, 3 if math.isnan(value) else 0, 1.7e9 + seq)
    for rank in (1, 0)
    for seq in range(3)
    for key, value in (("loss", 0.5 + seq + rank), ("épsilon 'q'", float("nan")), ("acc", 1.0 / (seq + 1)))
] + [(2, 0, 0, 0, "loss", 7.0, 1, 1.8e9)]


def _all_rows(store: Store) -> list[tuple]:
    with store.begin() as conn:
        rows = conn.exec_driver_sql("SELECT run_id, rank, seq, step, key, value, dtype, time FROM metrics").all()
    return sorted((tuple(r) for r in rows), key=repr)


def test_sqlite_rows_survive_the_clustering_migration_both_ways(tmp_path: Path) -> None:
    """0002 -> 0003 -> 0002 on SQLite keeps every row as it was, and restores the old indexes."""
    store = Store.for_upgrade(tmp_path / "runs.sqlite")
    store.upgrade("0002")
    with store.begin() as conn:
        conn.exec_driver_sql("INSERT INTO metrics VALUES (?, ?, ?, ?, ?, ?, ?, ?)", _OLD_ROWS)
    expected = sorted((tuple(r) for r in _OLD_ROWS), key=repr)
    store.upgrade("0003")
    assert _all_rows(store) == expected
    store.downgrade("0002")
    assert _all_rows(store) == expected
    with store.begin() as conn:
        names = {ix["name"] for ix in sa.inspect(conn).get_indexes("metrics")}
    store.close()
    assert names == {"ix_metrics_run_rank_step", "ix_metrics_run_key"}


def test_sqlite_upgrade_refuses_two_values_of_one_key_in_one_call(tmp_path: Path) -> None:
    """Rows the new key cannot hold stop the upgrade with what to delete; the store stays at 0002, whole."""
    store = Store.for_upgrade(tmp_path / "runs.sqlite")
    store.upgrade("0002")
    duplicate = [(1, 0, 5, 5, "1", 1.0, 1, 1.7e9), (1, 0, 5, 5, "1", 2.0, 0, 1.7e9)]
    with store.begin() as conn:
        conn.exec_driver_sql("INSERT INTO metrics VALUES (?, ?, ?, ?, ?, ?, ?, ?)", duplicate)
    with pytest.raises(StoreError, match=r"run 1 holds 2 values for key '1' in one log call \(rank 0, seq 5\)"):
        store.upgrade("0003")
    # the command says it in one line
    result = CliRunner().invoke(main, ["db", "upgrade", str(tmp_path / "runs.sqlite")])
    assert result.exit_code == 1 and result.output.startswith("Error: Cannot upgrade: run 1 holds 2 values")
    assert store.current_revision() == "0002"
    assert _all_rows(store) == sorted(duplicate, key=repr)
    store.close()


def test_duckdb_metrics_has_no_index_and_the_upgrade_keeps_rows_once(tmp_path: Path) -> None:
    """0006 drops DuckDB's unique index over every metric row (most of the store's bytes) and
    covers the stored rows with seq spans: a batch written again after the upgrade adds nothing."""
    import pyarrow as pa

    from multirank_logger.rows.batch import arrow_schema
    from multirank_logger.rows.schema import metrics

    db = tmp_path / "runs.duckdb"
    store = Store(db)
    store.downgrade("0005")
    with store.begin() as conn:  # a run as that schema holds it (no run_uuid yet)
        conn.exec_driver_sql("INSERT INTO runs (id, name, version, status, world_size, started_at) VALUES (1, 'exp', 0, 'running', 2, 0)")
    rows = {"run_id": [1] * 4, "rank": [0, 0, 1, 1], "seq": [0, 1, 0, 1], "step": [0, 1, 0, 1],
            "key": ["a"] * 4, "value": [1.0, 2.0, 3.0, 4.0], "dtype": [0] * 4, "time": [0.0] * 4}
    batch = pa.RecordBatch.from_pydict(rows, schema=arrow_schema(metrics))
    with store.begin() as conn:
        store.backend.insert_metrics(conn, metrics, batch)
        assert conn.exec_driver_sql("SELECT count(*) FROM duckdb_indexes() WHERE table_name = 'metrics'").scalar() == 1
    store.upgrade()
    assert store.write(batch) == 0 and store.write(batch.slice(2)) == 0
    with store.begin() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM duckdb_indexes() WHERE table_name = 'metrics'").scalar() == 0
        assert conn.exec_driver_sql("SELECT count(*) FROM metrics").scalar() == 4
        assert conn.exec_driver_sql("SELECT rank, first_seq, last_seq FROM metric_spans ORDER BY rank").fetchall() == [
            (0, 0, 1), (1, 0, 1)
        ]
    store.close()


def test_upgrade_gives_every_existing_run_its_own_uuid(db_path: Path) -> None:
    """0007: runs stored before it each get a distinct UUID, and new runs get one too."""
    import uuid

    store = Store(db_path)
    store.downgrade("0006")
    with store.begin() as conn:  # runs as that schema holds them (no run_uuid yet)
        for run_id in (1, 2):
            conn.exec_driver_sql(
                "INSERT INTO runs (id, name, version, status, world_size, started_at) "
                f"VALUES ({run_id}, 'exp', {run_id - 1}, 'success', 1, 0)"
            )
    store.upgrade()
    third = store.create_run("exp")
    with store.begin() as conn:
        uuids = [row[0] for row in conn.exec_driver_sql("SELECT run_uuid FROM runs ORDER BY id")]
    store.close()
    assert len(uuids) == 3 and len(set(uuids)) == 3
    assert all(str(uuid.UUID(u)) == u for u in uuids)
    assert third.uuid == uuids[2]
