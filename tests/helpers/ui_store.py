"""The ui tests' store: 16 ranks on two hosts x 300 steps x 3 keys (DuckDB), rank OUTLIER's `loss` 3
above the others from the middle step on, rank NAN_RANK's `loss` NaN at NAN_STEP."""

from __future__ import annotations

import time
from pathlib import Path

from tests.helpers.stores import summaries_of

RANKS, STEPS, KEYS = 16, 300, ("loss", "lr", "weight_norm")


OUTLIER, NAN_RANK, NAN_STEP = 11, 4, 200


def build_store(path: Path) -> Path:
    """The 16-rank store of the module doc (raw DuckDB bulk insert under the logger's schema)."""
    import duckdb

    from multirank_logger.rows.schema import DTYPE_NAN, METRIC_COLUMNS
    from multirank_logger.store.sql_store import Store

    store = Store(path)
    run = store.create_run("ui_test", world_size=RANKS, transport="gather")
    for rank in range(RANKS):
        node = rank // 8
        store.register_rank(
            run.id, rank, local_rank=rank % 8, node_rank=node, host=f"host{node}", pid=0, status="success"
        )
    store.update_run(run.id, status="success", ended_at=time.time())
    store.close()
    keys = ", ".join(f"'{k}'" for k in KEYS)
    cols = ", ".join(f'"{c}"' for c in METRIC_COLUMNS)
    con = duckdb.connect(str(path))
    con.execute("SELECT setseed(0.25)")
    con.execute(f"""INSERT INTO metrics ({cols})
        SELECT {run.id}, r.range::INTEGER, s.range * {len(KEYS)} + k.i, s.range, k.key, random(), 0, 1.7e9 + s.range
        FROM range({RANKS}) r, range({STEPS}) s, (SELECT unnest([{keys}]) AS key, generate_subscripts([{keys}], 1) AS i) k""")
    con.execute(
        f"UPDATE metrics SET value = value + 3 WHERE rank = {OUTLIER} AND key = 'loss' AND step >= {STEPS // 2}"
    )
    con.execute(
        f"UPDATE metrics SET value = NULL, dtype = {DTYPE_NAN} WHERE rank = {NAN_RANK} AND step = {NAN_STEP} AND key = 'loss'"
    )
    for sql in summaries_of(run.id, bit_or=True):
        con.execute(sql)
    con.close()
    return path
