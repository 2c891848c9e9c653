"""HF Transformers: `MultiRankCallback`, each rank's own loss, learning rate and gradient norm.

``Trainer(..., callbacks=[MultiRankCallback(db="runs.sqlite")])``. The Trainer averages the loss
across ranks before any callback sees it (``on_log``'s ``loss`` is the same on every rank), so a
rank's own loss is taken where the model returns it: a forward hook on the model the callbacks
receive (``on_train_begin``'s ``model``) reads ``outputs.loss`` on each training forward. That is
public API on both sides (a ``TrainerCallback`` and ``nn.Module.register_forward_hook``), works
for any model that returns a loss, and needs no Trainer subclass (a ``compute_loss`` override
would be one more line for the user, and clash with their own). The hook keeps the detached
tensor; the values are read once per optimizer step, in ``on_step_end`` (the loss: the mean over
the step's gradient-accumulation forwards), loss and gradient norm in one transfer from the
device. The Trainer itself already waits for the device each step (its default
``logging_nan_inf_filter`` tests every step's loss for NaN in Python), so reading them then
adds no stall of its own.

Per step, under ``train/``: ``loss`` (this rank's own), ``learning_rate``, ``grad_norm`` (the
norm of this rank's gradients as the optimizer receives them: after the Trainer's clipping to
``max_grad_norm``, so capped there, a NaN kept; under DDP they are already all-reduced, so it
agrees across ranks unless a rank's gradients diverged; the Trainer's pre-clip norm is
``on_log``'s ``grad_norm``, at its logging steps); and whatever ``on_log`` gives,
as the Trainer logged it (its cross-rank mean), at the same step. The run is the plain API's
(integrations/plain.py): one for all ranks, the watch on rank 0, ``success`` at
``on_train_end``, ``failed`` when a rank raises out of ``train()`` (at exit).
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from multirank_logger.integrations.plain import Run, init

__all__ = ["MultiRankCallback"]


class MultiRankCallback(TrainerCallback):
    """A Transformers callback that stores every rank's own training values in one run.

    Args:
        db: the store (a ``.sqlite`` / ``.duckdb`` path or a SQLAlchemy URL).
        name: the run's name (default: ``TrainingArguments.run_name``, else the script's name).
        options: any other keyword of `multirank_logger.init` (``transport``, ``watch``,
            ``on_alert``, ``alert_url``...).

    Example::

        trainer = Trainer(model=model, args=args, train_dataset=data,
                          callbacks=[MultiRankCallback(db="runs.sqlite")])
        trainer.train()
    """

    def __init__(self, db: str | os.PathLike[str] | None = None, name: str | None = None, **options: Any) -> None:
        self._db = db
        self._name = name
        self._options = options
        self.run: Run | None = None
        self._losses: list[torch.Tensor] = []
        self._grad_norm: torch.Tensor | None = None
        self._hook: Any = None

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self.run is None:
            self.run = init(db=self._db, name=self._name or args.run_name, config=_config(args), **self._options)
        model = kwargs.get("model")
        if model is not None and self._hook is None:
            self._hook = model.register_forward_hook(self._on_forward)

    def _on_forward(self, module: torch.nn.Module, inputs: Any, outputs: Any) -> None:
        if not module.training:
            return  # evaluation forwards are not this step's loss
        loss = outputs.get("loss") if isinstance(outputs, dict) else getattr(outputs, "loss", None)
        if isinstance(loss, torch.Tensor):
            self._losses.append(loss.detach())

    def on_pre_optimizer_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        model = kwargs.get("model")
        if model is None:
            return
        grads = [p.grad.detach() for p in model.parameters() if p.grad is not None]
        if grads:  # kept on the device (torch's fused norms over every gradient), read at the step's end
            self._grad_norm = torch.nn.utils.get_total_norm(grads)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self.run is None:
            return
        on_device: dict[str, torch.Tensor] = {}
        if self._losses:
            on_device["train/loss"] = torch.stack(self._losses).float().mean()
            self._losses.clear()
        if self._grad_norm is not None:
            norm = self._grad_norm.float()
            if on_device:  # beside the loss, for one transfer (a sharded model's norm may sit elsewhere)
                norm = norm.to(on_device["train/loss"].device)
            on_device["train/grad_norm"] = norm
            self._grad_norm = None
        values: dict[str, float] = {}
        if on_device:  # one transfer (one wait for the device) for both
            values = dict(zip(on_device, torch.stack(list(on_device.values())).tolist()))
        optimizer = kwargs.get("optimizer")
        if optimizer is not None and optimizer.param_groups:
            values["train/learning_rate"] = float(optimizer.param_groups[0]["lr"])
        if values:
            self.run.log(values, step=state.global_step)

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if self.run is None or not logs:
            return
        numbers = {f"log/{k}": float(v) for k, v in logs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if numbers:
            self.run.log(numbers, step=state.global_step)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.run is not None:
            self.run.finish("success")


def _config(args: TrainingArguments) -> dict[str, Any]:
    """The arguments that describe the training (JSON-able scalars only)."""
    keep = (bool, int, float, str)
    return {k: v for k, v in args.to_dict().items() if isinstance(v, keep) and not (isinstance(v, float) and math.isnan(v))}
