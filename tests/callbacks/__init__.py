"""Unit-level tests of multirank_logger/callbacks (one process; the multi-process runs are in tests/runs/)."""
