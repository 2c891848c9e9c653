"""Exactly once without an index over every row: per (run, rank), the seq ranges stored.

A metric row is identified by (run_id, rank, seq, key). A unique index on those columns
cost 82% of a DuckDB store's bytes (52.3 against 9.6 B/row) and made its inserts ~2.3x
dearer (benchmarks/RESULTS.md, scale). Instead, ``metric_spans`` holds, per (run, rank), the
seq ranges that may hold stored rows: a few rows per rank, grown as the rank's calls arrive.

Every insert of metric rows (`Store.write`, a spill import) goes through `insert_metrics_once`:

- the batch's seq range of each rank is looked up in ``metric_spans``, under a lock per (run,
  rank) where writers may overlap (PostgreSQL: `Backend.lock_seq_spans`; SQLite and DuckDB
  write one transaction at a time already);
- no overlap (a rank's next calls, the usual case): the rows go in as they are;
- an overlap (a batch retried after a commit its writer never saw, a spill file imported
  again, a call cut in two between batches): the rows of the overlapping seqs that the store
  holds already, by (rank, seq, key), are read back and left out; the others go in;
- the ranges are then extended (or a new one added) to cover what was inserted;
- the inserted rows' summaries go in beside them (store/step_summaries.py).

The spans only ever cover more than is stored, never less, so a row stored once is always
found before it could be stored again. Two spans of one launch with calls between them (or a
launch's first span that starts past its first call) are calls never stored: `calls_not_stored`. Rows inserted behind the store's back (raw SQL) are
not covered: on SQLite the primary key still refuses them, elsewhere they are not checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import sqlalchemy as sa

from multirank_logger.rows.batch import column_lists, take_rows
from multirank_logger.rows.schema import SEQ_ATTEMPT_SHIFT, metric_spans, metrics
from multirank_logger.store.step_summaries import insert_summaries

__all__ = ["CallsNotStored", "calls_not_stored", "insert_metrics_once"]


def insert_metrics_once(conn: sa.Connection, backend: Any, batch: Any) -> int:
    """Insert a metric batch (`batch.METRICS_SCHEMA`) exactly once, on an open transaction: the
    rows the store does not hold yet, their step summaries, and their seq ranges. Returns the
    rows inserted."""
    if len(batch) == 0:
        return 0
    run_id, rank, seq = (np.asarray(c) for c in column_lists(batch, ("run_id", "rank", "seq")))
    ranges = _ranges(run_id, rank, seq)
    backend.lock_seq_spans(conn, list(ranges))  # until the commit: no other writer reads these spans meanwhile
    stored = _overlapping_spans(conn, ranges)
    if stored:
        batch = _without_stored_rows(conn, batch, ranges, stored)
    if len(batch):
        backend.insert_metrics(conn, metrics, batch)
        insert_summaries(conn, backend, batch)  # of exactly the rows inserted: they never disagree
        _record(conn, ranges, stored)
    return len(batch)


def _ranges(run_id: np.ndarray, rank: np.ndarray, seq: np.ndarray) -> dict[tuple[int, int], tuple[int, int]]:
    """(run_id, rank) -> (lowest seq, highest seq) in the batch."""
    if run_id.min() == run_id.max() and rank.min() == rank.max():
        # one rank's batch (the usual case): no sort of every row's pair (np.unique along an axis)
        return {(int(run_id[0]), int(rank[0])): (int(seq.min()), int(seq.max()))}
    out: dict[tuple[int, int], tuple[int, int]] = {}
    pairs = np.stack([run_id, rank], axis=1)
    for run, r in np.unique(pairs, axis=0).tolist():
        mine = seq[(run_id == run) & (rank == r)]
        out[(run, r)] = (int(mine.min()), int(mine.max()))
    return out


def _overlapping_spans(
    conn: sa.Connection, ranges: dict[tuple[int, int], tuple[int, int]]
) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """The stored spans that overlap or touch each (run, rank)'s range (touching: to extend them)."""
    spans = metric_spans.c
    found: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for run_id in {run for run, _ in ranges}:
        ranks_ = sorted(r for run, r in ranges if run == run_id)
        low = min(ranges[(run_id, r)][0] for r in ranks_)
        high = max(ranges[(run_id, r)][1] for r in ranks_)
        rows = conn.execute(
            sa.select(spans.rank, spans.first_seq, spans.last_seq).where(
                spans.run_id == run_id, spans.rank.in_(ranks_), spans.last_seq >= low - 1, spans.first_seq <= high + 1
            )
        )
        for r, first, last in rows:
            lo, hi = ranges[(run_id, r)]
            if last >= lo - 1 and first <= hi + 1:
                found.setdefault((run_id, int(r)), []).append((int(first), int(last)))
    return found


def _without_stored_rows(
    conn: sa.Connection,
    batch: Any,
    ranges: dict[tuple[int, int], tuple[int, int]],
    stored: dict[tuple[int, int], list[tuple[int, int]]],
) -> Any:
    """`batch` minus the rows whose (run, rank, seq, key) the store holds, read back only where a
    stored span overlaps the batch's range."""
    held: set[tuple[int, int, int, str]] = set()
    keys: list[str] | None = None
    for (run_id, r), spans in stored.items():
        lo, hi = ranges[(run_id, r)]
        for first, last in spans:
            start, stop = max(lo, first), min(hi, last)
            if start > stop:
                continue  # only touching (the usual case: a rank's next calls): nothing stored in the batch's range
            if keys is None:
                # the batch's keys name the rows to read back: SQLite's table is clustered on (run_id, key,
                # rank, seq), so a read by rank and seq alone would walk every row of the run
                keys = _keys_of(batch.column("key"))
            rows = conn.execute(
                sa.select(metrics.c.seq, metrics.c.key).where(
                    metrics.c.run_id == run_id, metrics.c.key.in_(keys), metrics.c.rank == r,
                    metrics.c.seq.between(start, stop),
                )
            )
            held.update((run_id, r, int(s), k) for s, k in rows)
    if not held:
        return batch
    batch_rows = zip(*column_lists(batch, ("run_id", "rank", "seq", "key")))
    keep = np.fromiter((row not in held for row in batch_rows), np.bool_, len(batch))
    return take_rows(batch, keep)


def _keys_of(column: Any) -> list[str]:
    """The distinct keys of a batch's key column: its dictionary (a superset: a cut batch keeps the
    whole dictionary), not a Python str per row."""
    if isinstance(column, pa.DictionaryArray):
        return sorted(set(column.dictionary.to_pylist()))
    return sorted(set(column.to_pylist()))


def _record(
    conn: sa.Connection,
    ranges: dict[tuple[int, int], tuple[int, int]],
    stored: dict[tuple[int, int], list[tuple[int, int]]],
) -> None:
    """Cover each (run, rank)'s range: merged with the spans it overlaps or touches, or new.
    Two statements whatever the ranks (executemany): one per rank was 2,048 at 1,024 ranks."""
    spans = metric_spans.c
    merged, replaced = [], []
    for (run_id, r), (lo, hi) in ranges.items():
        touching = stored.get((run_id, r), [])
        first = min([lo] + [f for f, _ in touching])
        last = max([hi] + [s for _, s in touching])
        replaced += [{"r_run": run_id, "r_rank": r, "r_first": f} for f, _ in touching]
        merged.append({"run_id": run_id, "rank": r, "first_seq": first, "last_seq": last})
    if replaced:
        conn.execute(
            metric_spans.delete().where(
                spans.run_id == sa.bindparam("r_run"), spans.rank == sa.bindparam("r_rank"),
                spans.first_seq == sa.bindparam("r_first"),
            ),
            replaced,
        )
    conn.execute(metric_spans.insert(), merged)


@dataclass(frozen=True)
class CallsNotStored:
    """A rank's log calls of one launch that the store lacks, with later calls of that launch stored."""

    rank: int
    attempt: int
    first_call: int
    last_call: int

    @property
    def calls(self) -> int:
        return self.last_call - self.first_call + 1

    def __str__(self) -> str:
        calls = f"call {self.first_call}" if self.calls == 1 else f"calls {self.first_call}-{self.last_call}"
        return (f"rank {self.rank}, launch {self.attempt}: {calls} not in the store, later ones are (never stored: "
                "the process was killed, or they were lost; or in a spill file not imported yet)")


def calls_not_stored(conn: sa.Connection, run_id: int) -> list[CallsNotStored]:
    """The holes in each rank's calls, launch by launch, that the seq spans show (a call is a seq,
    numbered from its launch's base). Calls after a launch's last stored one cannot show here."""
    spans = metric_spans.c
    rows = conn.execute(
        sa.select(spans.rank, spans.first_seq, spans.last_seq).where(spans.run_id == run_id)
        .order_by(spans.rank, spans.first_seq)
    )
    out: list[CallsNotStored] = []
    previous: tuple[int, int, int] | None = None  # (rank, attempt, last call)
    for rank, first, last in rows:
        attempt, first_call, last_call = int(first) >> SEQ_ATTEMPT_SHIFT, _call(first), _call(last)
        before = previous[2] if previous is not None and previous[:2] == (rank, attempt) else -1
        if first_call > before + 1:
            out.append(CallsNotStored(int(rank), attempt, before + 1, first_call - 1))
        previous = (rank, attempt, last_call)
    return out


def _call(seq: int) -> int:
    return int(seq) & ((1 << SEQ_ATTEMPT_SHIFT) - 1)
