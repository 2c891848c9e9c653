"""Small stores built row by row, read by the tests of more than one layer: `fill_loss_rows` (one
run, LOSS_ROWS steps of `loss`), `fill_side_store` (a 3-rank run with decisions, logs, step
timing and NaN/inf metrics), `ragged_store` (5 ranks with missing steps, NaN/inf, a departure)."""

from __future__ import annotations

import math

import numpy as np
import sqlalchemy as sa

from multirank_logger.rows.schema import encode_value, metrics
from multirank_logger.store.sql_store import Store
from multirank_logger.write.buffer import RecordBuffer
from tests.helpers.stores import keep_summaries

LOSS_ROWS = 20


def fill_loss_rows(db: str) -> None:
    """One run of one rank in the store `db`: `loss` at steps 0 to LOSS_ROWS - 1."""
    store = Store(db)
    run = store.create_run("lightning_logs", world_size=1)
    buffer = RecordBuffer()
    for step in range(LOSS_ROWS):
        buffer.append(step, {"loss": float(step)})
    store.write(buffer.drain(run.id, 0))
    store.close()


def fill_side_store(db: str) -> str:
    """One 3-rank run in the store `db`: decisions the ranks split on, warnings and an error,
    step timing where rank 0's RSS is twice the others', and metrics with a NaN, an inf and a -inf."""
    import time

    import sqlalchemy as sa

    from multirank_logger.rows.schema import decisions, encode_value, logs, metrics, ranks, runs, step_timing
    from multirank_logger.store.sql_store import Store

    now = time.time()
    store = Store(db)
    with store.begin() as conn:
        conn.execute(sa.insert(runs), [{"id": 1, "name": "side", "version": 0, "status": "success", "world_size": 3,
                                        "started_at": now}])
        conn.execute(sa.insert(ranks), [{"run_id": 1, "rank": r, "host": "h", "status": "success",
                                         "started_at": now, "ended_at": now + 5} for r in range(3)])
        conn.execute(sa.insert(decisions), [
            {"run_id": 1, "rank": r, "seq": seq, "step": 10 * (seq + 1), "callback": "ModelCheckpoint",
             "monitor": "val_loss", "value": 1.0 + r, "vote": vote, "decision": False, "time": now}
            for seq, votes in enumerate([(True, True, True), (True, False, False)]) for r, vote in enumerate(votes)
        ])
        conn.execute(sa.insert(logs), [
            {"run_id": 1, "rank": r, "seq": s, "time": now + s - r / 10, "level": level, "levelno": no, "logger": "train",
             "message": msg}
            for r in range(3) for s, (level, no, msg) in enumerate([("INFO", 20, "epoch done"),
                                                                    ("WARNING", 30, "slow batch")])
        ] + [{"run_id": 1, "rank": 2, "seq": 9, "time": now + 9, "level": "ERROR", "levelno": 40,
              "logger": "train", "message": "CUDA error"}])
        conn.execute(sa.insert(step_timing), [
            {"run_id": 1, "rank": r, "seq": s, "step": s, "data_s": 0.001, "forward_s": 0.01, "rest_s": 0.01,
             "batch_size": 8, "rss": (2 if r == 0 else 1) * 400 * 2**20, "time": now + s}
            for r in range(3) for s in range(20)
        ])
        conn.execute(sa.insert(metrics), [
            {"run_id": 1, "rank": r, "seq": s, "step": s, "key": key, "value": v, "dtype": dtype, "time": now}
            for r in range(3) for s in range(20)
            for key, x in (("loss", float("nan") if (r, s) in ((1, 7), (1, 9)) else 1.0),
                           ("grad", float("inf") if (r, s) == (2, 3) else float("-inf") if (r, s) == (2, 5) else 0.5))
            for v, dtype in [encode_value(x)]
        ])
        keep_summaries(conn, 1)
    store.close()
    return db


def ragged_store(db: str) -> int:
    """5 ranks x 47 steps x 3 keys: NaN, +inf and -inf; rank 4 misses some steps and logs key "c"
    never; key "b" ends at step 30; rank 2 departs on "a"."""
    store = Store(db)
    run = store.create_run("ragged", world_size=5)
    rng = np.random.default_rng(3)
    rows, seq = [], dict.fromkeys(range(5), 0)
    for step in range(47):
        for rank in range(5):
            if rank == 4 and step % 5 == 2:
                continue
            for key in ("a", "b", "c"):
                if (key == "b" and step > 30) or (key == "c" and rank == 4):
                    continue
                x = float(rng.standard_normal()) + (4.0 if (key, rank) == ("a", 2) else 0.0)
                x = {(1, 9): math.nan, (3, 20): math.inf, (0, 33): -math.inf}.get((rank, step), x) if key == "a" else x
                v, dtype = encode_value(x)
                rows.append({"run_id": run.id, "rank": rank, "seq": seq[rank], "step": step, "key": key, "value": v,
                             "dtype": dtype, "time": 0.0})
                seq[rank] += 1
    with store.begin() as conn:
        conn.execute(sa.insert(metrics), rows)
        keep_summaries(conn, run.id)
    store.close()
    return run.id
