"""``ranks``: each rank's place beyond its host: the GPU it drives (index, name, UUID) and its
index in data parallelism.

A finding names a rank; what one does next is about its place (drain a host, replace a GPU).
Where CUDA is in use the rank records its device's index, name and UUID (torch's, as nvidia-smi
writes it: ``GPU-...``); on CPU they stay NULL. ``dp_rank`` is the rank's index among the
data-parallel replicas: from a device mesh where one is set, else the global rank. Rows from
before this revision keep NULL in all four.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_COLUMNS = ("gpu_index", "gpu_name", "gpu_uuid", "dp_rank")


def upgrade() -> None:
    # written out, not imported from schema.py: a later change there belongs in a later revision
    with op.batch_alter_table("ranks") as batch:
        batch.add_column(sa.Column("gpu_index", sa.Integer, nullable=True, comment="the CUDA device index the rank drives; NULL without CUDA"))
        batch.add_column(sa.Column("gpu_name", sa.String(255), nullable=True, comment="its device's name (torch.cuda.get_device_name)"))
        batch.add_column(sa.Column("gpu_uuid", sa.String(64), nullable=True, comment="its device's UUID, as nvidia-smi writes it (GPU-...)"))
        batch.add_column(sa.Column("dp_rank", sa.Integer, nullable=True, comment="its index among the data-parallel replicas"))


def downgrade() -> None:
    with op.batch_alter_table("ranks") as batch:
        for name in reversed(_COLUMNS):
            batch.drop_column(name)
