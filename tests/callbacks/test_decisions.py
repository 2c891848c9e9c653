"""DecisionAudit in one process (a real Trainer on CPU, a real SQLite store), and the read side
of a store without decisions or logs. The 2-rank disagreement itself is in tests/runs/test_audit_ddp.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

from multirank_logger import DecisionAudit, MultiRankLogger, open_store
from multirank_logger.cli import main as cli
from multirank_logger.errors import NoMultiRankLogger
from multirank_logger.query.side_tables import disagreements, format_ranks, group_alike

SCORES = [3.0, 4.0, 2.0]  # epoch 1 is worse: not saved


class _Model(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.log("score", SCORES[self.current_epoch])
        return self.layer(batch[0]).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(torch.ones(4, 2)), batch_size=2)


def _trainer(tmp_path: Path, logger, *callbacks) -> Trainer:
    return Trainer(accelerator="cpu", devices=1, max_epochs=len(SCORES), logger=logger, callbacks=list(callbacks),
                   enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)


def test_single_process_decisions_and_wrappers_removed(tmp_path: Path) -> None:
    """One rank: each epoch's save / refusal recorded; afterwards the strategy and callbacks are as before."""
    db = tmp_path / "runs.sqlite"
    checkpoint = ModelCheckpoint(monitor="score", mode="min", save_top_k=1)
    stopping = EarlyStopping(monitor="score", mode="min", patience=5)
    trainer = _trainer(
        tmp_path, MultiRankLogger(db=str(db), save_dir=str(tmp_path)), checkpoint, stopping, DecisionAudit()
    )
    trainer.fit(_Model())
    with open_store(db) as reader:
        df = reader.decisions()
    saves = df[df.callback == "ModelCheckpoint"]
    assert list(saves.epoch) == [0, 1, 2] and list(saves["rank"]) == [0, 0, 0]
    assert list(saves.vote) == [True, False, True] and list(saves.decision) == [True, False, True]
    assert list(saves.value) == SCORES and list(saves.best) == [3.0, 3.0, 2.0]
    assert saves.path.iloc[2].endswith("epoch=2-step=6.ckpt") and saves.path.isna().tolist() == [False, True, False]
    assert list(df[df.callback == "EarlyStopping"].decision) == [False, False, False]
    assert disagreements(df) == []
    assert "check_monitor_top_k" not in vars(checkpoint) and "on_train_epoch_end" not in vars(stopping)
    assert "reduce_boolean_decision" not in vars(trainer.strategy)


def test_without_multirank_logger_is_a_clear_error(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, CSVLogger(tmp_path), ModelCheckpoint(monitor="score"), DecisionAudit())
    with pytest.raises(NoMultiRankLogger) as info:
        trainer.fit(_Model())
    assert str(info.value) == (
        "DecisionAudit records into the Trainer's MultiRankLogger, and this Trainer has none (loggers: CSVLogger). "
        "Add one: Trainer(logger=MultiRankLogger(db=...), callbacks=[..., DecisionAudit()])."
    )


def test_run_without_side_rows_reads_empty(tmp_path: Path) -> None:
    """A run with no DecisionAudit and capture_logs=False: empty frames with the columns, and the CLI says why."""
    db = tmp_path / "runs.duckdb"
    logger = MultiRankLogger(db=str(db), save_dir=str(tmp_path), capture_logs=False)
    logger.log_metrics({"a": 1.0}, step=0)
    logger.finalize("success")
    with open_store(db) as reader:
        assert reader.decisions().empty and "vote" in reader.decisions().columns
        assert reader.logs().empty and list(reader.logs().columns)[:3] == ["rank", "seq", "time"]
    result = CliRunner().invoke(cli, ["decisions", str(db)])
    assert result.output == (
        "No decisions in lightning_logs/version_0: add multirank_logger.DecisionAudit() to the Trainer's callbacks.\n"
    )
    result = CliRunner().invoke(cli, ["logs", str(db)])
    assert (
        result.output
        == "No log records in lightning_logs/version_0 for this selection (capture_logs=False, or nothing logged).\n"
    )


def test_group_alike_pairs_the_nth_repeat_of_each_rank() -> None:
    """A line every rank logs twice is two rows with every rank, in time order; ranks print as ranges."""
    import pandas as pd

    rows = [(r, t, "INFO", 20, "x", m) for r, t, m in
            [(0, 1.0, "hi"), (1, 1.1, "hi"), (2, 1.2, "hi"), (0, 2.0, "hi"), (2, 2.1, "hi"), (1, 3.0, "own")]]
    df = pd.DataFrame(rows, columns=["rank", "time", "level", "levelno", "logger", "message"])
    grouped = group_alike(df)
    assert [(g.message, g.ranks, g.time) for g in grouped.itertuples()] == [
        ("hi", [0, 1, 2], 1.0),
        ("hi", [0, 2], 2.0),
        ("own", [1], 3.0),
    ]
    assert [format_ranks(g) for g in ([0, 1, 2, 3, 4, 5, 6, 7], [0, 2], [1, 2, 3, 6], [4])] == [
        "ranks 0-7",
        "ranks 0,2",
        "ranks 1-3,6",
        "rank 4",
    ]


def test_decisions_and_report_flag_the_same_split_decisions(tmp_path: Path) -> None:
    """One rule for a split decision (judgement.ranks.votes_split): a rank with no vote takes no
    side, StopOnAlert's rank-0-alone vote is no split; `decisions` marks exactly what `report`
    lists, and a NaN monitored value (SQLite keeps it as NULL) is shown, not a TypeError."""
    import time

    import sqlalchemy as sa

    from multirank_logger.report import find
    from multirank_logger.rows.schema import decisions
    from multirank_logger.store.sql_store import Store

    db = tmp_path / "runs.sqlite"
    store = Store(db)
    run = store.create_run("votes", world_size=3)
    votes = {  # seq: (callback, each rank's vote); the value of rank 2 at seq 0 is NaN
        0: ("ModelCheckpoint", [True, False, True]),  # split
        1: ("ModelCheckpoint", [True, None, True]),  # one rank's vote not recorded: no split
        2: ("StopOnAlert", [True, False, False]),  # rank 0 alone votes, by design
        3: ("EarlyStopping", [False, None, True]),  # split, beside an NA vote
    }
    rows = [{"run_id": run.id, "rank": r, "seq": seq, "step": 10 * seq, "epoch": seq, "callback": cb, "monitor": "val",
             "mode": "min", "value": float("nan") if (seq, r) == (0, 2) else 1.0 + r, "vote": vote, "decision": True,
             "path": None, "best": 1.0, "time": time.time()}
            for seq, (cb, ranks) in votes.items() for r, vote in enumerate(ranks)]
    with store.begin() as conn:
        conn.execute(sa.insert(decisions), rows)
    store.close()
    with open_store(db) as reader:
        assert disagreements(reader.decisions()) == [0, 3]
        assert [d["seq"] for d in find(reader).decisions] == [0, 3]
    result = CliRunner().invoke(cli, ["decisions", str(db)])
    assert result.exit_code == 0, result.output
    assert "4 decisions, 2 where the ranks voted differently (marked !)" in result.output
    assert result.output.count("!") == 2 + 1  # the two rows, and the legend's "(marked !)"
