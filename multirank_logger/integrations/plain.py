"""The plain API, for any torch.distributed script: ``run = multirank_logger.init(db=..., name=...)``,
``run.log(metrics, step=...)``, ``run.finish()``.

No Trainer: the script calls what Lightning would call. `init` builds a `MultiRankLoggerCore`
(`MultiRankLogger` less Lightning's ``Logger`` base, so the script never imports Lightning: the
same arguments, the same checks) and `Run` calls its public methods: ``log`` is its
``log_metrics`` and ``save`` (as the Trainer calls them after each logging step), ``finish`` its
``finalize``. So a plain script gets the Lightning path's transports (direct, gather over the
launch's TCPStore, node), its watch on rank 0 (alerts), its spill files and the same end at
every exit:

- ``finish()`` or the end of a ``with`` block: ``finalize`` with the status (an exception in the
  block: ``failed``, Ctrl-C: ``interrupted``), on every rank, as Lightning calls it;
- an exit without either (an uncaught exception, or a script that never calls ``finish``): the
  run is finalized at exit, ``failed`` when the interpreter printed an uncaught exception (or,
  in a worker of ``torch.multiprocessing.spawn``, when torch caught one: `_spawned_function_raised`),
  else ``success``. Registered after the logger's own exit hooks, so it runs before them (atexit is
  last in, first out): the rows are flushed and the end recorded as ``finalize`` records it;
  the logger's hooks (process_registry.py) then find the run finalized. A process killed
  (SIGKILL) or ended by ``os._exit`` runs no hook: its run is ended as the logger ends such a
  run (the next launch finds it ``vanished``, rank 0 records a silent rank ``missing``);
- SIGTERM (torchrun stops the other ranks when one fails, a scheduler preempts): where the
  process had Python's default for it, `init` puts a handler that raises ``SystemExit(143)`` in
  the main thread (once the logger's own handler flushed the writers, process_hooks.py), so the
  ``with`` block or the exit finishes the run (``interrupted``) instead of dying with it
  ``running``; one that comes while a run is finishing waits for that end, then exits.

The process group: the sink is set up (the transport chosen with the other ranks, this rank
registered, rank 0's watch started) once the group is up, by `init` when it is already, else at
the first ``log`` after it came up; the same bounded waits as ``logger.experiment`` under
Lightning. Rank, world size, local and node rank are the group's, else the launcher's variables
(_util/dist_env.py's `launch_place`).
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from types import FrameType, TracebackType
from typing import Any

from multirank_logger._util.best_effort import safely
from multirank_logger._util.dist_env import current_world_size, dist_if_initialized, launch_place
from multirank_logger._util.exit_logging import quiet_logging_errors
from multirank_logger.errors import ProcessGroupFirst, RunFinished
from multirank_logger.logger.core import MultiRankLoggerCore
from multirank_logger.store.status import FAILED, INTERRUPTED, SUCCESS, exit_status
from multirank_logger.watch.alerts import Alert

__all__ = ["Run", "init"]

#: the statuses `Run.finish` takes (the store settles `incomplete` itself: a rank or values missing)
FINISH_STATUSES = (SUCCESS, FAILED, INTERRUPTED)
#: this process received SIGTERM (through `_on_sigterm`)
_TERMINATED = threading.Event()
#: runs finishing right now: a SIGTERM then waits for their end (`_on_sigterm`)
_ENDING = [0]
#: a SIGTERM came while a run was finishing: the process exits once it has
_DEFERRED = threading.Event()
#: guards each run's `_finished` and `_ENDING` (finish from the main thread, or from the exit)
_END_LOCK = threading.Lock()
#: the exit status of a process SIGTERM ended (as a shell reports it)
SIGTERM_EXIT = 128 + int(signal.SIGTERM)


def init(
    db: str | os.PathLike[str] | None = None,
    name: str | None = None,
    *,
    config: Mapping[str, Any] | None = None,
    version: int | str | None = None,
    run_key: str | None = None,
    save_dir: str | os.PathLike[str] | None = None,
    transport: str = "auto",
    watch: bool = True,
    on_alert: Callable[[Alert], Any] | None = None,
    alert_url: str | None = None,
    export_csv: bool = False,
    **options: Any,
) -> Run:
    """Open the run every rank of this launch logs to; call it on every rank, once.

    Rank 0 allocates the run in the store; the other ranks learn it from rank 0 (over the
    launch's TCPStore), as under Lightning: one run for all ranks.

    Args:
        db: the store (a ``.sqlite``, ``.duckdb`` path or a SQLAlchemy URL, as `MultiRankLogger`
            takes); defaults to ``runs.sqlite`` in `save_dir`, or in the working directory.
        name: the run's name (runs of one name are numbered: ``name/version_N``); defaults to the
            script's file name without ``.py`` (``"run"`` when there is none).
        config: hyperparameters, stored with the run (``runs.hparams``).
        version, run_key: continue a run (a requeued job: ``run_key=os.environ["SLURM_JOB_ID"]``),
            as `MultiRankLogger` does (docs/resume.md).
        save_dir: where ``name/version_N`` lives (rank 0's ``metrics.csv`` with `export_csv`).
        transport: ``"auto"``, ``"direct"``, ``"gather"`` or ``"node"`` (docs/scale.md).
        watch, on_alert, alert_url: rank 0's watch and where its alerts go (docs/report.md).
        export_csv: rank 0 also writes CSVLogger's ``metrics.csv`` and ``hparams.yaml`` under
            `save_dir` (off by default here: a plain script has no CSVLogger to stand in for).
        options: any other keyword of `MultiRankLogger` (``flush_interval``, ``timeout``,
            ``capture_logs``, ``spill_dir``, ``prefix``...).

    Raises:
        ProcessGroupFirst: under Slurm with several tasks, before the process group is up and
            without ``WORLD_SIZE`` (the rank is not known yet).
        StoreError: when the store cannot be written (as `MultiRankLogger`).
    """
    place = launch_place()
    if dist_if_initialized() is None and place.world_size > 1 and not os.environ.get("WORLD_SIZE", "").strip():
        raise ProcessGroupFirst(place.world_size)
    if db is None and save_dir is None:
        save_dir = os.getcwd()
    logger = MultiRankLoggerCore(
        save_dir, name=name if name is not None else _script_name(), version=version, db=db, run_key=run_key,
        transport=transport, watch=watch, on_alert=on_alert, alert_url=alert_url, export_csv=export_csv, **options,
    )
    _exit_on_sigterm()
    return Run(logger, config)


class Run:
    """One rank's handle on the run `init` opened: ``log``, ``finish``, and a ``with`` block.

    Args:
        logger: the `MultiRankLoggerCore` behind it (``run.logger``: its ``record`` and the rest).
        config: hyperparameters to store with the run.
    """

    def __init__(self, logger: MultiRankLoggerCore, config: Mapping[str, Any] | None = None) -> None:
        self.logger = logger
        self._step = -1  # the last step logged: a call without step= logs the next one
        self._ready = False  # the sink is set up (the process group was up, or one rank)
        self._finished = False
        self._exit_hook = quiet_logging_errors(self._at_exit)
        atexit.register(self._exit_hook)  # after the logger's own hooks: runs before them
        if config:
            self.log_config(config)
        self._set_up_when_the_group_is_up()

    def __repr__(self) -> str:
        return f"Run({self.logger!r})"

    # -- who and where ----------------------------------------------------------------------

    @property
    def id(self) -> int:
        """The run's id in the store's ``runs`` table (the same on every rank)."""
        return self.logger.run_id

    @property
    def name(self) -> str:
        return self.logger.name

    @property
    def version(self) -> int | str:
        """The run's version among the runs of its name (``name/version_N``), agreed by every rank."""
        return self.logger.version

    @property
    def rank(self) -> int:
        """This process's global rank: the process group's, else the launcher's (RANK, SLURM_PROCID)."""
        return launch_place().rank

    @property
    def world_size(self) -> int:
        return launch_place().world_size

    @property
    def local_rank(self) -> int:
        """The rank among this node's processes (LOCAL_RANK, SLURM_LOCALID; else the global rank)."""
        return launch_place().local_rank

    @property
    def node_rank(self) -> int:
        """The node's rank (GROUP_RANK, NODE_RANK, SLURM_NODEID; else 0)."""
        return launch_place().node_rank

    @property
    def transport(self) -> str | None:
        """``"direct"``, ``"gather"`` or ``"node"`` once the sink is set up, else None."""
        return self.logger.transport

    @property
    def alerts(self) -> list[Alert]:
        """The alerts rank 0's watch raised so far, oldest first; empty on the other ranks."""
        return self.logger.alerts

    @property
    def finished(self) -> bool:
        return self._finished

    # -- logging ----------------------------------------------------------------------------

    def log(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """This rank's own values at `step` (default: the step after the last one logged).

        Appends to memory only (no I/O, no collective): the writer thread stores them. A value
        may be a number, a bool or a one-element tensor.

        Raises:
            InvalidMetric: for a value, key or step the store cannot hold (nothing of the call kept).
            RunFinished: after `finish`.
        """
        if self._finished:
            raise RunFinished("run.log")
        if step is None:
            step = self._step + 1
        if not self._ready:
            self._set_up_when_the_group_is_up()
        self.logger.log_metrics(metrics, step)
        self._step = step
        self.logger.save()  # as the Trainer does after each logging step: rank 0's watch, metrics.csv

    def log_config(self, config: Mapping[str, Any]) -> None:
        """Hyperparameters, stored with the run (``runs.hparams``; ``hparams.yaml`` with export_csv)."""
        if self._finished:
            raise RunFinished("run.log_config")
        self.logger.log_hyperparams(dict(config))

    def record(self, table: str, **values: Any) -> None:
        """One row of a side table (``decisions``, ``logs``, ``step_timing``), as `MultiRankLogger.record`."""
        if self._finished:
            raise RunFinished("run.record")
        self.logger.record(table, **values)

    def flush(self, timeout: float = 30.0) -> bool:
        """Store every row this rank logged so far before returning, as `MultiRankLogger.flush`:
        True when all of it is stored (or shipped to the rank that writes it), False when the store
        still refused some at `timeout` (they stay in memory, retried; never dropped).

        Raises:
            RunFinished: after `finish` (its end flushed everything already).
        """
        if self._finished:
            raise RunFinished("run.flush")
        return self.logger.flush(timeout)

    # -- the end ----------------------------------------------------------------------------

    def finish(self, status: str = SUCCESS) -> None:
        """End this rank's part: its last rows stored (or spilled), its end recorded; on rank 0
        the other ranks' ends awaited (bounded) and the run's status settled. Once; a second call
        does nothing. Never a collective: a rank may finish while another has died.

        Args:
            status: ``"success"``, ``"failed"`` or ``"interrupted"``. The run is ``success`` only
                when every rank ended so and nothing is missing (else ``incomplete``).
        """
        if status not in FINISH_STATUSES:
            raise ValueError(f"status={status!r}: pass one of {', '.join(map(repr, FINISH_STATUSES))}.")
        if self._end(status):
            atexit.unregister(self._exit_hook)
            if _DEFERRED.is_set() and _ENDING[0] == 0:
                _DEFERRED.clear()
                raise SystemExit(SIGTERM_EXIT)  # a SIGTERM waited for this end

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.finish(_status_of(exc))

    def _end(self, status: str) -> bool:
        with _END_LOCK:
            if self._finished:
                return False
            self._finished = True
            _ENDING[0] += 1
        try:
            self.logger.finalize(status)
        finally:
            with _END_LOCK:
                _ENDING[0] -= 1
        return True

    def _at_exit(self) -> None:
        """The interpreter exits and the run was not finished: failed after an uncaught exception
        (Ctrl-C: interrupted), else success."""
        exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
        if _TERMINATED.is_set():
            status = INTERRUPTED
        elif exc is not None:
            status = exit_status(exc)
        else:
            status = FAILED if _spawned_function_raised() else SUCCESS
        safely(lambda: self._end(status), "finishing the run at exit (run.finish() was never called)")

    def _set_up_when_the_group_is_up(self) -> None:
        """Once the process group is up (or with one rank): the sink set up, as ``logger.experiment``
        does under Lightning (every rank registered, rank 0's watch started; bounded waits)."""
        if current_world_size() > 1 and dist_if_initialized() is None:
            return  # the first log after the group is up does it (until then the writer thread waits)
        _ = self.logger.experiment
        self._ready = True


def _spawned_function_raised() -> bool:
    """In a worker of ``torch.multiprocessing.spawn``: whether the function raised. torch's wrapper
    (``_wrap(fn, i, args, error_file)``) catches the exception, pickles its traceback into the error
    file and calls ``sys.exit(1)``, so the exit sees no uncaught exception and atexit no exit code;
    the error file, which the parent removed before starting the worker, exists only then. Any
    other process, or a torch whose wrapper changed (tests/runs/test_plain_api.py would say): False."""
    process = multiprocessing.current_process()
    target, args = getattr(process, "_target", None), getattr(process, "_args", ())
    if getattr(target, "__module__", None) != "torch.multiprocessing.spawn" or getattr(target, "__name__", None) != "_wrap":
        return False
    error_file = args[3] if isinstance(args, tuple) and len(args) == 4 else None
    return isinstance(error_file, str) and os.path.isfile(error_file) and os.path.getsize(error_file) > 0


def _exit_on_sigterm() -> None:
    """Where SIGTERM still has Python's default (the process dies, its run left ``running``): a
    handler that ends the script through ``SystemExit``, so that its runs finish. The main thread
    only; a handler the script or a framework put there is left alone."""
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):  # embedded interpreters, restricted environments
        pass


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """SIGTERM: ``SystemExit(143)`` in the main thread, once; while a run is finishing, nothing
    now (its end must not be cut short): `Run.finish` exits after it."""
    first = not _TERMINATED.is_set()
    _TERMINATED.set()
    if not first:
        return
    if _ENDING[0]:
        _DEFERRED.set()
        return
    raise SystemExit(SIGTERM_EXIT)


def _status_of(exc: BaseException | None) -> str:
    """How a ``with`` block ended, as a run's status."""
    if _TERMINATED.is_set():
        return INTERRUPTED
    if exc is None or (isinstance(exc, SystemExit) and exc.code in (0, None)):
        return SUCCESS
    return INTERRUPTED if isinstance(exc, KeyboardInterrupt) else FAILED


def _script_name() -> str:
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return script[: -len(".py")] if script.endswith(".py") and len(script) > len(".py") else "run"
