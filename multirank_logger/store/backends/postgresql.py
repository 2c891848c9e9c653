"""PostgreSQL: a server that many processes write at once; COPY for bulk rows (psycopg 3).

Reads take Backend's defaults (a server's own cursor, one snapshot per export).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

from multirank_logger.errors import QueryFailed, ReadOnlyViolation, StoreUnreachable
from multirank_logger.store.backends.base import Backend, _raised_as_sqlalchemy_would, driver_connection
from multirank_logger.store.backends.store_urls import public_name, without_secrets

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["PostgreSQLBackend"]

# The first keywords of every statement that is not a read (SELECT, WITH, VALUES, TABLE,
# EXPLAIN, SHOW): these never reach the server. WITH ... DELETE is stopped by the read-only
# transaction; a word that starts no statement (a typo) gets the server's syntax error.
_NOT_READS = {
    "abort", "alter", "analyze", "analyse", "begin", "call", "checkpoint", "close", "cluster", "comment",
    "commit", "copy", "create", "deallocate", "declare", "delete", "discard", "do", "drop", "end", "execute",
    "fetch", "grant", "import", "insert", "listen", "load", "lock", "merge", "move", "notify", "prepare",
    "reassign", "refresh", "reindex", "release", "reset", "revoke", "rollback", "savepoint", "security", "set",
    "start", "truncate", "unlisten", "update", "vacuum",
}
# SQLSTATEs of a refused write: read_only_sql_transaction, insufficient_privilege (what the
# reading role may not do), active_sql_transaction (a SET TRANSACTION too late)
_REFUSALS = {"25006", "42501", "25001"}
# a run's ranks by a loose index scan: one descent of (run_id, rank, step) per rank (window_ranks)
_RANKS_OF_RUN = """
WITH RECURSIVE found(rank) AS (
    SELECT min(rank) FROM metrics WHERE run_id = :run
    UNION ALL
    SELECT (SELECT min(rank) FROM metrics WHERE run_id = :run AND rank > found.rank) FROM found WHERE found.rank IS NOT NULL
)
SELECT rank FROM found WHERE rank IS NOT NULL
"""
# the figures free_connections needs, in one round trip (reserved_connections: PostgreSQL 16+)
_ROOM_SQL = """
SELECT current_setting('max_connections')::int AS max_connections,
       current_setting('superuser_reserved_connections')::int
         + coalesce(nullif(current_setting('reserved_connections', true), '')::int, 0) AS reserved,
       (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) AS superuser,
       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend') AS in_use,
       (SELECT rolconnlimit FROM pg_roles WHERE rolname = current_user) AS role_limit,
       (SELECT count(*) FROM pg_stat_activity WHERE usename = current_user) AS role_in_use,
       (SELECT datconnlimit FROM pg_database WHERE datname = current_database()) AS db_limit,
       (SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()) AS db_in_use
"""

#: the most (run, rank) advisory locks one write takes; a write of more ranks locks their runs
_RANK_LOCKS_MAX = 16
# a run's own lock is (run_id, -1): no rank is -1; the arrays come sorted, and unnest keeps their order
_LOCK_RUNS = "SELECT {lock}(t.run, -1) FROM unnest(CAST(:runs AS integer[])) AS t(run)"
_LOCK_RANKS = (
    "SELECT pg_advisory_xact_lock(t.run, t.rank) FROM unnest(CAST(:runs AS integer[]), CAST(:ranks AS integer[])) AS t(run, rank)"
)


class PostgreSQLBackend(Backend):
    name = "postgresql"
    rows_read_back_show_damage = False

    def create_engine(self, readonly: bool = False) -> sa.Engine:
        options = "-c default_transaction_read_only=on" if readonly else ""
        return sa.create_engine(self.url, connect_args={"options": options} if options else {})

    def translate_error(self, exc: Exception) -> Exception | None:
        # no statement: the connection itself failed (refused, no such host, authentication, a
        # timeout); the driver's first line says why, the URL's password never in it
        if isinstance(exc, sa.exc.OperationalError) and exc.statement is None:
            first = (str(exc.orig).strip().splitlines() or ["no reason given"])[0]
            return StoreUnreachable(public_name(self.url), without_secrets(first, self.url))
        return None

    def insert_metrics(self, conn: sa.Connection, table: sa.Table, batch: pa.RecordBatch) -> None:
        from multirank_logger.rows.batch import column_lists

        cursor = driver_connection(conn).cursor()
        if not hasattr(cursor, "copy"):  # psycopg2: SQLAlchemy's executemany
            super().insert_metrics(conn, table, batch)
            return
        # psycopg 3: COPY streams the rows in one statement, the server's own bulk path
        columns = [c.name for c in table.columns]
        sql = f"COPY {table.name} ({', '.join(columns)}) FROM STDIN"
        with _raised_as_sqlalchemy_would(conn, sql), cursor.copy(sql) as copy:
            for row in zip(*column_lists(batch, columns)):
                copy.write_row(row)

    def window_ranks(self, conn: sa.Connection, run_id: int) -> list[int]:
        # Without the ranks, a range of steps is a scan of the whole table (PostgreSQL 16 has no
        # skip scan): the report's pass over a run of N windows read it N times. Named, each window
        # is one descent of ix_metrics_run_rank_step per rank. The ranks themselves: a loose index
        # scan (one descent per rank), not a DISTINCT over the run's rows.
        return list(conn.execute(sa.text(_RANKS_OF_RUN), {"run": run_id}).scalars())

    def json_member(self, column: Any, keys: tuple[str, ...]) -> tuple[Any, Any]:
        # jsonb: -> with a text key per level (never #>, whose path indexes a list by a number's
        # text); ->> gives a string's characters and a number's or a boolean's text, NULL for JSON null
        above: Any = sa.cast(column, JSONB)
        for key in keys[:-1]:
            above = above.op("->")(sa.literal(key, sa.Text))
        member = above.op("->")(sa.literal(keys[-1], sa.Text))
        kind = sa.func.jsonb_typeof(member)
        text = sa.case((kind == "string", above.op("->>")(sa.literal(keys[-1], sa.Text))),
                       else_=sa.cast(member, sa.Text))
        number = sa.case((kind == "number", sa.cast(sa.cast(member, sa.Text), sa.Float(53))))
        return text, number

    def lock_for_migration(self, conn: sa.Connection) -> None:
        # a transaction-scoped advisory lock: released at commit, even if the process dies
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": 0x6D726C67})

    def lock_seq_spans(self, conn: sa.Connection, runs_ranks: list[tuple[int, int]]) -> None:
        # Two writers of one (run, rank) at once (a spill file imported while its run still writes,
        # one file imported twice at once) would each read the spans before the other's commit,
        # and both store the overlap (no unique index here). Advisory locks, held to the commit: a
        # writer of a few ranks takes each (run, rank)'s, and its run's shared; one of many (rank
        # 0 of a gather run) its run's alone, so that the server's lock table (64 entries per
        # connection by default) holds a few entries, not one per rank. Sorted: no deadlock.
        pairs = sorted(set(runs_ranks))
        runs = sorted({run for run, _ in pairs})
        if len(pairs) > _RANK_LOCKS_MAX:
            conn.execute(sa.text(_LOCK_RUNS.format(lock="pg_advisory_xact_lock")), {"runs": runs})
            return
        conn.execute(sa.text(_LOCK_RUNS.format(lock="pg_advisory_xact_lock_shared")), {"runs": runs})
        conn.execute(sa.text(_LOCK_RANKS), {"runs": [run for run, _ in pairs], "ranks": [r for _, r in pairs]})

    def free_connections(self, conn: sa.Connection) -> tuple[int, str] | None:
        # what a new connection of this role into this database may take: the server's
        # max_connections less the slots reserved for superusers (unless we are one) and those in
        # use, and the role's and the database's own limits (-1: none)
        row = conn.execute(sa.text(_ROOM_SQL)).one()
        reserved = 0 if row.superuser else row.reserved
        free = [row.max_connections - reserved - row.in_use]
        if row.role_limit >= 0:
            free.append(row.role_limit - row.role_in_use)
        if row.db_limit >= 0:
            free.append(row.db_limit - row.db_in_use)
        limits = f"max_connections={row.max_connections}, {row.in_use} in use"
        if row.role_limit >= 0 or row.db_limit >= 0:
            limits += f", role limit {row.role_limit}, database limit {row.db_limit}"
        return max(min(free), 0), limits

    #: how long one user query (run_readonly) may run on the server (it holds a snapshot meanwhile)
    statement_timeout_s = 300.0

    def run_readonly(self, conn: sa.Connection, query: str) -> Any:
        # Exactly one statement (the extended query protocol refuses "a; b"), inside a
        # transaction made READ ONLY before any of the user's SQL and always rolled back, a
        # statement_timeout, and, for a superuser, SET LOCAL ROLE pg_read_all_data: the query
        # keeps read access to every table but loses what only a superuser may do (COPY ... TO
        # PROGRAM, pg_read_file, lo_import, pg_terminate_backend of others).
        import pandas as pd
        import psycopg

        if _first_keyword(query) in _NOT_READS:
            raise ReadOnlyViolation(query)
        raw = driver_connection(conn)
        if not hasattr(raw, "pgconn"):  # psycopg2 and others send "a; b" as one string
            raise QueryFailed(
                "PostgreSQL", "sql() needs the psycopg 3 driver (pip install 'multirank-logger[postgres]')"
            )
        raw.rollback()  # start from no transaction, whatever the pool handed back
        try:
            with raw.cursor() as cur:
                # before any of the user's SQL: read only, bounded, and no superuser powers
                cur.execute("SET TRANSACTION READ ONLY")
                cur.execute(f"SET LOCAL statement_timeout = {int(self.statement_timeout_s * 1000)}")
                cur.execute("SET LOCAL idle_in_transaction_session_timeout = 60000")
                cur.execute(
                    "SELECT rolsuper OR pg_has_role(current_user, 'pg_read_all_data', 'MEMBER') "
                    "FROM pg_roles WHERE rolname = current_user"
                )
                if cur.fetchone()[0]:
                    cur.execute("SET LOCAL ROLE pg_read_all_data")
                # prepare=True: the extended protocol, which takes exactly one statement
                cur.execute(query, prepare=True)
                if cur.description is None:
                    return pd.DataFrame()
                names = [d.name for d in cur.description]
                return pd.DataFrame.from_records(cur.fetchall(), columns=names)
        except psycopg.Error as exc:
            if exc.sqlstate in _REFUSALS or "multiple commands" in str(exc):
                raise ReadOnlyViolation(query) from None
            raise QueryFailed(conn.dialect.name, str(exc)) from None  # "postgresql", as before
        finally:
            raw.rollback()  # whatever ran, nothing of it stays


    def interrupt(self, conn: sa.Connection) -> None:
        # a cancel request sent on a connection of its own: the server stops the statement
        raw = driver_connection(conn)
        (getattr(raw, "cancel_safe", None) or raw.cancel)()  # cancel_safe: psycopg >= 3.2


def _first_keyword(query: str) -> str:
    """The statement's first word, past whitespace and ``--``/``/* */`` comments (nested, as PostgreSQL's)."""
    i, n = 0, len(query)
    while i < n:
        if query[i].isspace() or query[i] == "(":
            i += 1
        elif query.startswith("--", i):
            end = query.find("\n", i)
            i = n if end < 0 else end + 1
        elif query.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if query.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif query.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        else:
            break
    match = re.match(r"[A-Za-z_]+", query[i:])
    return match.group(0).lower() if match else ""
