"""``alerts``: what the watch raised while the run went (logger/watch.py), each finding once.

One row per alert, recorded by rank 0: the rank it names, its kind (``non_finite``,
``departure``, ``straggler``, ``memory``, ``stop``), key, first step, when it was seen and the
numbers. ``multirank-logger alerts`` lists them; ``report`` says which were raised.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # written out, not imported from schema.py: a later change there belongs in a later revision
    op.create_table(
        "alerts",
        sa.Column("run_id", sa.Integer, nullable=False),
        sa.Column("rank", sa.Integer, nullable=False, comment="the rank the alert names"),
        sa.Column("seq", sa.BigInteger, nullable=False, comment="the alert's number in the run (rank 0's counter)"),
        sa.Column("kind", sa.String(32), nullable=False, comment="non_finite | departure | straggler | memory | stop"),
        sa.Column("key", sa.String, nullable=True, comment="the metric key (a phase or memory measure for timing)"),
        sa.Column("first_step", sa.BigInteger, nullable=True, comment="the finding's first step"),
        sa.Column("step_seen", sa.BigInteger, nullable=True, comment="the newest step the watch held when it raised it"),
        sa.Column("seen_at", sa.Float(53), nullable=False, comment="unix time the watch raised it"),
        sa.Column("value", sa.Float(53), nullable=True, comment="the finding's number (a ratio, a value)"),
        sa.Column("detail", sa.Text, nullable=True, comment="the finding's numbers as JSON"),
        sa.Column("message", sa.Text, nullable=False, comment="the console line"),
        sa.PrimaryKeyConstraint("run_id", "seq", name="pk_alerts"),
    )


def downgrade() -> None:
    op.drop_table("alerts")
