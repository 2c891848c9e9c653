"""SQLite: `metrics` becomes a WITHOUT ROWID table clustered on (run_id, key, rank, seq).

One key's rows of one rank then sit together: an export and per_rank(key) read ranges
instead of looking up one row per value, inserts skip two secondary indexes (~1.8 against
~2.8 us/row), and the file is about half the size. The primary key is also the identity
of a row, which spill imports already relied on. DuckDB and PostgreSQL are unchanged.

SQLite cannot change a table's key in place: the rows are copied into the new table in
key order (one pass, no index to maintain) and the old table is dropped, in one
transaction. A store holding two rows with the same (run, rank, seq, key), which only
keys that print the same (``1`` and ``"1"`` in one call) could give, fails the upgrade
and stays as it was; the error says which run.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from multirank_logger.errors import StoreError

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_COLUMNS = "run_id, rank, seq, step, key, value, dtype, time"


def _metrics_columns() -> list[sa.Column]:
    return [
        sa.Column("run_id", sa.Integer, nullable=False),
        sa.Column("rank", sa.Integer, nullable=False, comment="global rank that logged the value"),
        sa.Column("seq", sa.BigInteger, nullable=False, comment="the rank's own log-call counter, 0-based"),
        sa.Column("step", sa.BigInteger, nullable=False, comment="step passed to log_metrics"),
        sa.Column("key", sa.String, nullable=False, comment="metric name, prefix included"),
        sa.Column("value", sa.Float(53), nullable=True, comment="NULL when the value was NaN"),
        sa.Column("dtype", sa.SmallInteger, nullable=False, comment="0 float, 1 int, 2 bool, 3 NaN, 4 -0.0"),
        sa.Column("time", sa.Float(53), nullable=False, comment="unix time of the log call"),
    ]


def _refuse_duplicates(bind: sa.Connection) -> None:
    row = bind.exec_driver_sql(
        "SELECT run_id, rank, seq, key, count(*) FROM metrics GROUP BY run_id, key, rank, seq HAVING count(*) > 1 LIMIT 1"
    ).first()
    if row is not None:
        run_id, rank, seq, key, n = row
        raise StoreError(
            f"Cannot upgrade: run {run_id} holds {n} values for key {key!r} in one log call (rank {rank}, "
            f"seq {seq}). Delete all but one (SELECT rowid, * FROM metrics WHERE run_id = {run_id} AND "
            f"rank = {rank} AND seq = {seq}), then upgrade again."
        )


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return
    _refuse_duplicates(bind)
    op.create_table(
        "metrics_clustered",
        *_metrics_columns(),
        sa.PrimaryKeyConstraint("run_id", "key", "rank", "seq", name="pk_metrics"),
        sqlite_with_rowid=False,
    )
    bind.exec_driver_sql(
        f"INSERT INTO metrics_clustered ({_COLUMNS}) SELECT {_COLUMNS} FROM metrics ORDER BY run_id, key, rank, seq"
    )
    op.drop_index("ix_metrics_run_key", table_name="metrics")
    op.drop_index("ix_metrics_run_rank_step", table_name="metrics")
    op.drop_table("metrics")
    op.rename_table("metrics_clustered", "metrics")


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return
    op.create_table("metrics_rowid", *_metrics_columns())
    bind.exec_driver_sql(
        f"INSERT INTO metrics_rowid ({_COLUMNS}) SELECT {_COLUMNS} FROM metrics ORDER BY run_id, rank, seq, key"
    )
    op.drop_table("metrics")
    op.rename_table("metrics_rowid", "metrics")
    op.create_index("ix_metrics_run_rank_step", "metrics", ["run_id", "rank", "step"])
    op.create_index("ix_metrics_run_key", "metrics", ["run_id", "key"])
