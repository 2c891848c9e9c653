"""Rank 0's metrics.csv during a real 2-rank DDP training and after it fails, against CSVLogger.

tests/scripts/dropin_train.py logs with CSVLogger and MultiRankLogger in one Trainer (gloo on CPU),
copies our metrics.csv aside while the run trains, and with ``--crash-at`` makes every rank
raise mid-run. SQLite (every rank writes) and DuckDB (rank 0 writes what the others ship): one
launch logs to both, a MultiRankLogger each, its files in its store's folder (``<backend>/``).
"""

from __future__ import annotations

import csv
import io
import subprocess
from pathlib import Path

import pytest

from tests.helpers.launches import SCRIPTS, run_ranks_forked
from tests.helpers.logger_helpers import query, train_env

SCRIPT = SCRIPTS / "dropin_train.py"
STEPS, CRASH_AT = 24, 20
LATE_KEY_FROM = 10


BACKENDS = ("sqlite", "duckdb")


def _launch(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    stores: list[str] = []
    for backend in BACKENDS:
        (tmp_path / backend).mkdir()
        stores += ["--db", str(_store(tmp_path, backend))]
    args = [*stores, "--save-dir", str(tmp_path), "--csv-dir", str(tmp_path / "csv"), "--steps", str(STEPS), *extra]
    return run_ranks_forked(SCRIPT, args, nproc=2, cwd=tmp_path, env=train_env(), timeout=240)


def _store(tmp_path: Path, backend: str) -> Path:
    return tmp_path / backend / f"runs.{backend}"


@pytest.fixture(scope="module")
def grown(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A training that ends well, our files copied aside at steps 6 and 16."""
    tmp = tmp_path_factory.mktemp("grown")
    proc = _launch(tmp, "--snapshot-at", "6", "16")
    assert proc.returncode == 0, proc.stdout[-8000:]
    return tmp


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A training whose every rank raises at step 20."""
    tmp = tmp_path_factory.mktemp("crashed")
    proc = _launch(tmp, "--crash-at", str(CRASH_AT), "--snapshot-at")
    assert proc.returncode != 0 and "crash at step 20" in proc.stdout, proc.stdout[-8000:]
    return tmp


def _table(data: bytes) -> tuple[list[str], list[dict[str, str]]]:
    reader = csv.DictReader(io.StringIO(data.decode(), newline=""))
    return list(reader.fieldnames or []), list(reader)


def _ours(folder: Path) -> Path:
    return folder / "lightning_logs" / "version_0" / "metrics.csv"


def _theirs(tmp_path: Path) -> Path:
    return tmp_path / "csv" / "lightning_logs" / "version_0" / "metrics.csv"


def _check_snapshot(snapshot: Path, final: bytes, least_rows: int) -> None:
    """What a reader saw mid-run: CSVLogger's layout, a prefix of the final file's rows, with the
    header of the keys logged so far (sorted, step among them)."""
    header, rows = _table(snapshot.read_bytes())
    final_header, final_rows = _table(final)
    assert len(rows) >= least_rows
    assert header == sorted(header) and "step" in header and set(header) <= set(final_header)
    for row, whole in zip(rows, final_rows):
        assert row == {k: whole[k] for k in header}
        assert all(whole[k] == "" for k in set(final_header) - set(header))  # no key missed in the header
    assert snapshot.read_bytes().endswith(b"\r\n") and b"\r\n\r\n" not in snapshot.read_bytes()


@pytest.mark.parametrize("backend", BACKENDS)
def test_metrics_csv_grows_during_ddp_training(grown: Path, backend: str) -> None:
    """Mid-run, rank 0's metrics.csv holds the calls logged so far in CSVLogger's layout, also
    after a new key rewrote it; at the end it is CSVLogger's file byte for byte."""
    ours = grown / backend
    # each backend's default way (SQLite: every rank writes; DuckDB: rank 0 writes what the others ship)
    assert query(_store(grown, backend), "SELECT transport FROM runs") == [({"sqlite": "direct", "duckdb": "gather"}[backend],)]
    final = _ours(ours).read_bytes()
    assert final == _theirs(grown).read_bytes()
    early, late = ours / "snapshot.6.csv", ours / "snapshot.16.csv"
    _check_snapshot(early, final, least_rows=5)
    assert "late_key" not in _table(early.read_bytes())[0]
    _check_snapshot(late, final, least_rows=15)
    assert "late_key" in _table(late.read_bytes())[0]  # the file was rewritten with the wider header
    assert {(ours / f"experiment.{r}").read_text() for r in (0, 1)} == {"RunExperiment", "_DummyExperiment"}
    assert (ours / "experiment.0").read_text() == "RunExperiment"


@pytest.mark.parametrize("backend", BACKENDS)
def test_metrics_csv_left_after_a_failed_ddp_run(crashed: Path, backend: str) -> None:
    """Every rank raises at step 20: rank 0's metrics.csv is left with every call logged before
    the crash, byte for byte what CSVLogger left, and the run is recorded as failed."""
    ours, theirs = _ours(crashed / backend).read_bytes(), _theirs(crashed).read_bytes()
    assert ours == theirs
    header, rows = _table(ours)
    assert len(rows) == CRASH_AT and "late_key" in header
    assert query(_store(crashed, backend), "SELECT status FROM runs") == [("failed",)]
