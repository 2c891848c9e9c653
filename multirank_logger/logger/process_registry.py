"""The runs of this process, and what happens to them at exit and around a fork.

Every run (rank_run.RankRun) registers here when its runtime is built (`track`). Three
process-wide hooks, registered at import, act on them through the `ProcessRun` protocol, so
that this module knows what a run does at those moments, never how it is built:

- at exit after an uncaught exception: a run never finalized is recorded as ended
  (`_end_runs_never_finalized`, with what `ProcessRun.unfinished` says is left); at a normal
  exit (a Fabric script or any script that never calls `finalize`), a run this process logged
  to and never finalized is ended as `finalize("success")` would end it (`end_normally_with`
  gives the way, finalize.py's);
- before a fork (ddp_notebook's launch): rank 0 allocates each run that has none yet, so
  every forked launch continues it (`_own_runs_before_fork`); at exit, such a run that no
  launch began (the fork was a DataLoader worker's, a pool's) is removed again
  (`_drop_runs_never_launched`);
- in the forked child: each run keeps its identity, none of the parent's runtime
  (`_reset_after_fork`), which the child never destroys, not even at its teardown. A forked
  child that exits normally leaves the run's end to its parent (its rows are flushed by the
  exit flush): the run is the parent's, and the parent may still be logging.
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

from multirank_logger._util.best_effort import safely
from multirank_logger._util.dist_env import current_rank, dist_if_initialized
from multirank_logger._util.exit_logging import quiet_logging_errors
from multirank_logger._util.fork_keep import keep_forever
from multirank_logger.store.run_lifecycle import drop_if_never_launched
from multirank_logger.store.sql_store import Store, retry_while_locked
from multirank_logger.store.status import end_at_exit, exit_status
from multirank_logger.write import process_hooks

__all__ = ["ProcessRun", "UnfinishedRun", "end_normally_with", "track"]


class UnfinishedRun(NamedTuple):
    """What a run never finalized leaves to record at exit, on a rank that writes the store itself."""

    store: Store
    run_id: int
    #: this rank: its row, and on rank 0 the run's row and this launch's attempt
    rank: int
    #: gather rank 0: the ranks whose rows it writes (recorded "missing": their end never reached it)
    senders: Sequence[int]
    attempt: int | None


class ProcessRun(Protocol):
    """What the hooks ask of each run of this process (rank_run.RankRun)."""

    def unfinished(self) -> UnfinishedRun | None:
        """At exit after an uncaught exception: what is left to record as ended, if anything."""

    def allocate_before_fork(self) -> tuple[Store, int] | None:
        """Rank 0 before a fork: allocate the run if it has none; (store, run id) of a new one."""

    def reset_after_fork(self, keep: Callable[[object], None]) -> None:
        """In a forked child: hand the parent's runtime to `keep`, build this process's own."""

    def logging_unfinished(self) -> bool:
        """At a normal exit: this process logged to the run since its last `finalize` (a phase
        it began and never ended), and it is not a forked child of the run's process."""


_LIVE: weakref.WeakSet[ProcessRun] = weakref.WeakSet()
_FORK_ORPHANS: list[Any] = []  # the parent's engines and threads' state, never touched in a child
#: how a run is ended at a normal exit (finalize.finish_run, given by `end_normally_with`)
_END_NORMALLY: list[Callable[[Any, str], None]] = []
# (pid, store, run id) of each new run allocated ahead of a fork
_ALLOCATED_FOR_A_FORK: list[tuple[int, Store, int]] = []


def track(run: ProcessRun) -> None:
    """A run's runtime was built in this process: end it at exit, carry it over a fork."""
    _LIVE.add(run)


def end_normally_with(finish: Callable[[Any, str], None]) -> None:
    """How a run this process never finalized is ended at a normal exit (finalize.finish_run):
    given from above, since the end of a run sits above the run."""
    _END_NORMALLY[:] = [finish]


def _end_runs_never_finalized() -> None:
    """At exit after an uncaught exception: a run this process allocated (rank 0) and never
    finalized, because the script failed before or outside Lightning's loops, is recorded as
    failed (interrupted for Ctrl-C) instead of staying "running", and so is the rank's own row
    on every rank that writes the store itself. In gather mode rank 0 writes the other ranks'
    rows: those still running become "missing" (their end never reached rank 0), as `finalize`
    records them.

    At a normal exit (Fabric, or any script that never calls `finalize`): each run this process
    logged to since its last `finalize` ends as `finalize("success")` ends it, with its bounded
    waits (a sender delivers its last rows and its end, rank 0 waits for the others' ends), so
    the run is not left "running" forever; it is `incomplete` when values or ranks' ends are
    missing, as ever."""
    exc = getattr(sys, "last_value", None)  # set when the interpreter printed an uncaught exception
    if exc is None:
        for run in list(_LIVE):
            if _END_NORMALLY and run.logging_unfinished():
                finish = _END_NORMALLY[0]
                safely(lambda: finish(run, "success"), "ending the run at exit (finalize was never called)")  # noqa: B023
        return
    status = exit_status(exc)
    now = time.time()
    for run in list(_LIVE):
        unfinished = run.unfinished()
        if unfinished is not None:
            _end_at_exit(unfinished, status, now)


def _end_at_exit(run: UnfinishedRun, status: str, now: float) -> None:
    def end() -> None:
        end_at_exit(
            run.store, run.run_id, rank=run.rank, senders=run.senders, status=status, now=now, attempt=run.attempt
        )

    safely(lambda: retry_while_locked(end, 5), "recording the run's end at exit")


# registered at import, before any writer's exit flush: atexit runs last-in first-out, so the
# rows are flushed before the run's status is written
atexit.register(quiet_logging_errors(_end_runs_never_finalized))


def _own_runs_before_fork() -> None:
    """Before a fork (ddp_notebook's launch, once for fit and again for test): a process certain
    to be rank 0, outside any process group, allocates the run of each logger that has none yet.
    The forked ranks inherit it, so every fork launch of this process continues one run (each an
    attempt of its own) instead of its rank 0 allocating a run the parent never learns."""
    if threading.current_thread() is not threading.main_thread() or dist_if_initialized() is not None or current_rank() != 0:
        return
    for run in list(_LIVE):
        allocated = run.allocate_before_fork()
        if allocated is not None:
            _ALLOCATED_FOR_A_FORK.append((os.getpid(), *allocated))


process_hooks.before_fork(_own_runs_before_fork)


def _drop_runs_never_launched() -> None:
    """At exit: Lightning calls nothing on the logger before its ddp_notebook fork, so every fork
    of rank 0's main thread allocates the runs that have none, DataLoader workers' and
    multiprocessing pools' too. A run no launch began by now was one of those: removed, as a
    logger built and never used leaves no run."""
    for pid, store, run_id in _ALLOCATED_FOR_A_FORK:
        if pid == os.getpid():  # never in a forked child: the run is its parent's
            drop = functools.partial(drop_if_never_launched, store, run_id)
            safely(lambda: retry_while_locked(drop, 5), "removing a run allocated for a fork that no launch used")  # noqa: B023


atexit.register(quiet_logging_errors(_drop_runs_never_launched))


def _reset_after_fork() -> None:
    """In a forked child (ddp_notebook): each run keeps its identity but none of the parent's
    runtime. The parent's store connection (a DuckDB instance, a PostgreSQL socket) must not
    be used or even closed here (closing sends a goodbye on the parent's socket, or checkpoints
    the parent's DuckDB file); its locks may be held by threads that do not exist here; its
    buffered rows are the parent's to write. They are kept unreachable, never collected."""
    for run in list(_LIVE):
        run.reset_after_fork(_FORK_ORPHANS.append)
    # cleared with the module at the child's teardown, the list would destroy the parent's engines
    # there (a DuckDB database joins threads the child does not have: it hung or aborted)
    keep_forever(_FORK_ORPHANS)


process_hooks.after_fork_in_child(_reset_after_fork)
