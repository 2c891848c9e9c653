"""``ranks.side_rows_spilled``: side-table rows a rank wrote to its spill file instead of the store.

A run whose end spilled side-table rows (the store held by another process as it ended: the
watch's verdict, its alerts, log lines) lacks them until the file is imported, as a run that
spilled values does. ``runs.values_spilled`` counts values only, so the run was recorded
"success" while the spiller said "incomplete". Counted per rank (the spill file is the rank's,
and `import` counts its rows off that rank), a run with any is "incomplete" whichever rank ends
last (store/status.run_is_whole). On ``ranks``, not ``runs``: DuckDB refuses to ALTER a table
whose rows an earlier revision of the same upgrade wrote (0007 fills ``runs.run_uuid``).

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("ranks") as batch:
        batch.add_column(sa.Column("side_rows_spilled", sa.BigInteger, nullable=True,
                                   comment="side-table rows (alerts, findings, logs...) in its spill file, not imported yet"))


def downgrade() -> None:
    with op.batch_alter_table("ranks") as batch:
        batch.drop_column("side_rows_spilled")
