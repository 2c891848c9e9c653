"""Alembic owns the schema: one head, every revision walks up and down, head equals schema.py."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from click.testing import CliRunner

from multirank_logger.cli import main
from multirank_logger.errors import SchemaOutdated, SchemaTooNew
from multirank_logger.schema import metadata
from multirank_logger.store import Store, _script, head_revision

REPO = Path(__file__).resolve().parent.parent


def _revisions_base_first() -> list[str]:
    return [rev.revision for rev in reversed(list(_script().walk_revisions()))]


def test_exactly_one_head() -> None:
    """The migrations form one line: a single head."""
    assert len(_script().get_heads()) == 1


def test_new_store_is_created_at_head(db_path: Path) -> None:
    """Opening a missing store for writing creates it at the head revision."""
    store = Store(db_path)
    assert store.current_revision() == head_revision()
    store.close()


def test_walk_every_revision_up_and_down(db_path: Path) -> None:
    """Each revision upgrades and downgrades one step at a time on SQLite and DuckDB."""
    store = Store.for_upgrade(db_path)
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
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
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
            if kind and constraint.columns:
                expected_keys.add((table.name, kind, tuple(c.name for c in constraint.columns)))
    assert {(t, k, tuple(cols)) for t, k, cols in keys} == expected_keys


def test_store_behind_head_is_refused(db_path: Path) -> None:
    """A store at an older revision is refused with the upgrade command to run."""
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
    assert f"multirank-logger db upgrade {db_path}" in message


def test_upgrade_command_brings_an_old_store_to_head(db_path: Path) -> None:
    """`multirank-logger db upgrade DB` moves an older store to head; `db current` says so."""
    revisions = _revisions_base_first()
    old = Store.for_upgrade(db_path)
    old.upgrade(revisions[0])
    old.close()
    result = CliRunner().invoke(main, ["db", "upgrade", str(db_path)])
    assert result.exit_code == 0, result.output
    if len(revisions) > 1:
        assert result.output == f"Upgraded {db_path} from {revisions[0]} to {head_revision()} (head).\n"
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
