"""Shared fixtures: real store files for each embedded backend, a real PostgreSQL server, free TCP ports."""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
import socket
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

BACKEND_SUFFIXES = {"sqlite": ".sqlite", "duckdb": ".duckdb"}

#: modules whose every test launches real multi-process trainings, or the benchmarks: marked
#: `slow`, so `make test-fast` (pytest -m "not slow") runs the rest in a fraction of the time.
#: A test elsewhere that launches processes says so itself with @pytest.mark.slow.
SLOW_MODULES = frozenset(
    {
        "test_audit_ddp", "test_benchmarks_smoke", "test_demo", "test_dropin_ddp", "test_launchers",
        "test_logger_cli_launch", "test_logger_ddp", "test_logger_many_ranks", "test_logger_signals",
        "test_shared_nothing", "test_tensor_gather",
    }
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.module is not None and item.module.__name__.rpartition(".")[2] in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(params=sorted(BACKEND_SUFFIXES))
def backend(request: pytest.FixtureRequest) -> str:
    """Each embedded backend in turn: 'duckdb', then 'sqlite'."""
    return request.param


@pytest.fixture
def db_path(tmp_path: Path, backend: str) -> Path:
    """A path for a new store file of the current backend (not created yet)."""
    return tmp_path / f"runs{BACKEND_SUFFIXES[backend]}"


def free_port() -> int:
    """A TCP port free on loopback right now, for a gloo rendezvous."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def port() -> int:
    return free_port()


def stop_process(pid: int, timeout: float = 30.0) -> None:
    """SIGSTOP `pid` and return once every thread of it is stopped: kill() only queues the signal,
    and on a loaded machine a server thread can still answer a request after kill() returned."""
    os.kill(pid, signal.SIGSTOP)
    tasks = Path(f"/proc/{pid}/task")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = []
        for task in tasks.iterdir():
            try:  # "pid (comm) S ...": the state follows the last ')'
                states.append((task / "stat").read_text().rpartition(")")[2].split()[0])
            except (FileNotFoundError, ProcessLookupError):
                continue  # a thread that ended meanwhile
        if states and all(state in "tT" for state in states):
            return
        time.sleep(0.005)
    raise TimeoutError(f"process {pid} did not stop within {timeout:g} s of SIGSTOP")


def forkserver(*modules: str) -> Any:
    """A forkserver context whose server imports torch.distributed, Lightning, the logger and
    `modules` once: its children start in a fraction of a spawned rank's time (8 ranks on 2 cores:
    70 s -> 6 s). Their stderr is the one of the test that started the server: a test that reads
    theirs has them write it to files (logger_helpers.stderr_to_file)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch.distributed", "lightning.pytorch", "multirank_logger.logger", *modules])
    return ctx


def start_ranks(target: Callable[..., None], world_size: int, *args: Any, ctx: Any = None) -> list[Any]:
    """Start `target(rank, world_size, port, *args)` in `world_size` processes of `ctx` (default:
    spawn), with a free port for their gloo rendezvous. The processes, for `join_ranks`."""
    ctx = ctx or mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, world_size, port, *args)) for r in range(world_size)]
    for p in procs:
        p.start()
    return procs


def join_ranks(procs: list[Any], join_s: float = 90) -> list[int | None]:
    """Wait up to `join_s` for each of `procs` to end, then kill those left. Their exit codes."""
    for p in procs:
        p.join(join_s)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(10)
    return [p.exitcode for p in procs]


def spawn_ranks(
    target: Callable[..., None], world_size: int, *args: Any, join_s: float = 90, ctx: Any = None
) -> list[int | None]:
    """`start_ranks` then `join_ranks`: the exit codes of `target`'s ranks, each given `join_s` to end."""
    return join_ranks(start_ranks(target, world_size, *args, ctx=ctx), join_s)


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


def new_postgres_database(server) -> str:
    """A URL to a new, empty database on `server` (the driver is left to resolve_url)."""
    from sqlalchemy.engine import make_url

    name = f"t_{uuid.uuid4().hex[:12]}"
    server.psql(f"CREATE DATABASE {name};")
    return make_url(server.get_uri()).set(database=name).render_as_string(hide_password=False)


def with_password(server, url: str) -> tuple[str, str]:
    """`url` as a new role with a password, owner of its database, would write it (cluster users'
    postgresql://user:PASSWORD@host/db); the URL and the password. The session's server trusts its
    local socket, so the password is carried everywhere a real one would be, and never checked."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    role, password = f"u_{uuid.uuid4().hex[:12]}", f"Pw-{uuid.uuid4().hex}"
    server.psql(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'; ALTER DATABASE {parsed.database} OWNER TO {role};")
    return parsed.set(username=role, password=password).render_as_string(hide_password=False), password


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
