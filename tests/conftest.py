"""Shared fixtures and pytest hooks: real store files for each embedded backend, a real
PostgreSQL server, free TCP ports. The plain helpers they use live in tests/helpers/, which is
where a test imports them from."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.launches import free_port
from tests.helpers.stores import BACKEND_SUFFIXES, new_postgres_database

#: the long modules listed at the end of each run (a report, never a failure)
pytest_plugins = ["tests.helpers.module_sizes"]

#: modules whose every test launches real multi-process trainings, or the benchmarks: marked
#: `slow`, so `make test-fast` (pytest -m "not slow") runs the rest in a fraction of the time.
#: A test elsewhere that launches processes says so itself with @pytest.mark.slow.
SLOW_MODULES = frozenset(
    {
        "test_accelerate_tracker", "test_audit_ddp", "test_benchmarks_smoke", "test_demo", "test_dropin_ddp", "test_launchers",
        "test_logger_cli_launch", "test_logger_ddp", "test_logger_many_ranks", "test_logger_signals", "test_mesh_places", "test_origin_ddp",
        "test_plain_api", "test_ray_train", "test_shared_nothing", "test_tensor_gather", "test_transformers_callback", "test_watch_ddp",
    }
)


@pytest.hookimpl(wrapper=True)  # around xdist's, which turns the xdist_group marks added here into groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> Iterator[None]:
    for item in items:
        if item.module is not None and item.module.__name__.rpartition(".")[2] in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
        if item.module is not None and _shares_a_module_fixture(item):
            # under `pytest -n 2 --dist loadgroup` (make test) the tests of a module that share a
            # module-scoped fixture (a real training, a served page) run on one worker, so it is
            # made once: plain `--dist load` hands out tests in chunks, and a module cut between
            # two workers made its training on each
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
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
