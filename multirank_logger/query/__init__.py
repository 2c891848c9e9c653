"""The read-only side: runs, the long and per-rank tables, metrics.csv rebuilt, side tables, user SQL."""
