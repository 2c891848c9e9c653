"""A store of RUNS runs built directly (runs, ranks and kept findings rows; no metric row) for the
hosts ledger: 4 ranks a run, two on each of two hosts. ``gpu-bad`` takes every 4th run and is
named as a straggler in 40 of its 50 (4 of its last 5); ``gpu-once`` takes 50 others and is named
once (a NaN, run 102); the last run kept a verdict in each of two launches."""

from __future__ import annotations

import datetime

RUNS = 200


T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc).timestamp()


def hosts_of(i: int) -> list[str]:
    """The host of each of run i's 4 ranks."""
    first = f"node{i % 10:02d}"
    second = "gpu-bad" if i % 4 == 0 else "gpu-once" if i % 4 == 1 else f"node{(i + 5) % 10:02d}"
    return [first, first, second, second]


def build_ledger_store(db: str, runs: int = RUNS) -> str:
    """The ledger's store of the module doc, `runs` runs, in the store `db`."""
    import sqlalchemy as sa

    from multirank_logger.rows.schema import SEQ_ATTEMPT_SHIFT, findings, ranks
    from multirank_logger.rows.schema import runs as runs_table
    from multirank_logger.store.sql_store import Store

    def finding(i: int, rank: int, kind: str, seq: int = 0) -> dict[str, object]:
        return {"run_id": i + 1, "rank": rank, "seq": seq, "kind": kind, "series": "timing:data_s", "first_step": 10,
                "origin": True, "origin_step": 10, "value": 0.1, "detail": "{}", "sentence": f"rank {rank} {kind}",
                "found_at": T0 + i * 3600 + 60}

    named = [finding(i, 2, "straggler") for i in range(runs) if i % 4 == 0 and i % 20 != 0]
    named.append(finding(101, 3, "non_finite"))
    last = runs - 1  # a resumed run: launch 0 named rank 0 (node09), launch 1 rank 2 (node04)
    named += [finding(last, 0, "memory"), finding(last, 2, "straggler", seq=1 << SEQ_ATTEMPT_SHIFT)]
    store = Store(db)
    try:
        with store.begin() as conn:
            conn.execute(sa.insert(runs_table), [
                {"id": i + 1, "name": "ledger", "version": i, "status": "success", "world_size": 4,
                 "started_at": T0 + i * 3600} for i in range(runs)])
            conn.execute(sa.insert(ranks), [
                {"run_id": i + 1, "rank": r, "host": host, "node_rank": r // 2, "local_rank": r % 2,
                 "status": "success", "started_at": T0 + i * 3600}
                for i in range(runs) for r, host in enumerate(hosts_of(i))])
            conn.execute(sa.insert(findings), named)
    finally:
        store.close()
    return db
