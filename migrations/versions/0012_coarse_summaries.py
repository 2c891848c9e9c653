"""``coarse_summaries``: the step summaries per 64 steps, kept beside the 16-step ones.

The page's buckets of a long run read the key's summaries: at 1,024 ranks x 100,000 steps a
page bucket is 64 steps, four 16-step summaries of each rank, and the read grew with the run's
length (2.1-3.3 s for the first key at 1B rows). Every insert of metric rows now also keeps their
summaries per 64 steps (store/step_summaries.coarse_batch), the same columns, the mask one bit
per 16 steps. The upgrade makes them from the 16-step summaries already stored (one
``INSERT ... SELECT ... GROUP BY`` over ``step_summaries``, not over the rows); the downgrade
drops the table.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_S, _C = 16, 64  # SUMMARY_STEPS and COARSE_STEPS at this revision


def upgrade() -> None:
    # written out, not imported from schema.py: a later change there belongs in a later revision
    op.create_table(
        "coarse_summaries",
        sa.Column("run_id", sa.Integer, nullable=False),
        sa.Column("rank", sa.Integer, nullable=False, comment="global rank that logged the values"),
        sa.Column("key", sa.String, nullable=False, comment="metric name, prefix included"),
        sa.Column("step", sa.BigInteger, nullable=False, comment="the bucket's first step: a multiple of COARSE_STEPS"),
        sa.Column("steps_mask", sa.Integer, nullable=False, comment="bit i: a row in steps `step + 16 i` .. `step + 16 i + 15`"),
        sa.Column("n_finite", sa.BigInteger, nullable=False, comment="finite values"),
        sa.Column("total", sa.Float(53), nullable=False, comment="sum of the finite values (0 when none)"),
        sa.Column("lo", sa.Float(53), nullable=True, comment="least finite value; NULL when none"),
        sa.Column("hi", sa.Float(53), nullable=True, comment="greatest finite value; NULL when none"),
        sa.Column("n_nan", sa.BigInteger, nullable=False, comment="NaN values (stored as NULL)"),
        sa.Column("n_pos_inf", sa.BigInteger, nullable=False, comment="+inf values"),
        sa.Column("n_neg_inf", sa.BigInteger, nullable=False, comment="-inf values"),
        sa.Column("last_time", sa.Float(53), nullable=False, comment="latest unix time of a log call among the rows"),
    )
    dialect = op.get_bind().dialect.name
    if dialect in ("sqlite", "postgresql"):
        op.create_index("ix_coarse_summaries_run_key", "coarse_summaries", ["run_id", "key"])
    # from the 16-step summaries (1/16 of the rows): each one's bit is its 16 steps' place in the
    # 64; the bits ORed (SQLite has no BIT_OR: the SUM of the distinct bits), ((step % C) + C) % C
    # the place also below 0 (% truncates on every engine)
    bit = f"1 << CAST((step - b) / {_S} AS INTEGER)"
    mask = f"SUM(DISTINCT {bit})" if dialect == "sqlite" else f"BIT_OR({bit})"
    op.execute(
        "INSERT INTO coarse_summaries (run_id, rank, key, step, steps_mask, n_finite, total, lo, hi, "
        "n_nan, n_pos_inf, n_neg_inf, last_time) "
        f"SELECT run_id, rank, key, b, CAST({mask} AS INTEGER), SUM(n_finite), SUM(total), MIN(lo), MAX(hi), "
        "SUM(n_nan), SUM(n_pos_inf), SUM(n_neg_inf), MAX(last_time) "
        f"FROM (SELECT *, step - ((step % {_C}) + {_C}) % {_C} AS b FROM step_summaries) AS f "
        "GROUP BY run_id, rank, key, b"
    )


def downgrade() -> None:
    if op.get_bind().dialect.name in ("sqlite", "postgresql"):
        op.drop_index("ix_coarse_summaries_run_key", table_name="coarse_summaries")
    op.drop_table("coarse_summaries")
