"""``findings``: a run's verdict, kept at its end (the judgement's findings, with their origin).

One row per finding of the watch's last judgement, recorded by rank 0 when every rank's last
rows are in (logger/rank_run.py ``stop_watch``): the rank, kind, series, first step, whether the
rank is where the problem started and that step, the numbers and the sentence. Later reads and
analyses across runs (``multirank-logger findings``) read it rather than recompute the run.
A resumed run has one verdict per launch (the launch in ``seq``'s high bits).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # written out, not imported from schema.py: a later change there belongs in a later revision
    op.create_table(
        "findings",
        sa.Column("run_id", sa.Integer, nullable=False),
        sa.Column("rank", sa.Integer, nullable=False, comment="the rank the finding names"),
        sa.Column("seq", sa.BigInteger, nullable=False, comment="its number in the run (rank 0's counter; the launch in the high bits)"),
        sa.Column("kind", sa.String(32), nullable=False, comment="non_finite | departure | straggler | memory"),
        sa.Column("series", sa.String, nullable=False, comment="the metric key, or timing:COLUMN (the page's series)"),
        sa.Column("first_step", sa.BigInteger, nullable=True, comment="its first step (None for memory)"),
        sa.Column("origin", sa.Boolean, nullable=False, comment="whether this rank is where the problem started"),
        sa.Column("origin_step", sa.BigInteger, nullable=True, comment="the step where the problem started (its origin's)"),
        sa.Column("value", sa.Float(53), nullable=True, comment="the finding's number (a ratio, seconds, a value)"),
        sa.Column("detail", sa.Text, nullable=True, comment="the finding's item as JSON (its numbers, its spread)"),
        sa.Column("sentence", sa.Text, nullable=False, comment="the finding in words (judgement/sentences.py)"),
        sa.Column("found_at", sa.Float(53), nullable=False, comment="unix time of the run's last judgement"),
        sa.PrimaryKeyConstraint("run_id", "seq", name="pk_findings"),
    )


def downgrade() -> None:
    op.drop_table("findings")
