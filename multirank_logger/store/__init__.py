"""Everything that touches SQL: the backends (SQLite, DuckDB, PostgreSQL), the store (engine, schema
check, inserts), a run's life across launches, spill files and their import, write-error classification.
Knows nothing of torch.distributed or Lightning."""
