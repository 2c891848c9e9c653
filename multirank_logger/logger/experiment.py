"""What ``MultiRankLogger.experiment`` hands to user code: CSVLogger's experiment, kept working.

Code written for CSVLogger calls ``logger.experiment.log_metrics(...)``, ``.log_hparams(...)``,
``.save()`` and reads ``.metrics_file_path`` on rank 0; on the other ranks CSVLogger gives
Lightning's do-nothing ``_DummyExperiment`` (`NoExperiment` where Lightning is not imported),
which is what code guarded for rank 0 expects.
`RunExperiment` offers the same surface over the run (rank_run.RankRun) the logger writes
through: a call goes into the store for rank 0 like any other, and ``save()`` writes
``metrics.csv`` now.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from multirank_logger.logger.csv_logger_files import NAME_HPARAMS_FILE, NAME_METRICS_FILE
from multirank_logger.logger.rank_run import RankRun

__all__ = ["NoExperiment", "RunExperiment"]


class RunExperiment:
    """Rank 0's experiment: CSVLogger's ``ExperimentWriter`` methods, and the run's identity.

    Args:
        run: this process's part in the logger's run.
    """

    NAME_METRICS_FILE = NAME_METRICS_FILE
    NAME_HPARAMS_FILE = NAME_HPARAMS_FILE

    def __init__(self, run: RankRun) -> None:
        self._run = run

    @property
    def log_dir(self) -> str:
        return self._run.log_dir

    @property
    def metrics_file_path(self) -> str:
        """Where rank 0's metrics.csv is (written as the run goes)."""
        return os.path.join(self.log_dir, self.NAME_METRICS_FILE)

    @property
    def hparams(self) -> dict[str, Any]:
        return self._run.hparams

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """The calls logged and not written yet, with their ``step`` (CSVLogger's unsaved rows):
        not in metrics.csv yet, or (export_csv=False) not drained to the store yet."""
        run = self._run
        buffer = run.logged.buffer
        calls = list(run.files.calls) if buffer.csv_calls is not None else buffer.pending_calls()
        return [{**values, "step": step} for step, values in calls]

    @property
    def run_id(self) -> int:
        return self._run.resolve().id

    @property
    def name(self) -> str:
        return self._run.settings.name

    @property
    def version(self) -> int | str:
        return self._run.version

    def log_metrics(self, metrics_dict: Mapping[str, Any], step: int | None = None) -> None:
        """Record one call, as CSVLogger's writer does (no prefix; the step defaults to the
        count of unsaved calls). Appends to memory only."""
        self._run.logged.record_call(metrics_dict, step)

    def log_hparams(self, params: Mapping[str, Any]) -> None:
        """Add hyperparameters and write hparams.yaml now."""
        self._run.log_hparams(dict(params))

    def save(self) -> None:
        """Write what was logged: into the store, and into metrics.csv, before returning
        (the logger's own ``save``, which the Trainer calls every step, writes metrics.csv only)."""
        run = self._run
        run.logged.flush_now(run.settings.timeout)

    def __repr__(self) -> str:
        return f"RunExperiment(log_dir={self.log_dir!r})"


class NoExperiment:
    """The experiment of a rank other than 0: every call does nothing, as Lightning's
    ``_DummyExperiment`` (which `MultiRankLogger` gives; the plain API imports no Lightning)."""

    def nop(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, _: str) -> Any:
        return self.nop

    def __getitem__(self, _: Any) -> NoExperiment:
        return self  # as `experiment[0].add_image(...)` on rank 0 of a logger list

    def __setitem__(self, *args: Any) -> None:
        pass
