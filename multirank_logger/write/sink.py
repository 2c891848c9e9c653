"""What the background writer hands its batches to: the `Sink` protocol (implementations in
sinks.py: this rank writes the store, ships to rank 0 or a node's writer, or receives others' rows)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import pyarrow as pa

from multirank_logger.write.spiller import Spiller

__all__ = ["Sink", "Target"]


class Sink(Protocol):
    """Where drained batches go (see sinks.py)."""

    @property
    def opens_store_per_write(self) -> bool:
        """True when each write is costly whatever its size: write once per flush interval."""

    #: where rows go that the store refused (None: they stay in memory)
    spiller: Spiller | None

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


#: what the writer needs before it can drain: (sink, run_id, global rank), or None while unknown
Target = Callable[[], "tuple[Sink, int, int] | None"]
