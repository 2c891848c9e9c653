"""A real 2-rank DDP training on CPU, logged by MultiRankLogger into demo_runs/runs.duckdb.

Run it with `make demo`. Each rank trains on its own shard of the data, so each rank's
unsynced `train_loss` differs: the per-rank view shows both, where CSVLogger keeps rank 0's.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pandas as pd
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_only
from torch.utils.data import DataLoader, TensorDataset

from multirank_logger import MultiRankLogger, StepTimer
from multirank_logger.errors import SchemaOutdated
from multirank_logger.query.reader import open_store
from multirank_logger.store.sql_store import Store

DB = Path("demo_runs") / "runs.duckdb"


class Regression(LightningModule):
    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)  # sync_dist=False: each rank records its own value
        self.log("mean_loss", loss, sync_dist=True)  # the same value on every rank
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(512, 8, generator=g)
        y = x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(512, 1, generator=g)
        return DataLoader(TensorDataset(x, y), batch_size=16)


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
    logger = MultiRankLogger(db=str(DB), name="demo")
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=1,
        log_every_n_steps=2,
        logger=logger,
        callbacks=[StepTimer()],  # each rank's data wait, forward and the rest per step: the report's stragglers
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Regression())
    if not trainer.is_global_zero:
        return
    pd.set_option("display.width", 160)
    with open_store(str(DB)) as store:
        print("\n== runs in", DB)
        print(store.runs().to_string(index=False))
        print(f"\n== train_loss per rank, run {logger.name}/version_{logger.version} (step x rank)")
        print(store.per_rank("train_loss", run=logger.run_id).to_string())
    print(f"\nCSVLogger's files for this run: {logger.log_dir}/metrics.csv, hparams.yaml")
    print(f'Query it yourself: {cli_command()} sql {DB} "SELECT rank, step, value FROM metrics WHERE key = \'train_loss\'"')
    _report(logger.run_id)


def _report(run_id: int) -> None:
    """This run's report (which rank is the problem), as report.html next to the store."""
    from multirank_logger.report import find
    from multirank_logger.ui.report_page import write_report

    page = DB.parent / "report.html"
    with open_store(str(DB)) as store:
        write_report(store, find(store, run=run_id), page)
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
