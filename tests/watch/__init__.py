"""Unit-level tests of multirank_logger/watch (one process; the multi-process runs are in tests/runs/)."""
