"""SinkHolder: this rank's sink and what goes with it (the transport chosen, its spiller, this rank
registered, the counts its end records). How this rank's rows leave.

`SinkHolder.setup` runs once the process group is up (or at once with one rank), from the
writer thread (logged_rows.py's `ready_sink`) or the main thread (``logger.experiment``, ``save()`` on rank 0): it
decides the transport with the other ranks (transport_choice.py), numbers the launch's attempt
(through the run), builds the sink (sinks.py) with this run's spiller (spiller.py) and records
this rank, and on rank 0 every rank, in the store's ``ranks`` table. A finalized phase drops
the sink (`drop`); the next phase (test after fit) sets up again, on a fresh channel.

It knows the run above it (logger/rank_run.RankRun) only through `RunForSink`, so this
module imports nothing of the Lightning front-end.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any, Protocol

from sqlalchemy.engine import URL

from multirank_logger._util.dist_env import current_rank, current_world_size, dist_if_initialized
from multirank_logger._util.rank_zero import rank_zero_info
from multirank_logger.channel.rank_facts import publish_facts, rank_facts
from multirank_logger.channel.row_channel import RowChannel
from multirank_logger.errors import StoreLocked
from multirank_logger.rows.run_ref import RunRef
from multirank_logger.store.backends import backend_for
from multirank_logger.store.open_for_write import free_connections, store_of_writer
from multirank_logger.store.spill_file import SpillWriter
from multirank_logger.store.sql_store import Store, retry_while_locked
from multirank_logger.write.sink_protocol import Sink
from multirank_logger.write.sinks import DirectSink, GatherReceiver, GatherSender
from multirank_logger.write.spiller import Spiller
from multirank_logger.write.transport_choice import choose_transport

__all__ = ["RunForSink", "SinkSettings", "SinkHolder"]


class SinkSettings(Protocol):
    """What the sink's set-up reads of the logger's arguments (logger/run_settings.RunSettings)."""

    @property
    def db(self) -> str:
        """The store as shown to the user (no password)."""

    @property
    def url(self) -> URL:
        """The store's URL this process connects with."""

    @property
    def transport(self) -> str:
        """The transport asked for."""

    @property
    def timeout(self) -> float:
        """The longest wait on another rank or a busy store."""

    @property
    def max_writers(self) -> int | None:
        """The most processes that write a server store at once."""

    @property
    def spill_dir(self) -> str:
        """Where this rank's spill file goes."""


class RunForSink(Protocol):
    """What the sink's set-up asks of the run above it (logger/rank_run.RankRun)."""

    @property
    def settings(self) -> SinkSettings:
        """The logger's arguments."""

    @property
    def store(self) -> Store | None:
        """The store, where this process opened it already (rank 0 always)."""

    @property
    def attempt(self) -> int | None:
        """This launch's attempt of the run, once numbered."""

    def open_store(self) -> Store:
        """The store, opened (waiting while another process holds it)."""

    def resolve(self) -> RunRef:
        """The run: allocated on rank 0, learned from rank 0 elsewhere."""

    def channel_name(self) -> str:
        """The row channel's name for this phase of the launch (fit, test: one each)."""

    def begin_attempt(self, rank: int, world: int, channel: RowChannel | None) -> None:
        """Number this launch's attempt (rank 0 records it, the others learn it over `channel`)."""

    def hparams_for_store(self) -> dict[str, Any] | None:
        """The hyperparameters to store with the run, None when none were logged."""

    def sink_ready(self) -> None:
        """The sink was just built, before any row goes through it (rank 0 starts its watch here)."""


class SinkHolder:
    """This rank's sink, set up once the process group is up, with its spiller and registration.

    Args:
        run: the run above (identity, attempt, store, settings).
        lock: the run's set-up lock (identity and sink), shared with the run; never taken by
            the hot path.
    """

    def __init__(self, run: RunForSink, lock: threading.RLock) -> None:
        self.run = run
        self.lock = lock
        self.sink: Sink | None = None
        #: this rank's place changed after it was registered (a device mesh set up later): its
        #: facts go again with its end (finalize), where its row is written
        self.place_changed = False
        self.world = 0  # the world size the sink was set up for
        self.rank = 0  # the rank the sink was set up with (the process group may be gone later)
        self.run_id = 0  # the run the sink writes under
        self.transport: str | None = None
        self.spiller: Spiller | None = None  # one per run: every phase spills into one file
        self.own_recorded = (0, 0)  # this rank's (spilled, lost) values already added to the run's row
        #: this rank's side-table rows in its spill file when the run's end was last recorded
        self.side_rows_recorded = 0
        #: gather rank 0: the senders' (spilled, lost) reported in a phase whose end the store did
        #: not take, for the next end it records
        self.others_pending = (0, 0)

    def setup(self) -> Sink | None:
        """Decide the transport and build the sink; None while the process group is not up."""
        with self.lock:
            world = current_world_size()
            if self.sink is not None and self.world == world:
                return self.sink
            if world > 1 and dist_if_initialized() is None:
                return None  # a launched rank before its process group: rank and peers unknown
            run, settings = self.run.resolve(), self.run.settings
            rank = current_rank()
            channel = None
            if world > 1:
                # one channel per phase (fit, test...): a finished phase's "done" keys stay behind
                channel = RowChannel(self.run.channel_name(), rank, world, timeout=settings.timeout)
            open_store = self.run.open_store
            transport, why = choose_transport(
                settings.transport, backend_for(settings.url), world, rank=rank, channel=channel,
                timeout=settings.timeout, max_writers=settings.max_writers,
                free_connections=(lambda: free_connections(open_store())) if rank == 0 else None,
            )
            self.run.begin_attempt(rank, world, channel)
            spiller = self._spiller_for(run, rank)
            sink: Sink
            store = open_store if rank == 0 else functools.partial(
                store_of_writer, open_store, run, rank, settings.timeout)
            if channel is not None and transport != "direct" and channel.receives:
                sink = GatherReceiver(store(), run.id, channel, spiller, transport=transport)
            elif channel is not None and transport != "direct":
                sink = GatherSender(channel, spiller, recorded=self.own_recorded, side_recorded=self.side_rows_recorded,
                                    transport=transport)
                publish_facts(channel)  # its writer records this rank's host and pid at the end
            else:
                sink = DirectSink(store(), run.id, spiller)
            self.rank, self.transport, self.world, self.run_id = rank, transport, world, run.id
            self.sink = sink
            # a node's writer records itself and its ranks at the end (rank 0 registered them all)
            opened = self.run.store is not None
            if not opened and transport == "direct":
                sink.defer(functools.partial(self._register, sink, run, rank, world, transport, why))
            elif opened and (rank == 0 or transport == "direct"):
                try:
                    self._register(sink, run, rank, world, transport, why)
                except BaseException:
                    self.sink = None  # set up again, registration included, on the next call
                    raise
            hparams = self.run.hparams_for_store() if rank == 0 else None
            if hparams is not None:
                sink.update_run(hparams=hparams)
            self.run.sink_ready()  # from whichever thread set it up: the writer's first cycle under Fabric
            return sink

    def drop(self) -> None:
        """The phase is over (finalize): a later one (test after fit) sets up again, on a fresh channel."""
        self.sink = None

    def spilled_lost(self) -> tuple[int, int]:
        """(spilled, lost) values of this run on this rank so far."""
        spiller = self.spiller
        return (0, 0) if spiller is None else (spiller.values_spilled, spiller.values_lost)

    def _spiller_for(self, run: RunRef, rank: int) -> Spiller:
        """This run's spill file on this rank (created on its first row): every phase spills into it."""
        if self.spiller is None or self.spiller.spill.header["run_id"] != run.id:
            settings = self.run.settings
            path = backend_for(settings.url).path
            shown = os.path.abspath(path) if path is not None else settings.db  # for the import command
            # what an import needs to recreate the run where the store lost it (never a server's URL)
            spill = SpillWriter(
                settings.spill_dir, run_id=run.id, name=run.name, version=run.version, rank=rank,
                attempt=self.run.attempt, run_started_at=run.started_at, run_uuid=run.uuid,
                world_size=run.world_size, version_name=run.version_name, hparams=self.run.hparams_for_store(),
                store=None if path is None else shown,
            )
            self.spiller = Spiller(spill, shown, rank)
            self.own_recorded = self.others_pending = (0, 0)
            self.side_rows_recorded = 0
        return self.spiller

    def place_moved(self) -> None:
        """This rank's facts (`rank_facts`) changed after its registration: a gather sender
        publishes them again (rank 0 fetches them at the end); a rank that writes its own row
        records them with its end."""
        sink = self.sink
        if sink is None:
            return  # not registered yet: its registration takes them
        if not sink.republish_facts():
            self.place_changed = True

    def _register(
        self, sink: Sink, run: RunRef, rank: int, world: int, transport: str, why: str
    ) -> None:
        """This rank in the store's ``ranks`` table (rank 0: every rank, and the run's transport)."""
        store = self.run.store
        assert store is not None
        facts = rank_facts(rank)

        def write() -> None:
            with store.writing():  # one connection, one retry unit: every step is idempotent
                store.register_rank(run.id, rank, **facts)
                if transport != "direct":
                    # they do not write: rank 0 (or their node's writer) records their end
                    for other in range(1, world):
                        store.register_rank(run.id, other)
                elif rank == 0 and store.backend.path is None:
                    # a server may refuse a rank its connection: its end stays unknown (the run
                    # not a success) until it or its spill file reaches the store
                    store.register_absent_ranks(run.id, range(1, world))
                if rank == 0:
                    store.update_run(run.id, transport=transport, world_size=world)

        try:
            retry_while_locked(write, min(self.run.settings.timeout, 1.0))
        except StoreLocked:
            # a reader holds the DuckDB file (a notebook): the rows must not wait for it, nor the
            # training; the writer registers the rank with its retries, before its next rows
            if not sink.defer(write):
                raise  # a sender never writes the store: there is no writer to defer to
        if rank == 0:
            rank_zero_info(
                f"MultiRankLogger: run {run.name}/{run.dir_name} (id {run.id}) in "
                f"{self.run.settings.db}, {world} rank(s), transport={transport} ({why})"
            )
