"""HF Accelerate: `MultiRankTracker`, a tracker that records every process's values under its rank.

``Accelerator(log_with=MultiRankTracker(db="runs.sqlite"))``. The tracker holds a plain-API `Run`
(integrations/plain.py) opened on every process: one run for all ranks, the watch on rank 0, the
same ends.

Accelerate (1.15) calls its trackers through ``init_trackers``, ``log`` and ``get_tracker`` on the
main process only (``@on_main_process``), whatever ``main_process_only`` says, and
``end_training`` finishes only the trackers the main process holds. So every process logs through
the tracker object it made itself: ``tracker.log(values, step=)`` (``accelerator.log`` still works
and records rank 0). The other processes' runs end with ``tracker.finish()``, or at exit as the
plain API ends them (``failed`` after an uncaught exception, else ``success``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from accelerate.tracking import GeneralTracker

from multirank_logger.integrations.plain import Run, init

__all__ = ["MultiRankTracker"]


class MultiRankTracker(GeneralTracker):
    """An Accelerate tracker that stores every process's own values in one multirank_logger run.

    Args:
        db: the store (a ``.sqlite`` / ``.duckdb`` path or a SQLAlchemy URL).
        name: the run's name (default: the script's name).
        options: any other keyword of `multirank_logger.init` (``transport``, ``watch``,
            ``on_alert``, ``alert_url``...).

    Example::

        tracker = MultiRankTracker(db="runs.sqlite", name="finetune")
        accelerator = Accelerator(log_with=tracker)
        accelerator.init_trackers("finetune", config={"lr": 1e-3})
        for step, batch in enumerate(loader):
            loss = ...
            tracker.log({"loss": loss.item()}, step=step)   # every process, under its rank
        accelerator.end_training()
    """

    name = "multirank"
    requires_logging_directory = False
    main_process_only = False

    def __init__(self, db: str | os.PathLike[str] | None = None, name: str | None = None, **options: Any) -> None:
        super().__init__()
        self._db = db
        self._run_name = name
        self._options = options
        self._run: Run | None = None

    @property
    def tracker(self) -> Run:
        """The plain-API run behind this tracker (opened on first use)."""
        return self.run

    @property
    def run(self) -> Run:
        if self._run is None:
            self._run = init(db=self._db, name=self._run_name, **self._options)
        return self._run

    def start(self) -> None:
        """Called by ``init_trackers`` (main process only); other processes open at their first log."""
        _ = self.run

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.run.log_config(values)

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """This process's own values at `step`: memory only, no I/O, no collective."""
        self.run.log({k: v for k, v in values.items() if not isinstance(v, str)}, step=step)

    def finish(self, status: str = "success") -> None:
        """End this process's part of the run (``accelerator.end_training`` calls it on the main process)."""
        if self._run is not None:
            self._run.finish(status)
