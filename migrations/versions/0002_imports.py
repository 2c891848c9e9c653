"""Spill imports: one row per import of a rank's spill file, so importing it again adds nothing.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "imports",
        sa.Column("spill_id", sa.String(64), nullable=False, comment="the spill file's unique id"),
        sa.Column("first_frame", sa.Integer, nullable=False, comment="first frame of the file this import read"),
        sa.Column("end_frame", sa.Integer, nullable=False, comment="frames of the file read so far (exclusive end)"),
        sa.Column("run_id", sa.Integer, nullable=False),
        sa.Column("rank", sa.Integer, nullable=False, comment="global rank that spilled the rows"),
        sa.Column("rows", sa.BigInteger, nullable=False, comment="rows added (rows the store already held are skipped)"),
        sa.Column("source", sa.Text, nullable=True, comment="path of the file when it was imported"),
        sa.Column("imported_at", sa.Float(53), nullable=False, comment="unix time of the import"),
        sa.PrimaryKeyConstraint("spill_id", "first_frame", name="pk_imports"),
    )


def downgrade() -> None:
    # the rows the imports added stay in `metrics`; only the bookkeeping goes
    op.drop_table("imports")
