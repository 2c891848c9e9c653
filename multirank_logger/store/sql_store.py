"""The store: engine creation, the schema check and upgrade, run bookkeeping, batched inserts.

A `Store` is opened either for writing (the logger, `db upgrade`) or read-only (the
query side). Opening for writing creates a missing store at the migrations' head;
a store at another revision is refused with the command to run. Nothing here knows
about torch.distributed.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import stat
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import URL

from multirank_logger._version import SCHEMA_HEAD, __version__
from multirank_logger.errors import (
    ForeignStore,
    NotAStoreFile,
    SchemaOutdated,
    SchemaTooNew,
    StoreError,
    StoreLocked,
    StoreNotWritable,
)
from multirank_logger.rows.run_ref import RunRef
from multirank_logger.rows.schema import SIDE_TABLES, metadata, ranks, runs
from multirank_logger.store.backends import Backend, backend_for, public_name, register_alembic_impl, resolve_url
from multirank_logger.store.backends.base import StoreFileFacts
from multirank_logger.store.seq_spans import insert_metrics_once
from multirank_logger.store.status import RUNNING

if TYPE_CHECKING:
    import pyarrow as pa
    from alembic.config import Config
    from alembic.script import ScriptDirectory

__all__ = ["Store", "head_revision", "is_known_revision", "migrations_dir", "retry_while_locked"]

T = TypeVar("T")

#: tries of a write another process may race (a run's id, a rank's row against rank 0's placeholder)
_RACE_ATTEMPTS = 50
# SCHEMA_HEAD (_version.py): the schema revision this code reads and writes, the head of
# migrations/versions (a test checks it), named there so that opening a store costs no import of
# Alembic and no read of its scripts (0.3 s of every `multirank-logger` command)


def migrations_dir() -> Path:
    """Where the Alembic scripts are: inside the wheel, or at the top of a source checkout."""
    package = Path(__file__).resolve().parents[1]
    for candidate in (package / "migrations", package.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise FileNotFoundError(f"no migrations/ folder next to {package}; the installation is incomplete")


def _alembic_config(url: URL | str) -> Config:
    """The one Alembic Config this package uses (script_location set, no alembic.ini)."""
    from alembic.config import Config

    register_alembic_impl()
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    text = url.render_as_string(hide_password=False) if isinstance(url, URL) else url
    cfg.set_main_option("sqlalchemy.url", text.replace("%", "%%"))
    return cfg


@functools.lru_cache(maxsize=1)
def _script() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_alembic_config("sqlite://"))


def head_revision() -> str:
    """The schema revision this version of the code reads and writes."""
    return SCHEMA_HEAD


def _revision_of(backend: Backend, conn: sa.Connection) -> str | None:
    """The store's schema revision (Alembic's own table), or None for a store without one."""
    if not backend.has_table(conn, "alembic_version"):
        return None
    return conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()


#: columns every revision's runs table has: a runs table without them is another application's
_OUR_RUNS_COLUMNS = frozenset({"id", "name", "version", "status", "world_size", "started_at"})


def _known_revisions() -> set[str]:
    return {rev.revision for rev in _script().walk_revisions()}


def is_known_revision(revision: str) -> bool:
    """Whether this version's migrations hold ``revision`` (a newer version's store has one they lack)."""
    return revision in _known_revisions()


def _beside(path: Path) -> Path:
    """A store path next to `path` for multirank_logger alone."""
    return path.with_name(f"{path.stem}-multirank{path.suffix}")


def _listed(names: list[str], most: int = 6) -> str:
    more = f", ... ({len(names)} in all)" if len(names) > most else ""
    return ", ".join(names[:most]) + more


#: what a path that is no regular file names, by its stat mode (checked before anything opens it)
_NOT_FILES = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (a named pipe)"),
              (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _refuse_unless_store_file(path: Path, *, must_exist: bool) -> None:
    """Refuse, before anything opens it, a store path that is no regular file (a directory, a FIFO
    that would block its reader, /dev/zero) and one whose place cannot hold a file.

    Raises:
        NotAStoreFile; StoreError: a missing store where `must_exist`, or a path that cannot be looked at.
    """
    try:
        mode = path.stat().st_mode  # stat opens nothing: a FIFO is not waited on
    except FileNotFoundError:
        if must_exist:
            raise StoreError(f"No store at {path}. Check the path; a store is created by the first run logged to it.") from None
        return
    except OSError as exc:  # a file where a directory should be, a name too long, a directory not searchable
        example = Path.cwd() / f"runs{path.suffix or '.sqlite'}"
        raise NotAStoreFile(str(path), f"a path no file can be at ({exc.strerror or exc})", str(example)) from None
    for is_kind, what in _NOT_FILES:
        if is_kind(mode):
            example = (path if stat.S_ISDIR(mode) else Path.cwd()) / f"runs{path.suffix or '.sqlite'}"
            raise NotAStoreFile(str(path), what, str(example))


def _check_writable(path: Path) -> None:
    """Fail now, not an hour into training, if the store file cannot be written (a path that is
    no regular file was refused before: `_refuse_unless_store_file`)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            with open(path, "r+b"):
                pass
        else:
            # a real probe: os.access says yes to root even on a read-only mount
            with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".multirank-probe-"):
                pass
    except OSError as exc:
        raise StoreNotWritable(str(path), exc.strerror or str(exc)) from exc


class Store:
    """One SQL store of runs and metrics.

    Args:
        db: a filesystem path (``.duckdb``, ``.db``, ``.sqlite``, ``.sqlite3``) or a SQLAlchemy URL.
        readonly: open for reading only; never creates, migrates or writes.
        create: False: a store file that does not exist is an error, not a new store (`import`).

    Raises:
        UnsupportedStore, StoreNotWritable, NotADatabase, StoreLocked, SchemaOutdated,
        SchemaTooNew: when the store cannot be used as it is; the file is left untouched.

    Example::

        store = Store("runs.duckdb")
        run = store.create_run("lightning_logs", world_size=2)
    """

    def __init__(self, db: str | os.PathLike[str] | URL, *, readonly: bool = False, create: bool = True) -> None:
        self.url = resolve_url(db)
        self._shown = public_name(db)  # as the user wrote it (a pasteable command), less its password
        self.backend: Backend = backend_for(self.url)
        self.readonly = readonly
        path = self.backend.path
        if path is not None:
            _refuse_unless_store_file(path, must_exist=readonly or not create)
            if not readonly:
                _check_writable(path)
            if not readonly:
                # before the engine: its first connection switches a SQLite file to WAL
                self._refuse_unless_ours(self.backend.inspect_before_write(), outdated_ok=False)
        self.engine = self.backend.create_engine(readonly=readonly)
        self._holding = threading.local()  # writing()'s connection, per thread
        self._check_schema(upgrade_empty=not readonly)

    # -- connections -------------------------------------------------------------------

    @contextlib.contextmanager
    def _translated(self) -> Iterator[None]:
        """Driver errors met inside become ours where we know them (a held file, not a database)."""
        try:
            yield
        except sa.exc.DBAPIError as exc:
            ours = self.backend.translate_error(exc)
            if ours is not None:
                raise ours from exc
            raise

    @contextlib.contextmanager
    def begin(self) -> Iterator[sa.Connection]:
        """A connection in one transaction, with driver errors translated into ours."""
        with self._translated():
            held = self.held_connection
            if held is not None:
                with held.begin():
                    yield held
            else:
                with self.engine.begin() as conn:
                    yield conn

    @contextlib.contextmanager
    def writing(self) -> Iterator[Store]:
        """Hold one connection across several transactions, for a burst of writes.

        Without it a DuckDB store opens and closes its file around every transaction
        (so readers get in between), and each open costs CPU whatever the write. Other threads keep
        opening their own connections.

        Raises:
            StoreLocked: when another process holds the DuckDB file.
        """
        if self.held_connection is not None:
            yield self
            return
        with self._translated():
            conn = self.engine.connect()
        with conn:
            self._holding.conn = conn
            try:
                yield self
            finally:
                self._holding.conn = None

    @property
    def held_connection(self) -> sa.Connection | None:
        """The connection this thread's `writing()` holds, or None (readers share it: see query/reader.py).

        Per thread: a flush from the SIGTERM listener thread must not use the main thread's
        connection mid-transaction; it opens its own (one DuckDB instance per process).
        """
        return getattr(self._holding, "conn", None)

    def close(self) -> None:
        self.engine.dispose()

    def __repr__(self) -> str:
        return f"Store({self.url.render_as_string(hide_password=True)!r})"

    # -- schema ------------------------------------------------------------------------

    def current_revision(self) -> str | None:
        """The store's schema revision, or None for an empty store."""
        with self.begin() as conn:
            return _revision_of(self.backend, conn)

    def _check_schema(self, upgrade_empty: bool) -> None:
        head = head_revision()
        with self.begin() as conn:
            self.backend.lock_for_migration(conn)
            found = _revision_of(self.backend, conn)
            if found == head:
                return
            if found is None and upgrade_empty and not self.backend.has_table(conn, runs.name):
                self._run_alembic(conn, "upgrade", "head")
                return
            self._raise_for_revision(found, head)

    def _refuse_unless_ours(self, facts: StoreFileFacts | None, *, outdated_ok: bool, newer_ok: bool = False) -> None:
        """Refuse, before anything writes it, a file that is another application's, or of a schema
        this code does not write (`outdated_ok`: `db upgrade` is about to bring it to head).

        Raises:
            ForeignStore: with advice that fits what the file holds; SchemaOutdated, SchemaTooNew.
        """
        if facts is None or not facts.tables:
            return  # a new store
        path = str(self.backend.path)
        own_file = f"give multirank_logger a file of its own, e.g. db={str(_beside(Path(path)))!r}"
        foreign = sorted(facts.tables - set(metadata.tables) - {"alembic_version"})
        revision, head = facts.revision, head_revision()
        known = revision == head or (revision is not None and revision in _known_revisions())
        if revision is not None and not known and foreign:
            raise ForeignStore(path, f"another application's Alembic schema (revision {revision!r}; tables "
                               f"{_listed(foreign)})", f"That application migrates this file itself: {own_file}.")
        if facts.runs_columns is not None and not _OUR_RUNS_COLUMNS <= facts.runs_columns:
            raise ForeignStore(path, f"a runs table that is not ours (columns {_listed(sorted(facts.runs_columns))})",
                               f"Another application keeps its runs there: {own_file}.")
        if foreign or revision is None:
            found = f"tables of another application ({_listed(foreign or sorted(facts.tables))})"
            raise ForeignStore(path, found, f"To keep that data apart, {own_file}.")
        if revision != head and not (outdated_ok and known) and not (newer_ok and not known):
            self._raise_for_revision(revision, head)

    def _raise_for_revision(self, found: str | None, head: str) -> None:
        # name the store as the user wrote it, so the suggested command can be pasted as is
        url = getattr(self, "_shown", None) or public_name(self.url)
        if found is None:
            raise StoreError(f"{url} holds no multirank_logger schema. Log a run to it first, or check the path.")
        if found in _known_revisions():
            raise SchemaOutdated(url, found, head, __version__)
        raise SchemaTooNew(url, found, __version__)

    def upgrade(self, revision: str = "head") -> None:
        """Bring the store to `revision` (head by default). Back it up first."""
        with self.begin() as conn:
            self.backend.lock_for_migration(conn)
            self._run_alembic(conn, "upgrade", revision)

    def downgrade(self, revision: str) -> None:
        with self.begin() as conn:
            self.backend.lock_for_migration(conn)
            self._run_alembic(conn, "downgrade", revision)

    def _run_alembic(self, conn: sa.Connection, verb: str, revision: str) -> None:
        cfg = _alembic_config(self.url)
        cfg.attributes["connection"] = conn  # migrate on this transaction, under its lock
        from alembic import command

        getattr(command, verb)(cfg, revision)

    @classmethod
    def for_upgrade(cls, db: str | os.PathLike[str] | URL, *, newer_ok: bool = False, create: bool = True) -> Store:
        """Open a store without the schema check, for `db upgrade` and `db current` (`newer_ok`:
        only to read the revision of a store a newer version wrote; `create`: False, a missing
        store file is an error, not a new empty store)."""
        self = cls.__new__(cls)
        self.url = resolve_url(db)
        self._shown = public_name(db)
        self.backend = backend_for(self.url)
        self.readonly = False
        if self.backend.path is not None:
            _refuse_unless_store_file(self.backend.path, must_exist=not create)
            if create:
                _check_writable(self.backend.path)
        self._refuse_unless_ours(self.backend.inspect_before_write(), outdated_ok=True, newer_ok=newer_ok)
        self.engine = self.backend.create_engine()
        self._holding = threading.local()
        return self

    # -- runs and ranks ----------------------------------------------------------------

    def create_run(
        self,
        name: str,
        *,
        version: int | None = None,
        world_size: int = 1,
        transport: str | None = None,
        hparams: Mapping[str, Any] | None = None,
        at_least: int = 0,
        version_name: str | None = None,
        run_key: str | None = None,
        run_uuid: str | None = None,
        status: str = RUNNING,
    ) -> RunRef:
        """Register a new run; `version=None` takes the next free version for `name` (and no
        lower than `at_least`: versions already taken on disk, see run_lifecycle.py). A new run
        gets a new UUID, unless `run_uuid` gives the one it had (an import recreating it).

        Two processes creating runs at once get different ids and versions: the
        (name, version) pair is unique, and a lost race is retried.

        Raises:
            StoreError: if `version` is given and already taken for `name`.
        """
        for _ in range(_RACE_ATTEMPTS):
            try:
                with self.begin() as conn:
                    run_id = conn.execute(sa.select(sa.func.coalesce(sa.func.max(runs.c.id), 0) + 1)).scalar_one()
                    chosen = version
                    if chosen is None:
                        latest = sa.select(sa.func.coalesce(sa.func.max(runs.c.version), -1) + 1)
                        chosen = max(conn.execute(latest.where(runs.c.name == name)).scalar_one(), at_least)
                    started_at = time.time()
                    run_uuid = run_uuid or str(uuid.uuid4())
                    conn.execute(
                        runs.insert().values(
                            id=run_id,
                            name=name,
                            version=chosen,
                            status=status,
                            world_size=world_size,
                            transport=transport,
                            started_at=started_at,
                            hparams=_to_json(hparams),
                            version_name=version_name,
                            run_key=run_key,
                            run_uuid=run_uuid,
                        )
                    )
                    return RunRef(run_id, name, int(chosen), version_name, started_at, world_size, run_uuid)
            except sa.exc.IntegrityError as exc:
                if version is not None and self.find_run(name, version) is not None:
                    raise StoreError(
                        f"Run {name}/version_{version} already exists in {self.url.database}. "
                        "Pass version=None to take the next free version, or another name."
                    ) from exc
        raise StoreError(f"Could not allocate a run id after {_RACE_ATTEMPTS} attempts; too many concurrent launches?")

    def find_run(self, name: str, version: int) -> RunRef | None:
        cols = (runs.c.id, runs.c.version_name, runs.c.started_at, runs.c.world_size, runs.c.run_uuid)
        with self.begin() as conn:
            row = conn.execute(sa.select(*cols).where(runs.c.name == name, runs.c.version == version)).first()
        if row is None:
            return None
        return RunRef(int(row.id), name, version, row.version_name, float(row.started_at), int(row.world_size), row.run_uuid)

    def update_run(self, run_id: int, *, where_status: str | None = None, **values: Any) -> None:
        """Set columns of a run: status, ended_at, transport, world_size, hparams (a mapping);
        with `where_status`, only while the run's status is that one."""
        if "hparams" in values:
            values["hparams"] = _to_json(values["hparams"])
        stmt = runs.update().where(runs.c.id == run_id)
        if where_status is not None:
            stmt = stmt.where(runs.c.status == where_status)
        with self.begin() as conn:
            conn.execute(stmt.values(**values))

    def register_rank(self, run_id: int, rank: int, **facts: Any) -> None:
        """Record (or refresh) one rank's facts: local_rank, node_rank, host, pid, status."""
        facts.setdefault("status", RUNNING)
        this_rank = ranks.c.run_id == run_id, ranks.c.rank == rank
        for attempt in range(_RACE_ATTEMPTS):
            try:
                with self.begin() as conn:
                    # an earlier launch's side rows still in its spill file stay counted (status.run_is_whole)
                    side = conn.execute(sa.select(ranks.c.side_rows_spilled).where(*this_rank)).scalar()
                    conn.execute(ranks.delete().where(*this_rank))
                    conn.execute(ranks.insert().values(run_id=run_id, rank=rank, started_at=time.time(),
                                                       side_rows_spilled=side, **facts))
                return
            except sa.exc.IntegrityError:
                # on a server, rank 0's `register_absent_ranks` may commit this rank's placeholder
                # between the DELETE and the INSERT (READ COMMITTED): the next attempt replaces it
                if attempt == _RACE_ATTEMPTS - 1:
                    raise

    def register_absent_ranks(self, run_id: int, ranks_: range) -> None:
        """Record `ranks_` as running where they have no row yet (a rank registering itself at the
        same time wins: its row has its facts)."""
        for _ in range(_RACE_ATTEMPTS):
            try:
                with self.begin() as conn:
                    known = set(conn.execute(sa.select(ranks.c.rank).where(ranks.c.run_id == run_id)).scalars())
                    now = time.time()
                    rows = [{"run_id": run_id, "rank": r, "status": RUNNING, "started_at": now} for r in ranks_]
                    rows = [row for row in rows if row["rank"] not in known]
                    if rows:
                        conn.execute(ranks.insert(), rows)
                return
            except sa.exc.IntegrityError:
                continue  # a rank registered itself meanwhile: read again

    def update_rank(self, run_id: int, rank: int, *, where_status: str | None = None, **values: Any) -> None:
        """Set columns of one rank's row; with `where_status`, only while its status is that one."""
        stmt = ranks.update().where(ranks.c.run_id == run_id, ranks.c.rank == rank)
        if where_status is not None:
            stmt = stmt.where(ranks.c.status == where_status)
        with self.begin() as conn:
            conn.execute(stmt.values(**values))

    # -- metrics -----------------------------------------------------------------------

    def write(self, batch: pa.RecordBatch) -> int:
        """Insert a batch of metric rows (`batch.METRICS_SCHEMA`) in one transaction, by the
        backend's fastest path. Rows already stored (same run, rank, seq and key: a batch retried
        after its commit was not seen) are skipped (store/seq_spans.py).

        Returns:
            The number of rows written.
        """
        if len(batch) == 0:
            return 0
        with self.begin() as conn:
            return insert_metrics_once(conn, self.backend, batch)

    def write_side(self, tables: Mapping[str, list[dict[str, Any]]]) -> int:
        """Insert side-table rows (`schema.SIDE_TABLES`: decisions, logs, step_timing) in one
        transaction. Rows already stored (same run, rank and seq: a batch retried after its
        commit was not seen) are skipped.

        Returns:
            The number of rows written.
        """
        written = 0
        with self.begin() as conn:
            for name, rows in tables.items():
                if rows:
                    table = SIDE_TABLES[name]
                    written += self.backend.insert_rows(conn, table, unseen_side_rows(conn, table, rows))
        return written


def unseen_side_rows(conn: sa.Connection, table: sa.Table, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`rows` minus those whose (run_id, rank, seq) `table` holds already."""
    run_ids = {row["run_id"] for row in rows}
    ranks_ = {row["rank"] for row in rows}
    lo, hi = min(row["seq"] for row in rows), max(row["seq"] for row in rows)
    query = sa.select(table.c.run_id, table.c.rank, table.c.seq).where(
        table.c.run_id.in_(sorted(run_ids)), table.c.rank.in_(sorted(ranks_)), table.c.seq.between(lo, hi)
    )
    stored = {tuple(row) for row in conn.execute(query)}
    return [row for row in rows if (row["run_id"], row["rank"], row["seq"]) not in stored] if stored else rows


def retry_while_locked(fn: Callable[[], T], timeout: float) -> T:
    """Run `fn`, retrying while another process holds the DuckDB file (a flush, a reader).

    Raises:
        StoreLocked: when the file is still held after `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        try:
            return fn()
        except StoreLocked:
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.5)


def _to_json(hparams: Mapping[str, Any] | None) -> str | None:
    # default=str: a user's hyperparameters may hold paths, dtypes, classes...
    return None if hparams is None else json.dumps(hparams, default=str, sort_keys=True)
