"""The Lightning front-end (MultiRankLogger) and what one rank does behind it.

Top down (each module imports only those below it):

- multi_rank_logger.py: `MultiRankLogger`, Lightning's hooks; experiment.py: what user code
  gets as ``logger.experiment``; finalize.py: the end of the run (``finalize``).
- rank_run.py: `RankRun`, this process's part in the run (store, identity, sink, writer), built
  from run_settings.py's `RunSettings`.
- Below the run: csv_logger_files.py and live_csv.py (rank 0's CSVLogger files), transport_choice.py
  (direct or gather), sinks.py (where rows go), writer.py (the thread that moves them), buffer.py
  (the hot path's memory), spiller.py (rows the store did not take), rank_facts.py (what each rank
  tells rank 0 of itself at its end), save_dir.py (the files' filesystem), process_registry.py and process_hooks.py
  (exit, SIGTERM and fork, process-wide), launch_env.py (the run identity in the environment of
  the children Lightning's launcher starts, and only there).
"""
