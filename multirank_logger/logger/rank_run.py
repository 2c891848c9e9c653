"""RankRun: this process's part in one run, behind the Lightning front-end (multi_rank_logger.py).

Who the run is and which attempt: it opens the store (rank 0 at construction, the others once
their transport is direct), learns the run's identity (allocated by rank 0,
store/run_lifecycle.py; shared through channel/identity.py), numbers this launch's attempt,
and keeps the hyperparameters. The rest of a rank's part it builds and holds: how its rows
leave (write/sink_holder.py: transport, sink, spiller, registration), the hot path and its
writer thread (write/logged_rows.py), rank 0's CSVLogger files, the log capture.

What it holds lives in two parts. The run (settings, identity, hyperparameters) survives
pickling into ddp_spawn's workers and a fork (ddp_notebook). The runtime (the hot path, the
sink set-up, store engine, lock, rank 0's files) belongs to one process: `init_runtime`
builds it, again after unpickling and in a forked child.

Imports point one way, down from here. Below: rank 0's CSVLogger files (csv_logger_files.py,
which reads the run through its `RunForFiles` protocol), the sink set-up (through
`RunForSink`) and the process-wide registry (process_registry.py, which at exit and around a
fork calls this run's methods for those moments, through its `ProcessRun` protocol). Above:
the logger, its `experiment` (experiment.py) and the run's end (finalize.py), which take a RankRun.
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from collections.abc import Callable
from itertools import count
from typing import Any

from multirank_logger._util.best_effort import safely
from multirank_logger._util.dist_env import current_rank, current_world_size
from multirank_logger._util.rank_zero import rank_zero_warn
from multirank_logger.channel.identity import IdentityBoard, RunIdentity, withdraw_identity
from multirank_logger.channel.row_channel import RowChannel
from multirank_logger.ddp.log_capture import LogCapture
from multirank_logger.errors import MultiRankLoggerError
from multirank_logger.logger.csv_logger_files import Rank0Files
from multirank_logger.logger.launch_env import hook_launchers
from multirank_logger.logger.process_registry import UnfinishedRun, track
from multirank_logger.logger.run_settings import RunSettings, jsonable
from multirank_logger.logger.save_dir import SaveDir, check_dir_writable
from multirank_logger.rows.run_ref import RunRef
from multirank_logger.store.backends import backend_for, without_secrets
from multirank_logger.store.run_lifecycle import begin_attempt, open_run, seq_base
from multirank_logger.store.spill_import import import_earlier_launches
from multirank_logger.store.sql_store import Store, retry_while_locked
from multirank_logger.store.write_errors import describe
from multirank_logger.watch.alerts import Alert, AlertOutlets, run_facts
from multirank_logger.watch.watch import Watch, watch_for
from multirank_logger.write import process_hooks
from multirank_logger.write.logged_rows import LoggedRows
from multirank_logger.write.sink_holder import SinkHolder
from multirank_logger.write.writer_thread import Destination, Observer

__all__ = ["RankRun"]

_INSTANCES = count()
#: the runtime's parts that stay in their process when the run is pickled (engines, threads, sockets, locks)
_PROCESS_ONLY = ("lock", "store", "files", "sink_holder", "logged", "capture", "watch", "watch_feed")


class RankRun:
    """This process's part in one run: who the run is, which attempt, and the runtime behind it.

    Args:
        settings: the logger's arguments.
    """

    def __init__(self, settings: RunSettings) -> None:
        self.settings = settings
        self.save_dir = SaveDir(settings.save_dir)  # its filesystem: where log_dir and its files are
        self.board = IdentityBoard(next(_INSTANCES), settings.timeout, settings.identity_wait)
        weakref.finalize(self, withdraw_identity, self.board.env_var)  # dropped unfinalized: no later child learns it
        self.identity: RunIdentity | None = None  # the run as rank 0 publishes it (store, opener's pid)
        self.published = False
        self.created_run = False  # rank 0 allocated a new run (not a resumed one)
        self.hparams: dict[str, Any] = {}
        self.hparams_logged = False
        self.phase = 0  # finalize calls so far: each phase (fit, test) gets its own row channel
        self.finalized = False  # ever: a run never finalized is ended at exit after a crash
        self.forked_from_its_process = False  # a forked child's copy: the run's end is its parent's
        self.alerts_raised: list[Alert] = []  # the watch's alerts of the phases that ended
        self.init_runtime()
        self.check_store()  # the run itself is allocated when first needed (`resolve`)

    def init_runtime(self) -> None:
        """State that lives in one process only (rebuilt after unpickling and in a forked child)."""
        self.lock = threading.RLock()  # identity and sink set-up; never taken by log_metrics/save
        process_hooks.guard_setup(self.lock)  # a SIGTERM inside a set-up must not wait for it
        self.store: Store | None = None
        self.attempt: int | None = None  # this process's launch of the run (run_lifecycle.py)
        self.files = Rank0Files(self)  # rank 0's metrics.csv and hparams.yaml
        self.sink_holder = SinkHolder(self, self.lock)  # how this rank's rows leave, once the group is up
        self.logged = LoggedRows(
            self.sink_holder,
            self,  # the writer asks this run where rows go (`destination`)
            flush_every=self.settings.flush_every,
            flush_interval=self.settings.flush_interval,
            csv_calls=self.files.calls if self.settings.export_csv else None,
        )
        # appends to the side rows directly: `record` would start the writer's SIGTERM hook (main thread only)
        level = self.settings.capture_level
        self.capture = None if level is None else LogCapture(self.logged.side.add, level)
        self.watch: Watch | None = None  # rank 0's, once its sink is set up (`start_watch`)
        self.watch_feed: Observer | None = None  # the watch's intake the writer hands each cycle's rows
        self.watch_failed = False  # it could not start: not tried again at every step
        track(self)

    # -- rank 0's watch ------------------------------------------------------------------

    def sink_ready(self) -> None:
        """`SinkHolder`: the sink is built and no row has gone through it yet: rank 0's watch starts
        now, so it is handed every row (Fabric calls no `save()` and reads no `experiment`: a watch
        started there missed the rows before, or never started)."""
        self.start_watch()

    def start_watch(self) -> None:
        """Rank 0, once its sink is set up: start the watch (watch/watch.py) when asked for.
        Cheap when there is nothing to do (`save` calls it on every step of rank 0; it is started
        at the set-up already, `sink_ready`, and again for a later phase)."""
        setup = self.sink_holder
        if self.watch is not None or self.watch_failed or not self.settings.watch or setup.sink is None or setup.rank != 0:
            return  # (watch_failed: no lock taken at every save of a rank 0 whose watch could not start)
        with self.lock:
            if self.watch is not None or setup.transport is None or self.watch_failed:
                return
            settings = self.settings
            try:
                facts = run_facts(self.identity.run, settings.store_identity) if self.identity is not None else None
                outlets = AlertOutlets(self.logged.side.add, settings.on_alert, settings.alert_url, run=facts)
                per_transaction = backend_for(settings.url).opens_per_transaction
                watch, fed = watch_for(setup.run_id, setup.world, setup.transport, settings.url, per_transaction,
                                       outlets, close_after=max(10.0, 2 * settings.flush_interval + 2),
                                       peek=setup.sink.peek)
                watch.start()
            except Exception as exc:  # noqa: BLE001 - the watch never takes the training down
                self.watch_failed = True
                rank_zero_warn(f"MultiRankLogger: the watch could not start ({without_secrets(describe(exc), settings.url)}); the run "
                               "is logged as usual, without alerts.")
                return
            if fed:
                self.watch_feed = watch.observe
            self.watch = watch

    def stop_watch(self, timeout: float = 2.0, final: bool = False, ends_wait: float = 0.0) -> None:
        """The run's end (finalize): judge what arrived, its alerts into the side rows for the
        writer's last cycles; `final`: every rank's last rows are in, so every step is judged
        (`ends_wait`: how long a watch that reads the store waits for the other ranks' ends)."""
        watch, self.watch = self.watch, None
        if watch is None:
            return
        watch.stop(timeout, final=final, ends_wait=ends_wait)
        if final:
            watch.keep_verdict()  # the run's findings, for later reads and across runs (the `findings` table)
        self.watch_feed = None
        watch.outlets.close(min(timeout, 1.0))
        self.alerts_raised.extend(watch.alerts)

    # -- what the writer thread asks (write/writer_thread.WriterOwner) ----------------------

    def destination(self, explicit: bool) -> Destination | None:
        """The writer's cycle: where rows go (the sink, set up now where rows wait), and rank 0's
        metrics.csv catches up first (`Rank0Files.catch_up`: never raises)."""
        sink = self.logged.ready_sink()
        if sink is None:
            return None
        setup = self.sink_holder
        self.files.catch_up(setup.rank, explicit)
        return Destination(sink, setup.run_id, setup.rank, self.watch_feed)

    # -- pickling (ddp_spawn) ---------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        if self.identity is None and current_rank() == 0:
            # pickled for ddp_spawn's workers: each launch of them must write under one run
            self.resolve()
        state = self.__dict__.copy()
        for key in _PROCESS_ONLY:
            del state[key]  # engines, threads and sockets stay in this process
        state["published"] = False  # the new process's rank 0 publishes into its own launch
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.init_runtime()

    # -- where the run's files go ----------------------------------------------------------

    @property
    def log_dir(self) -> str:
        """CSVLogger's ``save_dir/name/version_N`` (or the named version's directory)."""
        version = self.settings.version
        if isinstance(version, str):
            return os.path.join(self.settings.root_dir, version)
        return os.path.join(
            self.settings.root_dir, f"version_{version}" if version is not None else self.resolve().dir_name
        )

    @property
    def version(self) -> int | str:
        """The run's version: the one asked for, else the one rank 0 allocated in the store."""
        version = self.settings.version
        if version is not None:
            return version
        return self.resolve().version

    # -- the store and the run's identity ---------------------------------------------------

    def check_store(self) -> None:
        """Fail at construction, not an hour in, when the store cannot be used; rank 0 allocates.

        Other ranks only check that the file could be written: opening it would create a store
        of their own on a host that does not share rank 0's disk. They open it once the
        transport is "direct" (`SinkHolder.setup`).
        """
        # only a process certain to be rank 0 touches the disk: the first process of node 1
        # would otherwise create a store (and a run) of its own there
        if current_rank() == 0:
            self.open_store()
            settings = self.settings
            check_dir_writable(settings.spill_dir, "spill_dir", "rows the store cannot take are kept there")
            if not self.save_dir.remote:
                check_dir_writable(settings.save_dir, "save_dir", "metrics.csv, hparams.yaml and checkpoints go there")

    def open_store(self) -> Store:
        if self.store is None:
            url = self.settings.url
            self.store = retry_while_locked(lambda: Store(url), self.settings.timeout)
        return self.store

    def resolve(self) -> RunRef:
        """This run: allocated here on rank 0, learned from rank 0 elsewhere."""
        with self.lock:
            rank = current_rank()
            if self.identity is None:
                if rank == 0:
                    self.identity = self.open_run()
                else:
                    found = self.board.from_env(self.settings.store_identity) or self.board.fetch(rank, self.settings.owner)
                    if found is None:
                        who = f"Rank {rank}" if rank > 0 else "A process that is not certainly rank 0"
                        raise MultiRankLoggerError(
                            f"{who} cannot know the run's version yet: rank 0 allocates it and the "
                            f"process group is not up. {self.settings.version_advice}, or pass version=N."
                        )
                    self.identity = found
            if rank == 0 and not self.published:
                # for the children Lightning's launcher starts, in their environment only (launch_env.py)
                self.published = self.board.publish(self.identity, environ=not hook_launchers())
            return self.identity.run

    def open_run(self) -> RunIdentity:
        """Rank 0: the run this launch writes under, new or continued (store/run_lifecycle.py)."""
        store, settings = self.open_store(), self.settings
        run, resumed = retry_while_locked(
            lambda: open_run(
                store, settings.name, version=settings.version, resume=settings.resume, run_key=settings.run_key,
                world_size=current_world_size(), root_dir=settings.root_dir,
            ),
            settings.timeout,
        )
        self.created_run = not resumed
        log_dir = os.path.join(settings.root_dir, run.dir_name)
        if not resumed and os.path.isdir(log_dir) and os.listdir(log_dir):
            kept = safely(lambda: self.files.keep_earlier(log_dir), "keeping the earlier metrics.csv") or []
            rank_zero_warn(
                f"Experiment logs directory {log_dir} exists and is not empty. This new run's files "
                "(metrics.csv, hparams.yaml, checkpoints) will be written there beside the old ones"
                + (f"; the earlier ones are kept as {', '.join(kept)}." if kept else ".")
            )
        return RunIdentity(run, self.settings.store_identity, os.getpid())

    def begin_attempt(self, rank: int, world: int, channel: RowChannel | None) -> None:
        """Number this process's launch of the run (rank 0 records it, the others learn it), so
        that its rows' seq never repeats an earlier launch's: ddp_spawn's fit and test, a resume."""
        if self.attempt is not None:
            return
        assert self.identity is not None
        timeout = self.settings.timeout
        if rank == 0:
            store, run_id = self.open_store(), self.identity.run.id
            attempt = retry_while_locked(lambda: begin_attempt(store, run_id, world), timeout)
            if channel is not None:
                channel.publish("attempt", str(attempt).encode())
        else:
            assert channel is not None, "a rank other than 0 runs with a process group"
            attempt = int(channel.fetch("attempt", timeout))
        self.attempt = attempt
        self.logged.buffer.seq_base = self.logged.side.seq_base = seq_base(attempt)
        if rank == 0 and attempt:  # a resume: what earlier launches spilled here joins the run first
            earlier = functools.partial(import_earlier_launches, self.open_store(), self.settings.spill_dir,
                                        self.identity.run, attempt)
            safely(lambda: retry_while_locked(earlier, timeout), "importing the run's earlier launches' spill files")

    def log_hparams(self, params: dict[str, Any]) -> None:
        """Keep hyperparameters; rank 0's sink stores them with the run (by the writer), and rank 0
        writes hparams.yaml now, as CSVLogger does."""
        with self.lock:
            self.hparams.update(params)
            self.hparams_logged = True
            sink_holder = self.sink_holder
            if sink_holder.sink is not None and sink_holder.rank == 0:
                sink_holder.sink.update_run(hparams=jsonable(self.hparams))
            if sink_holder.spiller is not None:  # an import recreating the run from the spill file takes them
                sink_holder.spiller.spill.note_hparams(jsonable(self.hparams))
        if self.settings.export_csv and current_rank() == 0:
            safely(self.files.write_hparams, "writing hparams.yaml")

    # -- what the sink set-up asks of the run (write/sink_holder.RunForSink) ----------------

    def channel_name(self) -> str:
        """The row channel of this phase: a finished phase's "done" keys stay behind in its own."""
        return f"{self.board.namespace}-phase{self.phase}"

    def hparams_for_store(self) -> dict[str, Any] | None:
        return jsonable(self.hparams) if self.hparams_logged else None

    # -- the log capture -------------------------------------------------------------------

    def capture_logs(self, on: bool) -> None:
        if self.capture is not None:
            self.capture.install() if on else self.capture.remove()

    # -- at exit and around a fork (called by process_registry.py's hooks) ------------------

    def unfinished(self) -> UnfinishedRun | None:
        """At exit after an uncaught exception: what of this run is left to record as ended, when
        it was never finalized and this rank writes the store itself; else None."""
        store, identity, sink = self.store, self.identity, self.sink_holder.sink
        if self.finalized or store is None or identity is None:
            return None
        # the process group may be gone by now: the rank the sink was set up with
        rank = self.sink_holder.rank if sink is not None else current_rank()
        if rank != 0 and (sink is None or not sink.records_end):
            return None  # a sender's row is its writer's to write, and the store may not be reachable here
        senders = (sink.senders if sink is not None else None) or ()
        return UnfinishedRun(store, identity.run.id, rank, senders, self.attempt)

    def logging_unfinished(self) -> bool:
        """At a normal exit: this process logged since its last `finalize` (the writer started in
        this phase), or it is a rank of a gather run set up in this phase (rank 0 writes the
        others' rows and records their ends: one that logged nothing itself must still take them,
        and a sender that logged nothing must still say it is done); and it is a rank of the run,
        not a plain forked child of the run's process (ddp_notebook's forked ranks set up their
        sink in a process group of several)."""
        sink = self.sink_holder.sink
        gather = sink is not None and sink.transport != "direct"  # rows travel over the channel
        return (self.logged.live or gather) and (not self.forked_from_its_process or self.sink_holder.world > 1)

    def allocate_before_fork(self) -> tuple[Store, int] | None:
        """Rank 0, before a fork: allocate the run now when it has none, so that every forked
        launch continues this one run.

        Returns:
            (store, run id) when this allocated a new run (not a resumed one), else None.
        """
        if self.identity is None and self.store is not None and not self.finalized:
            with self.lock:
                if self.identity is None:
                    self.identity = self.open_run()
                    if self.created_run:
                        return self.store, self.identity.run.id
        return None

    def reset_after_fork(self, keep: Callable[[object], None]) -> None:
        """In a forked child: keep the identity, build a runtime of this process's own.

        The parent's runtime goes to `keep` first, to stay unreachable and never collected: its
        store connection must not be used or even closed here, its locks may be held by threads
        that do not exist here, its buffered rows are the parent's to write.
        """
        old_logged = self.logged
        keep((old_logged, self.lock, self.store, self.sink_holder))
        self.forked_from_its_process = True
        self.init_runtime()
        self.logged.buffer.continue_numbering(old_logged.buffer)  # the child never reuses the parent's seq

