"""A log call is accepted whole or refused whole (issue 38 point 1): what the writer, a store or
metrics.csv cannot take is refused at the call, naming the key and step; what passes is stored."""

from __future__ import annotations

import csv
import enum
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from multirank_logger import MultiRankLogger
from multirank_logger.errors import InvalidMetric
from multirank_logger.write.buffer import MAX_KEY_BYTES
from tests.helpers.internals import run_of
from tests.helpers.logger_helpers import query


class _Huge(enum.IntEnum):
    TOO_BIG = 10**400


def _logger(db: Path | str, **kwargs: Any) -> MultiRankLogger:
    kwargs.setdefault("flush_interval", 3600)  # only explicit flushes
    return MultiRankLogger(db=str(db), **kwargs)


#: (label, key, value, step, the InvalidMetric's message must contain)
REFUSED = [
    ("step nan", "k", 1.0, float("nan"), "Step nan"),
    ("step inf", "k", 1.0, float("inf"), "Step inf"),
    ("step -inf", "k", 1.0, -float("inf"), "Step -inf"),
    ("step 2**63", "k", 1.0, 2**63, "Step 9223372036854775808"),
    ("step -2**63-1", "k", 1.0, -(2**63) - 1, "Step -9223372036854775809"),
    ("step 1.5", "k", 1.0, 1.5, "Step 1.5"),
    ("step str", "k", 1.0, "7", "Step '7'"),
    ("step uint64 max", "k", 1.0, np.uint64(2**64 - 1), "18446744073709551615) of the call"),
    ("key surrogate", "loss\udcff", 1.0, 5, "'loss\\udcff' (logged at step 5) holds a lone surrogate"),
    ("key nul", "a\x00b", 1.0, 5, "'a\\x00b' (logged at step 5) holds a NUL"),
    ("key too long", "k" * (MAX_KEY_BYTES + 1), 1.0, 5, "1025 bytes of UTF-8"),
    ("non-str key surrogate", b"x".decode("utf-8", "surrogateescape") + "\udcff", 1.0, 5, "lone surrogate"),
    ("value int past float64", "k", 10**400, 5, "'k' (logged at step 5) is an int of 1329 bits"),
    ("value IntEnum past float64", "k", _Huge.TOO_BIG, 5, "is an int of 1329 bits"),
    ("value tensor of 2", "k", torch.tensor([1.0, 2.0]), 5, "'k' (logged at step 5) is a Tensor of shape (2,)"),
]


@pytest.mark.parametrize(("key", "value", "step", "message"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_a_bad_call_is_refused_at_the_call_and_the_others_are_stored(
    db_path: Path, key: Any, value: Any, step: Any, message: str
) -> None:
    """A call the store cannot hold raises InvalidMetric at the call, naming it; every other
    call (before and after it, also in the same writer batch) is stored and the run is a success."""
    logger = _logger(db_path)
    for s in range(25):
        logger.log_metrics({"a": float(s), "b": s}, step=s)
    with pytest.raises(InvalidMetric) as refused:
        logger.log_metrics({"fine": 2.0, key: value}, step=step)
    assert message in str(refused.value)
    for s in range(25, 50):
        logger.log_metrics({"a": float(s), "b": s}, step=s)
    logger.finalize("success")
    assert query(db_path, "SELECT COUNT(*), COUNT(DISTINCT step) FROM metrics") == [(100, 50)]
    assert query(db_path, "SELECT COUNT(*) FROM metrics WHERE key = 'fine'") == [(0,)]  # refused whole
    assert query(db_path, "SELECT status, COALESCE(values_lost, 0) FROM runs") == [("success", 0)]


def test_a_bad_key_mid_run_leaves_metrics_csv_whole(tmp_path: Path) -> None:
    """A lone surrogate key mid-run: refused at the call; metrics.csv and the store hold the 200 others."""
    db = tmp_path / "runs.sqlite"
    logger = _logger(db)
    for s in range(200):
        if s == 100:
            with pytest.raises(InvalidMetric, match="lone surrogate"):
                logger.log_metrics({"\udcff": 1.0}, step=s)
        logger.log_metrics({"loss": float(s)}, step=s)
        logger.save()
    logger.finalize("success")
    with open(Path(logger.log_dir) / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == list(range(200))
    assert query(db, "SELECT COUNT(*) FROM metrics") == [(200,)]


ACCEPTED = [
    ("whole float", 3.0, 3),
    ("numpy int", np.int64(5), 5),
    ("numpy whole float", np.float32(6.0), 6),
    ("int tensor", torch.tensor(7), 7),
    ("bool", True, 1),
    ("int64 max", 2**63 - 1, 2**63 - 1),
    ("int64 min", -(2**63), -(2**63)),
    ("negative", -4, -4),
]


@pytest.mark.parametrize(("step", "stored"), [r[1:] for r in ACCEPTED], ids=[r[0] for r in ACCEPTED])
def test_a_step_that_is_a_whole_number_is_stored_as_its_int(tmp_path: Path, step: Any, stored: int) -> None:
    """Any whole number within int64 is a step: stored as that int."""
    db = tmp_path / "runs.sqlite"
    logger = _logger(db)
    logger.log_metrics({"a": 1.0}, step=step)
    logger.finalize("success")
    assert query(db, "SELECT step FROM metrics") == [(stored,)]


def test_odd_keys_and_values_the_stores_hold_are_stored(any_db: str) -> None:
    """Empty, SQL-ish, unicode and 1024-byte keys; -0.0, nan, inf, numpy and 0-d tensor values: stored."""
    keys = ["", "'; DROP TABLE metrics; --", "λόσς/🔥", "k" * MAX_KEY_BYTES, 'quote"d,comma']
    values: list[Any] = [-0.0, math.nan, math.inf, np.float16(0.5), torch.tensor(3)]
    logger = _logger(any_db)
    logger.log_metrics(dict(zip(keys, values)), step=0)
    logger.finalize("success")
    rows = dict(query(any_db, "SELECT key, dtype FROM metrics"))
    assert sorted(rows) == sorted(keys)
    assert query(any_db, "SELECT status FROM runs") == [("success",)]


def test_a_call_the_encoder_fails_on_is_cut_out_and_counted_lost(db_path: Path) -> None:
    """Were a bad call past the checks (a bug), the writer cuts it out of its batch: the calls around
    it are stored, its values are counted in values_lost, and the run is not a success."""
    logger = _logger(db_path)
    for s in range(25):
        logger.log_metrics({"a": float(s), "b": s}, step=s)
    buffer = run_of(logger).logged.buffer
    buffer._calls.append((buffer._next_seq, float("nan"), time.time(), {"x": 1.0, "y": 2.0}))  # past append
    buffer._next_seq += 1
    for s in range(25, 50):
        logger.log_metrics({"a": float(s), "b": s}, step=s)
    logger.finalize("success")
    assert query(db_path, "SELECT COUNT(*) FROM metrics") == [(100,)]
    assert query(db_path, "SELECT status, values_lost FROM runs") == [("incomplete", 2)]
