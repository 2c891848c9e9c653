"""Unit-level tests of multirank_logger/ddp (one process; the multi-process runs are in tests/runs/)."""
