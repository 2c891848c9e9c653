"""Rank 0's watch during a run: the judgement fed as rows arrive, and where each alert goes.

``watch.py``: the thread that takes each new row (from gather's writer, or read from the store
through ``query/new_rows.py`` for direct and node), feeds ``judgement/live.py`` and keeps the
run's verdict at its end; ``alerts.py``: each new finding once to the console, the ``alerts``
table, ``on_alert`` and the webhook. Above ``query/`` and ``judgement/``; the logger starts and
stops it (``logger/rank_run.py``).
"""
