"""How this rank's rows leave it: the write path, below the Lightning front-end (logger/).

Top down (each module imports only those below it):

- logged_rows.py: `LoggedRows`, the training thread's side: a log call into the buffer (CSVLogger's
  unsaved count), the writer thread started by the first call, `flush` (the logger's public one).
- sink_holder.py: `SinkHolder`, this rank's sink and what goes with it: the transport chosen, the
  sink built with its spiller, this rank registered in the store, the counts its end records; it
  asks the run above (logger/) only through its `RunForSink` protocol.
- transport_choice.py: where rows go (every rank writes the store, rank 0 gathers them, or a
  node's writer does), decided on rank 0 and published over the launch's channel.
- sinks.py: the sinks the writer thread hands a batch to (`DirectSink` writes the store;
  `GatherSender` ships to rank 0 or a node's writer; `GatherReceiver` writes what it receives),
  behind sink_protocol.py's `Sink` protocol.
- writer_thread.py: `BackgroundWriter`, the thread that drains the buffer into the sink, retries
  and holds what the store refuses for a while, and spills the rest; it asks the run above once a
  cycle, through its `WriterOwner` protocol, where rows go.
- sink_protocol.py: `Sink`, what the writer (`SinkWrites`), the run while it goes on
  (`SinkUpdates`) and the run's end (`SinkEnd`, logger/finalize.py) ask of a sink, so that none
  asks which kind it holds, and each sees only its part.
- buffer.py: `RecordBuffer`, the hot path's memory (the only part the training thread touches).
- spiller.py: where rows the store or rank 0 did not take go (the spill file), and what the
  user is told.
- process_hooks.py: the process-wide hooks that flush every writer (SIGTERM, exit, fork).
"""
