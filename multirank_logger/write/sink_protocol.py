"""What the background writer hands its batches to, and what `finalize` asks at the end: the
`Sink` protocol (implementations in sinks.py: this rank writes the store, ships to rank 0 or a
node's writer, or receives others' rows). Neither caller asks which kind of sink it holds.

`Sink` is three small protocols, one per caller, so each sees only what it asks: `SinkWrites`
(the writer thread's cycle), `SinkUpdates` (the run's set-up and the training thread, while the
run goes on) and `SinkEnd` (`finalize`, at the phase's end)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import pyarrow as pa

from multirank_logger.store.sql_store import Store
from multirank_logger.write.spiller import Spiller

__all__ = ["Cycle", "Sink", "SinkEnd", "SinkUpdates", "SinkWrites"]

#: what the logger passes to `Sink.finish`: one writer cycle (receive, then write what it can)
Cycle = Callable[[], Any]


class SinkWrites(Protocol):
    """What the background writer's cycle asks (write/writer_thread.py)."""

    #: where rows go that the store refused (None: they stay in memory)
    spiller: Spiller | None

    @property
    def opens_store_per_write(self) -> bool:
        """True when each write is costly whatever its size: write once per flush interval."""

    def write(self, batch: pa.RecordBatch) -> None:
        """Store or ship one batch; raise to have it retried (transient) or isolated (permanent)."""

    def write_side(self, tables: dict[str, list[dict[str, Any]]]) -> None:
        """Store or ship side-table rows (decisions, logs, step timing); raise to retry."""

    def write_run(self) -> None:
        """Apply queued run-level updates (hparams); raise to retry."""

    def writing(self) -> Any:
        """A context holding one connection for a cycle's writes (raises when it cannot be opened)."""

    def receive(self) -> tuple[list[pa.RecordBatch], list[dict[str, list[dict[str, Any]]]]]:
        """Batches and side rows other ranks sent (rank 0 of a gather run), now this writer's to store."""


class SinkUpdates(Protocol):
    """What the run's set-up, the training thread and rank 0's watch ask while the run goes on."""

    def peek(self) -> list[pa.RecordBatch]:
        """The rows other ranks shipped here that the writer has not received yet (rank 0's watch)."""

    def update_run(self, **values: Any) -> None:
        """Queue column updates for the run's row (rank 0); the writer applies them (`write_run`)."""

    def defer(self, write: Callable[[], None]) -> bool:
        """Have the writer run `write` (idempotent bookkeeping) with its retries.

        Returns:
            False where this rank has no writer to the store (a sender): the caller must write it.
        """

    def republish_facts(self) -> bool:
        """This rank's place changed after its registration: a sender publishes its facts again
        for its writer to fetch at the end (True); a sink that records its own end returns
        False, and the end takes them."""


class SinkEnd(Protocol):
    """What `finalize` asks at the end of the phase (logger/finalize.py), in this order."""

    #: "direct", "gather" or "node": the transport the run chose
    transport: str

    def finish(self, status: str, timeout: float, cycle: Cycle) -> dict[int, str]:
        """Wait (bounded by `timeout`) for what the end needs: the other ranks' last rows (a
        receiver, running `cycle`), or rank 0's acknowledgement of this rank's (a sender).

        Returns:
            The status of each other rank whose end this sink learnt (a receiver), else {}.
        """

    @property
    def senders(self) -> list[int] | None:
        """The ranks whose ends this rank records besides its own (a receiver); None: its own only."""

    def fetch_facts(self, timeout: float) -> dict[int, dict[str, Any]]:
        """The senders' facts (host, pid...) for their rows in ``ranks``; {} where there are none."""

    @property
    def records_end(self) -> bool:
        """Whether this rank records its end in the store itself (False: a sender, whose writer does)."""

    def store_for_end(self) -> Store | None:
        """The store to record the end in, opened now where a server refused it so far (raises
        when it still cannot be opened); None where this rank does not record its end."""

    def check_store(self) -> None:
        """Raise StoreGone when the store's file was deleted or replaced under the run."""

    def close(self) -> None:
        """Release what the sink holds besides the store (the channel: its last acknowledgements)."""

    #: (spilled, lost) values the other ranks reported at the end (a receiver), for the run's totals
    others_spilled_lost: tuple[int, int]
    #: side-table rows each other rank reported in its spill file at the end (a receiver), for its row in ``ranks``
    others_side_spilled: Mapping[int, int]

    @property
    def recorded_by_writer(self) -> tuple[int, int] | None:
        """This rank's (spilled, lost) totals its writer has added to the run's row (a sender,
        after `finish`); None where this rank records its own end, and counts them itself."""

    @property
    def side_recorded_by_writer(self) -> int | None:
        """This rank's spilled side-table rows its writer has counted on its row in ``ranks`` (a
        sender, after `finish`); None where this rank records its own end."""


class Sink(SinkWrites, SinkUpdates, SinkEnd, Protocol):
    """Where drained batches go, and how this rank's part ends (see sinks.py): all three parts."""
