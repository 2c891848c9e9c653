"""A store is checked before it is written (issue 38, points 4 and 5): a damaged file, or another
application's, is refused at the logger's construction, byte for byte untouched (no WAL switch, no
table, no run), with advice that fits what the file holds."""

from __future__ import annotations

import os
import random
import sqlite3
from pathlib import Path

import pytest

from multirank_logger import MultiRankLogger
from multirank_logger.errors import DamagedStore, ForeignStore, NotADatabase
from multirank_logger.store.sql_store import Store
from multirank_logger.write.buffer import RecordBuffer

#: a DuckDB file's header (three 4 KiB pages), then blocks of the size the file records
_DUCKDB_HEADER_BYTES = 3 * 4096


def _filled_store(path: Path, calls: int = 20_000) -> None:
    """A store of ours with one run of `calls` calls of 10 keys, closed."""
    store = Store(path)
    run = store.create_run("lightning_logs", world_size=1)
    buffer = RecordBuffer()
    for i in range(calls):
        buffer.append(i, {f"k{k}": i * 0.1 + k for k in range(10)})
    store.write(buffer.drain(run.id, rank=0))
    store.close()


def _metrics_block_offset(path: Path) -> int:
    """Where in the file a block of the metrics table's data lies (past its checksum)."""
    import duckdb

    con = duckdb.connect(str(path), read_only=True)
    try:
        blocks = sorted(b for (b,) in con.execute(
            "SELECT DISTINCT block_id FROM pragma_storage_info('metrics') WHERE block_id >= 0").fetchall())
        block_bytes = con.execute("SELECT block_size FROM pragma_database_size()").fetchone()[0]  # the file's own
    finally:
        con.close()
    assert blocks, "the metrics table has data blocks"
    return _DUCKDB_HEADER_BYTES + blocks[len(blocks) // 2] * block_bytes + 8192


def _refused_untouched(path: Path, error: type[Exception], match: str) -> str:
    """MultiRankLogger(db=path) fails at construction with `error`; the directory is as it was."""
    before = {p.name: p.read_bytes() for p in path.parent.iterdir() if p.is_file()}
    with pytest.raises(error, match=match) as caught:
        MultiRankLogger(save_dir=str(path.parent / "logs"), db=str(path), spill_dir=str(path.parent / "spill"))
    after = {p.name: p.read_bytes() for p in path.parent.iterdir() if p.is_file()}
    assert after == before  # no byte changed, no -wal/-shm/.wal file, no new store
    return str(caught.value)


def test_duckdb_with_4kb_of_random_bytes_mid_file_is_refused_at_construction(tmp_path: Path) -> None:
    """4 KB of random bytes in a data block: DamagedStore at construction, no run added, file untouched."""
    path = tmp_path / "runs.duckdb"
    _filled_store(path)
    with open(path, "r+b") as fh:
        fh.seek(_metrics_block_offset(path))
        fh.write(random.Random(38).randbytes(4096))
    message = _refused_untouched(path, DamagedStore, "is a DuckDB database, but damaged")
    assert "left untouched" in message and "Log this run to another file" in message


def test_duckdb_cut_to_half_is_refused_at_construction(tmp_path: Path) -> None:
    """A DuckDB file cut to half its size: refused at construction, untouched."""
    path = tmp_path / "runs.duckdb"
    _filled_store(path)
    os.truncate(path, path.stat().st_size // 2)
    _refused_untouched(path, (DamagedStore, NotADatabase), "left untouched")  # type: ignore[arg-type]


def test_sqlite_with_one_random_page_is_refused_without_a_wal_switch(tmp_path: Path) -> None:
    """One page of random bytes in a SQLite store: refused at construction; no run, still not in WAL mode."""
    path = tmp_path / "runs.sqlite"
    _filled_store(path)
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode = DELETE")  # so that a switch to WAL would show in the file's header
    page_size = con.execute("PRAGMA page_size").fetchone()[0]
    con.close()
    pages = path.stat().st_size // page_size
    with open(path, "r+b") as fh:
        fh.seek(random.Random(38).randrange(pages // 2, pages) * page_size)
        fh.write(random.Random(5).randbytes(page_size))
    message = _refused_untouched(path, DamagedStore, "is a SQLite database, but damaged")
    assert "left untouched" in message
    assert path.read_bytes()[18:20] == b"\x01\x01"  # the file format bytes: rollback journal, not WAL (2)


def _foreign_sqlite(path: Path, *statements: str) -> None:
    con = sqlite3.connect(path)
    for statement in statements:
        con.execute(statement)
    con.commit()
    con.close()


def test_another_applications_sqlite_file_gets_no_table_and_no_wal(tmp_path: Path) -> None:
    """Tables that aren't ours: refused, no table added, no WAL switch, advice to use a file of our own."""
    path = tmp_path / "app.db"
    _foreign_sqlite(path, "CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT)", "INSERT INTO users VALUES (1, 'a@b')")
    message = _refused_untouched(path, ForeignStore, "is not a multirank_logger store: it holds tables of another application")
    assert "users" in message and f"db={str(tmp_path / 'app-multirank.db')!r}" in message
    con = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    assert [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")] == ["users"]
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    con.close()


def test_an_application_with_its_own_alembic_is_not_told_to_upgrade(tmp_path: Path) -> None:
    """Its own alembic_version (a revision not ours): advice about that application's migrations."""
    path = tmp_path / "app.db"
    _foreign_sqlite(path, "CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)",
                    "INSERT INTO alembic_version VALUES ('a1b2c3d4e5f6')", "CREATE TABLE accounts (id INTEGER)")
    message = _refused_untouched(path, ForeignStore, "another application's Alembic schema \\(revision 'a1b2c3d4e5f6'")
    assert "That application migrates this file itself" in message
    assert "upgrade" not in message.lower()


def test_an_application_with_its_own_runs_table_is_not_told_to_log_a_run(tmp_path: Path) -> None:
    """Its own runs table (not our columns): advice about that table, not "Log a run to it first"."""
    path = tmp_path / "app.sqlite"
    _foreign_sqlite(path, "CREATE TABLE runs (id INTEGER PRIMARY KEY, title TEXT, finished INTEGER)")
    message = _refused_untouched(path, ForeignStore, "a runs table that is not ours \\(columns finished, id, title\\)")
    assert "Another application keeps its runs there" in message
    assert "Log a run to it first" not in message


def test_an_outdated_store_is_refused_without_a_wal_switch(tmp_path: Path) -> None:
    """A store of ours at an older schema is refused (db upgrade) before its journal is switched."""
    path = tmp_path / "runs.sqlite"
    store = Store(path)
    store.downgrade("0005")
    store.close()
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode = DELETE")
    con.close()
    message = _refused_untouched(path, Exception, "multirank-logger db upgrade")
    assert "0005" in message


def test_a_healthy_store_of_ours_still_opens(tmp_path: Path, backend: str) -> None:
    """The check passes a store of ours: a second run goes in beside the first."""
    path = tmp_path / f"runs.{'sqlite' if backend == 'sqlite' else 'duckdb'}"
    _filled_store(path, calls=100)
    store = Store(path)
    assert store.create_run("lightning_logs").version == 1
    store.close()
