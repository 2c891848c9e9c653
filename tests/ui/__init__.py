"""Unit-level tests of multirank_logger/ui (one process; the multi-process runs are in tests/runs/)."""
