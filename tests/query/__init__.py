"""Unit-level tests of multirank_logger/query (one process; the multi-process runs are in tests/runs/)."""
