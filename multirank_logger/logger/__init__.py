"""The Lightning front-end (MultiRankLogger) and what it needs of one rank's run.

Top down (each module imports only those below it):

- multi_rank_logger.py: `MultiRankLogger`, Lightning's hooks; experiment.py: what user code
  gets as ``logger.experiment``; finalize.py: the end of the run (``finalize``).
- rank_run.py: `RankRun`, this process's part in the run (store, identity, sink, writer), built
  from run_settings.py's `RunSettings`.
- Below the run: csv_logger_files.py and live_csv.py (rank 0's CSVLogger files), save_dir.py
  (the files' filesystem), process_registry.py (the runs of this process at exit and fork),
  launch_env.py (the run identity in the environment of the children Lightning's launcher
  starts, and only there).

How this rank's rows leave (buffer, writer thread, sinks, spill) is the `write` package's.
"""
