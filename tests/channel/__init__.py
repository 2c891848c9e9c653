"""Unit-level tests of multirank_logger/transport (one process; the multi-process runs are in tests/runs/)."""
