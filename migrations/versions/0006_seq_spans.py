"""Exactly once by seq ranges: the unique index over every metric row goes, ``metric_spans`` comes.

The unique index on ``metrics`` (run_id, rank, seq, key) of DuckDB and PostgreSQL (0004) was 82%
of a DuckDB store's bytes at 51.2M rows (52.3 against 9.6 B/row) and made its inserts ~2.3x
dearer. ``metric_spans`` holds per (run, rank) the seq ranges that may hold stored rows: an
insert checks its range there and reads back only the rows of an overlap (store/seq_spans.py).
SQLite keeps its clustered primary key, which is the table itself.

The upgrade covers the rows already stored with one span per (run, rank), from its lowest to
its highest seq: a span may cover more than is stored (an import then reads the overlap back),
never less. The downgrade drops the spans and builds the index again, which fails on a store
that came to hold one row twice.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_INDEXED = ("duckdb", "postgresql")


def upgrade() -> None:
    # written out, not imported from schema.py: a later change there belongs in a later revision
    op.create_table(
        "metric_spans",
        sa.Column("run_id", sa.Integer, nullable=False),
        sa.Column("rank", sa.Integer, nullable=False, comment="global rank"),
        sa.Column("first_seq", sa.BigInteger, nullable=False, comment="lowest seq of the span"),
        sa.Column("last_seq", sa.BigInteger, nullable=False, comment="highest seq of the span (inclusive)"),
        sa.PrimaryKeyConstraint("run_id", "rank", "first_seq", name="pk_metric_spans"),
    )
    op.execute(
        "INSERT INTO metric_spans (run_id, rank, first_seq, last_seq) "
        "SELECT run_id, rank, MIN(seq), MAX(seq) FROM metrics GROUP BY run_id, rank"
    )
    if op.get_bind().dialect.name in _INDEXED:
        op.drop_index("uq_metrics_row", table_name="metrics")


def downgrade() -> None:
    if op.get_bind().dialect.name in _INDEXED:
        op.create_index("uq_metrics_row", "metrics", ["run_id", "rank", "seq", "key"], unique=True)
    op.drop_table("metric_spans")
