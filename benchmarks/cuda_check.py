"""A real CUDA training with MultiRankLogger beside CSVLogger: run on a GPU machine by hand.

``python benchmarks/cuda_check.py --out DIR [--steps N]``: one GPU, a small MLP on random
data, both loggers attached to the same Trainer. Checks what CI cannot (no GPU there):
values logged from CUDA tensors land in the store, the run ends `success`, and the rank-0
export is byte for byte the metrics.csv CSVLogger wrote for the same run. Prints the
wall time of `fit` with each logger alone and with none, for scale.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from multirank_logger import MultiRankLogger, open_store  # noqa: E402


class _Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        self.log("gpu_mem_mib", torch.cuda.memory_allocated() / 2**20)
        self.log("lr", self.trainer.optimizers[0].param_groups[0]["lr"])
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def _fit(out: Path, steps: int, loggers: list) -> float:
    data = TensorDataset(torch.randn(steps * 64, 256), torch.randn(steps * 64, 1))
    trainer = pl.Trainer(
        accelerator="gpu", devices=1, max_epochs=1, logger=loggers or False, log_every_n_steps=1,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=str(out), limit_val_batches=4,
    )
    start = time.perf_counter()
    trainer.fit(_Model(), DataLoader(data, batch_size=64), DataLoader(data, batch_size=64))
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    assert torch.cuda.is_available(), "no CUDA device"
    print("device:", torch.cuda.get_device_name(0), "torch", torch.__version__, "lightning", pl.__version__)
    pl.seed_everything(0)
    _fit(args.out / "warmup", 50, [])
    for db in ("runs.duckdb", "runs.sqlite"):
        save = args.out / db.replace(".", "_")
        ours = MultiRankLogger(db=str(save / db), name="cuda", save_dir=str(save))
        csv = CSVLogger(str(save / "csv"), name="cuda")
        wall = _fit(save, args.steps, [ours, csv])
        store = open_store(str(save / db))
        runs = store.runs()
        print(db, f"fit with both loggers {wall:.2f} s;", "status:", runs["status"].iloc[-1],
              "rows:", int(store.sql("SELECT count(*) AS n FROM metrics")["n"].iloc[0]))
        mine = (Path(ours.log_dir) / "metrics.csv").read_bytes()
        theirs = (Path(csv.log_dir) / "metrics.csv").read_bytes()
        print(db, "metrics.csv identical to CSVLogger's:", mine == theirs, f"({len(mine)} bytes, {len(mine.splitlines())} lines)")
        if mine != theirs:
            return 1
    for label, make in (("logger=False", lambda s: []), ("CSVLogger", lambda s: [CSVLogger(str(s), name="t")]),
                        ("MultiRankLogger duckdb", lambda s: [MultiRankLogger(db=str(s / "t.duckdb"), name="t")]),
                        ("MultiRankLogger sqlite", lambda s: [MultiRankLogger(db=str(s / "t.sqlite"), name="t")])):
        times = []
        for i in range(3):
            save = args.out / f"timing_{label.replace(' ', '_').replace('=', '_')}_{i}"
            times.append(_fit(save, args.steps, make(save)))
        print(f"timing {label}: fit {min(times):.3f} s best of 3 ({', '.join(f'{t:.3f}' for t in times)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
