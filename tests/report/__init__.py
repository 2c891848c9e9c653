"""Unit-level tests of multirank_logger/report (one process; the multi-process runs are in tests/runs/)."""
