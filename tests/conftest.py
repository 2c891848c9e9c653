"""Shared fixtures and pytest hooks: real store files for each embedded backend, a real
PostgreSQL server, free TCP ports, and the `slow` mark on every test in tests/runs/.

The layout mirrors the package: tests/<layer>/ holds the unit-level tests of
multirank_logger/<layer> (one process), tests/project/ the checks over the whole project,
tests/runs/ every test that launches real multi-process trainings (`slow`: the folder is the one
way to mark it), tests/scripts/ what those tests launch, tests/helpers/ the plain helpers the
tests share (a test imports them from there, never from another test module or from this file),
tests/data/ fixed input files."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from tests.helpers.launches import free_port
from tests.helpers.stores import BACKEND_SUFFIXES, new_postgres_database

#: the one way a test is `slow`: it lives in tests/runs/ (real multi-process trainings, the benchmarks,
#: other long processes), so `make test-fast` (pytest -m "not slow") runs every other folder
RUNS = Path(__file__).resolve().parent / "runs"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.resolve().is_relative_to(RUNS):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(params=sorted(BACKEND_SUFFIXES))
def backend(request: pytest.FixtureRequest) -> str:
    """Each embedded backend in turn: 'duckdb', then 'sqlite'."""
    return request.param


@pytest.fixture
def db_path(tmp_path: Path, backend: str) -> Path:
    """A path for a new store file of the current backend (not created yet)."""
    return tmp_path / f"runs{BACKEND_SUFFIXES[backend]}"


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture(scope="session")
def postgres_server():
    """A real PostgreSQL server for the session (pgserver: the server binaries in a wheel).

    Its data directory is its own, not under pytest's basetemp: a concurrent pytest session
    prunes the oldest basetemps, which deleted a running server's directory under our tests."""
    pgserver = pytest.importorskip("pgserver", reason="pgserver is not installed (pip install -e '.[test]')")
    data = Path(tempfile.mkdtemp(prefix="multirank-pg-"))
    server = pgserver.get_server(data, cleanup_mode="stop")
    yield server
    server.cleanup()
    shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(params=["duckdb", "sqlite", "postgresql"])
def any_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A new store of each backend in turn: a file path (DuckDB, SQLite), or a URL to a new
    database on the session's PostgreSQL server (skipped where pgserver is not installed)."""
    if request.param == "postgresql":
        return new_postgres_database(request.getfixturevalue("postgres_server"))
    return str(tmp_path / f"runs{BACKEND_SUFFIXES[request.param]}")


@pytest.fixture(params=["sqlite", "postgresql"])
def many_writers_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A new store of each backend that several processes may write at once (not DuckDB: one
    writing process per file)."""
    if request.param == "postgresql":
        return new_postgres_database(request.getfixturevalue("postgres_server"))
    return str(tmp_path / "runs.sqlite")


@pytest.fixture
def postgres_url(postgres_server) -> str:
    """A new, empty database on the session's server, for one test."""
    return new_postgres_database(postgres_server)
