"""``unheard_ends``: the (rank, launch) pairs whose end gather rank 0 never heard.

The ``ranks`` table keeps one row per rank, which a later launch of the run registers again;
a rank whose end rank 0 never heard in an earlier launch (its undelivered rows only in its
spill file) must keep the run from ``success`` until that file is imported.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # written out, not imported from schema.py: a later change there belongs in a later revision
    op.create_table(
        "unheard_ends",
        sa.Column("run_id", sa.Integer, nullable=False),
        sa.Column("rank", sa.Integer, nullable=False, comment="global rank"),
        sa.Column("attempt", sa.Integer, nullable=False, comment="the launch (attempts.attempt)"),
        sa.Column("recorded_at", sa.Float(53), nullable=False, comment="unix time rank 0 recorded the rank missing"),
        sa.PrimaryKeyConstraint("run_id", "rank", "attempt", name="pk_unheard_ends"),
    )


def downgrade() -> None:
    op.drop_table("unheard_ends")
