"""Unit-level tests of multirank_logger/write (one process; the multi-process runs are in tests/runs/)."""
