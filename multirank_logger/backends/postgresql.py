"""PostgreSQL: a server that many processes write at once; COPY for bulk rows (psycopg 3)."""

from __future__ import annotations

import sqlalchemy as sa

from multirank_logger.backends.base import Backend, _raised_as_sqlalchemy_would
from multirank_logger.buffer import MetricBatch

__all__ = ["PostgreSQLBackend"]


class PostgreSQLBackend(Backend):
    name = "postgresql"

    def create_engine(self, readonly: bool = False) -> sa.Engine:
        options = "-c default_transaction_read_only=on" if readonly else ""
        return sa.create_engine(self.url, connect_args={"options": options} if options else {})

    def insert_metrics(self, conn: sa.Connection, table: sa.Table, batch: MetricBatch) -> None:
        cursor = conn.connection.driver_connection.cursor()
        if not hasattr(cursor, "copy"):  # psycopg2: SQLAlchemy's executemany
            super().insert_metrics(conn, table, batch)
            return
        # psycopg 3: COPY streams the rows in one statement, the server's own bulk path
        columns = [c.name for c in table.columns]
        sql = f"COPY {table.name} ({', '.join(columns)}) FROM STDIN"
        with _raised_as_sqlalchemy_would(conn, sql), cursor.copy(sql) as copy:
            for row in zip(*batch.columns(columns)):
                copy.write_row(row)

    def lock_for_migration(self, conn: sa.Connection) -> None:
        # a transaction-scoped advisory lock: released at commit, even if the process dies
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": 0x6D726C67})
