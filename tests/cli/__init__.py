"""Unit-level tests of multirank_logger/cli.py (one process; the multi-process runs are in tests/runs/)."""
