"""Rows to rank 0 over the launch's TCPStore (no collective) and the run identity every rank adopts.
Knows no SQL. tcpstore_client: the bounded client of the TCPStore; row_channel: RowChannel, the protocol
of batches, acknowledgements, side rows and end reports over it; identity: the run identity."""
