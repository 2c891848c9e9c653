"""Secrets from the environment (issue 48): `MultiRankLogger(db=None)` reads MULTIRANK_LOGGER_DB,
`alert_url=None` MULTIRANK_LOGGER_ALERT_URL, so LightningCLI users keep a database password and
a webhook token out of config.yaml (Lightning's SaveConfigCallback saves the logger's arguments).

Asserted on a real LightningCLI fit: the run lands in the environment's store, and neither
config.yaml, the stored hyperparameters (`runs.hparams`), any byte of the store nor the console
holds the token; and in-process: an argument given wins over the environment.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from multirank_logger import MultiRankLogger
from multirank_logger.logger.run_settings import ALERT_URL_ENV, DB_ENV
from tests.helpers.internals import run_of
from tests.helpers.launches import REPO, SCRIPTS
from tests.helpers.logger_helpers import query, train_env

TOKEN = "T0KEN-never-saved-4711"
# a webhook nobody answers (the discard port): the token in its credentials and its path
ALERT_URL = f"http://hook:{TOKEN}@127.0.0.1:9/hooks/{TOKEN}"
CLI = SCRIPTS / "logger_cli.py"


def test_lightningcli_keeps_the_secrets_in_the_environment(tmp_path: Path) -> None:
    pytest.importorskip("jsonargparse")  # LightningCLI's parser (jsonargparse[signatures])
    store = tmp_path / "from_env" / "secret-store.sqlite"
    store.parent.mkdir()
    cmd = [
        sys.executable, str(CLI), "fit",
        "--trainer.logger=multirank_logger.MultiRankLogger", "--trainer.logger.save_dir=logs",
        "--trainer.max_steps=2", "--trainer.accelerator=cpu", "--trainer.devices=1",
        "--trainer.enable_progress_bar=false", "--trainer.log_every_n_steps=1",
    ]
    env = train_env() | {"PYTHONPATH": str(REPO), DB_ENV: str(store), ALERT_URL_ENV: ALERT_URL}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]

    assert query(store, "SELECT name, status FROM runs") == [("lightning_logs", "success")]  # the env's store
    assert not (tmp_path / "logs" / "runs.sqlite").exists()  # not save_dir's default
    configs = list(tmp_path.rglob("config.yaml"))
    assert configs, "LightningCLI saved no config.yaml"
    for config in configs:
        text = config.read_text()
        assert "logger" in text and TOKEN not in text and str(store) not in text, text
    [(hparams,)] = query(store, "SELECT hparams FROM runs")
    assert hparams and TOKEN not in hparams and str(store) not in hparams, hparams
    for path in store.parent.iterdir():  # the store, its WAL: not one byte of the token anywhere
        assert TOKEN.encode() not in path.read_bytes(), path
    assert TOKEN not in proc.stdout + proc.stderr


def test_an_argument_wins_over_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DB_ENV, str(tmp_path / "env.sqlite"))
    monkeypatch.setenv(ALERT_URL_ENV, ALERT_URL)
    from_env = MultiRankLogger(tmp_path / "logs")
    given = MultiRankLogger(tmp_path / "logs", db=tmp_path / "given.sqlite", alert_url="https://example.com/hook")
    assert run_of(from_env).settings.db == str(tmp_path / "env.sqlite")
    assert run_of(from_env).settings.alert_url == ALERT_URL and TOKEN not in repr(from_env)
    assert run_of(given).settings.db == str(tmp_path / "given.sqlite")
    assert run_of(given).settings.alert_url == "https://example.com/hook"
    monkeypatch.setenv(DB_ENV, "")  # set but empty: as unset, save_dir's default
    assert run_of(MultiRankLogger(tmp_path / "logs")).settings.db == str(tmp_path / "logs" / "runs.sqlite")


def test_a_bad_alert_url_from_the_environment_is_refused_unshown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALERT_URL_ENV, f"ftp://{TOKEN}@host/")
    with pytest.raises(ValueError, match="alert_url") as err:
        MultiRankLogger(tmp_path / "logs")
    assert TOKEN not in str(err.value)
