"""``verdicts``: whether a kept verdict judged the whole run, and the rows it judged.

One row per verdict the watch keeps at a run's end (beside its ``findings`` rows, the same
launch in ``seq``'s high bits): ``complete`` where the watch held the whole run's statistics and
judged them as the report's pass judges the rows, and then ``rows_by_rank`` (JSON: per rank, the
metric rows it judged) and ``steps_by_rank`` (each rank's distinct steps and last step, where its
rows came in step order). The page and ``report`` serve the kept findings instead of a pass over
the rows while the store holds exactly those rows (query/kept_verdict.py); ``reason`` says why a
verdict is not complete. Runs from before this revision have none: they are judged by the pass.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # written out, not imported from schema.py: a later change there belongs in a later revision
    op.create_table(
        "verdicts",
        sa.Column("run_id", sa.Integer, nullable=False),
        sa.Column("rank", sa.Integer, nullable=False, comment="the rank that judged (0)"),
        sa.Column("seq", sa.BigInteger, nullable=False, comment="its number in the run (the launch in the high bits)"),
        sa.Column("complete", sa.Boolean, nullable=False, comment="whether the whole run was judged as the report judges it"),
        sa.Column("rows_by_rank", sa.Text, nullable=True, comment="JSON list: per rank, the metric rows judged (complete only)"),
        sa.Column("steps_by_rank", sa.Text, nullable=True, comment="JSON list: per rank, [its distinct steps, its last step] (null where its rows came out of step order)"),
        sa.Column("findings", sa.Integer, nullable=False, comment="the findings rows kept with it (its launch's)"),
        sa.Column("reason", sa.Text, nullable=True, comment="why it is not complete"),
        sa.Column("judged_at", sa.Float(53), nullable=False, comment="unix time of the run's last judgement"),
        sa.PrimaryKeyConstraint("run_id", "seq", name="pk_verdicts"),
    )


def downgrade() -> None:
    op.drop_table("verdicts")
