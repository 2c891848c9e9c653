"""rows/side_records.py: a side-table row is stored as given, or refused at the call.

The store refuses a value its column cannot hold (a str in a boolean column) only at the writer's
insert, long after `record` returned, and with it the whole batch of side rows (spilled, the run
incomplete): so each value is checked against its column here, and a NumPy scalar is stored as the
Python number it is.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from multirank_logger.logger.core import MultiRankLoggerCore
from multirank_logger.rows.side_records import SideRecords
from tests.helpers.logger_helpers import query


@pytest.mark.parametrize(("column", "value", "said"), [
    ("decision", "kept", "decisions.decision takes True or False (or None), not 'kept' (str)"),
    ("vote", 2, "decisions.vote takes True or False (or None), not 2 (int)"),
    ("value", torch.tensor(0.5), "decisions.value takes a number (or None), not tensor(0.5000) (Tensor); a tensor: pass tensor.item()"),
    ("epoch", 1.5, "decisions.epoch takes a whole number (or None), not 1.5 (float)"),
    ("epoch", True, "decisions.epoch takes a whole number (or None), not True (bool)"),
    ("path", Path("x.ckpt"), "decisions.path takes a str (or None), not PosixPath('x.ckpt') (PosixPath)"),
])
def test_a_value_its_column_cannot_hold_is_refused_at_the_call(column: str, value: object, said: str) -> None:
    side = SideRecords()
    side.add("decisions", {"step": 1, "callback": "user", "decision": True})
    with pytest.raises(TypeError) as refused:
        side.add("decisions", {"step": 2, "callback": "user", column: value})
    assert said in str(refused.value) and "nothing of this row was kept" in str(refused.value)
    assert [row["step"] for row in side.drain(1, 0)["decisions"]] == [1]  # the row before it, alone


@pytest.mark.parametrize(("table", "values", "said"), [
    ("step_timing", {"step": 2**63}, "step_timing.step=9223372036854775808 is past what the column holds (+-2**63)"),
    ("step_timing", {"step": -(2**63) - 1}, "step_timing.step=-9223372036854775809 is past what the column holds"),
    ("decisions", {"step": 1, "callback": "u", "epoch": 2**31}, "decisions.epoch=2147483648 is past what the column holds (+-2**31)"),
    ("decisions", {"step": 1, "callback": "u", "time": math.nan}, "decisions.time cannot be NaN"),
    ("logs", {"level": "INFO", "levelno": np.int64(2**40), "logger": "x", "message": "m"}, "logs.levelno=1099511627776 is past"),
])
def test_a_number_its_column_cannot_hold_is_refused_at_the_call(table: str, values: dict, said: str) -> None:
    """Before: accepted, then the insert failed (an int past 64 bits: OverflowError; a NaN time on
    SQLite: NULL in a NOT NULL column) and the whole batch of side rows was spilled, the run incomplete."""
    side = SideRecords()
    with pytest.raises(ValueError, match="nothing of this row was kept") as refused:
        side.add(table, values)
    assert said in str(refused.value)
    assert len(side) == 0


@pytest.mark.parametrize("suffix", [".sqlite", ".duckdb"])
def test_the_edges_each_column_holds_are_stored(tmp_path: Path, suffix: str) -> None:
    """The largest whole numbers each column takes, and a NaN or inf where NULL is allowed: stored,
    the run a success (SQLite stores a NaN as NULL: its rule, for a nullable column)."""
    db = tmp_path / f"runs{suffix}"
    logger = MultiRankLoggerCore(db=str(db), spill_dir=str(tmp_path / "spill"), flush_interval=3600)
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.record("step_timing", step=2**63 - 1, batch_size=-(2**63), data_s=math.inf)
    logger.record("decisions", step=1, callback="u", epoch=2**31 - 1, value=math.nan, best=-math.inf)
    assert logger.flush(30)
    logger.finalize("success")
    assert query(db, "SELECT step, batch_size, data_s FROM step_timing") == [(2**63 - 1, -(2**63), math.inf)]
    (epoch, value, best), = query(db, "SELECT epoch, value, best FROM decisions")
    assert (epoch, best) == (2**31 - 1, -math.inf) and (value is None if suffix == ".sqlite" else math.isnan(value))
    assert query(db, "SELECT status FROM runs") == [("success",)]


def test_numpy_scalars_and_0_1_are_stored_as_python_values(tmp_path: Path) -> None:
    """Through a real logger into a real DuckDB store: every row stored, of Python's types, no spill."""
    db = tmp_path / "runs.duckdb"
    logger = MultiRankLoggerCore(db=str(db), spill_dir=str(tmp_path / "spill"), flush_interval=3600)
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.record("decisions", step=np.int64(3), epoch=np.int32(0), callback="user", value=np.float32(0.25),
                  vote=np.bool_(True), decision=1, best=np.float64(0.125))
    logger.record("step_timing", step=4, data_s=np.float16(0.5), batch_size=np.uint8(32), rss=2**40)
    assert logger.flush(30)
    logger.finalize("success")
    assert query(db, "SELECT step, epoch, value, vote, decision, best FROM decisions") == [(3, 0, 0.25, True, True, 0.125)]
    assert query(db, "SELECT step, data_s, batch_size, rss FROM step_timing") == [(4, 0.5, 32, 2**40)]
    assert query(db, "SELECT status FROM runs") == [("success",)]
    assert not (tmp_path / "spill").exists() or not list((tmp_path / "spill").iterdir())
