"""``step_summaries``: per (run, rank, key, bucket of 16 steps), what the rows hold, kept at ingest.

The page's first render of a key read every row of the key (5.12M at 256 ranks x 20,000 steps,
25.6M at 1,024 x 25,000) and the runs list every row of the store. Every insert of metric rows
now adds the summaries of the rows it inserted (store/step_summaries.py): counts, sum, min, max,
NaN/inf counts, a mask of the steps logged and the latest time, as partial aggregates that a
reader merges (SUM, MIN, MAX, OR). The upgrade summarizes the rows already stored, in one
``INSERT ... SELECT ... GROUP BY`` (a scan of the metrics table); the downgrade drops the table.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_S = 16  # SUMMARY_STEPS at this revision
_MAX = "1.7976931348623157e+308"  # the largest finite double: past it, +inf
_FINITE = f"(value IS NOT NULL AND value <= {_MAX} AND value >= -{_MAX})"


def upgrade() -> None:
    # written out, not imported from schema.py: a later change there belongs in a later revision
    op.create_table(
        "step_summaries",
        sa.Column("run_id", sa.Integer, nullable=False),
        sa.Column("rank", sa.Integer, nullable=False, comment="global rank that logged the values"),
        sa.Column("key", sa.String, nullable=False, comment="metric name, prefix included"),
        sa.Column("step", sa.BigInteger, nullable=False, comment="the bucket's first step: a multiple of SUMMARY_STEPS"),
        sa.Column("steps_mask", sa.Integer, nullable=False, comment="bit i: a row at step `step + i`"),
        sa.Column("n_finite", sa.BigInteger, nullable=False, comment="finite values"),
        sa.Column("total", sa.Float(53), nullable=False, comment="sum of the finite values (0 when none)"),
        sa.Column("lo", sa.Float(53), nullable=True, comment="least finite value; NULL when none"),
        sa.Column("hi", sa.Float(53), nullable=True, comment="greatest finite value; NULL when none"),
        sa.Column("n_nan", sa.BigInteger, nullable=False, comment="NaN values (stored as NULL)"),
        sa.Column("n_pos_inf", sa.BigInteger, nullable=False, comment="+inf values"),
        sa.Column("n_neg_inf", sa.BigInteger, nullable=False, comment="-inf values"),
        sa.Column("last_time", sa.Float(53), nullable=False, comment="latest unix time of a log call among the rows"),
    )
    if op.get_bind().dialect.name in ("sqlite", "postgresql"):
        op.create_index("ix_step_summaries_run_key", "step_summaries", ["run_id", "key"])
    # the rows already stored; the mask: the OR of the distinct steps' bits (BIT_OR, or on SQLite,
    # which has none, their SUM: 3.7x BIT_OR's time on DuckDB), and ((step % S) + S) % S the step's
    # place in its bucket also below 0 (% truncates on every engine)
    bit = "1 << CAST(step - b AS INTEGER)"
    mask = f"SUM(DISTINCT {bit})" if op.get_bind().dialect.name == "sqlite" else f"BIT_OR({bit})"
    op.execute(
        "INSERT INTO step_summaries (run_id, rank, key, step, steps_mask, n_finite, total, lo, hi, "
        "n_nan, n_pos_inf, n_neg_inf, last_time) "
        f"SELECT run_id, rank, key, b, CAST({mask} AS INTEGER), "
        f"SUM(CASE WHEN {_FINITE} THEN 1 ELSE 0 END), SUM(CASE WHEN {_FINITE} THEN value ELSE 0.0 END), "
        f"MIN(CASE WHEN {_FINITE} THEN value END), MAX(CASE WHEN {_FINITE} THEN value END), "
        "SUM(CASE WHEN value IS NULL THEN 1 ELSE 0 END), "
        f"SUM(CASE WHEN value > {_MAX} THEN 1 ELSE 0 END), SUM(CASE WHEN value < -{_MAX} THEN 1 ELSE 0 END), MAX(time) "
        f"FROM (SELECT run_id, rank, key, step, value, time, step - ((step % {_S}) + {_S}) % {_S} AS b "
        "FROM metrics) AS m GROUP BY run_id, rank, key, b"
    )


def downgrade() -> None:
    if op.get_bind().dialect.name in ("sqlite", "postgresql"):
        op.drop_index("ix_step_summaries_run_key", table_name="step_summaries")
    op.drop_table("step_summaries")
