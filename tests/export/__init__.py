"""Unit-level tests of multirank_logger/export (one process; the multi-process runs are in tests/runs/)."""
