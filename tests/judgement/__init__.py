"""Unit-level tests of multirank_logger/judgement (one process; the multi-process runs are in tests/runs/)."""
