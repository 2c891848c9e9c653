"""StepTimer: where each rank's training steps go, recorded per rank and step in the store.

Log-call timestamps cannot show a straggler: in DDP every rank waits for the slowest one
in the gradients' all-reduce, so all ranks finish each step, and log, together. What
differs is where each rank spent the step: the slow rank waited for its data (or
computed longer), the others waited in the all-reduce. This callback splits each step
of each rank at Lightning's hooks:

- data: from the end of one batch (``on_train_batch_end``) to the start of the next
  (``on_train_batch_start``): fetching the batch (Lightning prefetches one ahead, so the
  fetch of the batch after), the logger calls, validation when it runs there;
- forward: ``on_train_batch_start`` to ``on_before_backward`` (``training_step``, and its
  ``sync_dist`` collectives if it logs with them);
- rest: ``on_before_backward`` to ``on_train_batch_end`` (backward, the all-reduce that
  DDP overlaps with it, the optimizer step).

On CUDA, forward and rest are the GPU's own times (CUDA events, read once they have
completed, so no step ever waits for the GPU); data is the host's time. With them: peak
allocated and reserved bytes since the previous step and the allocator's retries (one
``torch.cuda.memory_stats`` call), and everywhere the process's resident set (one read
of ``/proc/self/statm``), and the batch size (the leading size of its first tensor).

Example::

    from multirank_logger import MultiRankLogger, StepTimer

    trainer = Trainer(logger=MultiRankLogger(db="runs.sqlite"), callbacks=[StepTimer()], strategy="ddp")
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from typing_extensions import override

__all__ = ["StepTimer"]

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class StepTimer(Callback):
    """Record each rank's data wait, forward and rest of every training step, its memory and batch size.

    Needs a ``MultiRankLogger`` among the Trainer's loggers (rows go to its ``step_timing``
    table); without one it warns once and records nothing.

    Args:
        every_n_steps: record one step in this many (1: every step).
    """

    def __init__(self, every_n_steps: int = 1) -> None:
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be 1 or more, got {every_n_steps}")
        self.every_n_steps = every_n_steps
        self._reset()

    def _reset(self) -> None:
        self._logger: Any = None
        self._cuda: torch.device | None = None
        self._statm: int | None = None  # fd of /proc/self/statm, opened in this process
        self._last_end: float | None = None
        self._row: dict[str, Any] | None = None
        self._marks: list[float] = []
        self._events: list[Any] = []
        self._pending: list[tuple[dict[str, Any], list[Any]]] = []  # CUDA rows whose events are not done

    def __getstate__(self) -> dict[str, Any]:
        # pickled into ddp_spawn workers: a file descriptor and CUDA events stay behind
        return {"every_n_steps": self.every_n_steps}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.every_n_steps = state["every_n_steps"]
        self._reset()

    # -- Lightning hooks -----------------------------------------------------------------------

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        from multirank_logger.logger.multi_rank_logger import MultiRankLogger

        self._logger = next((lg for lg in trainer.loggers if isinstance(lg, MultiRankLogger)), None)
        if self._logger is None:
            warnings.warn(
                "StepTimer records into a MultiRankLogger, and the Trainer has none: nothing is recorded. "
                "Pass logger=MultiRankLogger(db=...) to the Trainer.",
                stacklevel=2,
            )
        self._cuda = pl_module.device if pl_module.device.type == "cuda" else None
        try:
            self._statm = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:  # not Linux: no RSS
            self._statm = None
        self._last_end = None

    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        now = time.perf_counter()
        step = trainer.global_step
        if self._logger is None or step % self.every_n_steps:
            self._row = None
            return
        self._row = {
            "step": step,
            "epoch": trainer.current_epoch,
            "batch_idx": batch_idx,
            "data_s": None if self._last_end is None else now - self._last_end,
            "batch_size": _batch_size(batch),
        }
        self._marks = [now]
        if self._cuda is not None:
            self._events = [_cuda_event()]

    @override
    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor) -> None:
        if self._row is not None and len(self._marks) == 1:  # the first backward of the step
            self._marks.append(time.perf_counter())
            if self._cuda is not None:
                self._events.append(_cuda_event())

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        end = time.perf_counter()
        row, self._row = self._row, None
        if row is not None:
            if len(self._marks) == 1:  # no backward this step (training_step returned None)
                self._marks.append(end)
            start, backward = self._marks
            row.update(forward_s=backward - start, rest_s=end - backward, rss=self._rss(), time=time.time())
            if self._cuda is None:
                self._logger.record("step_timing", **row)
            else:
                row.update(_cuda_memory(self._cuda))
                self._events += [_cuda_event()] * (3 - len(self._events))
                self._pending.append((row, self._events))
                self._events = []
            self._record_completed(wait=False)
        self._last_end = time.perf_counter()  # after our own work: it is not the data loader's

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._record_completed(wait=True)
        self._close_statm()

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._close_statm()  # a failed fit never reaches on_train_end

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._close_statm()

    # -- helpers -------------------------------------------------------------------------------

    def _record_completed(self, wait: bool) -> None:
        """CUDA rows whose events the GPU has passed: forward and rest are the GPU's times."""
        while self._pending:
            row, (start, backward, end) = self._pending[0]
            if not wait and not end.query():
                return  # in order: a later step's events are not done either
            end.synchronize()
            row.update(forward_s=start.elapsed_time(backward) / 1e3, rest_s=backward.elapsed_time(end) / 1e3)
            self._logger.record("step_timing", **row)
            self._pending.pop(0)

    def _close_statm(self) -> None:
        if self._statm is not None:
            os.close(self._statm)
            self._statm = None

    def _rss(self) -> int | None:
        if self._statm is None:
            return None
        # statm: size resident shared ... in pages; one pread, no open/close per step
        return int(os.pread(self._statm, 64, 0).split()[1]) * _PAGE_SIZE


def _cuda_event() -> Any:
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def _cuda_memory(device: torch.device) -> dict[str, int]:
    stats = torch.cuda.memory_stats(device)
    torch.cuda.reset_peak_memory_stats(device)  # the next step's peaks are its own
    return {
        "mem_allocated_peak": int(stats.get("allocated_bytes.all.peak", 0)),
        "mem_reserved_peak": int(stats.get("reserved_bytes.all.peak", 0)),
        "alloc_retries": int(stats.get("num_alloc_retries", 0)),
    }


def _batch_size(batch: Any) -> int | None:
    """The leading size of the batch's first tensor, as Lightning infers a batch size (which
    costs twenty times as much a call through ``extract_batch_size``: benchmarks/step_timer_cost.py)."""
    while True:
        if isinstance(batch, torch.Tensor):
            return int(batch.shape[0]) if batch.ndim else 1
        if isinstance(batch, (list, tuple)) and batch:
            batch = batch[0]
        elif isinstance(batch, Mapping) and batch:
            batch = next(iter(batch.values()))
        else:
            return None  # no tensor first in the batch: no size to record
