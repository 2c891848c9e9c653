"""Hyperparameters holding NaN or infinities are stored as JSON every reader reads (issue 38 point 8):
the strings "NaN", "Infinity", "-Infinity" (docs/schema.md), never Python's bare ``NaN``; hparams.yaml
stays CSVLogger's bytes."""

from __future__ import annotations

import json
import math
from argparse import Namespace
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger

from multirank_logger import MultiRankLogger
from tests.helpers.logger_helpers import query

HPARAMS = {"lr": math.nan, "clip": math.inf, "floor": -math.inf, "nested": {"w": [1.0, math.nan]},
           "ns": Namespace(eps=math.nan), "fine": 0.5}
STORED = {"lr": "NaN", "clip": "Infinity", "floor": "-Infinity", "nested": {"w": [1.0, "NaN"]},
          "ns": {"eps": "NaN"}, "fine": 0.5}


def _strict(text: str) -> object:
    """JSON as a strict reader parses it: no NaN or Infinity literals."""
    def refuse(literal: str) -> None:
        raise ValueError(f"not JSON: {literal}")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_hparams_are_stored_as_strict_json(db_path: Path, tmp_path: Path) -> None:
    """runs.hparams parses as strict JSON, NaN and infinities as their JavaScript names in strings."""
    logger = MultiRankLogger(db=str(db_path), save_dir=str(tmp_path / "ours"), flush_interval=3600)
    logger.log_hyperparams(HPARAMS)
    logger.log_metrics({"a": 1.0}, step=0)
    logger.finalize("success")
    (text,), = query(db_path, "SELECT hparams FROM runs")
    assert _strict(text) == STORED


def test_postgresql_reads_non_finite_hparams_as_json(postgres_url: str, tmp_path: Path) -> None:
    """PostgreSQL's jsonb takes the stored hparams (it refused the NaN literal)."""
    logger = MultiRankLogger(db=postgres_url, save_dir=str(tmp_path), flush_interval=3600)
    logger.log_hyperparams(HPARAMS)
    logger.log_metrics({"a": 1.0}, step=0)
    logger.finalize("success")
    assert query(postgres_url, "SELECT CAST(hparams AS jsonb) ->> 'lr' FROM runs") == [("NaN",)]


def test_hparams_yaml_with_nan_is_csvloggers(db_path: Path, tmp_path: Path) -> None:
    """hparams.yaml holding NaN and infinities: the bytes CSVLogger writes."""
    ours = MultiRankLogger(db=str(db_path), save_dir=str(tmp_path / "ours"), flush_interval=3600)
    theirs = CSVLogger(str(tmp_path / "theirs"))
    plain = {k: v for k, v in HPARAMS.items() if k != "ns"}
    ours.log_hyperparams(plain)
    theirs.log_hyperparams(plain)
    ours.finalize("success")
    theirs.save()
    assert (Path(ours.log_dir) / "hparams.yaml").read_bytes() == (Path(theirs.log_dir) / "hparams.yaml").read_bytes()
