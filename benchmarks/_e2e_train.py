"""A 2-rank DDP training on CPU that logs `--metrics` values every step, once per variant.

Run by bench_e2e (never by hand): ``python benchmarks/_e2e_train.py --variants a,b --steps N
--metrics 5 --out DIR``. Lightning's launcher starts rank 1 by re-running this script, so
every rank runs the same variants in the same order. Each rank writes
``DIR/rank{r}.json``: per variant, the wall time of ``trainer.fit`` (logger set-up,
every step, finalize), the time of the training loop alone, the CPU seconds the rank
spent in the fit (all its threads), and the rank's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers.logger import Logger
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from torch import nn
from torch.utils.data import DataLoader, Dataset

WARMUP = "warm-up"
CONTROL = "control: rank 0 busy 0.2 ms/step"
CONTROL_EVERY_RANK = "control: every rank busy 0.2 ms/step"
NO_OP = "no-op Logger (Lightning's floor)"
VARIANTS = ("logger=False", NO_OP, CONTROL, CONTROL_EVERY_RANK, "CSVLogger", "TensorBoardLogger", "MultiRankLogger direct", "MultiRankLogger gather")
BATCH = 32
FEATURES = 32


class _Constant(Dataset):
    """`n` copies of one sample: the data pipeline costs the same in every variant."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.x = torch.randn(FEATURES)
        self.y = torch.randn(1)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x, self.y


class _Model(pl.LightningModule):
    def __init__(self, n_metrics: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 1))
        self.n_metrics = n_metrics

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=False)
        detached = loss.detach()
        for i in range(1, self.n_metrics):
            self.log(f"metric_{i}", detached * i, on_step=True, on_epoch=False)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


class _LoopTimer(pl.Callback):
    """The loop's wall time, and its steady part: from the end of step `STEADY_FROM` on.

    A logger starts on its first call, inside the first step (MultiRankLogger: the run's
    identity, the store, ~0.35 s the first time DuckDB is imported and a store created), so
    the steady part is the per-step cost without that one-time set-up.
    """

    STEADY_FROM = 10

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.t0 = time.perf_counter()
        self.t_steady = self.t0

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        if trainer.global_step == self.STEADY_FROM:
            self.t_steady = time.perf_counter()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        end = time.perf_counter()
        self.seconds = end - self.t0
        self.steady_seconds = end - self.t_steady


class _BusyLogger(Logger):
    """The controls: a logger that stores nothing and spins `spin_s` per call, on rank 0 only
    (as CSVLogger and TensorBoardLogger work) or on every rank (as MultiRankLogger works).
    With no spin it is the floor: what Lightning spends per step once any logger is attached.

    On this 2-core VM, making rank 0 alone slower per step made the 2-rank fit *faster*
    (0.88x of no logger), with the ranks floating or pinned one per core (E2E_PIN=1); the
    same spin on every rank did not (1.01x). An all-reduce both ranks reach together costs
    more here than one rank 1 waits in. These rows show how much of a logger's ratio that
    effect explains: a rank-0-only logger gains from it, a logger of every rank cannot.
    """

    @property
    def name(self) -> str:
        return "control"

    @property
    def version(self) -> int:
        return 0

    def __init__(self, every_rank: bool = False, spin_s: float = 200e-6) -> None:
        super().__init__()
        self.every_rank = every_rank
        self.spin_s = spin_s

    def log_metrics(self, metrics: Any, step: Any = None) -> None:
        if not self.every_rank and rank_zero_only.rank != 0:
            return
        end = time.perf_counter() + self.spin_s
        while time.perf_counter() < end:
            pass

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass


def _logger(variant: str, root: Path) -> Any:
    if variant in ("logger=False", WARMUP):
        return False
    if variant == CONTROL:
        return _BusyLogger()
    if variant == CONTROL_EVERY_RANK:
        return _BusyLogger(every_rank=True)
    if variant == NO_OP:
        return _BusyLogger(every_rank=True, spin_s=0.0)
    if variant == "CSVLogger":
        from lightning.pytorch.loggers import CSVLogger

        return CSVLogger(root, name="csv")
    if variant == "TensorBoardLogger":
        from lightning.pytorch.loggers import TensorBoardLogger

        return TensorBoardLogger(root, name="tb")
    from multirank_logger.logger.multi_rank_logger import MultiRankLogger

    if variant == "MultiRankLogger direct":
        return MultiRankLogger(db=root / "direct.sqlite", name="e2e", save_dir=root, transport="direct")
    if variant == "MultiRankLogger gather":
        return MultiRankLogger(db=root / "gather.duckdb", name="e2e", save_dir=root, transport="gather")
    raise ValueError(variant)


def _cpu_s() -> float:
    """CPU seconds (user + system) of this process, all its threads (the logger's writer too)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_variant(variant: str, steps: int, n_metrics: int, root: Path) -> dict[str, Any]:
    timer = _LoopTimer()
    world = 2
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=world,
        strategy="ddp",
        max_steps=steps,
        max_epochs=1,
        logger=_logger(variant, root / variant.replace(" ", "_").replace("=", "_")),
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[timer],
        default_root_dir=root,
    )
    data = DataLoader(_Constant(steps * BATCH * world), batch_size=BATCH)
    cpu0 = _cpu_s()
    t0 = time.perf_counter()
    trainer.fit(_Model(n_metrics), data)
    fit_s = time.perf_counter() - t0
    cpu_s = _cpu_s() - cpu0
    return {
        "variant": variant,
        "fit_s": fit_s,
        "loop_s": timer.seconds,
        "steady_s": timer.steady_seconds,
        "cpu_s": cpu_s,
        "steps": trainer.global_step,
        "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--variants", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--metrics", type=int, default=5)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    if os.environ.get("E2E_PIN"):  # one core per rank, to tell core contention from other effects
        # rank 1 is started by rank 0, after rank 0 pinned itself: the CPU list rides in the env
        cpus = os.environ.setdefault("E2E_CPUS", ",".join(map(str, sorted(os.sched_getaffinity(0))))).split(",")
        if len(cpus) >= 2:
            os.sched_setaffinity(0, {int(cpus[rank % len(cpus)])})
    # The first fit starts rank 1 (imports, ~4 s) and the process group: a short
    # warm-up fit takes that out of every measured variant.
    run_variant(WARMUP, 5, args.metrics, args.out)
    reports = []
    for variant in args.variants.split(","):
        reports.append(run_variant(variant, args.steps, args.metrics, args.out))
    (args.out / f"rank{rank}.json").write_text(json.dumps(reports))
    sys.exit(0)


if __name__ == "__main__":
    main()
