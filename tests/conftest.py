"""Shared fixtures: real store files for each embedded backend, and free TCP ports."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

BACKEND_SUFFIXES = {"sqlite": ".sqlite", "duckdb": ".duckdb"}


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
