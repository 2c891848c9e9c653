"""Where the writer thread puts a drained batch: straight into the store, or to rank 0.

- `DirectSink`: this rank writes its own rows into the store (SQLite, PostgreSQL: backends
  that take several writing processes).
- Gather transport (DuckDB admits one writing process per file): `GatherReceiver` on rank 0
  writes its own rows and hands the writer whatever the other ranks ship through the
  `RowChannel`; `GatherSender` on the other ranks only sends.

The node transport (a server store with more ranks than it admits connections) uses the same
two classes per node: the node's writer is a `GatherReceiver` of its node's ranks, which are
its `GatherSender`s (the channel's `route`, set by transport_choice.py).

Every sink has a `Spiller` (spiller.py): the writer puts there what the store refuses, and a
sender what it cannot deliver to rank 0 (rank 0 died, or stopped taking rows). Run-level
updates (hparams) are queued here and applied by the writer thread with its retries, never
by the training thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

import pyarrow as pa

from multirank_logger.channel.rank_facts import fetch_facts, publish_facts
from multirank_logger.channel.row_channel import RowChannel
from multirank_logger.errors import ChannelError, StoreGone
from multirank_logger.rows.batch import with_run_id
from multirank_logger.rows.side_records import decode_side, encode_side
from multirank_logger.store.sql_store import Store
from multirank_logger.write.sink_protocol import Cycle
from multirank_logger.write.spiller import Spiller

__all__ = ["SENDER_HELD_VALUES", "DirectSink", "GatherReceiver", "GatherSender"]

log = logging.getLogger(__name__)
#: values a sender keeps in memory that its writer has not acknowledged; past it new rows go
#: to its spill file until the writer catches up. 46 B per value as Arrow and on the wire: ~9 MB
#: per sender, also the most it leaves queued in rank 0's TCPStore. A writer acknowledges within
#: about two of its cycles (flush_interval, 5 s): this sustains ~20k values/s per sender, twice a
#: rank logging 10 keys every millisecond (benchmarks/RESULTS.md, "scale"; docs/scale.md)
SENDER_HELD_VALUES = 200_000
_POLL_S = 0.01
_POLL_MAX_S = 0.25
#: bounds on rank 0's wait for the senders' last word (their spilled/lost counts) at the end
_REPORT_WAIT_MIN_S = 0.5
_REPORT_WAIT_MAX_S = 2.0


class DirectSink:
    """This rank's batches go straight into the store (one transaction per batch).

    Args:
        store: an open Store (writing), or what opens it: a server that refuses the connection
            now (too many clients, restarting) is then asked again at each write, with the
            writer's backoff, and its rows are held and spilled as for any store error.
        run_id: the run that run-level updates apply to.
        spiller: where the writer puts rows the store refuses.
    """

    transport = "direct"
    #: (spilled, lost) values the other ranks reported at the end (gather rank 0), for the run's totals
    others_spilled_lost: tuple[int, int] = (0, 0)
    #: side-table rows each other rank reported in its spill file at the end (gather rank 0)
    others_side_spilled: Mapping[int, int] = MappingProxyType({})
    records_end = True  # this rank writes its own row in ``ranks``
    recorded_by_writer = None  # ...and adds its own counts to the run's row
    side_recorded_by_writer = None

    def __init__(self, store: Store | Callable[[], Store], run_id: int, spiller: Spiller | None = None) -> None:
        self._store = store if isinstance(store, Store) else None
        self._open = None if isinstance(store, Store) else store
        self.run_id = run_id
        self.spiller = spiller
        self._run_updates: dict[str, Any] = {}
        self._deferred: list[Callable[[], None]] = []  # bookkeeping writes a held store refused
        self._file = _file_identity(self._store)

    @property
    def store(self) -> Store:
        """The store, opened on first use when the sink was given what opens it.

        Raises:
            Whatever opening it raised (a refused connection: transient, store/write_errors.py).
        """
        if self._store is None:
            assert self._open is not None
            self._store = self._open()
            self._file = _file_identity(self._store)
        return self._store

    @property
    def connected(self) -> bool:
        """Whether the store was ever opened (a refusing server leaves it unopened)."""
        return self._store is not None

    @property
    def opens_store_per_write(self) -> bool:
        """True when each write opens the store (DuckDB): the writer then writes once per
        flush interval instead of every N calls (see writer_thread.BackgroundWriter)."""
        return self._store is not None and self._store.backend.opens_per_transaction

    def update_run(self, **values: Any) -> None:
        """Queue column updates for the run row; applied by the writer (`write_run`)."""
        self._run_updates.update(values)

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """One connection for a cycle's writes (each DuckDB open costs CPU, whatever the write)."""
        self.check_store()
        with self.store.writing():
            yield

    def write(self, batch: pa.RecordBatch) -> None:
        self.check_store()
        self.store.write(batch)

    def write_side(self, tables: dict[str, list[dict[str, Any]]]) -> None:
        """Side-table rows (decisions, logs, step timing); raise to have them retried."""
        self.store.write_side(tables)

    def defer(self, write: Callable[[], None]) -> bool:
        """Have the writer run `write` (idempotent bookkeeping) with its retries, before the run updates."""
        self._deferred.append(write)
        return True

    def republish_facts(self) -> bool:
        return False  # its end's row takes them

    def write_run(self) -> None:
        while self._deferred:
            self._deferred[0]()
            self._deferred.pop(0)
        if self._run_updates:
            updates = dict(self._run_updates)
            self.store.update_run(self.run_id, **updates)
            for key, value in updates.items():
                if self._run_updates.get(key) is value:
                    del self._run_updates[key]

    def receive(self) -> tuple[list[pa.RecordBatch], list[dict[str, list[dict[str, Any]]]]]:
        return [], []  # no other rank ships rows here

    def peek(self) -> list[pa.RecordBatch]:
        """The rows other ranks shipped here that the writer has not received yet (none here)."""
        return []

    def close(self) -> None:
        """End of the phase: release what the sink holds besides the store."""

    def finish(self, status: str, timeout: float, cycle: Cycle) -> dict[int, str]:
        """Nothing to wait for: every rank wrote its own rows. Returns no other rank's status."""
        return {}

    @property
    def senders(self) -> list[int] | None:
        return None  # no other rank's rows come here

    def fetch_facts(self, timeout: float) -> dict[int, dict[str, Any]]:
        return {}

    def store_for_end(self) -> Store | None:
        return self.store  # a server that refused it so far is asked once more

    def check_store(self) -> None:
        """A store file deleted or replaced under a run would take every later row with it
        silently (SQLite keeps writing the unlinked file; DuckDB would create an empty one)."""
        if self._file is None:
            return
        path, identity = self._file
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self.store.engine.dispose()  # drop the connection to the unlinked file
            raise StoreGone(path) from None
        if (st.st_dev, st.st_ino) != identity:
            self.store.engine.dispose()
            raise StoreGone(path)


def _file_identity(store: Store | None) -> tuple[str, tuple[int, int]] | None:
    path = None if store is None else store.backend.path
    if path is None:
        return None
    st = os.stat(path)
    return str(path), (st.st_dev, st.st_ino)


class GatherReceiver(DirectSink):
    """Rank 0 of a gather run: writes its own rows, and receives the other ranks' rows for the
    writer, which writes them with its own in one transaction (as Arrow record batches: no
    Python object per row on rank 0 for a store that reads Arrow in place, DuckDB).

    Args:
        store: the open Store.
        run_id: the run's id.
        channel: the RowChannel of this logger's launch.
        spiller: where the writer puts rows (its own and received) the store refuses.
    """

    transport = "gather"

    def __init__(
        self,
        store: Store | Callable[[], Store],
        run_id: int,
        channel: RowChannel,
        spiller: Spiller | None = None,
        transport: str = "gather",
    ) -> None:
        super().__init__(store, run_id, spiller)
        self.channel = channel
        self.transport = transport

    def receive(self) -> tuple[list[pa.RecordBatch], list[dict[str, list[dict[str, Any]]]]]:
        # each call acknowledges the previous call's batches: the writer holds them (or spilled them)
        # filed under rank 0's run, whatever id the sender put there (never a silent orphan)
        batches = [with_run_id(batch, self.run_id) for batch in self.channel.receive()]
        side = [_stamp_side(decode_side(payload), self.run_id) for payload in self.channel.receive_side()]
        return batches, side

    def peek(self) -> list[pa.RecordBatch]:
        """The batches the other ranks sent that the writer's next `receive` will take, for rank 0's
        watch to judge now (`RowChannel.peek`: nothing acknowledged, nothing taken from the writer);
        each batch once, under the run id its sender knew (the watch reads no run id)."""
        return self.channel.peek()

    def finish(self, status: str, timeout: float, cycle: Cycle) -> dict[int, str]:
        """Keep the writer cycling (receiving) until every other rank is done or `timeout` runs out,
        then take each rank's count of the values it spilled or lost (`others_spilled_lost`).

        Returns:
            The status of each other rank whose end is known (its rows all received, its
            counts reported); the others are absent: recorded "missing", the run "incomplete".
        """
        deadline = time.monotonic() + timeout
        expected = set(self.channel.senders)
        delay = _POLL_S
        while True:
            cycle()
            done = self.channel.done_ranks()
            if expected <= done.keys() or time.monotonic() >= deadline:
                break
            # each round asks the store about every sender: back off while they take their time
            time.sleep(delay)
            delay = min(delay * 1.5, _POLL_MAX_S)
        cycle()  # takes the last batches...
        cycle()  # ...and acknowledges them, so the senders stop waiting and report
        # a sender reports once it sees its last rows acknowledged (within one of its polls). A run
        # that did not succeed takes only the reports already there: a job being torn down
        # (SIGTERM: Lightning's launcher kills rank 0 within seconds of a dead child) must record
        # its end now, and its status is no success whatever the counts say
        wait = min(max(deadline - time.monotonic(), _REPORT_WAIT_MIN_S), _REPORT_WAIT_MAX_S)
        reports = self.channel.spilled_lost_reports(sorted(done), wait if status == "success" else 0.0)
        # a payload rank 0 could not read (damaged on the way) is lost: its rows are unknown, so each
        # counts as one value at least, enough that the run is never recorded as a success
        damaged = self.channel.damaged_batches
        if damaged:
            log.error("multirank_logger: %d row batch(es) from rank(s) %s could not be read and are lost (counted "
                      "as at least one value each).", damaged, sorted(self.channel.damaged_from))
        lost = sum(report.lost for report in reports.values()) + damaged
        self.others_spilled_lost = (sum(report.spilled for report in reports.values()), lost)
        self.others_side_spilled = {r: report.side_spilled for r, report in reports.items() if report.side_spilled}
        self.channel.acknowledge_reports(sorted(reports))  # in the totals: not to be reported again
        ended = set(reports) | (set(done) if status != "success" else set())  # not a success: their end is known, done
        missing = sorted(expected - ended)
        if missing:
            log.warning(
                "multirank_logger: ranks %s did not finish sending within %.0f s: the run is recorded 'incomplete' "
                "and those ranks 'missing'. Rows they could not deliver are in their own spill files (each rank "
                "names its file and the import command in its output); importing them completes the run.",
                missing, timeout,
            )
        return {r: done[r] for r in sorted(ended)}

    @property
    def senders(self) -> list[int] | None:
        return list(self.channel.senders)

    def fetch_facts(self, timeout: float) -> dict[int, dict[str, Any]]:
        senders = self.channel.senders
        return fetch_facts(self.channel, list(senders), timeout) if senders else {}

    def close(self) -> None:
        """Drop the channel's connection; this sends the last acknowledgements."""
        self.channel.close()


class GatherSender:
    """A rank other than 0 of a gather run: ships its batches to rank 0; what cannot be
    delivered goes to its spill file, on its own disk.

    Args:
        channel: the RowChannel of this logger's launch.
        spiller: where undelivered rows go (None: they are kept in memory and counted).
    """

    transport = "gather"
    # a push to the TCPStore is cheap, and frequent pushes keep rank 0's lag short
    opens_store_per_write = False
    others_spilled_lost = (0, 0)
    others_side_spilled: Mapping[int, int] = MappingProxyType({})
    records_end = False  # its writer (rank 0, or its node's) records its end
    senders = None

    def __init__(
        self,
        channel: RowChannel,
        spiller: Spiller | None = None,
        recorded: tuple[int, int] = (0, 0),
        side_recorded: int = 0,
        transport: str = "gather",
        max_held_values: int = SENDER_HELD_VALUES,
    ) -> None:
        self.channel = channel
        self.spiller = spiller
        self.transport = transport
        #: values kept unacknowledged before new rows go to the spill file instead
        self.max_held_values = max_held_values
        #: the spiller's (spilled, lost) totals that rank 0 has added to the run's row (it lives
        #: for the run, this sink for one phase): an earlier phase's counts rank 0 never took (it
        #: gave up waiting, and recorded this rank "missing") are reported again with this phase's
        self.recorded_by_writer: tuple[int, int] = recorded
        #: the spiller's side-table rows rank 0 has counted on this rank's row in ``ranks``, as above
        self.side_recorded_by_writer: int = side_recorded
        #: batches neither delivered nor spilled (no spiller)
        self.undelivered: list[pa.RecordBatch] = []

    def update_run(self, **values: Any) -> None:
        """Rank 0 records the run; nothing to do here."""

    def defer(self, write: Callable[[], None]) -> bool:
        return False  # a sender never writes the store: there is no writer to defer to

    def republish_facts(self) -> bool:
        publish_facts(self.channel)  # its writer fetches them at the end
        return True

    def writing(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def write(self, batch: pa.RecordBatch) -> None:
        channel = self.channel
        if channel.unacknowledged_values(refresh=False) + len(batch) > self.max_held_values:
            held = channel.unacknowledged_values()  # the acknowledgements first: it may have caught up
            if held + len(batch) > self.max_held_values:
                # the writer (rank 0, or the node's) takes rows slower than they come: keep this
                # rank's memory bounded; the spill file keeps the rest until `import`
                self._spill(
                    f"rank {channel.writer} has not yet acknowledged {held} values from rank {channel.rank}, "
                    f"the most a sender keeps in memory (SENDER_HELD_VALUES={self.max_held_values}); later "
                    f"rows go to the spill file until rank {channel.writer} catches up",
                    [batch],
                )
                return
        try:
            channel.send(batch)
        except ChannelError as exc:
            # rank 0 is gone: the writer must not retry into a dead channel forever
            self._spill(str(exc), exc.undelivered)

    def write_side(self, tables: dict[str, list[dict[str, Any]]]) -> None:
        try:
            self.channel.send_side(encode_side(tables))
        except ChannelError as exc:
            if self.spiller is not None:
                self.spiller.put_side(
                    tables, f"rank {self.channel.rank} could not deliver side-table rows to rank {self.channel.writer} ({exc})"
                )
                return
            rows = sum(map(len, tables.values()))
            log.error("multirank_logger: rank %d lost %d side-table row(s) (decisions, logs, timing): %s",
                      self.channel.rank, rows, exc)

    def write_run(self) -> None:
        pass

    def receive(self) -> tuple[list[pa.RecordBatch], list[dict[str, list[dict[str, Any]]]]]:
        return [], []

    def peek(self) -> list[pa.RecordBatch]:
        return []

    def finish(self, status: str, timeout: float, cycle: Cycle) -> dict[int, str]:
        """Say this rank is done, wait (bounded) for rank 0 to take its last rows; spill the rest.
        Then tell rank 0 how many values this phase spilled or lost, and write the same in the
        spill file: importing it tells a store whose rank 0 never heard (spill_import.import_spill)."""
        try:
            self.channel.mark_done(status)
        except ChannelError as exc:
            self._spill(str(exc), exc.undelivered)
        else:
            left = self.channel.wait_delivered(timeout)
            if left:
                self._spill(f"rank {self.channel.writer} did not acknowledge rank {self.channel.rank}'s last rows "
                            f"in {timeout:g} s", left)
        totals = _spilled_lost(self.spiller)
        spilled, lost = totals[0] - self.recorded_by_writer[0], totals[1] - self.recorded_by_writer[1]
        undelivered = sum(map(len, self.undelivered))  # no spiller: gone with this process
        side_total = self.spiller.side_rows_spilled if self.spiller is not None else 0
        # rank 0 waits for the reports only at a success (a job torn down must not wait)
        counted = self.channel.report_spilled_lost(
            spilled, lost + undelivered, side_total - self.side_recorded_by_writer
        ) and status == "success" and self.channel.report_counted(_REPORT_WAIT_MAX_S + 1.0)
        if counted:
            self.recorded_by_writer, self.side_recorded_by_writer = totals, side_total
        if self.spiller is not None and (spilled or lost or self.spiller.side_rows_spilled):
            self.spiller.end(status, spilled, lost, counted=counted)
        return {}

    def fetch_facts(self, timeout: float) -> dict[int, dict[str, Any]]:
        return {}

    def store_for_end(self) -> Store | None:
        return None

    def check_store(self) -> None:
        pass  # it holds no store

    def close(self) -> None:
        self.channel.close()

    def _spill(self, why: str, batches: list[pa.RecordBatch]) -> None:
        batches = [b for b in batches if len(b)]
        if not batches:
            return
        if self.spiller is None:
            self.undelivered.extend(batches)
            log.error("multirank_logger: %s (%d rows kept in memory only)", why, sum(map(len, batches)))
            return
        self.spiller.put(batches, f"rank {self.channel.rank} could not deliver its rows to rank {self.channel.writer} ({why})")


def _spilled_lost(spiller: Spiller | None) -> tuple[int, int]:
    return (0, 0) if spiller is None else (spiller.values_spilled, spiller.values_lost)


def _stamp_side(tables: dict[str, list[dict[str, Any]]], run_id: int) -> dict[str, list[dict[str, Any]]]:
    """Received side rows under rank 0's run, as `batch.with_run_id` does for metric rows."""
    for rows in tables.values():
        for row in rows:
            row["run_id"] = run_id
    return tables
