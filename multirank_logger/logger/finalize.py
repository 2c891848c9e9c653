"""The end of this process's part in a run (rank_run.RankRun): what ``MultiRankLogger.finalize`` does.

Flush the rows, let the sink finish (a sender waits for rank 0 to take its last rows; rank 0
receives the others'), record how the run ended (store/status.py's `record_rank_end`, retried while
the store is busy), end the attempt, and on rank 0 after a success write CSVLogger's files
(csv_logger_files.py). Never a collective and never an unbounded wait: with ``"failed"`` a
peer may be dead. Nothing here raises over Lightning's own error (`safely`).

It sits above the run: it imports RankRun, and nothing the run imports comes back here. The
end of a run whose process dies without `finalize` is process_registry.py's; a process that
exits normally without it is ended by `finish_run` too (given to the registry below).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from multirank_logger._util.best_effort import bounded, safely
from multirank_logger._util.dist_env import current_rank
from multirank_logger.channel.rank_facts import FACTS_WAIT_S, rank_facts
from multirank_logger.errors import StoreLocked
from multirank_logger.logger.process_registry import end_normally_with
from multirank_logger.logger.rank_run import RankRun
from multirank_logger.store.sql_store import Store, retry_while_locked
from multirank_logger.store.status import (
    FAILED,
    MISSING,
    SUCCESS,
    end_attempt,
    final_status,
    read_back_run,
    record_rank_end,
)
from multirank_logger.store.write_errors import describe
from multirank_logger.write import process_hooks
from multirank_logger.write.sink_holder import SinkHolder
from multirank_logger.write.sink_protocol import SinkEnd

__all__ = ["FAILED_TIMEOUT", "finish_run"]

log = logging.getLogger(__name__)
#: the longest a failing rank spends on the store or the channel in finalize("failed")
FAILED_TIMEOUT = 5.0
#: the longest the watch's last judgement may take at the run's end (its thread is left after it)
WATCH_END_S = 10.0


def finish_run(run: RankRun, status: str) -> None:
    """Flush everything, record how the run ended, and (rank 0, success) write the CSV files."""
    run.finalized = True
    run.capture_logs(False)  # what it kept is flushed below
    logged, sink_holder = run.logged, run.sink_holder
    started = time.monotonic()
    status = final_status(status, terminated=process_hooks.sigterm_received.is_set())
    timeout = run.settings.timeout if status == SUCCESS else min(run.settings.timeout, FAILED_TIMEOUT)
    if logged.buffer.calls_pending and sink_holder.sink is None:
        safely(sink_holder.setup)
    logged.writer.stop(timeout)  # from here on only this thread writes
    logged.live = False
    process_hooks.release_sigterm()  # the handler from before ours, once no writer needs it
    bound = run.settings.finalize_bound(timeout)
    left = max(bound - (time.monotonic() - started), 1.0)
    try:
        if sink_holder.sink is None or run.identity is None:
            bounded(lambda: _end_unset_run(run, status, timeout), left, "the end of the run")
        else:
            bounded(lambda: _end_with_sink(run, status, timeout), left, "the end of the run")
            run.phase += 1
            sink_holder.drop()  # a later fit/test sets up again, on a fresh channel
    except TimeoutError:
        _give_up(run, status, bound)
    finally:
        safely(run.stop_watch)  # an end that never reached the last rows (no sink, a store that stopped answering)
        run.board.withdraw()  # the launch is over: leave no variable behind in this process
        safely(run.board.close)  # nor a connection: a later phase (test after fit) opens its own
        if run.store is not None:
            run.store.close()  # the idle connections (the file's descriptors); a later phase reconnects


end_normally_with(finish_run)  # a script that exits without finalize (Fabric's) ends its runs as finalize would


def _end_with_sink(run: RankRun, status: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout  # the end's waits share `timeout`
    with _held(run.store, timeout):  # store: None on a rank that only sends
        _finish_sink(run, status, timeout, deadline)


def _give_up(run: RankRun, status: str, bound: float) -> None:
    """The end did not return within its bound: a store call that never answers (a server stopped
    or cut off mid-call: libpq has no read timeout). What was not written goes to the spill file
    now, with how this rank ended (`status`): importing the file records that end, else the run
    stayed 'running' for good. The job goes on ending; the stuck call is left behind in its thread
    (should it still record the end, the import leaves the end it finds)."""
    writer = run.logged.writer
    error = writer.last_error
    writer.spill_held(
        f"the end of the run did not finish within {bound:g} s: the store stopped answering"
        + (f" ({describe(error)})" if error is not None else ""),
        timeout=0.0,
    )
    spiller = run.sink_holder.spiller
    if spiller is not None:  # only where it spilled: a rank with nothing in its file has no file
        spiller.end(status, *_not_yet_recorded(run.sink_holder))
    where = f" The rows not stored are in {spiller.path}: {spiller.import_command()}" if spiller is not None and (
        spiller.values_spilled or spiller.side_rows_spilled) else ""
    log.error(
        "multirank_logger: the end of the run did not finish within %g s (finalize_timeout): the store "
        "stopped answering, and its row may still say 'running'.%s", bound, where,
    )
    run.sink_holder.drop()


def _finish_sink(run: RankRun, status: str, timeout: float, deadline: float) -> None:
    """The end with a sink: its last rows, the other ranks' ends, the run's row, the files.
    Whatever the sink's kind, the same calls: it answers for itself (write/sink_protocol.py)."""
    holder, writer = run.sink_holder, run.logged.writer
    sink: SinkEnd | None = holder.sink  # the end asks only its part of the protocol
    assert sink is not None and run.identity is not None

    def left() -> float:
        return max(deadline - time.monotonic(), 1.0)

    def cycle() -> bool:
        return writer.flush(timeout, now=False)  # receive; write when due

    writer.flush(timeout)
    others = safely(lambda: sink.finish(status, timeout, cycle)) or {}
    if run.watch is not None:  # rank 0: every rank's last rows are in; the watch judges them, to the last step
        writer.flush_until(max(deadline, time.monotonic() + 1.0))
        # direct and node: the other ranks write their own last rows; their ends say they have (bounded)
        ends_wait = min(left(), WATCH_END_S) / 2 if status == SUCCESS else 0.0
        safely(lambda: run.stop_watch(min(left(), WATCH_END_S), final=True, ends_wait=ends_wait),
               "the watch's last judgement")
    # its alerts' rows, those rank 0 received while finishing, and rows a busy store refused so far
    if not writer.flush_until(max(deadline, time.monotonic() + 1.0)):
        error = writer.last_error
        writer.spill_held(
            f"the store did not take these rows by the end of the run ({describe(error) if error else 'busy'})",
            timeout=left(),
        )
    # the ranks whose rows this rank received (gather rank 0; a node's writer): it records their ends
    senders = sink.senders
    facts: dict[int, dict[str, Any]] = safely(lambda: sink.fetch_facts(min(timeout, FACTS_WAIT_S))) or {}
    if (senders is not None and holder.rank != 0) or holder.place_changed:
        # a node's writer was registered by rank 0, without them; a place that changed after registration
        facts[holder.rank] = rank_facts(holder.rank)
    store = safely(sink.store_for_end, "opening the store for the run's end") if sink.records_end else None
    sink.close()  # rank 0: the last acknowledgements; every rank: the channel's socket
    if sink.recorded_by_writer is not None:
        holder.own_recorded = sink.recorded_by_writer  # what rank 0 took into the run's totals
    if sink.side_recorded_by_writer is not None:
        holder.side_rows_recorded = sink.side_recorded_by_writer  # ...and counted on this rank's row
    gather_world = holder.world if sink.transport == "gather" else 0
    end = _End(run, status, others, facts, senders, gather_world, sink.others_spilled_lost,
               dict(sink.others_side_spilled), left)
    if store is not None and _store_still_there(sink):
        _record_end(end, store)
    elif store is None and sink.records_end and holder.spiller is not None:  # the store never opened (a server refusing it)
        log.error("multirank_logger: rank %d never reached the store: its end is in its spill file only.", holder.rank)
        holder.spiller.end(status, *end.spilled_lost())
    spiller = holder.spiller
    summary = spiller.summary() if spiller is not None else None
    if spiller is not None and summary:
        spiller.say(summary)


@dataclasses.dataclass
class _End:
    """What this rank records at its end: its status and what its sink learnt of the others."""

    run: RankRun
    status: str
    others: dict[int, str]  # the status of each sender whose end is known
    facts: dict[int, dict[str, Any]]
    senders: list[int] | None
    gather_world: int  # the world of a gather run (its rank 0 records the senders), else 0
    #: (spilled, lost) values the senders reported this phase
    reported: tuple[int, int]
    #: side-table rows each sender reported in its spill file this phase
    others_side: dict[int, int]
    left: Callable[[], float]  # seconds left of the end's bound

    def others_spilled_lost(self) -> tuple[int, int]:
        """The senders' (spilled, lost) values: this phase's reports, and those of an earlier phase
        whose end could not be recorded (acknowledged to them: they will not report them again)."""
        earlier = self.run.sink_holder.others_pending
        return self.reported[0] + earlier[0], self.reported[1] + earlier[1]

    def spilled_lost(self) -> tuple[int, int]:
        """Every (spilled, lost) value this end adds to the run's row: this rank's and the senders'."""
        (spilled, lost), (others_spilled, others_lost) = _not_yet_recorded(self.run.sink_holder), self.others_spilled_lost()
        return spilled + others_spilled, lost + others_lost


def _record_end(end: _End, store: Store) -> None:
    """This rank's end (and its senders') in the store; on rank 0 the attempt's end and the CSV files."""
    run, holder = end.run, end.run.sink_holder
    assert run.identity is not None
    run_id, status = run.identity.run.id, end.status
    if status == SUCCESS and holder.rank == 0:
        status = _success_if_readable(store, run_id, status)
    spilled, lost = end.spilled_lost()
    # side-table rows (an alert, the verdict, log lines) in the spill file since the last end
    # recorded: the run lacks them until the file is imported (record_rank_end says so)
    side_total = holder.spiller.side_rows_spilled if holder.spiller is not None else 0
    side_spilled = side_total - holder.side_rows_recorded

    def record() -> bool:
        now = time.time()  # one end time, whatever the retries
        retry_while_locked(lambda: record_rank_end(
            store, run_id, rank=holder.rank, gather_world=end.gather_world, status=status, others=end.others,
            facts=end.facts, now=now, values_spilled=spilled, values_lost=lost, side_rows_spilled=side_spilled,
            others_side_rows_spilled=end.others_side, attempt=run.attempt, senders=end.senders,
        ), min(end.left(), 5.0))
        return True

    if safely(record, "recording the run's end"):
        holder.own_recorded, holder.others_pending = holder.spilled_lost(), (0, 0)
        holder.side_rows_recorded = side_total
    else:
        log.error("multirank_logger: the run's end could not be recorded: the store still says 'running'.")
        holder.others_pending = end.others_spilled_lost()
        if holder.spiller is not None:  # importing the spill file records it (spill_import.import_spill)
            # with the ends rank 0 heard from the ranks whose rows it wrote: else they stay
            # "running" after the import, though they ended well (issue 38 point 6)
            heard = {r: {**end.facts.get(r, {}), "status": end.others.get(r, MISSING)} for r in end.senders or ()}
            holder.spiller.end(status, spilled, lost, others=heard)
    if holder.rank == 0 and run.attempt is not None:
        attempt = run.attempt
        safely(lambda: retry_while_locked(lambda: end_attempt(store, run_id, attempt, status), 5),
               "recording this launch's end (attempts)")
    if holder.rank == 0 and status == SUCCESS and run.settings.export_csv:
        run.files.export_if_complete(store, run_id, end.left())


def _success_if_readable(store: Store, run_id: int, status: str) -> str:
    """Rank 0's success stands only if the store gives the run's rows back: a store damaged during
    the run took every write and said nothing (it ended "success", no spill, exit 0). Recorded
    "failed", not "incomplete": an import or a later rank's end settles an incomplete run back to
    success once nothing is counted missing, and what a damaged block lost is counted nowhere."""
    if not store.backend.rows_read_back_show_damage:
        return status
    damage = read_back_run(store, run_id)
    if damage is None:
        return status
    log.error(
        "multirank_logger: the store %s cannot read this run's rows back (%s): it was damaged during the "
        "run, and values written to it may be gone. The run is recorded as failed, not success. Keep the "
        "file as it is, restore it from a copy if you have one, and log the next run to another file.",
        store.url.render_as_string(hide_password=True), damage,
    )
    return FAILED


def _store_still_there(sink: SinkEnd) -> bool:
    def check() -> bool:
        sink.check_store()
        return True

    return bool(safely(check, "checking the store file"))


def _not_yet_recorded(sink_holder: SinkHolder) -> tuple[int, int]:
    """(spilled, lost) values of this rank not yet added to the run's row."""
    (spilled, lost), (s0, l0) = sink_holder.spilled_lost(), sink_holder.own_recorded
    return spilled - s0, lost - l0


@contextlib.contextmanager
def _held(store: Store | None, timeout: float) -> Iterator[None]:
    """One connection for the end of the run, where each write would open the file again.

    Opening a DuckDB file costs far more than a small write, and the end takes five or more
    writes (last rows, the other ranks' rows, the run's status, the export). Readers
    wait meanwhile: normally a fraction of a second, at most the bounded wait for ranks that do
    not finish. If a reader holds the file now, each step opens it on its own, with its own retries.
    """
    with contextlib.ExitStack() as stack:
        if store is not None and store.backend.opens_per_transaction:
            with contextlib.suppress(StoreLocked):
                retry_while_locked(lambda: stack.enter_context(store.writing()), min(timeout, 5.0))
        yield


def _end_unset_run(run: RankRun, status: str, timeout: float) -> None:
    """finalize before any sink: a run rank 0 allocated and nothing was logged to."""
    run.logged.writer.flush(timeout)
    if run.identity is not None and current_rank() == 0 and run.store is not None:
        store, run_id = run.store, run.identity.run.id
        safely(lambda: retry_while_locked(lambda: store.update_run(run_id, status=status, ended_at=time.time()), 5))
        if status == SUCCESS and run.settings.export_csv:
            run.files.export_if_complete(store, run_id)
