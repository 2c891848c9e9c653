"""Run identity across launches, truthful ends, and the per-rank side tables.

- ``runs.version_name``: the directory name of a named version (CSVLogger's
  ``version="2020-02-05-162402"``); NULL means ``version_{version}``.
- ``runs.run_key``: a key the caller chose to find the run again on resume (a scheduler's
  job id), unique per name when set.
- ``runs.values_spilled`` / ``runs.values_lost``: values that did not reach the store
  (written to spill files / lost), as far as the writers could record it; a run with
  either above 0 is not ``success`` (see ``schema.RUN_STATUSES``).
- ``attempts``: one row per launch of a run (first launch, ``ddp_spawn`` phases, a resume
  after preemption). A row's ``seq`` carries its attempt in its high bits
  (``schema.SEQ_ATTEMPT_SHIFT``), so no launch's rows collide with another's.
- ``metrics``: a unique key on (run_id, rank, seq, key) on DuckDB and PostgreSQL as well
  (SQLite's primary key already is one): a collision is an error, never a silent merge.
- ``decisions``, ``logs``, ``step_timing``: what each rank saw when a checkpoint or
  early-stopping decision was taken, its text log, and where its steps' time went.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from multirank_logger.schema import attempts, decisions, logs, step_timing

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_SIDE_TABLES = (attempts, decisions, logs, step_timing)


def _copy(table: sa.Table) -> list[sa.SchemaItem]:
    """The columns and constraints of a schema.py table, detached for op.create_table."""
    items: list[sa.SchemaItem] = [c._copy() for c in table.columns]
    for constraint in table.constraints:
        if isinstance(constraint, sa.PrimaryKeyConstraint):
            items.append(sa.PrimaryKeyConstraint(*constraint.columns.keys(), name=constraint.name))
    return items


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("version_name", sa.String(255), nullable=True, comment="directory of a named version; NULL: version_N"))
        batch.add_column(sa.Column("run_key", sa.String(255), nullable=True, comment="caller's key to resume the run by (a job id)"))
        batch.add_column(sa.Column("values_spilled", sa.BigInteger, nullable=True, comment="values written to spill files instead of the store"))
        batch.add_column(sa.Column("values_lost", sa.BigInteger, nullable=True, comment="values that reached neither the store nor a spill file"))
    bind = op.get_bind()
    if bind.dialect.name in ("duckdb", "postgresql"):
        op.create_index("uq_metrics_row", "metrics", ["run_id", "rank", "seq", "key"], unique=True)
    for table in _SIDE_TABLES:
        op.create_table(table.name, *_copy(table))


def downgrade() -> None:
    for table in reversed(_SIDE_TABLES):
        op.drop_table(table.name)
    bind = op.get_bind()
    if bind.dialect.name in ("duckdb", "postgresql"):
        op.drop_index("uq_metrics_row", table_name="metrics")
    with op.batch_alter_table("runs") as batch:
        for column in ("values_lost", "values_spilled", "run_key", "version_name"):
            batch.drop_column(column)
