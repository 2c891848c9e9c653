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


def summaries_of(run_id: int, bit_or: bool) -> list[str]:
    """The SQL (every backend) that gives run `run_id`'s rows, inserted by hand with a raw INSERT,
    the summaries the store's own writes keep beside them (store/step_summaries.py): its
    summaries dropped and made again from its rows. Readers count on them (the runs list, the
    page, a run's keys), so a test's hand-made store keeps the invariant a logged one has."""
    from multirank_logger.store.step_summaries import backfill, backfill_coarse

    where = f"WHERE run_id = {int(run_id)}"
    return [f"DELETE FROM step_summaries {where}", f"DELETE FROM coarse_summaries {where}",
            backfill(where=where, bit_or=bit_or), backfill_coarse(where=where, bit_or=bit_or)]


def keep_summaries(conn, run_id: int) -> None:
    """`summaries_of` run on a SQLAlchemy connection, in its transaction."""
    import sqlalchemy as sa

    for sql in summaries_of(run_id, bit_or=conn.dialect.name != "sqlite"):
        conn.execute(sa.text(sql))  # text(): psycopg would read the modulo's % as a placeholder
