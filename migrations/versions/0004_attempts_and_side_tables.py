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

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# The tables as they were at this revision, written out (not imported from schema.py):
# a later change to schema.py belongs in a later revision, and must not reach back into this one.


def _attempts() -> list[sa.SchemaItem]:
    return [
        sa.Column("run_id", sa.Integer, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False, comment="0 for the first launch; the high bits of its rows' seq"),
        sa.Column("world_size", sa.Integer, nullable=False, comment="number of ranks in this launch"),
        sa.Column("status", sa.String(16), nullable=False, comment="how this launch ended (runs.status values)"),
        sa.Column("started_at", sa.Float(53), nullable=False),
        sa.Column("ended_at", sa.Float(53), nullable=True),
        sa.Column("host", sa.String(255), nullable=True, comment="rank 0's host"),
        sa.Column("job_id", sa.String(255), nullable=True, comment="the scheduler's job id, when one is set"),
        sa.PrimaryKeyConstraint("run_id", "attempt", name="pk_attempts"),
    ]


def _decisions() -> list[sa.SchemaItem]:
    return [
        sa.Column("run_id", sa.Integer, nullable=False),
        sa.Column("rank", sa.Integer, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False, comment="the decision's number: the same on every rank"),
        sa.Column("step", sa.BigInteger, nullable=False, comment="trainer.global_step"),
        sa.Column("epoch", sa.Integer, nullable=True),
        sa.Column("callback", sa.String(255), nullable=False, comment="ModelCheckpoint | EarlyStopping (class name)"),
        sa.Column("monitor", sa.String(255), nullable=True),
        sa.Column("mode", sa.String(16), nullable=True, comment="min | max"),
        sa.Column("value", sa.Float(53), nullable=True, comment="this rank's own monitored value"),
        sa.Column("vote", sa.Boolean, nullable=True, comment="this rank alone would save / stop"),
        sa.Column("decision", sa.Boolean, nullable=True, comment="what the ranks decided together"),
        sa.Column("path", sa.Text, nullable=True, comment="the checkpoint saved, if any"),
        sa.Column("best", sa.Float(53), nullable=True, comment="the callback's best score after the decision"),
        sa.Column("time", sa.Float(53), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "rank", "seq", name="pk_decisions"),
    ]


def _logs() -> list[sa.SchemaItem]:
    return [
        sa.Column("run_id", sa.Integer, nullable=False),
        sa.Column("rank", sa.Integer, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False, comment="the rank's record counter"),
        sa.Column("time", sa.Float(53), nullable=False),
        sa.Column("level", sa.String(16), nullable=False, comment="DEBUG | INFO | WARNING | ERROR | CRITICAL"),
        sa.Column("levelno", sa.Integer, nullable=False),
        sa.Column("logger", sa.String(255), nullable=False, comment="the logging.Logger's name; 'py.warnings' for warnings"),
        sa.Column("message", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("run_id", "rank", "seq", name="pk_logs"),
    ]


def _step_timing() -> list[sa.SchemaItem]:
    return [
        sa.Column("run_id", sa.Integer, nullable=False),
        sa.Column("rank", sa.Integer, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False, comment="the rank's record counter"),
        sa.Column("step", sa.BigInteger, nullable=False, comment="trainer.global_step when the batch started"),
        sa.Column("epoch", sa.Integer, nullable=True),
        sa.Column("batch_idx", sa.BigInteger, nullable=True),
        sa.Column("data_s", sa.Float(53), nullable=True, comment="end of the previous batch to the start of this one"),
        sa.Column("forward_s", sa.Float(53), nullable=True),
        sa.Column("rest_s", sa.Float(53), nullable=True, comment="backward, optimizer and DDP communication"),
        sa.Column("batch_size", sa.BigInteger, nullable=True),
        sa.Column("mem_allocated_peak", sa.BigInteger, nullable=True, comment="CUDA: peak allocated bytes since the last step"),
        sa.Column("mem_reserved_peak", sa.BigInteger, nullable=True, comment="CUDA: peak reserved bytes since the last step"),
        sa.Column("alloc_retries", sa.BigInteger, nullable=True, comment="CUDA: the allocator's retries so far"),
        sa.Column("rss", sa.BigInteger, nullable=True, comment="CPU: the process's resident set, bytes"),
        sa.Column("time", sa.Float(53), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "rank", "seq", name="pk_step_timing"),
    ]


_SIDE_TABLES = {"attempts": _attempts, "decisions": _decisions, "logs": _logs, "step_timing": _step_timing}


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("version_name", sa.String(255), nullable=True, comment="directory of a named version; NULL: version_N"))
        batch.add_column(sa.Column("run_key", sa.String(255), nullable=True, comment="caller's key to resume the run by (a job id)"))
        batch.add_column(sa.Column("values_spilled", sa.BigInteger, nullable=True, comment="values written to spill files instead of the store"))
        batch.add_column(sa.Column("values_lost", sa.BigInteger, nullable=True, comment="values that reached neither the store nor a spill file"))
    bind = op.get_bind()
    if bind.dialect.name in ("duckdb", "postgresql"):
        op.create_index("uq_metrics_row", "metrics", ["run_id", "rank", "seq", "key"], unique=True)
    for name, columns in _SIDE_TABLES.items():
        op.create_table(name, *columns())


def downgrade() -> None:
    for name in reversed(list(_SIDE_TABLES)):
        op.drop_table(name)
    bind = op.get_bind()
    if bind.dialect.name in ("duckdb", "postgresql"):
        op.drop_index("uq_metrics_row", table_name="metrics")
    with op.batch_alter_table("runs") as batch:
        for column in ("values_lost", "values_spilled", "run_key", "version_name"):
            batch.drop_column(column)
