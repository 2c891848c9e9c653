"""Rows to rank 0 over the launch's TCPStore (no collective) and the run identity every rank adopts.
Knows no SQL."""
