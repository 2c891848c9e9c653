"""StopOnAlert: end ``fit`` on every rank at the same step when the watch raises an alert of a chosen kind.

The watch (watch/watch.py) runs on rank 0 alone; the stop must be symmetric, or the other
ranks would wait forever in their next collective. This callback does what `EarlyStopping`
does: at a hook every rank runs at the same point (the end of a training batch, every
``check_every_n_steps`` steps), each rank votes (rank 0: "an alert of these kinds was raised";
the others: no), the votes are reduced through ``trainer.strategy.reduce_boolean_decision``
(any may stop), and every rank sets ``trainer.should_stop`` from the same result: Lightning
ends the fit at the same step everywhere. The reduction is the callback's, in Lightning's
hook, as EarlyStopping's is; the logger itself never runs a collective.

The alerts are the Trainer's first `MultiRankLogger`'s. What it records: each rank a row of the
``decisions`` table in each MultiRankLogger's run (callback ``StopOnAlert``, the alert as the
monitor, ``kind:key:rank N``, its own vote and the decision), and rank 0 an alert of kind ``stop``
in the first's (its console line, the ``alerts`` table, ``on_alert`` and the webhook). From those
rows ``multirank-logger runs`` and ``report`` say the run was stopped, at which step, for which
alert (``StoreReader.stopped_by``); the run's status stays the one its end records (``success``). Nothing logged is lost: the
fit ends as at ``max_steps``, and the logger's finalize stores every row.

Example::

    from multirank_logger import MultiRankLogger, StopOnAlert

    trainer = Trainer(strategy="ddp", devices=8, logger=MultiRankLogger(db="runs.sqlite"),
                      callbacks=[StopOnAlert(kinds={"non_finite"})])
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from multirank_logger._util import lightning_compat
from multirank_logger.errors import NoMultiRankLogger
from multirank_logger.logger.multi_rank_logger import LIGHTNING_BASES, MultiRankLogger
from multirank_logger.watch.alerts import ALERT_KINDS, Alert

__all__ = ["ALERT_KINDS", "StopOnAlert", "logged_step"]



class StopOnAlert(Callback):
    """End the fit on every rank at one step once the watch raises an alert of one of `kinds`.

    Args:
        kinds: the alert kinds that stop (``non_finite``, ``departure``, ``straggler``, ``memory``).
        check_every_n_steps: training steps between two checks (each check is one all-reduce of a
            boolean on every rank, as EarlyStopping's; 1 stops soonest).

    Raises:
        ValueError: for an unknown kind or a check interval below 1.
        NoMultiRankLogger: at setup, when the Trainer has no `MultiRankLogger`.
        ValueError: at setup, when its first `MultiRankLogger` has ``watch=False`` (no alert comes).
    """

    def __init__(self, kinds: Iterable[str] = ("non_finite",), check_every_n_steps: int = 1) -> None:
        super().__init__()
        chosen = frozenset([kinds] if isinstance(kinds, str) else kinds)
        unknown = chosen - ALERT_KINDS
        if unknown or not chosen:
            raise ValueError(f"StopOnAlert(kinds={sorted(chosen)!r}): choose among {sorted(ALERT_KINDS)}.")
        if not (isinstance(check_every_n_steps, int) and check_every_n_steps >= 1):
            raise ValueError(f"check_every_n_steps={check_every_n_steps!r}: pass a whole number of steps, 1 or more.")
        self.kinds = chosen
        self.every = check_every_n_steps
        self._logger: MultiRankLogger | None = None  # the one whose alerts stop the fit
        self._loggers: list[MultiRankLogger] = []
        #: the alert that stopped the fit (rank 0), and the step it stopped at (every rank): the
        #: step its last batch's metrics are logged at (`logged_step`)
        self.stopped_by: Alert | None = None
        self.stopped_at: int | None = None

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        lightning_compat.adopt(MultiRankLogger, *LIGHTNING_BASES)  # the Trainer's package, imported by now
        loggers = [lg for lg in trainer.loggers if isinstance(lg, MultiRankLogger)]
        if not loggers:
            raise NoMultiRankLogger([type(lg).__name__ for lg in trainer.loggers])
        if not loggers[0].watching:  # no alert would ever come: a stop that cannot happen
            raise ValueError("StopOnAlert needs the watch's alerts, and the Trainer's first MultiRankLogger has "
                             "watch=False: drop watch=False (the default watches), or remove StopOnAlert.")
        self._logger = loggers[0]
        self._loggers = loggers  # each records the stop: every run of the fit says why it ended there

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._logger is None or self.stopped_at is not None or trainer.global_step % self.every:
            return
        alert = next((a for a in self._logger.alerts if a.kind in self.kinds), None)  # rank 0 alone holds any
        vote = alert is not None
        stop = bool(trainer.strategy.reduce_boolean_decision(vote, all=False))  # every rank, this hook: one result
        if not stop:
            return
        trainer.should_stop = True
        step = logged_step(trainer)
        self.stopped_at = step
        self.stopped_by = alert
        for logger in self._loggers:
            logger.record(
                "decisions", step=step, epoch=trainer.current_epoch, callback=type(self).__name__,
                monitor=f"{alert.kind}:{alert.key}:rank {alert.rank}" if alert is not None else None,
                value=None, vote=vote, decision=True, time=time.time(),
            )
        if alert is not None:
            self._logger.stopped_by_alert(alert, step)


def logged_step(trainer: pl.Trainer) -> int:
    """The step this batch's metrics are logged at: the stop's step, so that "stopped at step N"
    names the run's last logged step.

    ``on_train_batch_end`` runs after the optimizer step has counted ``global_step`` and before
    Lightning logs the batch at ``fit_loop.epoch_loop._batches_that_stepped``, which it counts
    after the log (``training_epoch_loop.advance`` / ``on_advance_end``): ``global_step`` there is
    one past the batch's logged step. The attribute is private; a Lightning without it gets
    ``global_step - 1`` (the same on a batch that stepped one optimizer).
    """
    stepped = getattr(getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None), "_batches_that_stepped", None)
    if isinstance(stepped, int):
        return stepped
    return max(trainer.global_step - 1, 0)

