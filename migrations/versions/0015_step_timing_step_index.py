"""``step_timing``: an index on (run_id, step) on SQLite and PostgreSQL.

The TensorBoard export reads StepTimer's rows of each window of steps beside the window's metric
rows (export/tensorboard.py), and the primary key (run_id, rank, seq) cannot serve a range of
steps: every window read all of the run's timing rows, a scan per window, so the export's time
grew with the square of the run's length. With the index each window's read is a range of it.
DuckDB keeps no index here: its zone maps on ``step`` skip the row groups out of the range (the
rows arrive in step order, flush after flush), as they do for ``metrics``.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name in ("sqlite", "postgresql"):
        op.create_index("ix_step_timing_run_step", "step_timing", ["run_id", "step"])


def downgrade() -> None:
    if op.get_bind().dialect.name in ("sqlite", "postgresql"):
        op.drop_index("ix_step_timing_run_step", table_name="step_timing")
