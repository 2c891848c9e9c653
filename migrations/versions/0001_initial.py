"""Initial schema: runs, ranks and the long metrics table.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False, comment="run id, allocated as max(id) + 1"),
        sa.Column("name", sa.String(255), nullable=False, comment="experiment name (CSVLogger's `name`)"),
        sa.Column("version", sa.Integer, nullable=False, comment="version number within name (version_N)"),
        sa.Column("status", sa.String(16), nullable=False, comment="running | success | failed | interrupted"),
        sa.Column("world_size", sa.Integer, nullable=False, comment="number of ranks in the launch"),
        sa.Column("transport", sa.String(16), nullable=True, comment="how rows reached the store: direct | gather"),
        sa.Column("started_at", sa.Float(53), nullable=False, comment="unix time the run was registered"),
        sa.Column("ended_at", sa.Float(53), nullable=True, comment="unix time rank 0 finalized the run"),
        sa.Column("hparams", sa.Text, nullable=True, comment="hyperparameters as JSON text"),
        sa.UniqueConstraint("name", "version", name="uq_runs_name_version"),
    )
    op.create_table(
        "ranks",
        sa.Column("run_id", sa.Integer, nullable=False),
        sa.Column("rank", sa.Integer, nullable=False, comment="global rank"),
        sa.Column("local_rank", sa.Integer, nullable=True),
        sa.Column("node_rank", sa.Integer, nullable=True),
        sa.Column("host", sa.String(255), nullable=True),
        sa.Column("pid", sa.Integer, nullable=True),
        sa.Column("status", sa.String(16), nullable=False, comment="running | success | failed | interrupted | missing"),
        sa.Column("started_at", sa.Float(53), nullable=False),
        sa.Column("ended_at", sa.Float(53), nullable=True),
        sa.PrimaryKeyConstraint("run_id", "rank", name="pk_ranks"),
    )
    op.create_table(
        "metrics",
        sa.Column("run_id", sa.Integer, nullable=False),
        sa.Column("rank", sa.Integer, nullable=False, comment="global rank that logged the value"),
        sa.Column("seq", sa.BigInteger, nullable=False, comment="the rank's own log-call counter, 0-based"),
        sa.Column("step", sa.BigInteger, nullable=False, comment="step passed to log_metrics"),
        sa.Column("key", sa.String, nullable=False, comment="metric name, prefix included"),
        sa.Column("value", sa.Float(53), nullable=True, comment="NULL when the value was NaN"),
        sa.Column("dtype", sa.SmallInteger, nullable=False, comment="0 float, 1 int, 2 bool, 3 NaN, 4 -0.0"),
        sa.Column("time", sa.Float(53), nullable=False, comment="unix time of the log call"),
    )
    # DuckDB answers range scans from zone maps; ART indexes there only slow bulk inserts
    if op.get_bind().dialect.name != "duckdb":
        op.create_index("ix_metrics_run_rank_step", "metrics", ["run_id", "rank", "step"])
        op.create_index("ix_metrics_run_key", "metrics", ["run_id", "key"])


def downgrade() -> None:
    if op.get_bind().dialect.name != "duckdb":
        op.drop_index("ix_metrics_run_key", table_name="metrics")
        op.drop_index("ix_metrics_run_rank_step", table_name="metrics")
    op.drop_table("metrics")
    op.drop_table("ranks")
    op.drop_table("runs")
