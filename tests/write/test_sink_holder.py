"""This rank's sink and how it ends (write/sink_holder.py, write/sinks.py): each kind of sink
answers the end's questions for itself, so finalize asks none of them which kind it is; a
dropped sink is set up again under the same run."""

from __future__ import annotations

import datetime
import threading
from pathlib import Path

import pytest
import torch.distributed as dist

from multirank_logger import MultiRankLogger
from multirank_logger.channel.row_channel import RowChannel
from multirank_logger.errors import StoreUnreachable
from multirank_logger.store.sql_store import Store
from multirank_logger.write.sinks import DirectSink, GatherReceiver, GatherSender
from tests.helpers.internals import run_of
from tests.helpers.launches import free_port
from tests.helpers.logger_helpers import query
from tests.helpers.processes import stopped, tcpstore_server_process


@pytest.fixture
def server() -> dist.TCPStore:
    """A launch's TCPStore, as rank 0 holds it."""
    return dist.TCPStore("127.0.0.1", free_port(), None, True, datetime.timedelta(seconds=10), wait_for_workers=False)


def test_each_sink_answers_for_its_end(server: dist.TCPStore, tmp_path: Path) -> None:
    """Direct and rank 0 of a gather run record their end, rank 0 its senders' too; a sender does
    not (its writer records it), holds no store, and reports what its writer counted."""
    store = Store(tmp_path / "runs.sqlite")
    run = store.create_run("ends", world_size=2)
    direct = DirectSink(store, run.id)
    receiver = GatherReceiver(store, run.id, RowChannel("t", 0, 2, host="127.0.0.1", port=server.port))
    sender = GatherSender(RowChannel("t", 1, 2, host="127.0.0.1", port=server.port), recorded=(3, 1))
    sinks = (direct, receiver, sender)
    assert [sink.records_end for sink in sinks] == [True, True, False]
    assert [sink.senders for sink in sinks] == [None, [1], None]
    assert [sink.store_for_end() for sink in sinks] == [store, store, None]
    assert [sink.recorded_by_writer for sink in sinks] == [None, None, (3, 1)]
    assert [sink.defer(lambda: None) for sink in sinks] == [True, True, False]  # a sender has no writer to defer to
    assert [sink.republish_facts() for sink in sinks] == [False, False, True]
    assert list(receiver.fetch_facts(5.0)) == [1]  # what the sender just published, for its row in `ranks`
    assert direct.fetch_facts(5.0) == sender.fetch_facts(5.0) == {}
    for sink in sinks:
        sink.close()
    store.close()


def test_a_store_refused_so_far_is_asked_again_at_the_end(tmp_path: Path) -> None:
    """A server that refused a rank's connection during the run: the end asks once more."""
    store = Store(tmp_path / "runs.sqlite")
    run = store.create_run("late", world_size=1)
    answers: list[Store | None] = [None, store]

    def open_store() -> Store:
        answer = answers.pop(0)
        if answer is None:
            raise StoreUnreachable("postgresql://db/runs", "too many clients")
        return answer

    sink = DirectSink(open_store, run.id)
    with pytest.raises(StoreUnreachable):
        sink.store_for_end()
    assert sink.store_for_end() is store
    store.close()


def test_a_dropped_sink_is_set_up_again_under_the_same_run(tmp_path: Path) -> None:
    """A finished phase drops its sink; the next phase's rows set up a fresh one for the same run."""
    db = tmp_path / "runs.sqlite"
    logger = MultiRankLogger(db=str(db), flush_interval=3600, watch=False)
    holder = run_of(logger).sink_holder
    logger.log_metrics({"a": 1.0}, step=0)
    assert logger.flush(timeout=30)
    first = holder.sink
    holder.drop()
    assert holder.sink is None
    logger.log_metrics({"a": 2.0}, step=1)
    assert logger.flush(timeout=30)
    assert holder.sink is not None and holder.sink is not first and holder.run_id == logger.run_id
    logger.finalize("success")
    assert query(db, "SELECT count(*) FROM ranks") == [(1,)]  # registered again, recorded once
    assert query(db, "SELECT step FROM metrics ORDER BY step") == [(0,), (1,)]


@pytest.mark.timeout(120)
def test_a_senders_side_rows_in_its_spill_file_leave_the_run_incomplete_until_imported(tmp_path: Path) -> None:
    """Rank 1's side rows could not reach rank 0 (its store stopped answering for a while): they go
    to rank 1's spill file, rank 1 reports them at its end with its values, and rank 0 counts them
    on rank 1's row in ``ranks``: the run is "incomplete", not "success", until the file is
    imported (before: the end report carried values only, and the run read "success")."""
    from multirank_logger.store.spill_file import SpillWriter
    from multirank_logger.store.spill_import import import_spill
    from multirank_logger.store.status import record_rank_end
    from multirank_logger.write.spiller import Spiller

    store = Store(tmp_path / "runs.sqlite")
    run = store.create_run("side", world_size=2)
    for rank in (0, 1):
        store.register_rank(run.id, rank)  # as rank 0 registers a gather run's ranks
    timing = [{"rank": 1, "seq": i, "step": i, "time": 1.0} for i in range(4)]
    with tcpstore_server_process() as (port, server):
        receiver = GatherReceiver(store, run.id, RowChannel("t", 0, 2, host="127.0.0.1", port=port, timeout=1.0))
        spill = SpillWriter(tmp_path / "spill", run_id=run.id, name="side", version=0, rank=1, run_uuid=run.uuid)
        spiller = Spiller(spill, str(tmp_path / "runs.sqlite"), 1)
        sender = GatherSender(RowChannel("t", 1, 2, host="127.0.0.1", port=port, timeout=1.0), spiller)
        receiver.receive()
        with stopped(server):
            sender.write_side({"step_timing": timing[:3]})  # times out: to the spill file
        assert spiller.side_rows_spilled == 3
        sender.write_side({"step_timing": timing[3:]})  # the store answers again: delivered

        def cycle() -> bool:
            batches, side = receiver.receive()
            for batch in batches:
                receiver.write(batch)
            for tables in side:
                receiver.write_side(tables)
            return True

        ending = threading.Thread(target=sender.finish, args=("success", 30.0, cycle))
        ending.start()
        others = receiver.finish("success", 30.0, cycle)
        ending.join(60)
        assert others == {1: "success"} and receiver.others_side_spilled == {1: 3}
        assert sender.side_recorded_by_writer == 3  # rank 0 took the report: a later phase reports what follows
        record_rank_end(store, run.id, rank=0, gather_world=2, status="success", others=others, facts={},
                        others_side_rows_spilled=receiver.others_side_spilled)
        receiver.close()
        sender.close()
    db = tmp_path / "runs.sqlite"
    assert query(db, "SELECT status FROM runs") == [("incomplete",)]
    assert query(db, "SELECT rank, side_rows_spilled FROM ranks ORDER BY rank") == [(0, None), (1, 3)]
    assert query(db, "SELECT step FROM step_timing ORDER BY step") == [(3,)]
    import_spill(store, spiller.path)
    store.close()
    assert query(db, "SELECT status FROM runs") == [("success",)]
    assert query(db, "SELECT rank, side_rows_spilled FROM ranks ORDER BY rank") == [(0, None), (1, 0)]
    assert query(db, "SELECT step FROM step_timing ORDER BY step") == [(0,), (1,), (2,), (3,)]
