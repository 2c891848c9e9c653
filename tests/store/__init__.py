"""Unit-level tests of multirank_logger/store (one process; the multi-process runs are in tests/runs/)."""
