"""The oldest dependencies the project is said to work with: installed beside the environment
(pip --target, no dependencies), a store written and read with them (tests/scripts/floor_reads.py).

- duckdb: the floor declared in pyproject.toml, read from it, so the test follows the declaration
  (1.1 up to 1.4.1 write a training but fail every read: no `to_arrow_table`).
- pandas: 2.3.3, the release issue 29 names, whose `fillna` downcasting warned from
  `multirank-logger runs` (FutureWarning); only 2.2+ raise that warning. The declared floor,
  pandas 2.0, is not importable beside numpy 2 (built against numpy 1): it is in the next item.
- all the declared floors at once (`FLOORS`: duckdb, duckdb-engine, sqlalchemy, alembic, pyarrow,
  pandas, fsspec, click, pyyaml), with numpy 1.26.4: pyarrow 14 and pandas 2.0 are built against
  numpy 1 and do not import beside numpy 2 (nor does pandas 3 beside numpy 1). Not installed:
  typing-extensions 4.6 (torch itself needs 4.10's ``TypeIs``), torch (the environment's).
- lightning: the floor declared in pyproject.toml (2.2.0), with ``setuptools<81`` (it imports
  ``pkg_resources``, which setuptools 81 removed): a 2-rank DDP training (tests/scripts/logger_train.py)
  whose ranks agree on the version read before fit and whose metrics.csv is that lightning's
  CSVLogger's, byte for byte.

CI installs these from the package registry; a failed download fails the test with pip's output.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from tests.helpers.launches import SCRIPTS
from tests.helpers.logger_helpers import query, rank_reports, train_cmd, train_env

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest depends on tomli below 3.11
    import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]


ROOT = Path(__file__).resolve().parents[2]
SCRIPT = SCRIPTS / "floor_reads.py"
#: the pandas that warned (issue 29); pytz: pandas 2.x imports it, pandas 3 (the environment's) does not
PANDAS_WARNED = ["pandas==2.3.3", "pytz"]


def declared_floor(package: str) -> str:
    """The lower bound pyproject.toml's [project] dependencies declare for `package`."""
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for spec in dependencies:
        if re.match(rf"{re.escape(package)}\s*[<>=!~;\[]", spec):
            found = re.search(r">=\s*([\w.]+)", spec)
            assert found, f"pyproject.toml declares {spec!r}: no >= floor to test"
            return found.group(1)
    raise AssertionError(f"pyproject.toml does not declare {package}")


def pip_install(target: Path, *requirements: str) -> Path:
    """`requirements` alone (no dependencies) into `target`; a failure shows pip's own output."""
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
           "--target", str(target), *requirements]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    if proc.returncode != 0:
        pytest.fail(f"could not install {' '.join(requirements)} (needs the package registry): "
                    f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    return target


@pytest.fixture(scope="session")
def duckdb_floor_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pip_install(tmp_path_factory.mktemp("duckdb-floor"), f"duckdb=={declared_floor('duckdb')}")


#: the declared floors installed together (their lower bounds read from pyproject.toml)
FLOORS = ("duckdb", "duckdb-engine", "sqlalchemy", "alembic", "pyarrow", "pandas", "fsspec", "click", "pyyaml")
#: beside them: the newest numpy 1 (pyarrow 14 and pandas 2.0 need numpy < 2); pytz (pandas 2 imports it)
FLOORS_NEED = ["numpy==1.26.4", "pytz"]
#: what lightning 2.2 needs beside it on a current Python stack (pkg_resources; issue 29)
LIGHTNING_2_2_NEEDS = ["setuptools<81"]


@pytest.fixture(scope="session")
def floors_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pip_install(tmp_path_factory.mktemp("floors"), *(f"{name}=={declared_floor(name)}" for name in FLOORS),
                       *FLOORS_NEED)


@pytest.fixture(scope="session")
def lightning_floor_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pip_install(tmp_path_factory.mktemp("lightning-floor"), f"lightning=={declared_floor('lightning')}",
                       *LIGHTNING_2_2_NEEDS)


@pytest.fixture(scope="session")
def pandas_warned_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pip_install(tmp_path_factory.mktemp("pandas-2.3"), *PANDAS_WARNED)


def write_and_read(site: Path, *dbs: Path) -> str:
    """Run floor_reads.py with `site` first on the path, on `dbs` (in one process); its output,
    asserting that every read command exited 0 and raised no FutureWarning."""
    env = train_env() | {"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    cwd = dbs[0].parent
    proc = subprocess.run([sys.executable, str(SCRIPT), str(cwd), *map(str, dbs)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    return proc.stdout


def test_every_read_command_works_with_the_declared_duckdb_floor(duckdb_floor_dir: Path, tmp_path: Path) -> None:
    """runs, ranks, logs, decisions and report on a DuckDB store written by the oldest declared duckdb."""
    out = write_and_read(duckdb_floor_dir, tmp_path / "runs.duckdb")
    assert out.startswith(f"floor_reads: duckdb {declared_floor('duckdb')}"), out[:200]  # that duckdb, not ours
    assert "ModelCheckpoint(loss, min)" in out and "a warning the logs command prints" in out


def test_runs_prints_no_future_warning_with_pandas_2_3(pandas_warned_dir: Path, tmp_path: Path) -> None:
    """On SQLite (its NULL counts come back as object columns) pandas 2.3 warned from `runs`."""
    out = write_and_read(pandas_warned_dir, tmp_path / "runs.sqlite")
    assert out.startswith("floor_reads: duckdb") and "pandas 2.3.3" in out.splitlines()[0], out[:200]
    assert " success " in out and "lightning_logs/version_0" in out


def test_every_read_command_works_with_all_declared_floors(floors_dir: Path, tmp_path: Path) -> None:
    """A DuckDB and a SQLite store written and read (runs, ranks, logs, decisions, report) with
    every declared floor at once, no FutureWarning (both in one process: its start is most of it)."""
    dbs = [tmp_path / "runs.duckdb", tmp_path / "runs.sqlite"]
    out = write_and_read(floors_dir, *dbs)
    first = out.splitlines()[0]
    for name in FLOORS:
        assert re.search(rf"\b{re.escape(name)} {re.escape(declared_floor(name))}(\.0)*(,|$)", first), first
    assert "numpy 1.26.4" in first
    for db in dbs:  # each store's every command ran, and its decision was read back from that store
        for command in ("runs", "ranks", "logs", "decisions", "report"):
            assert f"== multirank-logger {command} {db}" in out, (command, db)
        decisions = out.split(f"== multirank-logger decisions {db}", 1)[1].split("\n== ", 1)[0]
        assert "ModelCheckpoint(loss, min)" in decisions, decisions


def test_declared_lightning_floor_trains_two_ranks(lightning_floor_dir: Path, tmp_path: Path) -> None:
    """A 2-rank DDP training on the oldest declared lightning: every rank's values stored, the
    version read before fit adopted by rank 1 (launch_env.py's hook of that lightning's launcher),
    and metrics.csv identical to that lightning's own CSVLogger's."""
    env = train_env() | {"PYTHONPATH": os.pathsep.join([str(lightning_floor_dir), str(ROOT)])}
    version = subprocess.run([sys.executable, "-c", "import lightning; print(lightning.__version__)"], env=env,
                             capture_output=True, text=True, timeout=120)
    assert Version(version.stdout.strip()) == Version(declared_floor("lightning")), version.stdout + version.stderr[-3000:]
    db = tmp_path / "runs.sqlite"
    cmd = train_cmd(db, tmp_path, "--mode", "asym", "--steps", "4", "--read-version", "--csv-dir", str(tmp_path / "csv"),
                    "--report", str(tmp_path / "report"))
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert query(db, "SELECT version, status, world_size FROM runs") == [(0, "success", 2)]
    assert query(db, "SELECT rank, count(*) > 0 FROM metrics GROUP BY rank ORDER BY rank") == [(0, 1), (1, 1)]
    assert {r["version"] for r in rank_reports(tmp_path / "report").values()} == {0}
    ours = tmp_path / "lightning_logs" / "version_0" / "metrics.csv"
    assert ours.read_bytes() == (tmp_path / "csv" / "lightning_logs" / "version_0" / "metrics.csv").read_bytes()
