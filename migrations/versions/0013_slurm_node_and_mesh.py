"""``ranks``: Slurm's name of each rank's node, and the rank's coordinates in the device mesh.

``slurm_node`` is ``SLURMD_NODENAME`` where the rank ran in a Slurm job: the name ``--exclude``
takes (slurm.conf's ``NodeName``), which need not be the host's own name (a FQDN, an alias).
``mesh`` is the rank's place in the strategy's device mesh where there is one (tensor, pipeline,
data-parallel groups), as JSON text: ``{"dp": [1, 2], "tp": [0, 2]}``, each dimension's name with
the rank's coordinate along it and the dimension's size, outermost first. NULL in both where not
known, and in rows from before this revision.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # written out, not imported from schema.py: a later change there belongs in a later revision
    with op.batch_alter_table("ranks") as batch:
        batch.add_column(sa.Column("slurm_node", sa.String(255), nullable=True, comment="SLURMD_NODENAME: Slurm's name of its node"))
        batch.add_column(sa.Column("mesh", sa.String(1024), nullable=True, comment='its device-mesh coordinates, JSON {dim: [coordinate, size]}'))


def downgrade() -> None:
    with op.batch_alter_table("ranks") as batch:
        batch.drop_column("mesh")
        batch.drop_column("slurm_node")
