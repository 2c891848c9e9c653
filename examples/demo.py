"""Placeholder until the logger lands: create a store and print its schema."""
from pathlib import Path

import sqlalchemy as sa

from multirank_logger.store import Store

store = Store(Path("demo_runs") / "runs.duckdb")
with store.begin() as conn:
    for table in sa.inspect(conn).get_table_names():
        print(table)
