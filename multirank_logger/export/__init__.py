"""Runs in the formats other tools read: a Parquet dataset (Spark, Trino, DuckDB, Polars), TensorBoard's event files."""
