"""How a run ends in the store, and what each rank says about itself (host, pid, ranks).

The logger's `finalize` calls into here once the rows are flushed: every rank records its
own status where it writes the store; in gather mode rank 0 records the others, with the
facts each of them published on the run's channel at set-up (`publish_facts`). Every wait
is bounded: a rank that never published is recorded without its facts.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from collections.abc import Iterable
from typing import Any, TypeVar

import sqlalchemy as sa

from multirank_logger.errors import ChannelError
from multirank_logger.logger.process_hooks import sigterm_received
from multirank_logger.model.schema import attempts, ranks, runs, unheard_ends
from multirank_logger.store.sql_store import Store, retry_while_locked
from multirank_logger.transport.row_channel import RowChannel

__all__ = ["fetch_facts", "final_status", "publish_facts", "rank_facts", "record_end", "run_lacks_values"]

log = logging.getLogger(__name__)
T = TypeVar("T")
#: the longest rank 0 waits, for all ranks together, for facts the others did not publish
FACTS_WAIT_S = 2.0
_FACTS_KEY = "facts/{rank}"


def rank_facts() -> dict[str, Any]:
    """This process's facts for the `ranks` table."""
    return {
        "local_rank": _env_int("LOCAL_RANK", 0),
        "node_rank": _env_int("NODE_RANK", _env_int("GROUP_RANK", 0)),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }


def publish_facts(channel: RowChannel) -> None:
    """A rank that does not write the store (gather): leave its facts for rank 0. Best effort."""
    try:
        channel.publish(_FACTS_KEY.format(rank=channel.rank), json.dumps(rank_facts()).encode())
    except ChannelError as exc:
        log.warning("multirank_logger: rank %d could not publish its host and pid: %s", channel.rank, exc)


def fetch_facts(channel: RowChannel, ranks: Iterable[int], bound: float = FACTS_WAIT_S) -> dict[int, dict[str, Any]]:
    """Rank 0: the facts `ranks` published, waiting at most `bound` seconds for all of them."""
    deadline = time.monotonic() + bound
    out: dict[int, dict[str, Any]] = {}
    for rank in ranks:
        try:
            raw = channel.fetch(_FACTS_KEY.format(rank=rank), max(0.01, deadline - time.monotonic()))
            facts = json.loads(raw)
        except (ChannelError, ValueError):
            continue  # died before set-up ended, or the channel is gone: status only
        if isinstance(facts, dict):
            out[rank] = {k: facts[k] for k in ("local_rank", "node_rank", "host", "pid") if k in facts}
    return out


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
) -> None:
    """Write how the run ended for this rank and, on rank 0 in gather mode (``gather_world > 1``),
    for every other rank: the status it reported ("missing" when it did not) and its facts.

    Values this rank put in its spill file or lost are added to the run's ``values_spilled`` /
    ``values_lost``; a run with any is never recorded as "success" but as "incomplete", whichever
    rank finalizes last (importing the spill files brings it back: spill_import.import_spill). So is a
    gather run with a rank whose end never reached rank 0 (what it did not deliver is unknown
    here: its spill file, imported, records it). At a success, such a rank is also kept in
    ``unheard_ends`` under this launch's `attempt`, so that a later launch (``test`` after
    ``fit``), which registers the rank again, cannot make the run a success before that file is
    imported."""
    now = time.time() if now is None else now

    def write() -> None:
        # one connection for all of it (each DuckDB open costs CPU, whatever the write); each step is
        # idempotent, so a busy store retries the whole block
        with store.writing():
            store.update_rank(run_id, rank, status=status, ended_at=now)
            if rank == 0:
                for other in range(1, gather_world):
                    values = {**facts.get(other, {}), "status": others.get(other, "missing"), "ended_at": now}
                    store.update_rank(run_id, other, **values)
                if attempt is not None and gather_world > 1 and status == "success":
                    # a success takes every heard rank's report, which covers what that rank's
                    # earlier phases of this launch did not get counted (sinks.GatherSender). A
                    # launch that did not succeed keeps none: a resume supersedes its last rows,
                    # as it does a vanished launch's (run_lifecycle.begin_attempt)
                    heard = [o for o in range(1, gather_world) if o in others]
                    unheard = [o for o in range(1, gather_world) if o not in others]
                    _record_unheard(store, run_id, attempt, unheard, heard, now)
            if values_spilled or values_lost:
                _count_unstored(store, run_id, values_spilled, values_lost)
            if rank == 0 or status != "success":
                # a failing rank marks the run too: rank 0 may be stuck in a collective and never finalize
                missing = rank == 0 and any(other not in others for other in range(1, gather_world))
                _end_run(store, run_id, "incomplete" if missing and status == "success" else status, now)
            else:
                _settle_incomplete(store, run_id)

    retry_while_locked(write, timeout)


def _record_unheard(store: Store, run_id: int, attempt: int, unheard: list[int], heard: list[int], now: float) -> None:
    """Keep this launch's `unheard` ranks in ``unheard_ends``; drop the `heard` ones (a later phase's
    report counted what the earlier phase's did not)."""
    this_launch = sa.and_(unheard_ends.c.run_id == run_id, unheard_ends.c.attempt == attempt)
    with store.begin() as conn:
        if heard:
            conn.execute(unheard_ends.delete().where(this_launch, unheard_ends.c.rank.in_(heard)))
        known = set(conn.execute(sa.select(unheard_ends.c.rank).where(this_launch)).scalars())
        new = sorted(set(unheard) - known)  # the block may be retried: each step is idempotent
        if new:
            rows = [{"run_id": run_id, "rank": r, "attempt": attempt, "recorded_at": now} for r in new]
            conn.execute(unheard_ends.insert(), rows)


def _count_unstored(store: Store, run_id: int, spilled: int, lost: int) -> None:
    with store.begin() as conn:
        conn.execute(
            runs.update()
            .where(runs.c.id == run_id)
            .values(
                values_spilled=sa.func.coalesce(runs.c.values_spilled, 0) + spilled,
                values_lost=sa.func.coalesce(runs.c.values_lost, 0) + lost,
                # rank 0 may have ended the run already
                status=sa.case((runs.c.status == "success", "incomplete"), else_=runs.c.status),
            )
        )


def _whole() -> Any:
    """SQL: true when the run lacks nothing known: no value spilled or lost, and no rank whose end is
    unknown ("running": a rank writing the store itself that has not recorded its end, or cannot;
    "missing": a gather rank whose end never reached rank 0), in this launch or an earlier one
    (``unheard_ends``)."""
    unstored = sa.func.coalesce(runs.c.values_spilled, 0) + sa.func.coalesce(runs.c.values_lost, 0)
    unended = (
        sa.select(ranks.c.rank)
        .where(ranks.c.run_id == runs.c.id, ranks.c.status.in_(("running", "missing")))
        .exists()
    )
    unheard = sa.select(unheard_ends.c.rank).where(unheard_ends.c.run_id == runs.c.id).exists()
    return sa.and_(unstored == 0, ~unended, ~unheard)


def _end_run(store: Store, run_id: int, status: str, now: float) -> None:
    value: Any = status
    if status == "success":  # another rank (or an earlier phase) may have spilled or lost values
        value = sa.case((_whole(), "success"), else_="incomplete")
    with store.begin() as conn:
        conn.execute(runs.update().where(runs.c.id == run_id).values(status=value, ended_at=now))


def _settle_incomplete(store: Store, run_id: int) -> None:
    """A rank (not 0) that ended well after rank 0 recorded the run "incomplete" for want of it:
    the run is a success now if nothing else is lacking."""
    with store.begin() as conn:
        settled = conn.execute(
            runs.update().where(runs.c.id == run_id, runs.c.status == "incomplete", _whole()).values(status="success")
        ).rowcount
        if settled:  # rank 0 recorded its launch as the run stood then (run_lifecycle.end_attempt)
            conn.execute(
                attempts.update()
                .where(attempts.c.run_id == run_id, attempts.c.status == "incomplete")
                .values(status="success")
            )


def run_lacks_values(store: Store, run_id: int) -> tuple[int, int, int]:
    """(values_spilled, values_lost, ends never heard) the store records for the run: a rank
    end in ``unheard_ends`` may hold rows the store lacks, in a number nobody knows yet."""
    with store.begin() as conn:
        row = conn.execute(sa.select(runs.c.values_spilled, runs.c.values_lost).where(runs.c.id == run_id)).first()
        unheard = conn.execute(sa.select(sa.func.count()).where(unheard_ends.c.run_id == run_id)).scalar_one()
    return (0, 0, int(unheard)) if row is None else (row[0] or 0, row[1] or 0, int(unheard))


def final_status(status: str) -> str:
    """Lightning reports every exception as "failed": tell a preemption or Ctrl-C apart."""
    if status != "failed":
        return status
    exc = sys.exc_info()[1]
    if sigterm_received.is_set() or isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return "interrupted"
    return status


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return default
