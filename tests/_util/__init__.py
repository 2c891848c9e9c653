"""Unit-level tests of multirank_logger/_util (one process; the multi-process runs are in tests/runs/)."""
