"""Stores for tests: the embedded backends' file suffixes, new databases on a PostgreSQL server."""

from __future__ import annotations

import uuid

#: each embedded backend's store file suffix
BACKEND_SUFFIXES = {"sqlite": ".sqlite", "duckdb": ".duckdb"}


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
