"""StepTimer in a real one-process fit on CPU (the 3-rank DDP runs are in tests/runs/test_report_ddp.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset

from multirank_logger import MultiRankLogger, StepTimer
from tests.helpers.logger_helpers import query


class _Model(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _fit(tmp_path: Path, timer: StepTimer, logger: object) -> None:
    data = TensorDataset(torch.randn(44, 4), torch.randn(44, 1))  # 5 batches of 8, then one of 4
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=logger, callbacks=[timer],
                      enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                      default_root_dir=tmp_path)
    trainer.fit(_Model(), DataLoader(data, batch_size=8))


def test_step_timer_records_sampled_steps_with_their_batch_size(tmp_path: Path) -> None:
    """every_n_steps=3 over 12 steps: steps 0, 3, 6, 9 with their parts and RSS; every step: its batch size
    (4 for each epoch's last batch)."""
    db = tmp_path / "runs.sqlite"
    _fit(tmp_path, StepTimer(every_n_steps=3), MultiRankLogger(db=str(db), save_dir=str(tmp_path)))
    rows = query(db, "SELECT step, epoch, batch_idx, batch_size, data_s, forward_s, rest_s, rss, mem_allocated_peak "
                     "FROM step_timing ORDER BY seq")
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [(0, 0, 0, 8), (3, 0, 3, 8), (6, 1, 0, 8), (9, 1, 3, 8)]
    assert rows[0][4] is None and all(r[4] >= 0 for r in rows[1:])  # nothing to wait from before the first batch
    assert all(r[5] > 0 and r[6] > 0 and r[7] > 2**20 and r[8] is None for r in rows)  # CPU: RSS, no CUDA peaks
    _fit(tmp_path, StepTimer(every_n_steps=1), MultiRankLogger(db=str(db), save_dir=str(tmp_path)))
    sizes = query(db, "SELECT batch_size, COUNT(*) FROM step_timing WHERE run_id = 2 GROUP BY batch_size")
    assert sorted(sizes) == [(4, 2), (8, 10)]


def test_step_timer_without_multirank_logger_warns(tmp_path: Path) -> None:
    """With no MultiRankLogger to record into, StepTimer says so and the fit goes on."""
    with pytest.warns(UserWarning, match="StepTimer records into a MultiRankLogger"):
        _fit(tmp_path, StepTimer(), False)


def test_every_n_steps_must_be_positive() -> None:
    with pytest.raises(ValueError, match="every_n_steps must be 1 or more"):
        StepTimer(every_n_steps=0)


def _statm_fds() -> list[str]:
    fds = Path("/proc/self/fd")
    return [f.name for f in fds.iterdir() if f.name != "." and "statm" in _link(f)]


def _link(fd: Path) -> str:
    try:
        return str(fd.readlink())
    except OSError:  # the listing's own descriptor, closed already
        return ""


class _Failing(_Model):
    def __init__(self) -> None:
        super().__init__()
        self.open_at_failure: list[str] = []  # the statm descriptors open when the step fails

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        if batch_idx == 2:
            self.open_at_failure = _statm_fds()
            raise RuntimeError("a failing step")
        return super().training_step(batch, batch_idx)


def test_a_failed_fit_leaves_no_descriptor_open(tmp_path: Path) -> None:
    """A fit that fails mid-epoch: StepTimer's /proc/self/statm descriptor is closed with it
    (before: only on_train_end closed it, which a failed fit never reaches)."""
    before = _statm_fds()
    data = TensorDataset(torch.randn(40, 4), torch.randn(40, 1))
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=MultiRankLogger(db=tmp_path / "runs.sqlite"),
                      callbacks=[StepTimer()], enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, default_root_dir=tmp_path)
    model = _Failing()
    with pytest.raises(RuntimeError, match="a failing step"):
        trainer.fit(model, DataLoader(data, batch_size=8))
    assert len(model.open_at_failure) == len(before) + 1  # StepTimer had opened its descriptor...
    assert _statm_fds() == before  # ...and closed it
