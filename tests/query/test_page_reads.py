"""What the page asks the store for (``StoreReader.run_headers``, ``run_status``, ``timing_series``,
``rank_nodes``, ``bucket_summary``), on real SQLite and DuckDB files: the reads ``ui/views.py``
shapes into its answers, without a query of its own."""

from __future__ import annotations

from pathlib import Path

from multirank_logger import open_store
from multirank_logger.query.step_buckets import TIMING_SERIES
from multirank_logger.store.sql_store import Store
from multirank_logger.write.buffer import RecordBuffer

STEPS = 40


def _store(db: Path) -> tuple[int, int]:
    """Two runs: 'trained' (3 ranks: two on host h0, one known by its node rank alone; StepTimer's
    data_s and rss; stopped by StopOnAlert at step 30; ended) and 'bare' (nothing logged)."""
    store = Store(db)
    try:
        trained = store.create_run("trained", world_size=3, transport="gather")
        bare = store.create_run("bare", world_size=1)
        nodes = [{"host": "h0", "node_rank": 0}, {"host": "h0", "node_rank": 0}, {"node_rank": 1}]
        for rank, facts in enumerate(nodes):
            store.register_rank(trained.id, rank, status="success", **facts)
            buffer = RecordBuffer()
            for step in range(STEPS):
                buffer.append(step, {"loss": 1.0 / (step + 1) + rank})
            store.write(buffer.drain(trained.id, rank))
        store.write_side({
            "step_timing": [{"run_id": trained.id, "rank": r, "seq": s, "step": s, "data_s": 0.01, "rss": 1000 + s,
                             "time": 1.7e9 + s} for r in range(3) for s in range(5)],
            "decisions": [{"run_id": trained.id, "rank": 0, "seq": 0, "step": 30, "callback": "StopOnAlert",
                           "monitor": "departure:loss:rank 2", "vote": True, "decision": True, "time": 1.7e9}],
        })
        store.update_run(trained.id, status="success", ended_at=1.8e9)
    finally:
        store.close()
    return trained.id, bare.id


def test_run_headers_list_each_run_newest_first_with_its_nodes_last_step_and_stop(db_path: Path) -> None:
    trained, bare = _store(db_path)
    with open_store(db_path) as reader:
        listed = reader.run_headers()
        only = reader.run_headers(only=trained)
        assert reader.run_headers(only=bare + 1) == []
    assert [r["id"] for r in listed] == [bare, trained]
    assert listed[1] == only[0]
    row = only[0]
    facts = (row["name"], row["status"], row["world_size"], row["transport"], row["ended_at"])
    assert facts == ("trained", "success", 3, "gather", 1.8e9)
    assert row["n_nodes"] == 2  # h0, and node 1 known by its node rank alone
    assert row["last_step"] == STEPS - 1 and row["last_time"] is not None
    assert row["stopped_by"] == "stopped by StopOnAlert at step 30 (departure alert: rank 2, loss)"
    assert [listed[0][name] for name in ("n_nodes", "last_step", "last_time", "stopped_by")] == [None] * 4


def test_status_timing_series_nodes_and_buckets_of_a_run_id(db_path: Path) -> None:
    trained, bare = _store(db_path)
    with open_store(db_path) as reader:
        assert [reader.run_status(i) for i in (trained, bare, bare + 1)] == ["success", "running", None]
        assert reader.timing_series(trained, TIMING_SERIES) == ["timing:data_s", "timing:rss"]  # in the order asked
        assert reader.timing_series(trained, ["timing:rss", "timing:data_s"]) == ["timing:rss", "timing:data_s"]
        assert reader.timing_series(bare, TIMING_SERIES) == []
        assert sorted(reader.rank_nodes(trained), key=lambda r: r["rank"]) == [
            {"rank": r, "node_rank": n, "host": h, "gpu_index": None, "gpu_name": None, "mesh": None}
            for r, n, h in [(0, 0, "h0"), (1, 0, "h0"), (2, 1, None)]]
        assert reader.rank_nodes(bare) == []
        summary = reader.bucket_summary(trained, "loss")
        assert summary.ranks == [0, 1, 2] and summary.series == "loss"
        assert reader.bucket_summary(trained, "timing:rss").ranks == [0, 1, 2]
