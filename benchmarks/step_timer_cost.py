"""What StepTimer costs per training step: its hooks alone, and a whole fit with and without it.

    .venv/bin/python benchmarks/step_timer_cost.py [--steps 1500] [--rounds 5] [--accelerator cuda]

Two figures, one process on CPU (the callback's cost is per rank, whatever the world size):

- hooks: StepTimer's three per-step hooks (batch start, before backward, batch end: two
  clock reads, the batch size, one pread of /proc/self/statm, one ``record``) called in a
  loop against a live MultiRankLogger on SQLite; microseconds per step, median of rounds;
- fit: the steady training loop (after step 50) of a small model logging 5 keys per step,
  with and without StepTimer, rounds interleaved (A B A B ...); the ratio of the medians,
  and the rounds' own spread without it, to tell a cost from noise.

With ``--accelerator cuda`` the fits train on the GPU (StepTimer then times forward and rest with
CUDA events and records the allocator's peaks and retries); the last timed fit's step_timing
rows are summarized at the end either way, as a check of what was recorded.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from multirank_logger import MultiRankLogger, StepTimer, open_store  # noqa: E402

STEADY_FROM = 50


class _Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        for i in range(5):
            self.log(f"metric_{i}", loss.detach() * i if i else loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


class _Steady(pl.Callback):
    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == STEADY_FROM:
            self.start = time.perf_counter()

    def on_train_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self.seconds = time.perf_counter() - self.start


def _fit(folder: Path, steps: int, timed: bool, accelerator: str = "cpu") -> float:
    data = TensorDataset(torch.randn(steps * 16, 32), torch.randn(steps * 16, 1))
    steady = _Steady()
    trainer = pl.Trainer(
        accelerator=accelerator, devices=1, max_steps=steps, log_every_n_steps=1, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False,
        logger=MultiRankLogger(db=str(folder / "runs.sqlite"), save_dir=str(folder)),
        callbacks=[steady, StepTimer()] if timed else [steady],
    )
    trainer.fit(_Model(), DataLoader(data, batch_size=16))
    return steady.seconds / (steps - STEADY_FROM)


def _hooks(folder: Path, steps: int) -> float:
    """StepTimer's per-step hooks alone, against a live logger, in microseconds per step."""
    logger = MultiRankLogger(db=str(folder / "hooks.sqlite"), save_dir=str(folder))
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=logger, max_steps=1, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False)
    model = _Model()
    timer = StepTimer()
    timer.on_train_start(trainer, model)
    batch = [torch.randn(16, 32), torch.randn(16, 1)]
    loss = torch.tensor(1.0)
    start = time.perf_counter()
    for i in range(steps):
        timer.on_train_batch_start(trainer, model, batch, i)
        timer.on_before_backward(trainer, model, loss)
        timer.on_train_batch_end(trainer, model, None, batch, i)
    elapsed = time.perf_counter() - start
    timer.on_train_end(trainer, model)
    logger.finalize("success")
    return elapsed / steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--accelerator", default="cpu")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        hooks = [_hooks(Path(tmp) / f"h{r}", 20_000) for r in range(args.rounds)]
        times: dict[bool, list[float]] = {False: [], True: []}
        for r in range(args.rounds):
            for timed in (False, True):
                times[timed].append(_fit(Path(tmp) / f"f{r}{int(timed)}", args.steps, timed, args.accelerator))
        with open_store(str(Path(tmp) / f"f{args.rounds - 1}1" / "runs.sqlite")) as store:
            recorded = store.sql(
                "SELECT COUNT(*) AS rows, AVG(data_s) AS data_s, AVG(forward_s) AS forward_s, "
                "AVG(rest_s) AS rest_s, MAX(batch_size) AS batch, MAX(mem_allocated_peak) AS alloc_peak, "
                "MAX(mem_reserved_peak) AS reserved_peak, MAX(alloc_retries) AS retries, MAX(rss) AS rss "
                "FROM step_timing"
            )
    without, with_ = statistics.median(times[False]), statistics.median(times[True])
    spread = (max(times[False]) - min(times[False])) / without
    print(f"StepTimer hooks alone: {statistics.median(hooks):.1f} us/step (median of {args.rounds} rounds "
          f"of 20,000 steps; min {min(hooks):.1f}, max {max(hooks):.1f})")
    print(f"steady fit, {args.steps} steps x {args.rounds} rounds: without {without * 1e3:.3f} ms/step, "
          f"with {with_ * 1e3:.3f} ms/step: ratio {with_ / without:.3f} "
          f"(the rounds without it spread {spread:.1%} of their median); fastest rounds: without "
          f"{min(times[False]) * 1e3:.3f}, with {min(times[True]) * 1e3:.3f} ms/step: ratio "
          f"{min(times[True]) / min(times[False]):.3f}")
    print(f"step_timing of the last timed fit ({args.accelerator}):\n{recorded.to_string(index=False)}")


if __name__ == "__main__":
    main()
