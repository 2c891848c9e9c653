"""Shared fixtures and pytest hooks: real store files for each embedded backend, a real
PostgreSQL server, free TCP ports, and the `slow` mark on every test in tests/runs/.

The layout mirrors the package: tests/<layer>/ holds the unit-level tests of
multirank_logger/<layer> (one process), tests/project/ the checks over the whole project,
tests/runs/ every test that launches real multi-process trainings (`slow`: the folder is the one
way to mark it; where the launch itself is not what a test is about, its ranks are forked as
torchrun starts them from a server that imported Lightning once: helpers/launches.run_ranks_forked),
tests/scripts/ what those tests launch, tests/helpers/ the plain helpers the
tests share (a test imports them from there, never from another test module or from this file),
tests/data/ fixed input files."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import quick_exit
from tests.helpers.launches import free_port
from tests.helpers.stores import BACKEND_SUFFIXES, new_postgres_database

# every process the suite launches (the workers too: this runs before xdist starts them) skips the
# garbage collections of its interpreter's teardown, most of a second of CPU where Lightning was imported
# (helpers/quick_exit/sitecustomize.py); the tests about a process's end launch without it
quick_exit.switch_on(os.environ)

#: the long modules listed at the end of each run (a report, never a failure)
pytest_plugins = ["tests.helpers.module_sizes"]

#: the one way a test is `slow`: it lives in tests/runs/ (real multi-process trainings, the benchmarks,
#: other long processes), so `make test-fast` (pytest -m "not slow") runs every other folder
RUNS = Path(__file__).resolve().parent / "runs"


@pytest.hookimpl(wrapper=True)  # around xdist's, which turns the xdist_group marks added here into groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> Iterator[None]:
    for item in items:
        if item.path.resolve().is_relative_to(RUNS):
            item.add_marker(pytest.mark.slow)
        if item.module is not None and _shares_a_module_fixture(item):
            # under `pytest -n 2 --dist loadgroup` (make test) the tests of a module that share a
            # module-scoped fixture (a real training, a served page) run on one worker, so it is
            # made once: plain `--dist load` hands out tests in chunks, and a module cut between
            # two workers made its training on each
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    # the long ones first (a stable sort: each module's tests stay together, in their order): the
    # workers take the trainings while there is still short work to even out their ends, instead of
    # one worker starting a 3-minute module when the other has nothing left
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    yield
    for item in items:
        # pytest-xdist 3.8 names a group by writing "nodeid@group" into `item._nodeid`, which pytest 9
        # no longer reads the nodeid from (it would schedule as plain load): read it back as the nodeid
        grouped = getattr(item, "_nodeid", None)
        if isinstance(grouped, str) and grouped != item.nodeid and hasattr(item, "_id"):
            from _pytest.nodeid import NodeId

            item._id = NodeId.parse(grouped)


def _shares_a_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)  # a Function's: the fixtures it uses, each with its definitions
    return info is not None and any(defs and defs[-1].scope == "module" for defs in info.name2fixturedefs.values())


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
