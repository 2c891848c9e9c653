"""Writing a run's end into the store: status.py's transitions in one held connection, retried
while the store is busy.

The logger's finalize calls `record_end` once the rows are flushed: every rank records its own
status where it writes the store; in gather mode rank 0 records the others too (a node's writer, its node's ranks), with the facts
each of them published (transport/rank_facts.py). What each status is, is status.py's to say.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from multirank_logger.store.sql_store import Store, retry_while_locked
from multirank_logger.store.status import record_rank_end

__all__ = ["record_end"]


def record_end(
    store: Store,
    run_id: int,
    *,
    rank: int,
    gather_world: int,
    status: str,
    others: dict[int, str],
    facts: dict[int, dict[str, Any]],
    timeout: float,
    values_spilled: int = 0,
    values_lost: int = 0,
    now: float | None = None,
    attempt: int | None = None,
    senders: Sequence[int] | None = None,
) -> None:
    """`status.record_rank_end` (what is written, and why), retried for up to `timeout` seconds
    while another process holds the store.

    Raises:
        StoreLocked: when the store stayed busy past `timeout`.
    """
    at = time.time() if now is None else now

    def write() -> None:
        # one connection for all of it (each DuckDB open costs CPU, whatever the write); each step is
        # idempotent, so a busy store retries the whole block
        with store.writing():
            record_rank_end(
                store, run_id, rank=rank, gather_world=gather_world, status=status, others=others, facts=facts,
                now=at, values_spilled=values_spilled, values_lost=values_lost, attempt=attempt,
                senders=senders,
            )

    retry_while_locked(write, timeout)
