"""The logger (MultiRankLogger, and its Lightning-free core) and what it needs of one rank's run.

Top down (each module imports only those below it):

- multi_rank_logger.py: `MultiRankLogger`, core.py's logger as Lightning's ``Logger``.
- core.py: `MultiRankLoggerCore`, every behaviour of the logger without Lightning (what the plain
  API builds: its scripts never import Lightning); experiment.py: what user code gets as
  ``logger.experiment``; finalize.py: the end of the run (``finalize``).
- rank_run.py: `RankRun`, this process's part in the run: who the run is (store, identity) and
  which attempt, built from run_settings.py's `RunSettings`; it builds and carries over pickling
  and fork the rank's runtime (write/logged_rows.py, write/sink_holder.py, rank 0's files).
- Below the run: csv_logger_files.py and live_csv.py (rank 0's CSVLogger files), save_dir.py
  (the files' filesystem), process_registry.py (the runs of this process at exit and fork),
  launch_env.py (the run identity in the environment of the children Lightning's launcher
  starts, and only there).

How this rank's rows leave (the hot path, buffer, writer thread, the sink's set-up, sinks, spill)
is the `write` package's.
"""
