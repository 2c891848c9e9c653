"""DecisionAudit: why a checkpoint was (not) saved, or training stopped, with every rank's own vote.

`ModelCheckpoint` saves only when every rank's own comparison says "improved": it reduces
them through ``trainer.strategy.reduce_boolean_decision`` (all must agree), and
`EarlyStopping` reduces its stop vote the same way (any may stop). With a monitor that is
not synced across ranks, the logged value improves and no checkpoint appears, and nothing
says why. `Logger.after_save_checkpoint` runs only on rank 0 and only after a save, so a
logger alone cannot see a refusal.

This callback sees each decision where it is made, on every rank, without a collective of
its own: it wraps the strategy's ``reduce_boolean_decision`` (the collective Lightning runs
anyway) to read this rank's vote going in and the result coming out, and attributes the
call to the callback running it by wrapping that callback's decision points: the public
``ModelCheckpoint.check_monitor_top_k`` (also called where no reduction is needed, e.g. the
first ``save_top_k`` saves) and `EarlyStopping`'s check hooks. Each rank records its own
row into the `MultiRankLogger` of the Trainer (the ``decisions`` table): the rank's value
and vote, the decision, and for a save the checkpoint's path and the best score. Every
wrapper is removed again at teardown.

Example::

    from multirank_logger import DecisionAudit, MultiRankLogger

    trainer = Trainer(
        strategy="ddp", devices=2, logger=MultiRankLogger(db="runs.duckdb"),
        callbacks=[ModelCheckpoint(monitor="val_loss"), DecisionAudit()],
    )
    # then: multirank-logger decisions runs.duckdb
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any, cast

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint
from typing_extensions import override

from multirank_logger._util import lightning_compat
from multirank_logger.errors import NoMultiRankLogger
from multirank_logger.logger.multi_rank_logger import LIGHTNING_BASES, MultiRankLogger

__all__ = ["DecisionAudit"]

# the EarlyStopping hooks in which it may check (which one depends on check_on_train_epoch_end)
_STOP_HOOKS = ("on_train_epoch_end", "on_validation_end")


@dataclass
class _Decision:
    """One decision as this rank saw it; becomes one row of the ``decisions`` table."""

    callback: Callback
    step: int
    epoch: int
    value: float | None
    vote: bool | None = None  # this rank's own answer, as it went into the reduction
    decision: bool | None = None  # what the ranks decided together
    path: str | None = None
    best: float | None = None
    time: float = field(default_factory=time.time)
    kept: dict[str, Any] = field(default_factory=dict)  # ModelCheckpoint's best_k_models before the save

    def row(self) -> dict[str, Any]:
        cb = self.callback
        return {
            "step": self.step, "epoch": self.epoch, "callback": type(cb).__name__,
            "monitor": getattr(cb, "monitor", None), "mode": getattr(cb, "mode", None),
            "value": self.value, "vote": self.vote, "decision": self.decision,
            "path": self.path, "best": self.best, "time": self.time,
        }


class DecisionAudit(Callback):
    """Record every `ModelCheckpoint` and `EarlyStopping` decision with each rank's vote.

    Add it to a Trainer that logs to a `MultiRankLogger`. Each rank stores, per decision:
    step, epoch, callback, monitor, mode, its own monitored value, its own vote (it alone
    would save / stop), the decision taken, and for a save the checkpoint path and the best
    score. Read them with ``open_store(db).decisions()`` or ``multirank-logger decisions DB``.

    It adds no collective: it only watches the ``reduce_boolean_decision`` calls Lightning
    makes anyway. It acts while fitting; one DecisionAudit per Trainer.

    Raises:
        NoMultiRankLogger: at setup, when the Trainer has no `MultiRankLogger`.
    """

    def __init__(self) -> None:
        self._logger: MultiRankLogger | None = None
        self._patched: list[tuple[Any, str]] = []  # (object, attribute) we set, to remove at teardown
        self._deciding: _Decision | None = None  # the decision being made right now on this rank
        self._saving: list[_Decision] = []  # saves decided: their path is known once the save is done

    # -- set up and tear down -----------------------------------------------------------

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return  # checkpoints and early stopping decide only while fitting
        lightning_compat.adopt(MultiRankLogger, *LIGHTNING_BASES)  # the Trainer's package, imported by now
        loggers = [lg for lg in trainer.loggers if isinstance(lg, MultiRankLogger)]
        if not loggers:
            raise NoMultiRankLogger([type(lg).__name__ for lg in trainer.loggers])
        self._logger = loggers[0]
        strategy = trainer.strategy
        self._patch(strategy, "reduce_boolean_decision", self._watch_reduce(strategy.reduce_boolean_decision))
        # the Trainer's package's classes: lightning's or pytorch_lightning's (both when both are imported)
        checkpoints = lightning_compat.classes("callbacks", "ModelCheckpoint")
        stoppers = lightning_compat.classes("callbacks", "EarlyStopping")
        for cb in trainer.callbacks:  # type: ignore[attr-defined]  # set by Lightning's callback connector
            if isinstance(cb, checkpoints):
                self._patch(cb, "check_monitor_top_k", self._watch_top_k(cb, cb.check_monitor_top_k))
            elif isinstance(cb, stoppers):
                for hook in _STOP_HOOKS:
                    self._patch(cb, hook, self._watch_stop(cb, getattr(cb, hook)))

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._record_saves()
        self._unpatch()

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._record_saves()  # decisions made before the failure are worth keeping
        self._unpatch()

    # a save decided in one hook is done by the next of these: its path can be read
    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._record_saves()

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._record_saves()

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._record_saves()

    def _patch(self, obj: Any, name: str, wrapper: Any) -> None:
        # an instance attribute shadows the method: Lightning calls it through the instance
        setattr(obj, name, wrapper)
        self._patched.append((obj, name))

    def _unpatch(self) -> None:
        for obj, name in reversed(self._patched):
            obj.__dict__.pop(name, None)
        self._patched.clear()
        self._deciding = None

    # -- the wrappers --------------------------------------------------------------------

    def _watch_reduce(self, original: Any) -> Any:
        @functools.wraps(original)
        def reduce_boolean_decision(*args: Any, **kwargs: Any) -> bool:
            result = original(*args, **kwargs)
            deciding = self._deciding
            if deciding is not None and deciding.vote is None:  # the callback's own reduction
                deciding.vote = bool(args[0] if args else kwargs["decision"])
                deciding.decision = bool(result)
            return result

        return reduce_boolean_decision

    def _watch_top_k(self, cb: ModelCheckpoint, original: Any) -> Any:
        @functools.wraps(original)
        def check_monitor_top_k(trainer: pl.Trainer, current: Any = None) -> bool:
            self._record_saves()
            deciding = self._begin(cb, trainer, current)
            deciding.kept = dict(cb.best_k_models)
            try:
                result = original(trainer, current)
            finally:
                self._deciding = None
            deciding.decision = bool(result)
            if deciding.vote is None:  # decided without a vote (fewer than save_top_k kept): the same everywhere
                deciding.vote = deciding.decision
            if result:
                self._saving.append(deciding)  # ModelCheckpoint saves right after this returns
            else:
                deciding.best = _float(cb.best_model_score)
                self._record(deciding)
            return result

        return check_monitor_top_k

    def _watch_stop(self, cb: EarlyStopping, original: Any) -> Any:
        @functools.wraps(original)
        def hook(trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            self._record_saves()
            deciding = self._begin(cb, trainer, trainer.callback_metrics.get(cb.monitor))
            try:
                original(trainer, pl_module)
            finally:
                self._deciding = None
            if deciding.vote is not None:  # the check ran (it is skipped in other hooks, sanity checks...)
                deciding.best = _float(cb.best_score)
                self._record(deciding)

        return hook

    # -- rows ----------------------------------------------------------------------------

    def _begin(self, cb: Callback, trainer: pl.Trainer, current: Any) -> _Decision:
        self._deciding = _Decision(cb, trainer.global_step, trainer.current_epoch, _float(current))
        return self._deciding

    def _record_saves(self) -> None:
        """The saves decided earlier are done now: their path is the entry they put in best_k_models."""
        for deciding in self._saving:
            cb = cast(ModelCheckpoint, deciding.callback)  # or pytorch_lightning's: the same class, copied
            new = [path for path, score in cb.best_k_models.items() if deciding.kept.get(path) is not score]
            deciding.path = new[0] if new else cb.best_model_path or None
            deciding.best = _float(cb.best_model_score)
            self._record(deciding)
        self._saving.clear()

    def _record(self, deciding: _Decision) -> None:
        if self._logger is not None:
            self._logger.record("decisions", **deciding.row())


def _float(value: Any) -> float | None:
    """A monitored value (a 0-dim tensor, a number, or None) as a float."""
    if value is None:
        return None
    return float(value.item() if hasattr(value, "item") else value)
