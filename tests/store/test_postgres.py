"""The store, its migrations and the query side on a real PostgreSQL server (pgserver).

What only a server has: its driver, its advisory lock, its read-only sessions. The checks
every backend shares run on PostgreSQL through the `any_db` fixture (conftest.py: a new
database on one server started for the session), in the modules that own them; the 2-rank
DDP trainings on PostgreSQL are in tests/runs/test_logger_ddp.py, beside SQLite's and DuckDB's.
"""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from multirank_logger.query.reader import open_store
from multirank_logger.rows.batch import concat_batches
from multirank_logger.rows.schema import metadata
from multirank_logger.store.seq_spans import insert_metrics_once
from multirank_logger.store.sql_store import Store
from multirank_logger.write.buffer import RecordBuffer


def test_plain_postgresql_url_uses_psycopg_3(postgres_url: str) -> None:
    """``postgresql://`` takes psycopg 3 (our ``postgres`` extra) even with psycopg2 installed
    beside it (the test extras install both); ``postgresql+psycopg2://`` still takes psycopg2."""
    import psycopg2  # noqa: F401 - installed: it must not take psycopg 3's place

    store = Store(postgres_url)
    assert store.url.get_backend_name() == "postgresql"
    assert store.engine.dialect.driver == "psycopg"
    store.close()
    store = Store(postgres_url.replace("postgresql://", "postgresql+psycopg2://", 1))
    assert store.engine.dialect.driver == "psycopg2"
    store.close()


def test_schema_at_head_equals_metadata(postgres_url: str) -> None:
    """Alembic's own comparison finds nothing between the migrated schema and schema.py."""
    store = Store(postgres_url)
    with store.begin() as conn:
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
    store.close()


def test_reader_refuses_writes(postgres_url: str) -> None:
    """The query side's connection is read-only on the server too, not only by its parser."""
    Store(postgres_url).create_run("lightning_logs")
    with open_store(postgres_url) as reader:
        assert list(reader.runs()["name"]) == ["lightning_logs"]
        with reader.store.engine.connect() as conn, pytest.raises(sa.exc.DBAPIError, match="read-only"):
            conn.execute(sa.text("DELETE FROM runs"))


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://trainer:s3cret@db-host/runs",
        "postgresql://trainer@db-host/runs?password=s3cret&sslmode=require",
        "postgresql+psycopg://trainer@db-host/runs?sslpassword=s3cret",
    ],
)
def test_the_name_shown_and_shared_holds_no_password(url: str) -> None:
    """What messages show and ranks exchange (`public_name`) drops a password wherever libpq
    takes it: in the userinfo and as a query parameter; the rest of the URL stays."""
    from multirank_logger.store.backends import public_name

    shown = public_name(url)
    assert "s3cret" not in shown and "trainer@db-host/runs" in shown
    assert ("sslmode=require" in shown) == ("sslmode=require" in url)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://trainer:s3cret%2Fx@db-host/runs",
        "postgresql://trainer@db-host/runs?password=s3cret/x&sslmode=require",
        "postgresql+psycopg://trainer@db-host/runs?sslpassword=s3cret/x",
    ],
)
def test_an_error_shown_holds_no_password(url: str) -> None:
    """An error's text that quotes the URL it was given (SQLAlchemy's, a driver's) is shown
    with the password, raw or URL-quoted, replaced (`without_secrets`): the watch's warning, the
    page's 500 answer."""
    from sqlalchemy.engine import make_url

    from multirank_logger.store.backends import without_secrets

    said = f"could not use {url} (password s3cret/x, quoted s3cret%2Fx)"
    for db in (url, make_url(url)):
        shown = without_secrets(said, db)
        assert "s3cret" not in shown and "db-host/runs" in shown and shown.count("***") >= 2
    assert without_secrets(said, "/runs/s3cret.duckdb") == said  # a path names no secret


def _calls(run_id: int, ranks: range, seqs: range) -> pa.RecordBatch:
    """Rows of `seqs` (two keys each, at step = seq) from every rank of `ranks`."""
    batches = []
    for rank in ranks:
        buf = RecordBuffer()
        buf._next_seq = seqs.start
        for seq in seqs:
            buf.append(seq, {"loss": float(seq), "acc": 0.5})
        batches.append(buf.drain(run_id=run_id, rank=rank))
    return concat_batches(batches)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("first_ranks", [1, 65], ids=["one-rank", "many-ranks"])
def test_two_writers_of_one_rank_store_each_row_once(postgres_url: str, first_ranks: int) -> None:
    """Two transactions write overlapping seqs of one (run, rank) at once (a spill file imported
    while its run still writes: rank 0's batch of every rank, or one rank's). The second waits for
    the first's commit, then finds its rows: none stored twice. Without a lock each read the spans
    before the other wrote, and the overlap was stored twice (PostgreSQL has no unique index)."""
    store = Store(postgres_url)
    run = store.create_run("race", world_size=first_ranks)
    first, second = _calls(run.id, range(first_ranks), range(0, 10)), _calls(run.id, range(1), range(5, 15))
    errors: list[BaseException] = []

    def write_second() -> None:
        try:
            with store.begin() as conn:
                insert_metrics_once(conn, store.backend, second)
        except BaseException as exc:  # noqa: BLE001 - the test's thread reports it
            errors.append(exc)

    with store.begin() as conn:
        insert_metrics_once(conn, store.backend, first)
        other = threading.Thread(target=write_second)
        other.start()
        # the second writer either finished (no lock: it read the spans before this commit) or waits on a lock
        with store.engine.connect() as watch:
            waiting = "SELECT count(*) FROM pg_locks WHERE NOT granted"
            while other.is_alive() and not watch.execute(sa.text(waiting)).scalar():
                time.sleep(0.02)
    other.join(60)
    assert not errors and not other.is_alive()
    with store.begin() as conn:
        rows = conn.execute(sa.text("SELECT rank, seq, key, count(*) FROM metrics GROUP BY rank, seq, key")).all()
    store.close()
    assert {n for *_, n in rows} == {1}
    assert len(rows) == 2 * (10 * first_ranks + 5)  # rank 0's seqs 0-14, the other ranks' 0-9
