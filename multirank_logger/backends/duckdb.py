"""DuckDB: one writing process per file, opened only inside a transaction; rows go in as Arrow."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic.ddl.impl import DefaultImpl
from sqlalchemy.pool import NullPool

from multirank_logger.backends.base import Backend
from multirank_logger.buffer import MetricBatch, as_arrow
from multirank_logger.errors import NotADatabase, StoreError, StoreLocked

__all__ = ["AlembicDuckDBImpl", "DuckDBBackend"]


class DuckDBBackend(Backend):
    name = "duckdb"
    concurrent_writers = False
    opens_per_transaction = True  # see create_engine
    inserts_arrow = True

    @property
    def path(self) -> Path | None:
        db = self.url.database
        return None if db in (None, "", ":memory:") else Path(db)

    def create_engine(self, readonly: bool = False) -> sa.Engine:
        # Rows come and go as Arrow tables: load pyarrow with the store (~0.15 s of CPU), not
        # in the writer thread's first flush, where it competes with the training for a core.
        import pyarrow  # noqa: F401

        # NullPool: the file is open only inside a transaction, so that between two
        # flushes another process (a reader, `multirank-logger sql`) can open it.
        connect_args: dict[str, Any] = {"read_only": readonly}
        if readonly:
            # a reader sees the store and nothing else: no read_csv('/etc/passwd'), COPY TO, ATTACH, INSTALL
            connect_args["config"] = {"enable_external_access": False}
        else:
            # one thread: DuckDB's default is one per core, and a writer inserting a few thousand
            # rows then checkpointing gains nothing from them but CPU taken from the training
            # (measured: -30% CPU per 20k-row flush, wall time the same)
            connect_args["config"] = {"threads": 1}
        return sa.create_engine(self.url, poolclass=NullPool, connect_args=connect_args)

    def insert_metrics(self, conn: sa.Connection, table: sa.Table, batch: MetricBatch) -> None:
        # DuckDB's executemany runs row by row (~1,400 rows/s); from Arrow it takes millions.
        # duckdb_engine turns the "register" statement into DuckDBPyConnection.register.
        view = "_multirank_batch"
        # a MetricBatch, or already a pyarrow.Table (`inserts_arrow`)
        conn.exec_driver_sql("register", (view, as_arrow(batch)))
        cols = ", ".join(f'"{c.name}"' for c in table.columns)
        conn.exec_driver_sql(f'INSERT INTO "{table.name}" ({cols}) SELECT {cols} FROM {view}')
        conn.connection.driver_connection.unregister(view)

    def insert_rows(self, conn: sa.Connection, table: sa.Table, rows: list[dict[str, Any]]) -> int:
        # executemany runs row by row here (~1,400 rows/s): go through Arrow as the metrics do
        import pyarrow as pa

        if not rows:
            return 0
        columns = [c.name for c in table.columns]
        view = f"_multirank_{table.name}"
        data = pa.Table.from_pylist([{c: row.get(c) for c in columns} for row in rows])
        conn.exec_driver_sql("register", (view, data))
        cols = ", ".join(f'"{c}"' for c in columns)
        conn.exec_driver_sql(f'INSERT INTO "{table.name}" ({cols}) SELECT {cols} FROM {view}')
        conn.connection.driver_connection.unregister(view)
        return len(rows)

    def translate_error(self, exc: Exception) -> Exception | None:
        text = str(getattr(exc, "orig", exc))
        if "Could not set lock on file" in text:
            holder = re.search(r"Conflicting lock is held in (.*?)(?: See also|$)", text)
            return StoreLocked(str(self.path), holder.group(1).strip().rstrip(".") if holder else text)
        if "not a valid DuckDB database file" in text:
            return NotADatabase(str(self.path), "DuckDB", "no DuckDB header")
        if "Corrupt database file" in text:
            return NotADatabase(str(self.path), "DuckDB", "its header checksum does not match")
        if "created with a newer version of DuckDB" in text:
            import duckdb

            found = re.search(r"version number (\d+)", text)
            detail = f"storage version {found.group(1)}" if found else "a newer storage format"
            return StoreError(
                f"{self.path} was written by a newer DuckDB ({detail}) than the duckdb {duckdb.__version__} "
                "installed here, which cannot read it. It was left untouched; open it where that newer "
                "DuckDB is installed, or log to another file."
            )
        return None


class AlembicDuckDBImpl(DefaultImpl):
    """Lets Alembic accept the duckdb dialect (duckdb_engine's documented recipe)."""

    __dialect__ = "duckdb"
    transactional_ddl = True
