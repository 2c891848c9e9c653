"""A store of 12 ranks with chosen places: three hosts (node1: ranks 0-3, node2: 4-7, node3: 8-11),
GPUs 0-3 on each. Every rank of node2 straggles in its data wait from step 10; every rank of
node3 has a NaN loss from step 25; rank 2 alone a NaN grad_norm from step 30."""

from __future__ import annotations

import math
import time

from tests.helpers.stores import keep_summaries

RANKS, STEPS, PER_HOST = 12, 40, 4


SLOW_HOST, NAN_HOST, ONE_RANK = 1, 2, 2  # node2 straggles, node3 NaNs, rank 2's grad_norm


def host_of(rank: int) -> str:
    """The host of `rank`: node1, node2 or node3."""
    return f"node{rank // PER_HOST + 1}"


def gpu_uuid(rank: int) -> str:
    """The GPU UUID `rank` drives."""
    return f"GPU-00000000-0000-0000-0000-{rank:012d}"


def build_places_store(db: str) -> str:
    """The 12-rank store of the module doc, in the store `db`."""
    import sqlalchemy as sa

    from multirank_logger.rows.schema import encode_value, metrics, ranks, runs, step_timing
    from multirank_logger.store.sql_store import Store

    now = time.time()

    def data_s(r: int, s: int) -> float:
        return 0.2 if r // PER_HOST == SLOW_HOST and s >= 10 else 0.010 + 0.0005 * r

    def value(r: int, s: int, key: str) -> float:
        if key == "loss":
            return math.nan if r // PER_HOST == NAN_HOST and s >= 25 else 1.0 + 0.01 * r
        return math.nan if r == ONE_RANK and s >= 30 else 0.5 + 0.01 * r

    store = Store(db)
    try:
        with store.begin() as conn:
            conn.execute(sa.insert(runs), [{"id": 1, "name": "places", "version": 0, "status": "success",
                                            "world_size": RANKS, "started_at": now}])
            conn.execute(sa.insert(ranks), [
                {"run_id": 1, "rank": r, "host": host_of(r), "node_rank": r // PER_HOST, "local_rank": r % PER_HOST,
                 "gpu_index": r % PER_HOST, "gpu_name": "NVIDIA H200", "gpu_uuid": gpu_uuid(r), "dp_rank": r,
                 "status": "success", "started_at": now, "ended_at": now + 5}
                for r in range(RANKS)
            ])
            conn.execute(sa.insert(step_timing), [
                {"run_id": 1, "rank": r, "seq": s, "step": s, "data_s": data_s(r, s), "forward_s": 0.02,
                 "rest_s": 0.05, "batch_size": 8, "rss": 400 * 2**20, "time": now + s}
                for r in range(RANKS) for s in range(STEPS)
            ])
            conn.execute(sa.insert(metrics), [
                {"run_id": 1, "rank": r, "seq": 2 * s + i, "step": s, "key": key, "value": v, "dtype": dtype, "time": now}
                for r in range(RANKS) for s in range(STEPS) for i, key in enumerate(("loss", "grad_norm"))
                for v, dtype in [encode_value(value(r, s, key))]
            ])
            keep_summaries(conn, 1)
    finally:
        store.close()
    return db
