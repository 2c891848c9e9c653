"""A real 3-rank DDP training on CPU (gloo), logged by MultiRankLogger into demo_runs/runs.duckdb,
with two problems planted that only a per-rank view shows:

- rank 1 is slow: its data loading sleeps 100 ms a batch, and every rank waits for it at each
  step's gradient sync (StepTimer's data wait names it the straggler);
- rank 2's shard goes bad: from step 25 its batches hold NaN; the gradient sync carries the NaN
  into every rank's weights a step later, so all ranks log NaN, and the report names rank 2 as
  where it started.

Run it with `make demo` (about a minute on 2 cores): it ends with the report naming both ranks
and the command that opens the page.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import pandas as pd
import torch
import torch.distributed as dist
from lightning.pytorch import LightningModule, Trainer, seed_everything
from lightning.pytorch.utilities import rank_zero_only
from torch.utils.data import DataLoader, TensorDataset, default_collate

from multirank_logger import MultiRankLogger, StepTimer
from multirank_logger.errors import SchemaOutdated
from multirank_logger.query.reader import open_store
from multirank_logger.store.sql_store import Store

DB = Path("demo_runs") / "runs.duckdb"
RANKS, STEPS = 3, 40
# 100 ms: well above the 10-50 ms a loaded 2-core host puts on any rank's data now and then
SLOW_RANK, SLOW_S = 1, 0.100
BAD_RANK, BAD_FROM = 2, 25
# every rank's compute per step: a loaded host's few ms of noise stay a small part of a step
COMPUTE_S = 0.050


class Regression(LightningModule):
    def __init__(self, lr: float = 0.02) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(8, 1)
        self.batches_served = 0

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        time.sleep(COMPUTE_S)  # the model's compute, the same on every rank
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)  # sync_dist=False: each rank records its own value
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(RANKS * 8 * STEPS, 8, generator=g)
        y = x @ torch.randn(8, 1, generator=g) + 0.5 * torch.randn(len(x), 1, generator=g)
        return DataLoader(TensorDataset(x, y), batch_size=8, collate_fn=self._collate)

    def _collate(self, items: list) -> list[torch.Tensor]:
        x, y = default_collate(items)
        rank = dist.get_rank() if dist.is_initialized() else 0
        if rank == SLOW_RANK:
            time.sleep(SLOW_S)  # a slow shard: this rank waits for its data, the others for it
        if rank == BAD_RANK and self.batches_served >= BAD_FROM:
            x = torch.full_like(x, float("nan"))  # a corrupt shard: its records read as NaN
        self.batches_served += 1
        return [x, y]


@rank_zero_only  # the launcher re-runs this script for rank 1, while rank 0 may hold the file
def _upgrade_if_outdated() -> None:
    """This demo's own store, kept from an earlier version's demo: bring its schema up, as
    `multirank-logger db upgrade` would (a store of yours: back it up first)."""
    try:
        Store(DB, readonly=True).close()
    except SchemaOutdated as exc:
        store = Store.for_upgrade(DB)
        store.upgrade()
        store.close()
        print(f"Upgraded the demo's store {DB} from schema {exc.found} to {exc.head}.")


def main() -> None:
    if DB.exists():
        _upgrade_if_outdated()
    seed_everything(0, verbose=False)  # one trajectory: the same report every run
    torch.set_num_threads(1)  # 3 ranks on 2 cores: no rank's threads crowding the others
    logger = MultiRankLogger(db=str(DB), name="demo", flush_interval=0.5)
    trainer = Trainer(
        accelerator="cpu",
        devices=RANKS,
        strategy="ddp",  # over gloo on CPU
        max_steps=STEPS,
        log_every_n_steps=1,
        logger=logger,
        callbacks=[StepTimer()],  # each rank's data wait, forward and the rest per step: the report's stragglers
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    trainer.fit(Regression())
    if not trainer.is_global_zero:
        return
    pd.set_option("display.width", 160)
    with open_store(str(DB)) as store:
        print("\n== runs in", DB)
        print(store.runs().to_string(index=False))
        print(f"\n== train_loss per rank around step {BAD_FROM}, run {logger.name}/version_{logger.version} (step x rank)")
        print(store.per_rank("train_loss", run=logger.run_id).loc[BAD_FROM - 3 : BAD_FROM + 2].to_string())
    print(f"\nCSVLogger's files for this run: {logger.log_dir}/metrics.csv, hparams.yaml")
    print(f'Query it yourself: {cli_command()} sql {DB} "SELECT rank, step, value FROM metrics WHERE key = \'train_loss\'"')
    _report(logger.run_id)


def _report(run_id: int) -> None:
    """This run's report (which rank is the problem), as report.html next to the store."""
    from multirank_logger.report import find
    from multirank_logger.report.render import findings_text
    from multirank_logger.ui.report_page import write_report

    page = DB.parent / "report.html"
    with open_store(str(DB)) as store:
        found = find(store, run=run_id)
        write_report(store, found, page)
    print(f"\n== the report: rank {SLOW_RANK} was made slow, rank {BAD_RANK}'s shard bad from step {BAD_FROM}")
    print(findings_text(found))
    print(f"\nThis run's report: {page.resolve()}")
    print(f"In the terminal: {cli_command()} report {DB} --run {run_id}")
    print(f"Live in a browser (runs, heatmaps, findings): {cli_command()} ui {DB}")


def cli_command() -> str:
    """The command that runs `multirank-logger` from this shell: its bare name where it is on
    PATH (an active venv), else the script next to this Python (`make demo` runs .venv/bin/python
    from a shell without .venv active: the bare name is "command not found" there)."""
    beside = Path(sys.executable).parent / "multirank-logger"
    found = shutil.which("multirank-logger")
    if found and (not beside.exists() or Path(found).resolve() == beside.resolve()):
        return "multirank-logger"
    if beside.exists():
        try:
            return str(beside.relative_to(Path.cwd()))
        except ValueError:
            return str(beside)
    return f"{sys.executable} -m multirank_logger.cli"


if __name__ == "__main__":
    main()
