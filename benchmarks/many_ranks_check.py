"""A real N-rank CPU DDP training with MultiRankLogger (Lightning's launcher, gloo): run by hand on a
machine with cores to spare (64 ranks on the lent 16-core machine); the suite runs it at 3 ranks.

``python benchmarks/many_ranks_check.py --devices 64 --steps 200 --rounds 2 --out DIR``

Each sample is one launch of this script as ``Trainer(accelerator="cpu", devices=N,
strategy="ddp")`` (Lightning starts ranks 1..N-1 by re-running it), one thread per rank, every
rank logging its own `train_loss`, `weight_norm` and `grad_norm` every step. Variants, run in
turn within each round so that each sees the same machine: ``logger=False`` (the peer),
``CSVLogger`` (rank 0 writes metrics.csv) and ``MultiRankLogger`` with its defaults on a DuckDB
file (``transport="auto"``: rank 0 writes every rank's rows). Rank N - 3 (`bad_rank`) logs a
train_loss 20x its own from step `LOSS_FROM` on, in every variant (the same compute).

Checked on the MultiRankLogger stores: each run ``success``, every rank's every step of every
key stored once, and ``multirank-logger report`` names the planted rank as the train_loss
outlier. Printed: rank 0's wall time of ``trainer.fit`` (the launch of the other ranks included)
and of its training loop alone, per variant and round, and their ratios to ``logger=False`` of
the same round. Exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: benchmarks/ alone is on the path
from benchmarks._harness import launch_env, run_launch  # noqa: E402

VARIANTS = ("logger=False", "CSVLogger", "MultiRankLogger")
KEYS = ("train_loss", "weight_norm", "grad_norm")
LOSS_FROM, LOSS_FACTOR = 20, 20.0
BATCH, FEATURES = 32, 32


def bad_rank(devices: int) -> int:
    """The rank that logs a train_loss 20x its own: neither rank 0 nor the last."""
    return devices - 3 if devices > 3 else devices - 1


def _train(variant: str, devices: int, steps: int, out: Path) -> None:
    """One rank of one launch (Lightning's launcher re-runs this for ranks 1..N-1)."""
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.loggers import CSVLogger
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from multirank_logger import MultiRankLogger

    torch.set_num_threads(1)
    bad = bad_rank(devices)

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 1))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            planted = self.global_rank == bad and self.global_step >= LOSS_FROM
            self.log("train_loss", loss.detach() * (LOSS_FACTOR if planted else 1.0))
            self.log("weight_norm", self.net[0].weight.detach().norm())
            return loss

        def on_before_optimizer_step(self, optimizer: Any) -> None:
            grads = [p.grad.detach().norm() for p in self.parameters() if p.grad is not None]
            self.log("grad_norm", torch.stack(grads).norm())

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    logger: Any = False
    if variant == "CSVLogger":
        logger = CSVLogger(str(out), name="csv")
    elif variant == "MultiRankLogger":
        logger = MultiRankLogger(db=str(out / "runs.duckdb"), name="many", save_dir=str(out))
    class LoopTimer(pl.Callback):
        """The training loop alone: at 64 ranks on 16 cores, fit's ~75 s are mostly the launch
        (63 processes importing torch, the process group) whatever the steps (60 or 200)."""

        def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            self.start = time.perf_counter()

        def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            self.seconds = time.perf_counter() - self.start

    timer = LoopTimer()
    trainer = pl.Trainer(
        accelerator="cpu", devices=devices, strategy="ddp", max_steps=steps, max_epochs=1, logger=logger,
        log_every_n_steps=1, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=str(out), callbacks=[timer],
    )
    g = torch.Generator().manual_seed(0)
    x = torch.randn(steps * BATCH * devices, FEATURES, generator=g)
    data = TensorDataset(x, x @ torch.randn(FEATURES, 1, generator=g))
    start = time.perf_counter()
    trainer.fit(Model(), DataLoader(data, batch_size=BATCH))
    if trainer.global_rank == 0:
        (out / f"{variant}.json").write_text(json.dumps({"fit_s": time.perf_counter() - start, "loop_s": timer.seconds,
                                                         "steps": trainer.global_step}))


def _pythonpath() -> str:
    """PYTHONPATH with the repository after what is there (wheels carried to a machine, say)."""
    return os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p)


def _launch(variant: str, devices: int, steps: int, out: Path, timeout_s: float) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, __file__, "--rank-of", variant, "--devices", str(devices), "--steps", str(steps),
           "--out", str(out)]
    returncode, output = run_launch(cmd, launch_env(PYTHONPATH=_pythonpath()), timeout_s, f"{variant} at {devices} ranks")
    report = out / f"{variant}.json"
    if returncode != 0 or not report.is_file():
        raise RuntimeError(f"{variant}: exit {returncode}: {output[-3000:]}")
    return json.loads(report.read_text())


def check_store(db: Path, devices: int, steps: int) -> list[str]:
    """What is wrong with the store of one MultiRankLogger launch (empty when nothing is)."""
    from multirank_logger import open_store

    problems = []
    with open_store(str(db)) as store:
        runs = store.runs()
        keys = ", ".join(f"'{k}'" for k in KEYS)
        counts = store.sql(
            f"SELECT rank, key, COUNT(*) AS n, COUNT(DISTINCT step) AS steps FROM metrics "
            f"WHERE key IN ({keys}) GROUP BY rank, key"
        )
    if list(runs["status"]) != ["success"]:
        problems.append(f"run status {list(runs['status'])}, not ['success']")
    if len(counts) != devices * len(KEYS):
        problems.append(f"{len(counts)} (rank, key) pairs stored, not {devices} x {len(KEYS)}")
    short = counts[(counts["n"] != steps) | (counts["steps"] != steps)]
    if len(short):
        problems.append(f"{len(short)} (rank, key) pairs without exactly {steps} rows: {short.head(5).to_dict('records')}")
    report = subprocess.run([sys.executable, "-m", "multirank_logger.cli", "report", str(db), "--format", "json"],
                            capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=_pythonpath()))
    if report.returncode != 0:
        return [*problems, f"report exited {report.returncode}: {report.stderr[-2000:]}"]
    found = json.loads(report.stdout)
    outliers = [(o["rank"], o["key"]) for o in found["outliers"]]
    if outliers != [(bad_rank(devices), "train_loss")]:
        problems.append(f"report's outliers {outliers}, not [({bad_rank(devices)}, 'train_loss')]")
    return problems


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=64)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of: " + ", ".join(VARIANTS))
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one launch may take")
    p.add_argument("--rank-of", choices=VARIANTS, help=argparse.SUPPRESS)  # a rank of one launch
    args = p.parse_args()
    if args.rank_of:
        _train(args.rank_of, args.devices, args.steps, args.out)
        return 0
    asked = args.variants.split(",")
    if unknown := sorted(set(asked) - set(VARIANTS)):
        p.error(f"unknown variant(s) {', '.join(unknown)}: choose among {', '.join(VARIANTS)}")
    variants = tuple(v for v in VARIANTS if v in asked)
    print(f"{args.devices} ranks on {os.cpu_count()} cores, {args.steps} steps, {args.rounds} rounds", flush=True)
    times: dict[str, list[float]] = {v: [] for v in variants}
    loops: dict[str, list[float]] = {v: [] for v in variants}
    problems: list[str] = []
    for round_ in range(args.rounds):
        order = variants[round_ % len(variants):] + variants[:round_ % len(variants)]
        for variant in order:
            out = args.out / f"round{round_}" / variant.replace("=", "_")
            result = _launch(variant, args.devices, args.steps, out, args.timeout)
            times[variant].append(result["fit_s"])
            loops[variant].append(result["loop_s"])
            print(f"round {round_} {variant}: fit {result['fit_s']:.2f} s, its training loop {result['loop_s']:.2f} s, "
                  f"{result['steps']} steps", flush=True)
            if variant == "MultiRankLogger":
                t0 = time.perf_counter()
                found = check_store(out / "runs.duckdb", args.devices, args.steps)
                print(f"  store checked in {time.perf_counter() - t0:.1f} s (report included): "
                      + ("; ".join(found) or f"success, {args.devices} ranks x {args.steps} steps x "
                         f"{len(KEYS)} keys once each, the report names rank {bad_rank(args.devices)}"), flush=True)
                problems += found
    for label, figures in (("fit", times), ("training loop", loops)):
        for variant in variants:
            got = figures[variant]
            line = f"{variant}: {label} median {statistics.median(got):.2f} s [{min(got):.2f}, {max(got):.2f}]"
            ratios = [t / base for t, base in zip(got, figures.get("logger=False", []))]
            if ratios:
                line += f", {statistics.median(ratios):.3f}x of logger=False [{min(ratios):.3f}, {max(ratios):.3f}]"
            print(line)
    for problem in problems:
        print("PROBLEM:", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
