"""Unit-level tests of multirank_logger/model (one process; the multi-process runs are in tests/runs/)."""
