"""MultiRankLogger's every behaviour, without Lightning's ``Logger`` base: naming, versioning, rank.

`MultiRankLoggerCore` is what the plain API (integrations/plain.py: torchrun scripts, Accelerate,
Transformers) builds, so that such a script never imports Lightning (seconds of CPU on every
rank's start); `MultiRankLogger` (multi_rank_logger.py) is this class and Lightning's ``Logger``,
with what only Lightning calls (``log_graph``) and Lightning's do-nothing experiment.

The hot path (`log_metrics`, `save`) only appends to this rank's `RecordBuffer` and may
wake the `BackgroundWriter` (write/logged_rows.py); the writer thread moves rows into the sink
that write/sink_holder.py sets up. This process's part in the run (who the run is, which
attempt, and the runtime behind it) is a `RankRun` (rank_run.py), built from the checked
arguments (run_settings.py), which also carries the run through pickling (ddp_spawn) and fork.
Its end is finalize.py, rank 0's CSVLogger files csv_logger_files.py, what user code gets as
``logger.experiment`` experiment.py, the process-wide hooks process_registry.py and process_hooks.py.
"""

from __future__ import annotations

import math
import os
import time
import weakref
from argparse import Namespace
from collections.abc import Callable, Mapping
from typing import Any

from multirank_logger._util.best_effort import safely
from multirank_logger._util.dist_env import current_rank
from multirank_logger._util.torch_version import require_store_queues
from multirank_logger.ddp.log_capture import capture_level
from multirank_logger.errors import InvalidTransport
from multirank_logger.logger.csv_logger_files import NAME_HPARAMS_FILE, NAME_METRICS_FILE
from multirank_logger.logger.experiment import NoExperiment, RunExperiment
from multirank_logger.logger.finalize import finish_run
from multirank_logger.logger.rank_run import RankRun
from multirank_logger.logger.run_settings import ALERT_URL_ENV, DB_ENV, RunSettings, from_environment
from multirank_logger.logger.save_dir import DEFAULT_DB_NAME, check_store_is_local
from multirank_logger.store.backends import backend_for, public_name, resolve_url
from multirank_logger.store.run_lifecycle import check_run_choice
from multirank_logger.watch.alerts import Alert, check_alert_url
from multirank_logger.write.transport_choice import TRANSPORTS

__all__ = ["MultiRankLoggerCore"]


class MultiRankLoggerCore:
    """Every rank's own metrics into one SQL store: `MultiRankLogger` less Lightning's ``Logger``.

    Its arguments, properties and methods are `MultiRankLogger`'s (documented there); the plain
    API (``multirank_logger.init``) builds one. Under a Lightning Trainer or Fabric, use
    `MultiRankLogger`.
    """

    LOGGER_JOIN_CHAR = "-"
    NAME_METRICS_FILE = NAME_METRICS_FILE
    NAME_HPARAMS_FILE = NAME_HPARAMS_FILE

    def __init__(
        self,
        save_dir: str | os.PathLike[str] | None = None,
        name: str | None = "lightning_logs",
        version: int | str | None = None,
        prefix: str = "",
        flush_logs_every_n_steps: int = 100,
        *,
        db: str | os.PathLike[str] | None = None,
        flush_interval: float = 5.0,
        transport: str = "auto",
        max_writers: int | None = None,
        export_csv: bool = True,
        timeout: float = 60.0,
        spill_dir: str | os.PathLike[str] | None = None,
        capture_logs: bool | int | str | None = "INFO",
        resume: str = "allow",
        run_key: str | None = None,
        finalize_timeout: float | None = None,
        start_timeout: float | None = None,
        watch: bool = True,
        on_alert: Callable[[Alert], Any] | None = None,
        alert_url: str | None = None,
        mesh: Any = None,
    ) -> None:
        super().__init__()
        if mesh is not None:  # each rank's coordinates in it go in its ranks row (schema 0013)
            from multirank_logger.channel.rank_facts import use_mesh

            use_mesh(mesh)
        require_store_queues()  # a clear error now, not an AttributeError in the writer thread
        if transport not in TRANSPORTS:
            raise InvalidTransport(transport, TRANSPORTS)
        check_run_choice(version, resume, run_key)
        if not isinstance(watch, bool):
            raise TypeError(f"watch={watch!r}: pass True (the default) or False.")
        if on_alert is not None and not callable(on_alert):
            raise TypeError(f"on_alert={on_alert!r}: pass a callable taking one Alert, or None.")
        # secrets may come from the environment, never part of the arguments LightningCLI saves
        db, alert_url = from_environment(db, DB_ENV), from_environment(alert_url, ALERT_URL_ENV)
        check_alert_url(alert_url)
        whole = isinstance(max_writers, int) and not isinstance(max_writers, bool)  # True is an int to Python
        if max_writers is not None and not (whole and max_writers >= 1):
            raise ValueError(f"max_writers={max_writers!r}: pass a whole number of processes, 1 or more (or None).")
        waits = [("flush_interval", flush_interval), ("timeout", timeout)]
        waits += [(name, s) for name, s in (("finalize_timeout", finalize_timeout), ("start_timeout", start_timeout))
                  if s is not None]
        for argument, seconds in waits:
            _check_seconds(argument, seconds)
        if db is None:
            if save_dir is None:
                raise TypeError("MultiRankLogger needs save_dir (as CSVLogger does), or db=, or both")
            db = os.path.join(check_store_is_local(None, save_dir), DEFAULT_DB_NAME)
        db = check_store_is_local(os.fspath(db))
        url = resolve_url(db)
        path = backend_for(url).path
        default_dir = str(path.parent) if path is not None else os.getcwd()
        self._prefix = prefix
        self._flush_every = max(1, int(flush_logs_every_n_steps))
        shown = public_name(db)  # the password stays in `url`, in this process
        settings = RunSettings(
            db=shown,
            url=url,
            name=name or "",
            version=version,
            resume=resume,
            run_key=run_key,
            save_dir=os.fspath(save_dir) if save_dir is not None else default_dir,
            spill_dir=os.fspath(spill_dir) if spill_dir is not None else default_dir,
            transport=transport,
            max_writers=max_writers,
            export_csv=export_csv,
            timeout=float(timeout),
            flush_interval=float(flush_interval),
            flush_every=self._flush_every,
            capture_level=capture_level(capture_logs),
            owner=f"MultiRankLogger(db={shown!r}, name={name or ''!r}, version={version!r})",
            version_advice=self._version_advice,
            finalize_timeout=float(finalize_timeout) if finalize_timeout is not None else None,
            start_timeout=float(start_timeout) if start_timeout is not None else None,
            watch=watch,
            on_alert=on_alert,
            alert_url=alert_url,
        )
        #: this process's part in the run: store, identity, its hot path and sink (pickled with
        #: its run for ddp_spawn; its engines, threads and sockets are rebuilt in each process)
        self._run = RankRun(settings)
        self._run.capture_logs(True)
        # no thread yet: the first log call (or `experiment`) starts the writer, so a logger
        # built and never used leaves nothing running
        weakref.finalize(self, _dropped, self._run)
        self._built()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        weakref.finalize(self, _dropped, self._run)  # this copy's own (ddp_spawn's workers, deepcopy)

    def __repr__(self) -> str:
        return self._run.settings.owner

    # -- CSVLogger's properties ---------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._run.settings.name

    @property
    def version(self) -> int | str:
        """The run's version: agreed by every rank, allocated by rank 0 in the store."""
        return self._run.version

    @property
    def save_dir(self) -> str:
        return self._run.settings.save_dir

    @property
    def root_dir(self) -> str:
        return self._run.settings.root_dir

    @property
    def log_dir(self) -> str:
        return self._run.log_dir

    @property
    def run_id(self) -> int:
        """The run's id in the store's ``runs`` table."""
        return self._run.resolve().id

    @property
    def transport(self) -> str | None:
        """``"direct"``, ``"gather"`` or ``"node"`` once decided (when the process group is up), else None."""
        return self._run.sink_holder.transport

    @property
    def experiment(self) -> Any:
        """CSVLogger's experiment for user code: on rank 0 a `RunExperiment` (``log_metrics``,
        ``log_hparams``, ``save``, ``metrics_file_path``), elsewhere a do-nothing one.

        Lightning reads this on every rank once the process group is up: the moment each rank
        learns the run and sets up its sink. Bounded waits, no collective.
        """
        run = self._run
        run.sink_holder.setup()
        if not run.logged.writer.running:
            run.logged.writer.start()
        run.capture_logs(True)  # again for a later phase (fit, then test), and in ddp_spawn workers
        run.start_watch()
        return RunExperiment(run) if current_rank() == 0 else self._idle_experiment()

    # -- the hot path ------------------------------------------------------------------------

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        # Runs every logging step on every rank: no SQL, no collective, no lock; I/O only on rank 0
        # every flush_logs_every_n_steps calls, where CSVLogger's saves (the Trainer saves every step)
        if self._prefix:
            metrics = {f"{self._prefix}{self.LOGGER_JOIN_CHAR}{key}": value for key, value in metrics.items()}
        if self._run.logged.record_call(metrics, step):
            self.save()

    def record(self, table: str, **values: Any) -> None:
        """Keep one row for a side table (``decisions``, ``logs``, ``step_timing``: see schema.py)
        from this rank; the writer stores it with the metrics. Appends to memory only.

        Raises:
            KeyError: for a table or column the schema does not have.
            ValueError: for a row without a value the table needs.
            TypeError: for a value its column cannot store (a str for a boolean, a tensor: ``.item()``).
        """
        self._run.logged.record_side(table, values)

    def save(self) -> None:
        """Rank 0's metrics.csv holds every call logged so far, as after CSVLogger's ``save()``.

        Lightning calls this after every log_metrics: on rank 0 the new lines formatted and
        appended to the open file in one write, elsewhere a counter check (benchmarks/RESULTS.md).
        """
        run = self._run
        logged, sink_holder = run.logged, run.sink_holder
        logged.unsaved = 0
        if run.files.calls:
            rank = sink_holder.rank if sink_holder.sink is not None else current_rank()
            if sink_holder.sink is None and rank == 0 and not logged.save_set_up:
                # once, on rank 0: the run and this launch first (a resumed run's file continues the
                # earlier launches'); a set-up that fails is the writer thread's to retry, not each step's
                logged.save_set_up = True
                safely(sink_holder.setup, "setting up the run for metrics.csv")
            if sink_holder.sink is not None or rank != 0:  # else the writer's cycles write the file once it is set up
                run.files.write_live(rank)
            if sink_holder.sink is not None and rank != 0:
                logged.buffer.csv_calls = None  # this process is not rank 0: its calls need no CSV queue
        logged.writer.maybe_wake()
        if run.watch is None and sink_holder.sink is not None and sink_holder.rank == 0:
            run.start_watch()

    def flush(self, timeout: float = 30.0) -> bool:
        """Store every row this rank logged so far, before returning: into the store, or shipped to
        the rank that writes it (rank 0 of a gather run, a node's writer); rank 0's metrics.csv too.

        Unlike `save`, which Lightning calls every step and which only wakes the writer, this waits:
        call it before reading the store from the same script, or before a step you want on disk.
        A store that refuses the rows meanwhile (a reader holding a DuckDB file, a locked SQLite
        file, a server restarting) is retried until `timeout`; the rows are never dropped: what is
        not stored by then stays in memory for the writer's next cycles (and ``finalize``).

        Args:
            timeout: the longest wait, in seconds, for the store (or the channel) to take the rows.

        Returns:
            True when every row logged so far is stored (or shipped); False when some still wait
            (the store refused them until `timeout`, or this rank's run is not known yet: a rank
            other than 0 before its process group is up).

        Example::

            logger.log_metrics({"loss": 0.25}, step=10)
            if logger.flush(timeout=10):
                ...  # step 10 is in the store

        Raises:
            ValueError: for a `timeout` that is not a number of seconds greater than 0 and finite
                (a wait with no end is not a flush).
        """
        _check_seconds("timeout", timeout)
        return self._run.logged.flush(timeout)

    @property
    def watching(self) -> bool:
        """Whether rank 0's watch judges the run and raises alerts (``watch=True``, the default)."""
        return self._run.settings.watch

    @property
    def alerts(self) -> list[Alert]:
        """The alerts rank 0's watch raised so far in this run (every phase), oldest first; empty
        on the other ranks (``StopOnAlert`` reads it)."""
        earlier = list(self._run.alerts_raised)
        return earlier + (list(self._run.watch.alerts) if self._run.watch is not None else [])

    def stopped_by_alert(self, alert: Alert, step: int) -> None:
        """Rank 0: `StopOnAlert` ends the fit at `step` for `alert`: said and recorded as an alert of kind ``stop``."""
        watch = self._run.watch
        if watch is None:
            return
        message = f"step {step:,}: StopOnAlert ends the fit on every rank (for: {alert.message})"
        # on the watch's thread, after the alerts before it: on_alert and the webhook never run on this one
        watch.deliver_soon(Alert("stop", alert.rank, alert.key, alert.first_step, step, time.time(), None, message,
                                 {"alert_kind": alert.kind, "stopped_at": step}))

    def log_hyperparams(self, params: dict[str, Any] | Namespace | None = None, *args: Any, **kwargs: Any) -> None:
        """Keep the hyperparameters and store them with the run; rank 0 writes hparams.yaml now,
        as CSVLogger does."""
        self._run.log_hparams(vars(params) if isinstance(params, Namespace) else params or {})

    # -- the end ---------------------------------------------------------------------------

    def finalize(self, status: str) -> None:
        """Flush everything, record how the run ended, and (rank 0, success) write the CSV files.

        Never a collective and never an unbounded wait: with ``"failed"`` a peer may be dead.
        """
        finish_run(self._run, status)

    # -- what a front-end adds -------------------------------------------------------------------

    #: what ``experiment`` gives on ranks other than 0 (MultiRankLogger: Lightning's own do-nothing one)
    _idle_experiment: Callable[[], Any] = NoExperiment
    #: the advice where a rank > 0 asks for the version before it can learn it (rank_run.py)
    _version_advice = ("Start every rank under a launcher that gives it MASTER_ADDR and MASTER_PORT (torchrun, "
                       "or srun with them exported)")

    def _built(self) -> None:
        """Called once construction is done (MultiRankLogger: say it is Lightning's Logger to every
        Lightning package imported by then)."""


def _check_seconds(argument: str, seconds: object) -> None:
    """A wait given in seconds: a number greater than 0 and finite, else one error saying what to pass
    (True is an int to Python, and no number of seconds)."""
    if isinstance(seconds, bool) or not (isinstance(seconds, (int, float)) and 0 < seconds < math.inf):
        raise ValueError(f"{argument}={seconds!r}: pass a number of seconds greater than 0 (and finite).")


def _dropped(run: RankRun) -> None:
    """The logger was collected (never finalized, or finalized and dropped): leave no environment
    variable and no thread behind. Its writer thread (which keeps the run alive, not the logger)
    writes what is left, then ends; so does rank 0's watch. Returns at once: the collector may run
    in any thread."""
    run.board.withdraw()
    run.logged.writer.finish_soon()
    if run.watch is not None:
        run.watch.stop_soon()
