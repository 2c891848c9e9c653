"""Run, rank and launch statuses: the one place that decides them, and whether a run is whole.

A run (``runs.status``), each of its launches (``attempts.status``) and each rank
(``ranks.status``) is ``running`` until its end is recorded:

- ``success``, ``failed``, ``interrupted`` (a preemption, Ctrl-C: `final_status`), as reported;
- ``incomplete``: a run (or launch) that ended in success but is not *whole* (`run_is_whole`):
  values went to spill files or were lost, or a rank's end was never heard. Importing the spill
  files settles it back to ``success`` (`settle_imported`, `settle_rank`);
- ``missing``: a gather rank whose end never reached rank 0 (or a rank still ``running`` when a
  new launch began);
- ``vanished``: an earlier launch still ``running`` when a new one began (`close_earlier_launches`).

A rank's end the store does not know is *unended*: its row says ``running`` or ``missing``, or
(an earlier launch's, which the ranks table no longer shows) it is kept in ``unheard_ends``.

Every transition takes the store (anything with `StatusStore`'s methods: ``sql_store.Store``) or
an open connection; none retries while the store is locked: the caller wraps the call in
``sql_store.retry_while_locked`` (each transition is idempotent, so a retry repeats it whole).
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import sqlalchemy as sa

from multirank_logger.errors import DamagedStore, NotADatabase
from multirank_logger.rows.schema import attempts, metrics, ranks, runs, unheard_ends

__all__ = [
    "FAILED",
    "INCOMPLETE",
    "INTERRUPTED",
    "MISSING",
    "RUNNING",
    "SUCCESS",
    "UNENDED",
    "VANISHED",
    "StatusStore",
    "close_earlier_launches",
    "count_off_side_rows",
    "end_at_exit",
    "end_attempt",
    "ends_unknown",
    "exit_status",
    "final_status",
    "keep_unheard",
    "rank_end_unknown",
    "read_back_run",
    "record_rank_end",
    "run_is_whole",
    "run_lacks_values",
    "settle_imported",
    "settle_rank",
]

RUNNING = "running"
SUCCESS = "success"
FAILED = "failed"
#: a preemption (SIGTERM) or Ctrl-C: not the training's own failure
INTERRUPTED = "interrupted"
#: the run ended in success, but lacks values (spill files, lost) or a rank's end
INCOMPLETE = "incomplete"
#: a rank whose end never reached the rank that records it
MISSING = "missing"
#: an earlier launch still ``running`` when a new one begins: it stopped without recording any end
#: (SIGKILL, the OOM killer, a node lost, a scheduler's kill after its grace period). "vanished",
#: not "killed": the store saw it go silent, not why.
VANISHED = "vanished"
#: a rank's row whose end the store does not know
UNENDED = (RUNNING, MISSING)


class StatusStore(Protocol):
    """What the transitions use of a store (``sql_store.Store`` has it)."""

    def begin(self) -> AbstractContextManager[sa.Connection]: ...

    def writing(self) -> AbstractContextManager[Any]: ...

    def update_rank(self, run_id: int, rank: int, *, where_status: str | None = None, **values: Any) -> None: ...

    def update_run(self, run_id: int, *, where_status: str | None = None, **values: Any) -> None: ...


# -- the rule: is the run whole? ---------------------------------------------------------------


def _unended_rank() -> Any:
    """SQL, for the ``runs`` row of the query: a rank of the run whose end the store does not know
    ("running": a rank writing the store itself that has not recorded its end, or cannot;
    "missing": a gather rank whose end never reached rank 0)."""
    return sa.and_(ranks.c.run_id == runs.c.id, ranks.c.status.in_(UNENDED))


def _unheard_end() -> Any:
    """SQL: an earlier launch's rank of the run whose end was never heard (``unheard_ends``)."""
    return unheard_ends.c.run_id == runs.c.id


def run_is_whole() -> Any:
    """SQL, for the ``runs`` row of the query: true when the run lacks nothing known: no value
    spilled or lost, and no rank whose end is unknown, in this launch or an earlier one."""
    unstored = sa.func.coalesce(runs.c.values_spilled, 0) + sa.func.coalesce(runs.c.values_lost, 0)
    unended = sa.select(ranks.c.rank).where(_unended_rank()).exists()
    unheard = sa.select(unheard_ends.c.rank).where(_unheard_end()).exists()
    side_spilled = sa.select(ranks.c.rank).where(ranks.c.run_id == runs.c.id, ranks.c.side_rows_spilled > 0).exists()
    return sa.and_(unstored == 0, ~unended, ~unheard, ~side_spilled)


def ends_unknown() -> Any:
    """SQL, for the ``runs`` row of the query: how many rank ends the store never heard, as the
    query side shows it: the unended ranks of a run that is over (a running run's ranks are still
    to end), plus the unheard ends the ranks table does not show. Rank 0 keeps a gather rank it
    did not hear in ``unheard_ends`` under its launch *and* marks its row ``missing``: one end,
    counted once (it was counted twice)."""
    unended = sa.select(sa.func.count()).where(_unended_rank()).scalar_subquery()
    latest = sa.select(sa.func.max(attempts.c.attempt)).where(attempts.c.run_id == runs.c.id).scalar_subquery()
    shown = sa.select(ranks.c.rank).where(_unended_rank(), ranks.c.rank == unheard_ends.c.rank).exists()
    unheard = (
        sa.select(sa.func.count())
        .where(_unheard_end(), ~sa.and_(unheard_ends.c.attempt == latest, shown))
        .scalar_subquery()
    )
    return sa.case((runs.c.status == RUNNING, 0), else_=unended) + unheard


def run_lacks_values(store: StatusStore, run_id: int) -> tuple[int, int, int]:
    """(values_spilled, values_lost, ends never heard) the store records for the run: a rank
    end in ``unheard_ends`` may hold rows the store lacks, in a number nobody knows yet."""
    with store.begin() as conn:
        row = conn.execute(sa.select(runs.c.values_spilled, runs.c.values_lost).where(runs.c.id == run_id)).first()
        unheard = conn.execute(sa.select(sa.func.count()).where(unheard_ends.c.run_id == run_id)).scalar_one()
    return (0, 0, int(unheard)) if row is None else (row[0] or 0, row[1] or 0, int(unheard))


#: what the drivers say of a damaged file (DuckDB: a block's checksum; SQLite: a malformed image)
_DAMAGE = re.compile(r"checksum|corrupt|malformed", re.IGNORECASE)


def read_back_run(store: StatusStore, run_id: int) -> str | None:
    """Read every stored row of the run back, every column, before its end is recorded as a
    success: a store damaged during the run (bytes overwritten in a block of the metrics table)
    took the writes and said nothing, and only reading the blocks checks them (DuckDB verifies a
    block's checksum as it reads it). Aggregates that no statistic answers (a count or a min/max
    may come from metadata alone) make the database read each column's values.

    One scan of the run's rows (its other runs' row groups skipped by the run_id filter): 1.5 to
    2 s for 51.2M rows on DuckDB, 2 loaded cores (a bare count took 1 ms: metadata, no block read).

    Returns:
        What the store said when it could not read the rows back (damaged), else None; None too
        for any other failure (a reader holds the store, the file was deleted or replaced): the
        end's own writes meet it and wait or spill as they do.
    """
    parity = [sa.func.sum(col % 2) for col in (metrics.c.seq, metrics.c.step, metrics.c.dtype, metrics.c.rank)]
    checks = sa.select(
        sa.func.count(), *parity,
        sa.func.sum(sa.func.length(metrics.c.key)),
        sa.func.sum(sa.case((metrics.c.value > 0, 1), else_=0)),
        sa.func.sum(sa.case((metrics.c.time > 0, 1), else_=0)),
    ).where(metrics.c.run_id == run_id)
    try:
        with store.begin() as conn:
            conn.execute(checks).all()
    except Exception as exc:  # noqa: BLE001 - only damage is this check's to report
        # a store deleted or replaced meanwhile (no table), a reader holding it: not damage, and
        # the end's own writes meet it and spill as they do
        text = str(exc).strip()
        if isinstance(exc, (DamagedStore, NotADatabase)) or _DAMAGE.search(text):
            return text.splitlines()[0] if text else repr(exc)
    return None


# -- the status a process reports --------------------------------------------------------------


def final_status(status: str, *, terminated: bool) -> str:
    """Lightning reports every exception as "failed": tell a preemption (`terminated`: SIGTERM
    received) or Ctrl-C apart, by the exception being handled."""
    if status != FAILED:
        return status
    exc = sys.exc_info()[1]
    if terminated or isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return INTERRUPTED
    return status


def exit_status(exc: BaseException) -> str:
    """The status of a run never finalized, at exit after the uncaught `exc`."""
    return INTERRUPTED if isinstance(exc, KeyboardInterrupt) else FAILED


# -- a run's end -------------------------------------------------------------------------------


def record_rank_end(
    store: StatusStore,
    run_id: int,
    *,
    rank: int,
    gather_world: int,
    status: str,
    others: dict[int, str],
    facts: dict[int, dict[str, Any]],
    now: float | None = None,
    values_spilled: int = 0,
    values_lost: int = 0,
    side_rows_spilled: int = 0,
    others_side_rows_spilled: Mapping[int, int] | None = None,
    attempt: int | None = None,
    senders: Sequence[int] | None = None,
) -> None:
    """Write how the run ended for this rank and, on a rank that received other ranks' rows
    (rank 0 in gather mode, ``gather_world > 1``; a node's writer, `senders`), for each of them:
    the status it reported (`MISSING` when it did not) and its facts (this rank's own, too,
    where `facts` has them).

    Values this rank put in its spill file or lost are added to the run's ``values_spilled`` /
    ``values_lost``; a run with any is never recorded as "success" but as "incomplete", whichever
    rank finalizes last (importing the spill files brings it back: `settle_imported`). So is a
    gather run with a rank whose end never reached rank 0 (what it did not deliver is unknown
    here: its spill file, imported, records it). At a success, such a rank is also kept in
    ``unheard_ends`` under this launch's `attempt`, so that a later launch (``test`` after
    ``fit``), which registers the rank again, cannot make the run a success before that file is
    imported. So do side-table rows this rank put in its spill file (an alert, the verdict, log lines
    the store refused at the end): added to this rank's ``side_rows_spilled``, counted off by the
    import of its file; and those its senders reported in theirs (`others_side_rows_spilled`, by rank:
    added to each sender's row).

    All of it on one connection (each DuckDB open costs CPU, whatever the write). Each step is
    idempotent: the caller retries the whole on a busy store (``retry_while_locked``), with the
    `now` it took before the first try (default: the time of this call)."""
    now = time.time() if now is None else now
    with store.writing():
        received = list(range(1, gather_world) if senders is None and rank == 0 else senders or ())
        store.update_rank(run_id, rank, **facts.get(rank, {}), status=status, ended_at=now)
        for other in received:
            values = {**facts.get(other, {}), "status": others.get(other, MISSING), "ended_at": now}
            store.update_rank(run_id, other, **values)
        if attempt is not None and received and status == SUCCESS:
            # a success takes every heard rank's report, which covers what that rank's earlier
            # phases of this launch did not get counted (sinks.GatherSender). A launch that did not
            # succeed keeps none: a resume supersedes its last rows, as it does a vanished launch's
            # (close_earlier_launches)
            heard = [o for o in received if o in others]
            unheard = [o for o in received if o not in others]
            with store.begin() as conn:
                keep_unheard(conn, run_id, attempt, unheard, now, heard=heard)
        if values_spilled or values_lost:
            with store.begin() as conn:
                _count_spilled_lost(conn, run_id, values_spilled, values_lost)
        side_spilled = {rank: side_rows_spilled}
        side_spilled.update((o, n) for o, n in (others_side_rows_spilled or {}).items() if o in received)
        if any(side_spilled.values()):
            with store.begin() as conn:
                for spilling, rows in side_spilled.items():
                    if rows:
                        _count_side_spilled(conn, run_id, spilling, rows)
        with store.begin() as conn:
            if rank == 0 or status != SUCCESS:
                # a failing rank marks the run too: rank 0 may be stuck in a collective and never finalize
                missing = rank == 0 and any(other not in others for other in received)
                _end_run(conn, run_id, INCOMPLETE if missing and status == SUCCESS else status, now)
            else:
                # a rank (not 0) that ended well after rank 0 recorded the run "incomplete" for want of it
                _settle_incomplete(conn, run_id)


def keep_unheard(
    conn: sa.Connection, run_id: int, attempt: int, unheard: Iterable[int], now: float, *, heard: Iterable[int] = ()
) -> None:
    """Keep the ends of launch `attempt`'s `unheard` ranks in ``unheard_ends`` (once each); drop the
    `heard` ones (a later phase's report counted what the earlier phase's did not)."""
    this_launch = sa.and_(unheard_ends.c.run_id == run_id, unheard_ends.c.attempt == attempt)
    heard = list(heard)
    if heard:
        conn.execute(unheard_ends.delete().where(this_launch, unheard_ends.c.rank.in_(heard)))
    known = set(conn.execute(sa.select(unheard_ends.c.rank).where(this_launch)).scalars())
    new = sorted(set(unheard) - known)  # a block may be retried: each step is idempotent
    if new:
        rows = [{"run_id": run_id, "rank": r, "attempt": attempt, "recorded_at": now} for r in new]
        conn.execute(unheard_ends.insert(), rows)


def _count_side_spilled(conn: sa.Connection, run_id: int, rank: int, rows: int) -> None:
    """`rows` more side-table rows of `rank` in its spill file: the run lacks them (`run_is_whole`)."""
    side = ranks.c.side_rows_spilled
    conn.execute(ranks.update().where(ranks.c.run_id == run_id, ranks.c.rank == rank)
                 .values(side_rows_spilled=sa.func.coalesce(side, 0) + rows))
    _success_now_incomplete(conn, run_id)


def count_off_side_rows(conn: sa.Connection, run_id: int, rank: int, rows: int) -> None:
    """`rows` side-table rows of `rank`'s spill file are in the store now: counted off its
    ``side_rows_spilled`` (never below 0); `settle_imported` then settles the run."""
    if rows:
        side = ranks.c.side_rows_spilled
        conn.execute(ranks.update().where(ranks.c.run_id == run_id, ranks.c.rank == rank, side > 0)
                     .values(side_rows_spilled=sa.case((side > rows, side - rows), else_=0)))


def _count_spilled_lost(conn: sa.Connection, run_id: int, spilled: int, lost: int) -> None:
    conn.execute(
        runs.update()
        .where(runs.c.id == run_id)
        .values(
            values_spilled=sa.func.coalesce(runs.c.values_spilled, 0) + spilled,
            values_lost=sa.func.coalesce(runs.c.values_lost, 0) + lost,
        )
    )
    _success_now_incomplete(conn, run_id)


def _success_now_incomplete(conn: sa.Connection, run_id: int) -> None:
    """What a rank ending after rank 0 just counted (values or side rows in a spill file, values
    lost) leaves the run lacking: a run rank 0 already recorded a success is incomplete now."""
    conn.execute(runs.update().where(runs.c.id == run_id, runs.c.status == SUCCESS).values(status=INCOMPLETE))


def _end_run(conn: sa.Connection, run_id: int, status: str, now: float) -> None:
    value: Any = status
    if status == SUCCESS:  # another rank (or an earlier phase) may have spilled or lost values
        value = sa.case((run_is_whole(), SUCCESS), else_=INCOMPLETE)
    conn.execute(runs.update().where(runs.c.id == run_id).values(status=value, ended_at=now))


def _settle_incomplete(conn: sa.Connection, run_id: int) -> None:
    """A run "incomplete" that lacks nothing now is a success, and so are its launches recorded
    "incomplete" (as the run stood at their end: `end_attempt`)."""
    settles = runs.c.id == run_id, runs.c.status == INCOMPLETE, run_is_whole()
    # asked first: DuckDB reports no rowcount for an UPDATE
    if conn.execute(sa.select(sa.exists().where(*settles))).scalar():
        conn.execute(runs.update().where(*settles).values(status=SUCCESS))
        conn.execute(
            attempts.update().where(attempts.c.run_id == run_id, attempts.c.status == INCOMPLETE).values(status=SUCCESS)
        )


def end_at_exit(
    store: StatusStore, run_id: int, *, rank: int, senders: Iterable[int], status: str, now: float, attempt: int | None
) -> None:
    """At exit after an uncaught exception, for a run never finalized: only what is still running
    ends (a ddp_spawn parent never finalizes, its workers did): this rank's row as `status`, the
    gather `senders`' rows as `MISSING` (their end never reached rank 0), and on rank 0 the run
    and this launch."""
    with store.writing():
        store.update_rank(run_id, rank, where_status=RUNNING, status=status, ended_at=now)
        for other in senders:
            store.update_rank(run_id, other, where_status=RUNNING, status=MISSING, ended_at=now)
        if rank == 0:
            store.update_run(run_id, where_status=RUNNING, status=status, ended_at=now)
            if attempt is not None:
                end_attempt(store, run_id, attempt, status)


# -- launches ----------------------------------------------------------------------------------


def close_earlier_launches(conn: sa.Connection, run_id: int) -> None:
    """A new launch of `run_id` begins: launches of a run follow one another, so the earlier one
    is gone. Its attempts still ``running`` become `VANISHED` (their ``ended_at`` stays unknown),
    and ranks still ``running`` become `MISSING`, as at a run's end.

    A rank still ``running`` in a launch that ended well (rank 0 recorded "success", or
    "incomplete" for want of that rank) never recorded its own end (its store was unwritable):
    what it did not store is in its spill file only, so it is kept in ``unheard_ends``, which
    the new launch's registering the rank again does not clear. A launch that was interrupted or
    failed keeps none: what its ranks logged last is what a resume logs again, as for a vanished
    launch."""
    previous = conn.execute(
        sa.select(attempts.c.attempt, attempts.c.status)
        .where(attempts.c.run_id == run_id)
        .order_by(attempts.c.attempt.desc())
        .limit(1)
    ).first()
    if previous is not None and previous.status in (SUCCESS, INCOMPLETE):
        unrecorded = conn.execute(sa.select(ranks.c.rank).where(ranks.c.run_id == run_id, ranks.c.status == RUNNING))
        keep_unheard(conn, run_id, int(previous.attempt), unrecorded.scalars().all(), time.time())
    conn.execute(
        attempts.update().where(attempts.c.run_id == run_id, attempts.c.status == RUNNING).values(status=VANISHED)
    )
    conn.execute(ranks.update().where(ranks.c.run_id == run_id, ranks.c.status == RUNNING).values(status=MISSING))


def end_attempt(store: StatusStore, run_id: int, attempt: int, status: str) -> None:
    """Record how this launch ended: as the run's end was recorded (a run whose ranks went
    missing is not a success), else `status`."""
    recorded = sa.select(runs.c.status).where(runs.c.id == run_id, runs.c.status != RUNNING).scalar_subquery()
    with store.begin() as conn:
        conn.execute(
            attempts.update()
            .where(attempts.c.run_id == run_id, attempts.c.attempt == attempt)
            .values(status=sa.func.coalesce(recorded, status), ended_at=time.time())
        )


# -- importing spill files ---------------------------------------------------------------------


def settle_rank(conn: sa.Connection, run_id: int, rank: int, end: dict[str, Any], attempt: int | None) -> str | None:
    """A spill file's rank, whose end the store never heard (`UNENDED`: gather rank 0 did not, or
    the rank could not write the store at its end; or in ``unheard_ends`` for the file's launch,
    which a later launch registered again): record the last end its file holds (`end`), and count
    the values it spilled (this file's, taken off again by `settle_imported`) and lost in the run.
    That end's counts cover every earlier phase whose counts the run lacks (spill_file.py's
    header), unless the end says rank 0 ``counted`` them already.

    Returns:
        The rank's status, when its end was unknown; None when the store knew its end already.
    """
    current, row_unended, unheard = _end_unknown(conn, run_id, rank, attempt)
    ended_at = end.get("ended_at") if isinstance(end.get("ended_at"), (int, float)) else None  # format 5 on
    if not current and rank == 0:  # that launch did end: the store, never told, took it for one that vanished
        conn.execute(attempts.update().where(attempts.c.run_id == run_id, attempts.c.attempt == attempt,
                                             attempts.c.status == VANISHED).values(status=end["status"]))
    if not (row_unended or unheard):
        return None  # the store heard its end, and counted its values then (record_rank_end)
    if current and rank == 0 and attempt is not None:  # the launch's end its rank 0 could not record (end_attempt)
        ended = INCOMPLETE if end["status"] == SUCCESS else end["status"]  # a success once whole (_settle_incomplete)
        conn.execute(attempts.update().where(attempts.c.run_id == run_id, attempts.c.attempt == attempt,
                                             attempts.c.status == RUNNING).values(status=ended, ended_at=ended_at))
    this_launch = sa.and_(unheard_ends.c.run_id == run_id, unheard_ends.c.rank == rank, unheard_ends.c.attempt == attempt)
    if unheard:
        conn.execute(unheard_ends.delete().where(this_launch))
    if row_unended:
        conn.execute(ranks.update().where(ranks.c.run_id == run_id, ranks.c.rank == rank)
                     .values(status=end["status"], ended_at=sa.func.coalesce(ranks.c.ended_at, ended_at)))
        _settle_heard_ranks(conn, run_id, end.get("others"))
    if end.get("counted"):
        end = {**end, "values_spilled": 0, "values_lost": 0}  # in the run's totals already
    if not current:  # a later launch owns the run's status now: only the counts are this file's
        run_status: Any = runs.c.status
    elif end["status"] in (FAILED, INTERRUPTED):  # a rank that failed, as rank 0 would have recorded had it heard
        run_status = sa.case((runs.c.status.in_((INCOMPLETE, RUNNING)), end["status"]), else_=runs.c.status)
    elif rank == 0:  # rank 0 could not record the run's end: it is over, whole or not (settle_imported)
        run_status = sa.case((runs.c.status == RUNNING, INCOMPLETE), else_=runs.c.status)
    else:
        run_status = runs.c.status
    conn.execute(
        runs.update()
        .where(runs.c.id == run_id)
        .values(
            values_spilled=sa.func.coalesce(runs.c.values_spilled, 0) + int(end.get("values_spilled", 0)),
            values_lost=sa.func.coalesce(runs.c.values_lost, 0) + int(end.get("values_lost", 0)),
            status=run_status,
            # rank 0's end is the run's: when it ended, as record_rank_end would have written it
            ended_at=sa.func.coalesce(runs.c.ended_at, ended_at) if current and rank == 0 else runs.c.ended_at,
        )
    )
    return str(end["status"])


def rank_end_unknown(conn: sa.Connection, run_id: int, rank: int, attempt: int | None) -> bool:
    """Whether the store lacks the end of launch `attempt`'s `rank` (what `settle_rank` records from
    a spill file): the values that rank spilled are then not in the run's ``values_spilled`` yet."""
    _, row_unended, unheard = _end_unknown(conn, run_id, rank, attempt)
    return row_unended or unheard


def _end_unknown(conn: sa.Connection, run_id: int, rank: int, attempt: int | None) -> tuple[bool, bool, bool]:
    """(whether `attempt` is the run's latest launch, whether the rank's row is that launch's and
    unended, whether the rank's end for `attempt` is kept in ``unheard_ends``)."""
    latest = conn.execute(sa.select(sa.func.max(attempts.c.attempt)).where(attempts.c.run_id == run_id)).scalar()
    # the ranks row is the file's launch's unless a later launch registered the rank again
    current = attempt is None or latest is None or int(attempt) == int(latest)
    status = conn.execute(sa.select(ranks.c.status).where(ranks.c.run_id == run_id, ranks.c.rank == rank)).scalar()
    this_launch = sa.and_(unheard_ends.c.run_id == run_id, unheard_ends.c.rank == rank, unheard_ends.c.attempt == attempt)
    unheard = attempt is not None and bool(conn.execute(sa.select(sa.exists().where(this_launch))).scalar())
    return current, current and status in UNENDED, unheard


#: the facts of a rank's end that a spill file's "others" may set in its ``ranks`` row
_RANK_FACTS = ("status", "host", "pid", "local_rank", "node_rank", "gpu_index", "gpu_name", "gpu_uuid", "dp_rank", "slurm_node", "mesh")


def _settle_heard_ranks(conn: sa.Connection, run_id: int, others: Any) -> None:
    """Gather rank 0's end in its spill file (it could not write the store at its end) holds the
    ends it heard from the ranks whose rows it wrote: record each whose row is still unended."""
    if not isinstance(others, dict):
        return
    for rank, heard in others.items():
        if not isinstance(heard, dict) or not isinstance(heard.get("status"), str):
            continue
        values = {k: v for k, v in heard.items() if k in _RANK_FACTS}
        conn.execute(
            ranks.update()
            .where(ranks.c.run_id == run_id, ranks.c.rank == int(rank), ranks.c.status.in_(UNENDED))
            .values(**values)
        )


def settle_imported(conn: sa.Connection, run_id: int, values: int) -> None:
    """`values` spilled values are in the store now: count them off the run's ``values_spilled``;
    a run left "incomplete" only for want of them (no value lost, no rank whose end is unknown,
    no side-table row in a spill file) is a success again (only a run that ended in success is
    recorded as incomplete)."""
    before = conn.execute(sa.select(runs.c.values_spilled).where(runs.c.id == run_id)).scalar_one()
    spilled = max((before or 0) - values, 0)
    if spilled != (before or 0):
        conn.execute(runs.update().where(runs.c.id == run_id).values(values_spilled=spilled))
    _settle_incomplete(conn, run_id)
