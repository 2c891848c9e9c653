"""``runs.run_uuid``: one identity for a run everywhere (the store, its spill files, its exports).

A run's (name, version) is unique only within one store: a store deleted mid-run and a new run
logged under the same name and version into a new store share it, and ``import`` merged the first
run's spill file into the second. Each run now carries a UUID, written into every spill file;
``import`` matches on it. The upgrade gives every run already stored one of its own.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26
"""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # written out, not imported from schema.py: a later change there belongs in a later revision
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("run_uuid", sa.String(36), nullable=True, comment="the run's unique id (a UUID)"))
    bind = op.get_bind()
    table = sa.table("runs", sa.column("id", sa.Integer), sa.column("run_uuid", sa.String(36)))
    for (run_id,) in bind.execute(sa.select(table.c.id)).all():
        bind.execute(table.update().where(table.c.id == run_id).values(run_uuid=str(uuid.uuid4())))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("run_uuid")
