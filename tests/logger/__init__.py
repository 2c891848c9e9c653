"""Unit-level tests of multirank_logger/logger (one process; the multi-process runs are in tests/runs/)."""
