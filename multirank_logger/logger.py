"""MultiRankLogger: the Lightning front-end. Naming, versioning, rank, and Lightning's hooks.

The hot path (`log_metrics`, `save`) only appends to this rank's `RecordBuffer` and may
wake the `BackgroundWriter`; the writer thread moves rows into a sink (sinks.py). How the
ranks agree on one run is in identity.py; the storage is store.py.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
import time
import weakref
from argparse import Namespace
from collections.abc import Callable, Iterator, Mapping
from itertools import count
from typing import Any, TypeVar

from lightning.fabric.loggers.logger import _DummyExperiment
from lightning.fabric.utilities.logger import _add_prefix, _convert_params
from lightning.pytorch.core.saving import save_hparams_to_yaml
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.logger import Logger
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from typing_extensions import override

from multirank_logger import process_hooks
from multirank_logger.backends import backend_for, resolve_url
from multirank_logger.buffer import RecordBuffer
from multirank_logger.exit_logging import quiet_logging_errors
from multirank_logger.experiment import RunExperiment
from multirank_logger.live_csv import LiveCsv
from multirank_logger.log_dir import DEFAULT_DB_NAME, LogDir, check_store_is_local
from multirank_logger.errors import MultiRankLoggerError, StoreLocked
from multirank_logger.identity import IdentityBoard, RunIdentity, current_rank, current_world_size
from multirank_logger.log_capture import LogCapture, capture_level
from multirank_logger.placement import TRANSPORTS, InvalidTransport, choose_transport
from multirank_logger.query import StoreReader
from multirank_logger.run_lifecycle import (
    begin_attempt,
    check_run_choice,
    check_same_run,
    end_attempt,
    open_run,
    seq_base,
)
from multirank_logger.run_end import (
    FACTS_WAIT_S,
    fetch_facts,
    final_status,
    publish_facts,
    rank_facts,
    record_end,
    run_lacks_values,
)
from multirank_logger.side_records import SideRecords
from multirank_logger.sinks import DirectSink, GatherReceiver, GatherSender
from multirank_logger.spill import SpillWriter
from multirank_logger.store import Store, retry_while_locked
from multirank_logger.torch_floor import require_store_queues
from multirank_logger.transport import RowChannel
from multirank_logger.unstored import Spiller, describe
from multirank_logger.writer import BackgroundWriter

__all__ = ["MultiRankLogger"]

log = logging.getLogger(__name__)
T = TypeVar("T")
_INSTANCES = count()
_LIVE: weakref.WeakSet[MultiRankLogger] = weakref.WeakSet()
#: the longest a failing rank spends on the store or the channel in finalize("failed")
_FAILED_TIMEOUT = 5.0


class MultiRankLogger(Logger):
    r"""Record every rank's own metrics from Lightning (or Fabric) into one SQL store.

    Laid out like `CSVLogger` (``save_dir/name/version_N``), so checkpoints land where they
    would with it; rank 0 also writes the ``metrics.csv`` (as the run goes, live_csv.py) and
    ``hparams.yaml`` that `CSVLogger` would have written.

    The first five parameters are CSVLogger's, in its order: ``CSVLogger("logs")`` becomes
    ``MultiRankLogger("logs")``.

    Args:
        save_dir: where ``name/version_N`` lives (local, or any fsspec URL such as ``s3://...``,
            as with CSVLogger); defaults to the db file's directory (the working directory for a
            server URL).
        name: experiment name; ``None`` means ``""``, as in CSVLogger.
        version: version number within `name`, or a str for a named version (its directory is
            the str itself, as in CSVLogger); ``None`` takes the next version free both in the
            store and on disk (a ``version_N`` of another logger is never reused).
        prefix: a string put before every metric key (joined with ``"-"``).
        flush_logs_every_n_steps: pending log calls that make the writer flush early (and write
            rank 0's ``metrics.csv``, as CSVLogger does every that many steps); a DuckDB store,
            which each write opens, is written once per ``flush_interval`` or at
            ``writer.SELDOM_MAX_CALLS`` pending calls instead.
        db: the store: a path ending in ``.duckdb``, ``.db``, ``.sqlite``, ``.sqlite3``, or a
            SQLAlchemy URL. Created at the current schema when missing. Defaults to
            ``save_dir/runs.sqlite``: SQLite never blocks a reader and lets every rank of a node
            write (see the README). A local file or a server: never a remote filesystem.
        flush_interval: seconds between two flushes of the background writer.
        transport: ``"direct"`` (every rank writes the store), ``"gather"`` (rank 0 writes,
            the others ship their rows to it) or ``"auto"`` (gather for DuckDB with several
            ranks, direct otherwise).
        export_csv: rank 0 writes ``metrics.csv`` into `log_dir` as the run goes (and leaves it
            after a failure) and ``hparams.yaml`` when hyperparameters are logged, as CSVLogger does.
        timeout: the longest any wait on another rank or on a busy store lasts, in seconds.
        spill_dir: where a rank that cannot deliver its rows to rank 0 (gather transport, rank 0
            gone) writes them, for ``multirank-logger import``; defaults to the db file's
            directory (the working directory for a server URL), as seen by that rank.
        capture_logs: keep every rank's `logging` records at or above this level (a name or
            number; ``True`` is INFO) and its `warnings` in the store's ``logs`` table, from
            construction to `finalize`; ``False`` or ``None`` keeps none. On by default: a
            record costs an append in memory, off the metrics path, and the console shows
            what it showed before (see log_capture.py).
        resume: whether an existing run (the `version` or `run_key` given) is continued as a
            new attempt: ``"allow"`` (default), ``"must"`` (it must exist; with neither given,
            the latest run of `name`) or ``"never"``. See run_lifecycle.py.
        run_key: your key for the run, e.g. the scheduler's job id: a launch with the same
            key and name continues that run, so a requeue needs no version bookkeeping.

    Raises:
        StoreError: when the store cannot be written (checked at construction); RemoteStore for
            a db on a remote filesystem.

    Example::

        from lightning.pytorch import Trainer
        from multirank_logger import MultiRankLogger

        logger = MultiRankLogger("logs", name="my_model")  # the store: logs/runs.sqlite
        trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=logger)
    """

    LOGGER_JOIN_CHAR = "-"
    NAME_METRICS_FILE = "metrics.csv"
    NAME_HPARAMS_FILE = "hparams.yaml"

    def __init__(
        self,
        save_dir: str | os.PathLike[str] | None = None,
        name: str | None = "lightning_logs",
        version: int | None = None,
        prefix: str = "",
        flush_logs_every_n_steps: int = 100,
        *,
        db: str | os.PathLike[str] | None = None,
        flush_interval: float = 5.0,
        transport: str = "auto",
        export_csv: bool = True,
        timeout: float = 60.0,
        spill_dir: str | os.PathLike[str] | None = None,
        capture_logs: bool | int | str | None = "INFO",
        resume: str = "allow",
        run_key: str | None = None,
    ) -> None:
        super().__init__()
        require_store_queues()  # a clear error now, not an AttributeError in the writer thread
        if transport not in TRANSPORTS:
            raise InvalidTransport(transport)
        check_run_choice(version, resume, run_key)
        if db is None:
            if save_dir is None:
                raise TypeError("MultiRankLogger needs save_dir (as CSVLogger does), or db=, or both")
            db = os.path.join(check_store_is_local(None, save_dir), DEFAULT_DB_NAME)
        self._db = check_store_is_local(os.fspath(db))
        self._url = resolve_url(self._db)
        self._url_text = self._url.render_as_string(hide_password=False)
        self._name = name or ""
        self._version_arg = version
        self._resume = resume
        self._run_key = run_key
        path = backend_for(self._url).path
        default_dir = str(path.parent) if path is not None else os.getcwd()
        self._save_dir = os.fspath(save_dir) if save_dir is not None else default_dir
        self._files = LogDir(self._save_dir)
        self._prefix = prefix
        self._flush_every = max(1, int(flush_logs_every_n_steps))
        self._flush_interval = float(flush_interval)
        self._transport_arg = transport
        self._export_csv = export_csv
        self._timeout = float(timeout)
        self._spill_dir = os.fspath(spill_dir) if spill_dir is not None else default_dir
        self._board = IdentityBoard(next(_INSTANCES), self._timeout)
        # a logger dropped without finalize leaves no variable behind (it is for its own launch)
        weakref.finalize(self, os.environ.pop, self._board.env_var, None)
        self._identity: RunIdentity | None = None
        self._published = False
        self._hparams: dict[str, Any] = {}
        self._hparams_logged = False
        self._phase = 0  # finalize calls so far: each phase (fit, test) gets its own row channel
        self._finalized = False  # ever: a run never finalized is ended at exit after a crash
        self._capture_level = capture_level(capture_logs)
        self._init_runtime()
        self._check_store()  # the run itself is allocated when first needed (`_resolve`)
        self._capture_logs(True)
        # no thread yet: the first log call (or `experiment`) starts the writer, so a logger
        # built and never used leaves nothing running

    def _init_runtime(self) -> None:
        """State that lives in one process only (rebuilt after unpickling)."""
        self._buffer = RecordBuffer()
        self._side = SideRecords()
        self._unsaved = 0  # CSVLogger's unsaved-row count: the step when none is given
        self._lock = threading.RLock()  # identity and sink set-up; never taken by log_metrics/save
        process_hooks.guard_setup(self._lock)  # a SIGTERM inside a set-up must not wait for it
        self._store: Store | None = None
        self._sink: DirectSink | GatherSender | None = None
        self._sink_world = 0
        self._spiller: Spiller | None = None  # one per run: every phase spills into one file
        self._unstored_recorded = (0, 0)  # (spilled, lost) values already added to the run's row
        self._rank = 0
        self._transport: str | None = None
        self._attempt: int | None = None  # this process's launch of the run (run_lifecycle.py)
        self._live = False
        self._live_csv: LiveCsv | None = None  # rank 0's metrics.csv, once rank 0 has rows
        self._csv_gaps = 0  # batches the live file missed
        self._writer = BackgroundWriter(
            self._buffer,
            self._target,
            flush_interval=self._flush_interval,
            flush_every=self._flush_every,
            side=self._side,
            tap=self._tap_csv,
        )
        # appends to the side rows directly: `record` would start the writer's SIGTERM hook (main thread only)
        self._capture = None if self._capture_level is None else LogCapture(self._side.add, self._capture_level)
        _LIVE.add(self)

    # -- pickling (ddp_spawn) ---------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        if self._identity is None and current_rank() == 0:
            # pickled for ddp_spawn's workers: each launch of them must write under one run
            self._resolve()
        state = self.__dict__.copy()
        for key in ("_buffer", "_side", "_lock", "_store", "_sink", "_writer", "_spiller", "_capture", "_live_csv"):
            del state[key]  # engines, threads and sockets stay in this process
        state["_published"] = False  # the new process's rank 0 publishes into its own launch
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    def __repr__(self) -> str:
        return f"MultiRankLogger(db={self._db!r}, name={self._name!r}, version={self._version_arg!r})"

    # -- CSVLogger's properties ---------------------------------------------------------------

    @property
    @override
    def name(self) -> str:
        return self._name

    @property
    @override
    def version(self) -> int | str:
        """The run's version: agreed by every rank, allocated by rank 0 in the store."""
        if self._version_arg is not None:
            return self._version_arg
        return self._resolve().version

    @property
    @override
    def save_dir(self) -> str:
        return self._save_dir

    @property
    @override
    def root_dir(self) -> str:
        return os.path.join(self._save_dir, self._name)

    @property
    @override
    def log_dir(self) -> str:
        version = self._version_arg
        if isinstance(version, str):
            return os.path.join(self.root_dir, version)
        return os.path.join(self.root_dir, f"version_{version}" if version is not None else self._resolve().dir_name)

    @property
    def run_id(self) -> int:
        """The run's id in the store's ``runs`` table."""
        return self._resolve().run_id

    @property
    def transport(self) -> str | None:
        """``"direct"`` or ``"gather"`` once decided (when the process group is up), else None."""
        return self._transport

    @property
    def experiment(self) -> RunExperiment | _DummyExperiment:
        """CSVLogger's experiment for user code: on rank 0 a `RunExperiment` (``log_metrics``,
        ``log_hparams``, ``save``, ``metrics_file_path``), elsewhere a do-nothing one.

        Lightning reads this on every rank once the process group is up: the moment each rank
        learns the run and sets up its sink. Bounded waits, no collective.
        """
        self._setup_sink()
        if not self._writer.running:
            self._writer.start()
        self._capture_logs(True)  # again for a later phase (fit, then test), and in ddp_spawn workers
        return RunExperiment(self) if current_rank() == 0 else _DummyExperiment()

    # -- the hot path ------------------------------------------------------------------------

    @override
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        # Runs every logging step on every rank: no I/O, no SQL, no collective, no lock.
        if self._prefix:
            metrics = _add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR)
        self._record_call(metrics, step)

    def _record_call(self, metrics: Mapping[str, Any], step: int | None) -> None:
        """One log call into the buffer (`log_metrics`, and the experiment's, which has no prefix)."""
        if step is None:
            step = self._unsaved
        self._buffer.append(step, metrics)
        self._unsaved += 1
        if (step + 1) % self._flush_every == 0:
            self._unsaved = 0  # where CSVLogger saves, and so restarts its count
        if not self._live:
            self._start()

    def record(self, table: str, **values: Any) -> None:
        """Keep one row for a side table (``decisions``, ``logs``, ``step_timing``: see schema.py)
        from this rank; the writer stores it with the metrics. Appends to memory only.

        Raises:
            KeyError: for a table or column the schema does not have.
        """
        self._side.add(table, values)
        if not self._live:
            self._start()

    @override
    def save(self) -> None:
        # Lightning calls this after every log_metrics: a counter check, at most an Event.set()
        self._unsaved = 0
        self._writer.maybe_wake()

    @override
    def log_hyperparams(self, params: dict[str, Any] | Namespace | None = None, *args: Any, **kwargs: Any) -> None:
        """Keep the hyperparameters and store them with the run; rank 0 writes hparams.yaml now,
        as CSVLogger does."""
        with self._lock:
            self._hparams.update(_convert_params(params))
            self._hparams_logged = True
            if self._sink is not None and self._rank == 0:
                self._sink.update_run(hparams=_jsonable(self._hparams))
        if self._export_csv and current_rank() == 0:
            self._safely(self._write_hparams, "writing hparams.yaml")

    # -- the end ---------------------------------------------------------------------------

    @override
    def finalize(self, status: str) -> None:
        """Flush everything, record how the run ended, and (rank 0, success) write the CSV files.

        Never a collective and never an unbounded wait: with ``"failed"`` a peer may be dead.
        """
        self._finalized = True
        self._capture_logs(False)  # what it kept is flushed below
        status = final_status(status)
        timeout = self._timeout if status == "success" else min(self._timeout, _FAILED_TIMEOUT)
        if self._buffer.calls_pending and self._sink is None:
            self._safely(self._setup_sink)
        self._writer.stop(timeout)  # from here on only this thread writes
        self._live = False
        process_hooks.release_sigterm()  # the handler from before ours, once no writer needs it
        sink = self._sink
        if sink is None or self._identity is None:
            self._writer.flush(timeout)
            self._end_unset_run(status)
            self._board.withdraw()
            return
        store, run_id = self._store, self._identity.run_id  # store: None on a rank that only sends
        deadline = time.monotonic() + timeout
        left = lambda: max(deadline - time.monotonic(), 1.0)  # the end's waits share `timeout`
        with self._held(store, timeout):
            self._writer.flush(timeout)
            cycle = lambda: self._writer.flush(timeout, now=False)  # receive; write when due
            others = self._safely(lambda: sink.finish(status, timeout, cycle)) or {}
            # rows rank 0 received while finishing, and rows a busy store refused so far: the last wait
            if not self._writer.flush_until(max(deadline, time.monotonic() + 1.0)):
                error = self._writer.last_error
                self._writer.spill_held(
                    f"the store did not take these rows by the end of the run ({describe(error) if error else 'busy'})"
                )
            gather_world = self._sink_world if sink.transport == "gather" else 0
            facts: dict[int, dict[str, Any]] = {}
            if gather_world and self._rank == 0:
                facts = self._safely(lambda: fetch_facts(sink.channel, range(1, gather_world), min(timeout, FACTS_WAIT_S))) or {}
            sink.close()  # rank 0: the last acknowledgements; every rank: the channel's socket
            spilled, lost = self._unstored_since_recorded()
            others_spilled, others_lost = sink.others_unstored  # gather rank 0: what the senders reported
            if store is not None and self._safely(lambda: sink.check_store() or True, "checking the store file"):
                end = {"rank": self._rank, "gather_world": gather_world, "status": status, "others": others, "facts": facts}
                recorded = self._safely(lambda: record_end(
                    store, run_id, **end, timeout=min(left(), 5.0), values_spilled=spilled + others_spilled,
                    values_lost=lost + others_lost,
                ) or True)
                if recorded:
                    self._unstored_recorded = self._unstored_totals()
                else:
                    log.error("multirank_logger: the run's end could not be recorded: the store still says 'running'.")
                    if self._spiller is not None:  # importing the spill file records it (spill.import_spill)
                        self._spiller.end(status, *self._unstored_totals())
                if self._rank == 0 and self._attempt is not None:
                    attempt = self._attempt
                    self._safely(lambda: retry_while_locked(lambda: end_attempt(store, run_id, attempt, status), 5))
                if self._rank == 0 and status == "success" and self._export_csv:
                    self._export_if_complete(store, run_id, left())
            if self._spiller is not None and self._spiller.summary():
                self._spiller.say(self._spiller.summary())
        self._phase += 1
        self._sink = None  # a later fit/test sets up again, on a fresh channel
        self._board.withdraw()  # the launch is over: leave no variable behind in this process

    def _unstored_totals(self) -> tuple[int, int]:
        spiller = self._spiller
        return (0, 0) if spiller is None else (spiller.values_spilled, spiller.values_lost)

    def _unstored_since_recorded(self) -> tuple[int, int]:
        (spilled, lost), (s0, l0) = self._unstored_totals(), self._unstored_recorded
        return spilled - s0, lost - l0

    def _export_if_complete(self, store: Store, run_id: int, wait: float = 5.0) -> None:
        """metrics.csv only when it holds every value: never a short file passed off as CSVLogger's.

        The file written as the run went (live_csv.py) was fed every row rank 0 logged, before
        the store saw them: it is whole whatever the store refused. Only a file rebuilt from the
        store at the end depends on the store holding every value."""
        if self._live_csv_whole():
            self._safely(self._export_files, "writing metrics.csv and hparams.yaml")
            return
        lacks = self._safely(lambda: retry_while_locked(lambda: run_lacks_values(store, run_id), wait), "reading the run")
        if lacks is None or any(lacks):
            why = "the store could not be read" if lacks is None else (
                f"the store lacks {lacks[0]} value(s) kept in spill files and {lacks[1]} lost"
            )
            log.error(
                "multirank_logger: metrics.csv was not written: %s. Import the spill files named above, then write "
                "it with: multirank-logger export %s --run %s -o %s",
                why, self._db, run_id, os.path.join(self.log_dir, self.NAME_METRICS_FILE),
            )
            return
        self._safely(self._export_files, "writing metrics.csv and hparams.yaml")

    @contextlib.contextmanager
    def _held(self, store: Store | None, timeout: float) -> Iterator[None]:
        """One connection for the end of the run, where each write would open the file again.

        A DuckDB open costs ~20 ms and the end took five or more (last rows, the other ranks'
        rows, the run's status, the export). Readers wait meanwhile: normally a fraction of a
        second, at most the bounded wait for ranks that do not finish. If a reader holds the
        file now, each step opens it on its own, with its own retries.
        """
        with contextlib.ExitStack() as stack:
            if store is not None and store.backend.opens_per_transaction:
                with contextlib.suppress(StoreLocked):
                    retry_while_locked(lambda: stack.enter_context(store.writing()), min(timeout, 5.0))
            yield

    def _end_unset_run(self, status: str) -> None:
        """finalize before any sink: a run rank 0 allocated and nothing was logged to."""
        if self._identity is not None and current_rank() == 0 and self._store is not None:
            store, run_id = self._store, self._identity.run_id
            self._safely(lambda: retry_while_locked(lambda: store.update_run(run_id, status=status, ended_at=time.time()), 5))
            if status == "success" and self._export_csv:
                self._export_if_complete(store, run_id)

    def _export_files(self) -> None:
        """Rank 0: the metrics.csv and hparams.yaml CSVLogger would have written for this run."""
        self._files.makedirs(self.log_dir)
        if self._hparams_logged:
            self._write_hparams()
        if self._live_csv_whole():
            return  # the file written as the run went holds every row of rank 0 (live_csv.py)
        # one implementation of CSVLogger's format: the query side's, reading back what was stored
        # (through this logger's store: no second engine, no second schema check)
        reader = StoreReader(self._open_store(), lock_timeout=self._timeout)
        self._files.export_csv(reader, os.path.join(self.log_dir, self.NAME_METRICS_FILE), run=self.run_id, rank=0)

    def _live_csv_whole(self) -> bool:
        """The live metrics.csv holds every row rank 0 logged (none missed, none left to write)."""
        live = self._live_csv
        return live is not None and live.complete and not self._csv_gaps and live.write_pending()

    def _write_hparams(self) -> None:
        self._files.makedirs(self.log_dir)
        save_hparams_to_yaml(os.path.join(self.log_dir, self.NAME_HPARAMS_FILE), self._hparams)  # through fsspec

    def _tap_csv(self, batch: Any, rank: int) -> None:
        """Writer thread, each drained batch: rank 0's metrics.csv grows as CSVLogger's does."""
        if rank != 0 or not self._export_csv:
            return
        if self._live_csv is None:
            path = self._safely(lambda: os.path.join(self.log_dir, self.NAME_METRICS_FILE), "opening metrics.csv")
            if path is None:
                self._csv_gaps += 1  # the file would miss these rows: the end exports from the store
                return
            self._live_csv = LiveCsv(path)
            if self._attempt:  # a later launch of the run: the file continues the earlier launches'
                reader = StoreReader(self._open_store(), lock_timeout=self._timeout)
                live, run_id = self._live_csv, self.run_id
                if self._safely(lambda: live.continue_from(lambda fp: reader.write_csv(fp, run=run_id, rank=0)),
                                "continuing metrics.csv from the earlier launches") is None:
                    self._csv_gaps += 1  # the end exports the whole history from the store instead
        self._live_csv.add(batch)

    def _flush_now(self) -> None:
        """The experiment's ``save()``: what was logged goes to the store and metrics.csv now."""
        if self._buffer.calls_pending and self._sink is None:
            self._setup_sink()
        self._unsaved = 0  # as CSVLogger's save empties its unsaved rows
        self._writer.flush(self._timeout)

    # -- identity and sink --------------------------------------------------------------------

    def _check_store(self) -> None:
        """Fail at construction, not an hour in, when the store cannot be used; rank 0 allocates.

        Other ranks only check that the file could be written: opening it would create a store
        of their own on a host that does not share rank 0's disk. They open it once the
        transport is "direct" (`_setup_sink`).
        """
        # only a process certain to be rank 0 touches the disk: the first process of node 1
        # would otherwise create a store (and a run) of its own there
        if current_rank() == 0:
            self._open_store()

    def _open_store(self) -> Store:
        if self._store is None:
            self._store = retry_while_locked(lambda: Store(self._url), self._timeout)
        return self._store

    def _resolve(self) -> RunIdentity:
        """This run's identity: allocated here on rank 0, learned from rank 0 elsewhere."""
        with self._lock:
            rank = current_rank()
            if self._identity is None:
                if rank == 0:
                    self._identity = self._open_run()
                else:
                    found = self._board.from_env(self._url_text) or self._board.fetch(rank, repr(self))
                    if found is None:
                        who = f"Rank {rank}" if rank > 0 else "A process that is not certainly rank 0"
                        raise MultiRankLoggerError(
                            f"{who} cannot know the run's version yet: rank 0 allocates it and the "
                            f"process group is not up. Read {type(self).__name__}.version after fit starts, "
                            "or pass version=N."
                        )
                    self._identity = found
            if rank == 0 and not self._published:
                self._published = self._board.publish(self._identity)
            return self._identity

    def _open_run(self) -> RunIdentity:
        """Rank 0: the run this launch writes under, new or continued (run_lifecycle.py)."""
        store = self._open_store()
        run = retry_while_locked(
            lambda: open_run(
                store, self._name, version=self._version_arg, resume=self._resume, run_key=self._run_key,
                world_size=current_world_size(), root_dir=self.root_dir,
            ),
            self._timeout,
        )
        identity = RunIdentity(
            run.id, run.name, run.version, self._url_text, os.getpid(), run.version_name, run.started_at
        )
        log_dir = os.path.join(self.root_dir, identity.dir_name)
        if not run.resumed and os.path.isdir(log_dir) and os.listdir(log_dir):
            rank_zero_warn(
                f"Experiment logs directory {log_dir} exists and is not empty. This new run's files "
                "(metrics.csv, hparams.yaml, checkpoints) will be written there beside the old ones."
            )
        return identity

    def _begin_attempt(self, rank: int, world: int, channel: RowChannel | None) -> None:
        """Number this process's launch of the run (rank 0 records it, the others learn it), so
        that its rows' seq never repeats an earlier launch's: ddp_spawn's fit and test, a resume."""
        if self._attempt is not None:
            return
        assert self._identity is not None
        if rank == 0:
            store, run_id = self._open_store(), self._identity.run_id
            attempt = retry_while_locked(lambda: begin_attempt(store, run_id, world), self._timeout)
            if channel is not None:
                channel.publish("attempt", str(attempt).encode())
        else:
            assert channel is not None, "a rank other than 0 runs with a process group"
            attempt = int(channel.fetch("attempt", self._timeout))
        self._attempt = attempt
        self._buffer.seq_base = self._side.seq_base = seq_base(attempt)

    def _target(self) -> tuple[DirectSink | GatherSender, int, int] | None:
        """For the writer thread: where rows go, once that is known."""
        if self._sink is None and self._buffer.calls_pending == 0:
            return None  # nothing to write: leave the set-up to `experiment`, in the main thread
        sink = self._setup_sink()
        if sink is None:
            return None
        assert self._identity is not None
        return sink, self._identity.run_id, self._rank

    def _setup_sink(self) -> DirectSink | GatherSender | None:
        """Decide the transport and build the sink; None while the process group is not up."""
        with self._lock:
            world = current_world_size()
            if self._sink is not None and self._sink_world == world:
                return self._sink
            if world > 1 and not _dist_up():
                return None  # a launched rank before its process group: rank and peers unknown
            identity = self._resolve()
            rank = current_rank()
            channel = None
            if world > 1:
                # one channel per phase (fit, test...): a finished phase's "done" keys stay behind
                channel = RowChannel(f"{self._board.namespace}-phase{self._phase}", rank, world, timeout=self._timeout)
            transport, why = choose_transport(
                self._transport_arg, backend_for(self._url), world, rank=rank, channel=channel, timeout=self._timeout
            )
            self._begin_attempt(rank, world, channel)
            spiller = self._spiller_for(identity, rank)
            sink: DirectSink | GatherSender
            if transport == "gather" and channel is not None and rank == 0:
                sink = GatherReceiver(self._open_store(), identity.run_id, channel, spiller)
            elif transport == "gather" and channel is not None:
                sink = GatherSender(channel, spiller)
                publish_facts(channel)  # rank 0 records this rank's host and pid at the end
            else:
                store = self._open_store()
                if rank != 0:  # before its first write: is rank 0's run the one this store holds?
                    check_same_run(store, rank, identity.run_id, identity.name, identity.version, identity.started_at)
                sink = DirectSink(store, identity.run_id, spiller)
            self._rank, self._transport, self._sink_world = rank, transport, world
            self._sink = sink
            if self._store is not None:
                try:
                    self._register(identity, rank, world, transport, why)
                except BaseException:
                    self._sink = None  # set up again, registration included, on the next call
                    raise
            if rank == 0 and self._hparams_logged:
                sink.update_run(hparams=_jsonable(self._hparams))
            return sink

    def _spiller_for(self, identity: RunIdentity, rank: int) -> Spiller:
        """This run's spill file on this rank (created on its first row): every phase spills into it."""
        if self._spiller is None or self._spiller.spill.header["run_id"] != identity.run_id:
            spill = SpillWriter(
                self._spill_dir, run_id=identity.run_id, name=identity.name, version=identity.version, rank=rank
            )
            path = backend_for(self._url).path
            shown = os.path.abspath(path) if path is not None else self._db  # for the import command
            self._spiller = Spiller(spill, shown, rank)
            self._unstored_recorded = (0, 0)
        return self._spiller

    def _register(self, identity: RunIdentity, rank: int, world: int, transport: str, why: str) -> None:
        store = self._store
        assert store is not None
        facts = rank_facts()

        def write() -> None:
            with store.writing():  # one connection, one retry unit: every step is idempotent
                store.register_rank(identity.run_id, rank, **facts)
                if transport == "gather":
                    for other in range(1, world):  # they cannot write: rank 0 keeps their rows
                        store.register_rank(identity.run_id, other)
                if rank == 0:
                    store.update_run(identity.run_id, transport=transport, world_size=world)

        try:
            retry_while_locked(write, min(self._timeout, 1.0))
        except StoreLocked:
            # a reader holds the DuckDB file (a notebook): the rows must not wait for it, nor the
            # training; the writer registers the rank with its retries, before its next rows
            assert self._sink is not None
            self._sink.defer(write)
        if rank == 0:
            rank_zero_info(
                f"MultiRankLogger: run {identity.name}/{identity.dir_name} (id {identity.run_id}) in "
                f"{self._db}, {world} rank(s), transport={transport} ({why})"
            )

    def _start(self) -> None:
        """The first log call of a phase (and construction): writer thread up, SIGTERM hook on top."""
        if not self._writer.running:
            self._writer.start()
        # by the first log call Lightning has installed its SIGTERM handler: wrap it, so that a
        # preemption flushes before Lightning's handler runs its broadcast
        process_hooks.outermost_sigterm()
        self._live = True

    def _capture_logs(self, on: bool) -> None:
        if self._capture is not None:
            self._capture.install() if on else self._capture.remove()

    def _safely(self, fn: Callable[[], T], what: str = "finishing the run") -> T | None:
        # finalize must not raise over Lightning's own error (or turn a success into a crash)
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001
            log.error("multirank_logger: %s failed: %s: %s", what, type(exc).__name__, exc)
            return None


# Lightning's Trainer.log_dir asks isinstance(loggers[0], (TensorBoardLogger, CSVLogger)) to
# decide whether the first logger has a per-version log_dir, and falls back to save_dir
# otherwise (so LightningCLI would write config.yaml into save_dir and refuse a 2nd run). Ours
# has CSVLogger's layout: say so to that check, without inheriting CSVLogger's file writing.
CSVLogger.register(MultiRankLogger)


def _dist_up() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _jsonable(value: Any) -> Any:
    """Nested Namespaces and mappings as dicts, so the stored JSON keeps their structure."""
    if isinstance(value, Namespace):
        value = vars(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _end_runs_never_finalized() -> None:
    """At exit after an uncaught exception: a run this process allocated (rank 0) and never
    finalized, because the script failed before or outside Lightning's loops, is recorded as
    failed (interrupted for Ctrl-C) instead of staying "running", and so is the rank's own row
    on every rank that writes the store itself. In gather mode rank 0 writes the other ranks'
    rows: those still running become "missing" (their end never reached rank 0), as `finalize`
    records them. A normal exit leaves all of it."""
    exc = getattr(sys, "last_value", None)  # set when the interpreter printed an uncaught exception
    if exc is None:
        return
    status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
    now = time.time()
    for logger in list(_LIVE):
        store, identity = logger._store, logger._identity
        if logger._finalized or store is None or identity is None:
            continue
        # the process group may be gone by now: the rank the sink was set up with
        rank = logger._rank if logger._sink is not None else current_rank()
        if rank != 0 and (logger._sink is None or logger._sink.transport == "gather"):
            continue  # a sender's row is rank 0's to write, and the store may not be reachable here

        gather = logger._sink is not None and logger._sink.transport == "gather"
        senders = range(1, logger._sink_world) if gather else range(0)

        def end(
            store: Store = store,
            run_id: int = identity.run_id,
            senders: range = senders,
            attempt: int | None = logger._attempt,
            rank: int = rank,
        ) -> None:
            # only what is still running: a ddp_spawn parent never finalizes, its workers did
            with store.writing():
                store.update_rank(run_id, rank, where_status="running", status=status, ended_at=now)
                for other in senders:
                    store.update_rank(run_id, other, where_status="running", status="missing", ended_at=now)
                if rank == 0:
                    store.update_run(run_id, where_status="running", status=status, ended_at=now)
                    if attempt is not None:
                        end_attempt(store, run_id, attempt, status)

        logger._safely(lambda: retry_while_locked(end, 5), "recording the run's end at exit")


# registered at import, before any writer's exit flush: atexit runs last-in first-out, so the
# rows are flushed before the run's status is written
atexit.register(quiet_logging_errors(_end_runs_never_finalized))


def _own_runs_before_fork() -> None:
    """Before a fork (ddp_notebook's launch, once for fit and again for test): a process certain
    to be rank 0, outside any process group, allocates the run of each logger that has none yet.
    The forked ranks inherit it, so every fork launch of this process continues one run (each an
    attempt of its own) instead of its rank 0 allocating a run the parent never learns."""
    if threading.current_thread() is not threading.main_thread() or _dist_up() or current_rank() != 0:
        return
    for logger in list(_LIVE):
        if logger._identity is None and logger._store is not None and not logger._finalized:
            with logger._lock:
                if logger._identity is None:
                    logger._identity = logger._open_run()


process_hooks.before_fork(_own_runs_before_fork)


_FORK_ORPHANS: list[Any] = []  # the parent's engines and threads' state, never touched in a child


def _reset_after_fork() -> None:
    """In a forked child (ddp_notebook): each logger keeps its run but none of the parent's
    runtime. The parent's store connection (a DuckDB instance, a PostgreSQL socket) must not
    be used or even closed here (closing sends a goodbye on the parent's socket, or checkpoints
    the parent's DuckDB file); its locks may be held by threads that do not exist here; its
    buffered rows are the parent's to write. They are kept unreachable, never collected."""
    for logger in list(_LIVE):
        old = (logger._buffer, logger._side, logger._lock, logger._store, logger._sink, logger._writer, logger._spiller)
        _FORK_ORPHANS.append(old)
        logger._init_runtime()
        logger._buffer._next_seq = old[0]._next_seq  # the child never reuses the parent's seq


process_hooks.after_fork_in_child(_reset_after_fork)
