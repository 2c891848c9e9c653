"""The read-only query side: runs, the long table, per-rank tables, metrics.csv rebuilt.

Everything here opens the store through ``Store(db, readonly=True)``: SQLite with
``mode=ro`` (a WAL reader never blocks the writers), DuckDB with ``read_only=True``
and a connection held only while one query runs, so a training run that flushes
into the same file waits at most that long. Filters are pushed into SQL; the bulk
rows come back as Arrow (DuckDB) and are pivoted in NumPy, never as a dict per row.

Example::

    store = open_store("runs.duckdb")
    store.runs()                                  # one row per run
    store.per_rank("train_loss")                  # step x rank, latest run
    store.export_csv("metrics.csv", run="lightning_logs/version_3", rank=0)
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from multirank_logger._util.atomic_file import replace_atomically
from multirank_logger._util.background_import import import_in_background
from multirank_logger.errors import LookupFailed, ReadsStopped
from multirank_logger.query.host_ledger import read_host_ledger
from multirank_logger.query.long_table import FRAMES, as_frame, long_table
from multirank_logger.query.rank_spread import RankSpread, key_extent, pivot_step_rank, pivot_streamed
from multirank_logger.query.run_filter import RunFilter, read_hparams
from multirank_logger.query.run_list import read_run_headers, read_run_rows, read_runs
from multirank_logger.query.side_tables import (
    read_alerts,
    read_decisions,
    read_findings,
    read_logs,
    read_rank_nodes,
    read_rank_rows,
    read_step_timing,
    read_stops,
    read_timing_columns,
    read_timing_series,
    read_transport,
)
from multirank_logger.query.step_buckets import BucketSummary, summarize
from multirank_logger.query.stoppable import run_stoppable
from multirank_logger.rows.csv_layout import LongRows, to_frame, write_csv
from multirank_logger.rows.run_ref import RunRef, run_number
from multirank_logger.rows.schema import attempts, fits_bigint, metrics, ranks, runs
from multirank_logger.store.run_lifecycle import orphan_runs
from multirank_logger.store.seq_spans import CallsNotStored, calls_not_stored
from multirank_logger.store.sql_store import Store, retry_while_locked

__all__ = ["RankSpread", "StoreReader", "open_store", "run_number"]

# A DuckDB file is locked while the training run flushes into it (each flush opens it: RESULTS.md, "Figures the source cites"):
# wait this long for the lock before reporting StoreLocked.
LOCK_TIMEOUT_S = 5.0
_RUN_LABEL = re.compile(r"^(?P<name>.+)/(?:version_)?(?P<version>\d+)$")


def open_store(db: str | os.PathLike[str], *, lock_timeout: float = LOCK_TIMEOUT_S) -> StoreReader:
    """Open a store for reading only; it never takes a write lock.

    Args:
        db: a path (``.duckdb``, ``.db``, ``.sqlite``, ``.sqlite3``) or a SQLAlchemy URL.
        lock_timeout: seconds to wait for a DuckDB file that a writer holds for a flush.

    Raises:
        StoreError: when the store is missing, outdated, or stays locked past ``lock_timeout``.
    """
    store = retry_while_locked(lambda: Store(db, readonly=True), lock_timeout)
    return StoreReader(store, lock_timeout=lock_timeout)


class StoreReader:
    """Read-only views of one store, as pandas DataFrames.

    ``run`` arguments take a run id (``3``, ``"3"``), a label (``"lightning_logs/version_3"``,
    ``"lightning_logs/3"``), or a name (its latest version); ``None`` is the latest run.
    The side tables' reads live in ``query/side_tables.py``; a run's findings (which rank is
    the problem) are the report layer's: ``multirank_logger.report.find(reader, run)``.
    What the page asks for every few seconds (`run_headers`, `run_status`, `bucket_summary`,
    `timing_series`, `rank_nodes`) takes the id of a run resolved already: no lookup per request.
    """

    def __init__(self, store: Store, *, lock_timeout: float = LOCK_TIMEOUT_S) -> None:
        self.store = store
        self.lock_timeout = lock_timeout
        #: connections in use now, on any thread (a held one may be in use on several): what `interrupt` stops
        self._in_use: dict[sa.Connection, int] = {}
        self._in_use_lock = threading.Lock()
        #: why this reader's reads were stopped (`interrupt`); None while they may run
        self.stopped: str | None = None

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"StoreReader({self.store.url.render_as_string(hide_password=True)!r})"

    # -- stopping: Ctrl-C, a bound on the page's requests --------------------------------

    def interrupt(self, reason: str = "The reads were stopped.") -> None:
        """Stop every query this reader runs now, on any thread and connection, and refuse the
        ones it would start (`ReadsStopped`, with ``reason``). Safe from any thread; a query
        that has not reached the engine yet is missed: call again until the reads have ended
        (`stoppable` does)."""
        if self.stopped is None:
            self.stopped = reason
        with self._in_use_lock:
            conns = list(self._in_use)
        for conn in conns:
            with contextlib.suppress(Exception):  # the connection may be closing as its query ends
                self.store.backend.interrupt(conn)

    def check_stopped(self) -> None:
        """Raise `ReadsStopped` once `interrupt` was called: a pass of many queries ends at its next one."""
        if self.stopped is not None:
            raise ReadsStopped(self.stopped)

    def stoppable(self, reads: Callable[[], Any], timeout: float | None = None) -> Any:
        """``reads()`` (any reads through this reader, on any threads it starts) in a thread of its
        own; Ctrl-C here interrupts every connection it uses and raises KeyboardInterrupt once it
        has ended, as a timeout raises QueryTimedOut (see `sql`)."""
        return run_stoppable(reads, lambda: self.interrupt("The reads were stopped (Ctrl-C)."), timeout)

    # -- connections -------------------------------------------------------------------

    @contextlib.contextmanager
    def _in_use_while(self, conn: sa.Connection) -> Iterator[sa.Connection]:
        """``conn`` among the connections `interrupt` stops while the block runs; an engine error
        of a stopped reader is `ReadsStopped` (the reason, not the driver's "interrupted")."""
        with self._in_use_lock:
            self._in_use[conn] = self._in_use.get(conn, 0) + 1
        try:
            self.check_stopped()  # after registering: an interrupt either sees it or is seen here
            yield conn
        except Exception as exc:
            if self.stopped is not None and not isinstance(exc, ReadsStopped):
                raise ReadsStopped(self.stopped) from exc
            raise
        finally:
            with self._in_use_lock:
                if (left := self._in_use.pop(conn) - 1) > 0:
                    self._in_use[conn] = left

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sa.Connection]:
        """One short-lived connection; a DuckDB file locked by a flush is waited for.

        Inside the store's `writing()` (the logger exporting at the end of a run) the held
        connection is used instead: a second one would open the DuckDB file again (a DuckDB open: RESULTS.md),
        and a read-only one cannot be opened beside it in the same process.
        """
        self.check_stopped()
        held = self.store.held_connection
        if held is not None:
            with self._in_use_while(held):
                if held.in_transaction():
                    yield held
                else:
                    with held.begin():  # ends the transaction a SELECT starts, for the next writer
                        yield held
            return

        def connect() -> sa.Connection:
            try:
                return self.store.engine.connect()
            except sa.exc.DBAPIError as exc:
                ours = self.store.backend.translate_error(exc)
                if ours is not None:
                    raise ours from exc
                raise

        conn = retry_while_locked(connect, self.lock_timeout)
        with conn, self._in_use_while(conn):
            yield conn

    def fetch_arrow(self, stmt: sa.Select) -> Any:
        """Run a SELECT (SQLAlchemy Core, over `multirank_logger.rows.schema`'s tables) on a read
        connection and return a pyarrow Table (DuckDB hands Arrow over without Python rows). What
        every read of this class, the side tables' ``read_*`` and the export build on."""
        with self._connect() as conn:
            return self.store.backend.fetch_arrow(conn, stmt)

    def _fetch_rows(self, stmt: sa.Select | sa.TextClause) -> list[Any]:
        """Run a SELECT and return the driver's rows (no Arrow: see query/host_ledger.py)."""
        with self._connect() as conn:
            return list(conn.execute(stmt).fetchall())

    def _scalars(self, stmt: sa.Select) -> list[Any]:
        with self._connect() as conn:
            return list(conn.execute(stmt).scalars())

    # -- runs and keys -----------------------------------------------------------------

    def runs(self, where: RunFilter | None = None) -> Any:
        """One row per run (of those `where` keeps: query/run_filter.py): id, run (label), name, version, status, world_size, started,
        duration_s, steps, keys, last_value (the time of its latest stored value, NaT if none),
        values_spilled, values_lost, side_rows_spilled, ends_unknown, stopped_by, uuid.

        ``duration_s`` runs to ``ended_at``, or to the last logged value while a run is
        still running. ``steps`` counts the distinct steps rank 0 logged; ``keys`` the
        distinct keys any rank logged. What keeps an ``incomplete`` run from success:
        ``values_spilled`` and ``side_rows_spilled`` (in spill files, not imported yet), ``values_lost``, and
        ``ends_unknown``, the ranks whose end the store never heard (``missing``, or
        ``running`` in a run that is over; an earlier launch's, in ``unheard_ends``: status.py).
        ``stopped_by``: why a run ended before its end, from its stored rows (`StopOnAlert`'s
        stop: ``stopped by StopOnAlert at step N (KIND alert: rank R, KEY, from step S)``; the
        status stays the one its end recorded), else None.
        ``uuid`` is the run's one identity everywhere (its spill files, ``import``, every export);
        None for a run logged before schema 0007.
        """
        return read_runs(self.fetch_arrow, where.conditions(self.store.backend) if where else ())

    def run_rows(self, where: RunFilter | None = None) -> list[dict[str, Any]]:
        """`runs`, one dict per run and without pandas: times as Unix seconds (``started_at``,
        ``last_time``: None if nothing stored), as the CLI's ``runs`` table reads them."""
        return read_run_rows(self.fetch_arrow, where.conditions(self.store.backend) if where else ())

    def hparams(self, run_ids: Iterable[int]) -> dict[int, dict[str, Any]]:
        """Each run's stored hyperparameters (``runs.hparams`` parsed; {} where none), by run id."""
        return read_hparams(self.fetch_arrow, [int(i) for i in run_ids])

    def run_ids(self) -> list[int]:
        """Every run's id, in order: no scan of the metrics (``runs`` counts their steps and keys)."""
        return [int(i) for i in self._scalars(sa.select(runs.c.id).order_by(runs.c.id))]

    def run_headers(self, only: int | None = None) -> list[dict[str, Any]]:
        """Each run's row as the page lists it, newest first (``only``: that run id's): `run_list.read_run_headers`."""
        return read_run_headers(self.fetch_arrow, only)

    def run_status(self, run_id: int) -> str | None:
        """The status the run's row holds now (``running`` while it goes); None for no such run id."""
        return next(iter(self._scalars(sa.select(runs.c.status).where(runs.c.id == run_id))), None)

    def calls_not_stored(self, run_id: int) -> list[CallsNotStored]:
        """Each rank's log calls the store lacks while later ones of that launch are stored (store/seq_spans.py)."""
        with self._connect() as conn:
            return calls_not_stored(conn, run_id)

    def resolve_run(self, run: int | str | RunRef | None = None) -> RunRef:
        """The run meant by ``run`` (see the class docstring; a `RunRef` is taken as it is).

        Raises:
            LookupFailed: listing the runs there are, when none matches.
        """
        if isinstance(run, RunRef):
            return run
        cols = (runs.c.id, runs.c.name, runs.c.version, runs.c.version_name, runs.c.started_at, runs.c.world_size,
                runs.c.run_uuid)
        stmt = sa.select(*cols).order_by(runs.c.id.desc()).limit(1)
        text = None if run is None else str(run).strip()
        if text is not None:
            label = _RUN_LABEL.match(text)
            if text.isdigit():  # past 64 bits no run has that id
                run_id = run_number(text)
                stmt = stmt.where(runs.c.id == run_id if run_id is not None else sa.false())
            elif label:
                version = run_number(label["version"])
                stmt = stmt.where(runs.c.name == label["name"], runs.c.version == version if version is not None else sa.false())
            elif "/" in text:  # NAME/VERSION_NAME: a named version
                name, version_name = text.rsplit("/", 1)
                stmt = stmt.where(runs.c.name == name, runs.c.version_name == version_name)
            else:
                stmt = stmt.where(runs.c.name == text)
        with self._connect() as conn:
            row = conn.execute(stmt).first()
            if row is None:
                everything = conn.execute(sa.select(*cols).order_by(runs.c.id)).all()
                labels = [f"{r.name}/version_{r.version} (id {r.id})" for r in everything]
                raise LookupFailed("run", text or "(latest)", labels)
        return RunRef(int(row.id), row.name, int(row.version), row.version_name, float(row.started_at), int(row.world_size),
                      row.run_uuid)

    def keys(self, run: int | str | None = None) -> list[str]:
        """The metric keys of a run, any rank, sorted."""
        ref = self.resolve_run(run)
        with self._connect() as conn:
            return sorted(self.store.backend.run_keys(conn, ref.id))

    def ranks(self, run: int | str | None = None) -> list[int]:
        """The ranks of a run: 0..world_size-1, plus any other rank registered or logging."""
        ref = self.resolve_run(run)
        with self._connect() as conn:
            return _run_ranks(conn, ref)

    def _check_keys(self, ref: RunRef, wanted: Iterable[str]) -> None:
        wanted = list(wanted)
        present = set(self._scalars(
            sa.select(metrics.c.key).where(metrics.c.run_id == ref.id, metrics.c.key.in_(wanted)).distinct()
        ))
        missing = [k for k in wanted if k not in present]
        if missing:
            raise LookupFailed("key", missing[0], self.keys(ref.id))

    # -- tables ------------------------------------------------------------------------

    def metrics(
        self,
        run: int | str | None = None,
        ranks: Iterable[int] | None = None,
        keys: Iterable[str] | None = None,
        all_attempts: bool = False,
        *,
        frame: str = "pandas",
    ) -> Any:
        """The long table of one run: run_id, rank, seq, step, key, value, dtype, time (UTC), attempt.

        ``frame``: ``"pandas"`` (a DataFrame), ``"arrow"`` (a ``pyarrow.Table``) or ``"polars"`` (a
        ``polars.DataFrame``, the ``polars`` extra): built in Arrow, never copied through pandas.

        ``value`` is a float (NaN where NaN was logged); ``dtype`` says what was logged
        (``schema.DTYPE_*``); ``attempt`` is the launch that logged it (store/run_lifecycle.py). Rows
        come sorted by rank, then call order. A value a later launch logged again for the same
        (rank, key, step) (a resume from a checkpoint older than the preemption) supersedes the
        earlier one, which is left out unless ``all_attempts``.

        Raises:
            LookupFailed: for an unknown run, or a key the run does not hold.
            ValueError: for another ``frame``; MissingExtra: polars is not installed.
        """
        if frame not in FRAMES:
            raise ValueError(f"frame={frame!r}: pass one of {', '.join(map(repr, FRAMES))}.")
        ref = self.resolve_run(run)
        cols = [metrics.c.run_id, metrics.c.rank, metrics.c.seq, metrics.c.step,
                metrics.c.key, metrics.c.value, metrics.c.dtype, metrics.c.time]
        stmt = sa.select(*cols).where(metrics.c.run_id == ref.id)
        if ranks is not None:
            stmt = stmt.where(metrics.c.rank.in_([int(r) for r in ranks]))
        if keys is not None:
            keys = list(keys)
            self._check_keys(ref, keys)
            stmt = stmt.where(metrics.c.key.in_(keys))
        found = self.fetch_arrow(stmt.order_by(metrics.c.rank, metrics.c.seq))
        return as_frame(long_table(found, all_attempts), frame)

    def attempts(self, run: int | str | None = None) -> Any:
        """The launches of one run: attempt, world_size, status, started_at, ended_at, host, job_id."""
        ref = self.resolve_run(run)
        cols = [attempts.c.attempt, attempts.c.world_size, attempts.c.status, attempts.c.started_at,
                attempts.c.ended_at, attempts.c.host, attempts.c.job_id]
        stmt = sa.select(*cols).where(attempts.c.run_id == ref.id).order_by(attempts.c.attempt)
        return self.fetch_arrow(stmt).to_pandas()

    def orphans(self) -> list[tuple[int, int]]:
        """(run id, rows) of metric rows under a run id with no ``runs`` row (none expected)."""
        with self._connect() as conn:
            return orphan_runs(conn)

    def per_rank(self, key: str, run: int | str | None = None, *, frame: str = "pandas") -> Any:
        """One key as a step x rank table (index ``step``, one float column per rank).

        ``frame``: ``"arrow"`` or ``"polars"``: a ``step`` column, then one column per rank named
        by its number (``"0"``, ``"1"``...), from the NumPy grid without pandas.

        Where a rank logged the key twice at one step, its later call wins: of a run resumed
        from a checkpoint, the latest launch's value (``metrics(all_attempts=True)`` shows all).

        ``timing:COLUMN`` (``timing:data_s``, ``timing:rss``...): StepTimer's column, per rank and step.

        Raises:
            LookupFailed: for an unknown run, or a key the run does not hold (the keys are listed).
        """
        if frame not in FRAMES:
            raise ValueError(f"frame={frame!r}: pass one of {', '.join(map(repr, FRAMES))}.")
        ref = self.resolve_run(run)
        if frame == "pandas":
            import_in_background("pandas")  # for the DataFrame, while the store reads the rows
        if key.startswith("timing:"):  # StepTimer's series, as the page names them (timing:data_s)
            rank, seq, step, value, dtype = read_timing_columns(self.fetch_arrow, ref, key, self.keys(ref.id))
        else:
            with self._connect() as conn:
                # streamed into the table where the key's summaries give its extent (peak: ~1.1x the answer)
                extent = key_extent(conn, ref.id, key)
                if extent is not None:
                    chunks = self.store.backend.per_rank_chunks(conn, ref.id, key)
                    table = pivot_streamed(extent, chunks, frame="pandas" if frame == "pandas" else "arrow")
                    if table is not None:
                        return table if frame in ("pandas", "arrow") else as_frame(table, frame)
                rank, seq, step, value, dtype = self.store.backend.per_rank_columns(conn, ref.id, key)
            assert rank is not None and step is not None and value is not None and dtype is not None
            if len(rank) == 0:
                self._check_keys(ref, [key])
        if frame == "pandas":
            return pivot_step_rank(rank, seq, step, value, dtype)
        return as_frame(pivot_step_rank(rank, seq, step, value, dtype, frame="arrow"), frame)

    def rank_spread(self, key: str, run: int | str | None = None) -> RankSpread:
        """One key per rank, how far the ranks spread, which stands out, where each logged NaN or inf (left out)."""
        ref = self.resolve_run(run)
        table = self.per_rank(key, ref.id)
        with self._connect() as conn:
            return RankSpread.read(conn, key, ref, table)

    def bucket_summary(self, run_id: int, series: str) -> BucketSummary:
        """A key or ``timing:COLUMN`` per bucket and rank as the page draws it (`summarize`), on one connection."""
        with self._connect() as conn:  # its few reads: one DuckDB open, not one each (RESULTS.md)
            return summarize(lambda stmt: self.store.backend.fetch_arrow(conn, stmt), run_id, series)

    @contextlib.contextmanager
    def _rank_pieces(self, ref: RunRef, rank: int) -> Iterator[tuple[list[str], Iterator[LongRows]]]:
        """One rank's keys, and its rows as pieces of whole calls in call order, read while
        the connection stays open: a long run's export holds a few fetches, not every row.

        Raises:
            LookupFailed: for a rank the run does not have.
        """
        with self._connect() as conn:
            if not fits_bigint(rank):  # no rank has it; the driver would overflow binding it
                raise LookupFailed("rank", str(rank), [str(r) for r in _run_ranks(conn, ref)])
            self.store.backend.hold_snapshot(conn)
            keys, pieces = self.store.backend.rank_calls(conn, ref.id, rank)
            if not keys and rank not in (known := _run_ranks(conn, ref)):
                raise LookupFailed("rank", str(rank), [str(r) for r in known])
            yield keys, pieces

    def _rank_rows(self, ref: RunRef, rank: int) -> LongRows:
        """One rank's rows, all at once (for a DataFrame, which holds them all anyway)."""
        with self._rank_pieces(ref, rank) as (_, pieces):
            return LongRows.concat(list(pieces))

    def rank_frame(self, run: int | str | None = None, rank: int = 0) -> Any:
        """One rank's values in CSVLogger's layout: one row per log call, sorted columns with ``step``."""
        return to_frame(self._rank_rows(self.resolve_run(run), rank))

    def export_csv(self, path: str | os.PathLike[str], run: int | str | None = None, rank: int = 0) -> int:
        """Write one rank's values to ``path`` exactly as CSVLogger writes ``metrics.csv``.

        The file is replaced atomically. A rank that logged nothing gets no file, as
        CSVLogger writes none. The rows stream from the store into the file; on DuckDB the
        file stays open for reading until the export is written (a training run that flushes
        into it meanwhile keeps its rows, and writes them at its next flush).

        Returns:
            The number of rows (log calls) written.

        Raises:
            LookupFailed: for an unknown run or rank.
        """
        path = Path(path)
        with self._rank_pieces(self.resolve_run(run), rank) as (keys, pieces):
            if not keys:
                return 0
            path.parent.mkdir(parents=True, exist_ok=True)  # as CSVLogger makes its log_dir
            # newline="": the csv module writes its own "\r\n", as in CSVLogger's open()
            with replace_atomically(path, newline="") as fp:
                count = write_csv(fp, keys, pieces)
        return count

    def write_csv(self, fp: Any, run: int | str | None = None, rank: int = 0) -> int:
        """Like ``export_csv``, onto an open text file (``newline=""``), e.g. stdout."""
        with self._rank_pieces(self.resolve_run(run), rank) as (keys, pieces):
            return write_csv(fp, keys, pieces) if keys else 0

    def sql(self, query: str, timeout: float | None = None) -> Any:
        """Run one read-only query and return its result as a DataFrame.

        The query runs in a thread of its own while this one waits: a query in the engine's C
        code never returns to Python to see Ctrl-C, so the waiting thread takes it and stops
        the query through the backend (``interrupt``: SQLite's and DuckDB's ``interrupt()``,
        PostgreSQL's cancel request), as it does when ``timeout`` runs out.

        Args:
            query: the user's SQL.
            timeout: seconds the query may run; ``None``: no limit.

        Raises:
            ReadOnlyViolation: for a statement that would write; nothing is changed.
            QueryFailed: with the engine's own message, for an invalid query.
            QueryTimedOut: the query ran past ``timeout`` and was stopped.
            KeyboardInterrupt: Ctrl-C, once the query has stopped.
        """
        running: list[sa.Connection] = []

        def run() -> Any:
            with self._connect() as conn:
                running.append(conn)
                return self.store.backend.run_readonly(conn, query)

        def stop() -> None:
            if running:
                self.store.backend.interrupt(running[0])

        return run_stoppable(run, stop, timeout)

    # -- side tables (query/side_tables.py) ----------------------------------------------

    def alerts(self, run: int | str | RunRef | None = None, *, every_run: bool = False) -> Any:
        """What the watch raised during a run (``MultiRankLogger(watch=True)``), in the order raised;
        `every_run`: every run's, by run, with a ``run_id`` column first.

        Columns: ``seq``, ``kind`` (non_finite, departure, straggler, memory, stop), ``rank``,
        ``key``, ``first_step``, ``step_seen``, ``seen_at`` (unix seconds), ``value``,
        ``message`` and ``detail`` (JSON). Empty when nothing was raised.

        Raises:
            LookupFailed: for an unknown run.
        """
        return read_alerts(self.fetch_arrow, None if every_run else self.resolve_run(run))

    def findings(self, run: int | str | RunRef | None = None, *, every_run: bool = False) -> Any:
        """A run's verdict as kept at its end (the watch's last judgement: the ``findings`` table),
        origins first; `every_run`: every run's, by run (what analyses across runs read).

        Columns: ``run_id``, ``launch``, ``seq``, ``kind``, ``rank``, ``series``, ``first_step``,
        ``origin`` (this rank is where the problem started), ``origin_step``, ``value``,
        ``sentence``, ``found_at`` (unix seconds), ``detail`` (JSON). Empty for a run that kept
        none: nothing found, ``watch=False``, still running, or from before schema 0010.

        Raises:
            LookupFailed: for an unknown run.
        """
        return read_findings(self.fetch_arrow, None if every_run else [self.resolve_run(run).id])

    def hosts(self, *, since: float | None = None, kinds: Iterable[str] | None = None,
              chronic: tuple[int, int] = (3, 5), by: str = "host") -> list[dict[str, Any]]:
        """Every host across the runs (started at or after `since`, unix seconds), with its runs, those whose
        kept verdict named a rank on it (of `kinds`), and whether it is chronic (query/host_ledger.py)."""
        return read_host_ledger(lambda sql: self._fetch_rows(sa.text(sql)), since=since, kinds=kinds, chronic=chronic, by=by)

    def stopped_by(self, run: int | str | RunRef | None = None) -> dict[str, Any] | None:
        """How `StopOnAlert` ended a run, from its stored rows: ``step``, ``alert_kind``, ``key``,
        ``rank``, ``first_step``, ``monitor`` (None where not known); None when nothing stopped it.

        Raises:
            LookupFailed: for an unknown run.
        """
        ref = self.resolve_run(run)
        return read_stops(self.fetch_arrow, [ref.id]).get(ref.id)

    def decisions(self, run: int | str | RunRef | None = None) -> Any:
        """Every ModelCheckpoint / EarlyStopping decision of a run, one row per (decision, rank).

        Columns: ``seq`` (the decision's number, the same on every rank), ``step``, ``epoch``,
        ``callback``, ``monitor``, ``mode``, ``rank``, ``value`` (the rank's own monitored
        value), ``vote`` (this rank alone would save / stop), ``decision`` (what was done),
        ``path`` (the checkpoint saved), ``best`` (the callback's best score after it) and
        ``time`` (unix seconds). Sorted by decision, then rank. Empty when the run had no
        `DecisionAudit`.

        Raises:
            LookupFailed: for an unknown run.
        """
        return read_decisions(self.fetch_arrow, self.resolve_run(run))

    def logs(self, run: int | str | RunRef | None = None, rank: int | None = None, level: int | str | None = None,
             limit: int | None = None) -> Any:
        """Every rank's logging records and warnings kept during a run (``capture_logs``).

        Args:
            run: see the class docstring.
            rank: only this rank's records.
            level: only records at or above this level (``"WARNING"``, ``30``).
            limit: only the first this many records.

        Returns:
            Columns ``rank``, ``seq`` (the rank's record number), ``time`` (unix seconds),
            ``level``, ``levelno``, ``logger``, ``message``; in time order.

        Raises:
            LookupFailed: for an unknown run.
            ValueError: for a level name logging does not know.
        """
        return read_logs(self.fetch_arrow, self.resolve_run(run), rank, level, limit)

    def step_timing(self, run: int | str | RunRef | None = None) -> Any:
        """The run's StepTimer rows, one per (rank, batch): ``side_tables.TIMING_COLUMNS``."""
        return read_step_timing(self.fetch_arrow, self.resolve_run(run))

    def timing_series(self, run_id: int, among: Iterable[str]) -> list[str]:
        """The StepTimer series of ``among`` (``timing:COLUMN``) the run holds a value of, in that order."""
        return read_timing_series(self.fetch_arrow, run_id, among)

    def rank_rows(self, run: int | str | RunRef | None = None) -> Any:
        """The run's registered ranks: rank, host, status, started_at, ended_at, their GPU and DP index."""
        return read_rank_rows(self.fetch_arrow, self.resolve_run(run))

    def rank_nodes(self, run_id: int) -> list[dict[str, Any]]:
        """The run's registered ranks' ``rank``, ``node_rank`` and ``host`` (None where not known)."""
        return read_rank_nodes(self.fetch_arrow, run_id)

    def transport(self, run: int | str | RunRef | None = None) -> str | None:
        """How the run's rows reached the store (``direct``, ``gather``, ...)."""
        return read_transport(self.fetch_arrow, self.resolve_run(run))


def _run_ranks(conn: sa.Connection, ref: RunRef) -> list[int]:
    registered = conn.execute(sa.select(ranks.c.rank).where(ranks.c.run_id == ref.id)).scalars()
    return sorted(set(range(ref.world_size)) | set(registered))
