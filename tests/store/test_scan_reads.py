"""The report's pass reads a SQLite store one key at a time, through ADBC's C driver where it is
installed (store/backends/sqlite_arrow.py), else through Python's sqlite3: whichever way, the
pass must see the same rows, so the page and `report` name the same ranks (the one verdict).

Over runs with planted faults (an outlier rank, a straggler, a NaN that spreads, one NaN in the
last row, a key logged every N steps, a constant key, a key NaN from its first row), the findings
through ADBC (in batches of a few rows: the driver infers a column's type from its first batch),
through sqlite3, and from the same rows in a DuckDB store are equal.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multirank_logger import open_store
from multirank_logger.report.findings import find
from multirank_logger.rows.schema import encode_value, metrics, ranks, runs
from multirank_logger.store.backends import sqlite_arrow
from multirank_logger.store.sql_store import Store
from tests.helpers.stores import keep_summaries

RANKS = 5


def _rows(seed: int, steps: int, outlier: int, nan_rank: int, nan_step: int, every: int) -> list[dict]:
    """A run of `RANKS` ranks with the faults the module docstring names."""
    rng = np.random.default_rng(seed)
    out = []
    for rank in range(RANKS):
        seq = 0
        for step in range(steps):
            call = {
                "loss": 1.0 + 0.1 * rng.standard_normal() + (3.0 if rank == outlier and step >= steps // 2 else 0.0),
                "grad": float("nan") if rank == nan_rank and step >= nan_step else rng.random(),  # spreads: stays NaN
                "lr": 0.1,  # constant, alike on every rank
                "dead": float("nan") if step < steps // 3 else rng.random(),  # NaN from its first row
                "last": float("nan") if (rank, step) == (RANKS - 1, steps - 1) else rng.random(),  # NaN in the last row
            }
            if step % every == 0:
                call["sparse"] = float(step % 7) + rng.random()
            for key, x in call.items():
                value, dtype = encode_value(x)
                out.append({"run_id": 1, "rank": rank, "seq": seq, "step": step, "key": key, "value": value,
                            "dtype": dtype, "time": 0.0})
            seq += 1
    return out


def _store(path: Path, rows: list[dict]) -> str:
    store = Store(str(path))
    now = time.time()
    with store.begin() as conn:
        conn.execute(sa.insert(runs), [{"id": 1, "name": "reads", "version": 0, "status": "success",
                                        "world_size": RANKS, "started_at": now}])
        conn.execute(sa.insert(ranks), [{"run_id": 1, "rank": r, "host": "h", "status": "success", "started_at": now}
                                        for r in range(RANKS)])
        conn.execute(sa.insert(metrics), rows)
        keep_summaries(conn, 1)
    store.close()
    return str(path)


def _verdict(db: str, *, arrow: bool | None = None) -> dict:
    """The findings the page and `report` show, as comparable plain data (`arrow`: how SQLite reads)."""
    with open_store(db) as reader:
        if arrow is not None:
            reader.store.backend.arrow_reads = arrow
        found = find(reader, 1)
    out = found.to_dict()
    return {name: out[name] for name in ("ranks", "outliers", "non_finite", "stragglers")}


def test_adbc_is_installed_for_the_tests() -> None:
    """The test extra installs the driver: the tests below read both ways, never one twice."""
    assert sqlite_arrow.available()


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**16), steps=st.integers(40, 160), outlier=st.integers(0, RANKS - 1),
       nan_rank=st.integers(0, RANKS - 1), nan_at=st.floats(0.5, 1.0), every=st.integers(1, 4))
def test_the_findings_are_the_same_whichever_way_sqlite_is_read(
    tmp_path_factory, monkeypatch, seed: int, steps: int, outlier: int, nan_rank: int, nan_at: float, every: int
) -> None:
    """ADBC in batches of 3 rows, sqlite3, and DuckDB over the same rows: equal findings."""
    monkeypatch.setattr(sqlite_arrow, "BATCH_ROWS", 3)
    root = tmp_path_factory.mktemp("reads")
    rows = _rows(seed, steps, outlier, nan_rank, min(steps - 1, math.floor(nan_at * steps)), every)
    sqlite, duckdb = _store(root / "runs.sqlite", rows), _store(root / "runs.duckdb", rows)
    through_adbc = _verdict(sqlite, arrow=True)
    assert through_adbc == _verdict(sqlite, arrow=False)
    assert through_adbc == _verdict(duckdb)
    assert [(o["key"], o["rank"]) for o in through_adbc["outliers"]] == [("loss", outlier)]
    assert {(n["key"], n["rank"]) for n in through_adbc["non_finite"]} >= {("grad", nan_rank), ("last", RANKS - 1)}


def test_every_double_comes_back_bit_for_bit(tmp_path: Path) -> None:
    """-0.0, subnormals, the largest doubles, +-inf and NaN (stored NULL) read through ADBC are
    sqlite3's values, bit for bit; a NULL first in a batch (the driver's type inference) too."""
    specials = [float("nan"), -0.0, 5e-324, -1.7976931348623157e308, 1.7976931348623157e308,
                float("inf"), float("-inf"), 0.1, 1 / 3, 2.0**60]
    rows = []
    for seq, x in enumerate(specials * 3):
        value, dtype = encode_value(x)
        rows.append({"run_id": 1, "rank": seq % RANKS, "seq": seq, "step": seq, "key": "k", "value": value,
                     "dtype": dtype, "time": 0.0})
    db = _store(tmp_path / "runs.sqlite", rows)
    stmt = sa.select(metrics.c.seq, metrics.c.value).where(metrics.c.run_id == 1)
    types = [np.int64, np.float64]
    with open_store(db) as reader, reader._connect() as conn:
        backend = reader.store.backend
        for batch_rows in (1, 4, 1_000):
            sqlite_arrow.BATCH_ROWS, before = batch_rows, sqlite_arrow.BATCH_ROWS
            try:
                got = [np.concatenate(c) for c in zip(*sqlite_arrow.arrow_chunks(backend._readonly_uri(backend.path), conn, stmt, types))]
            finally:
                sqlite_arrow.BATCH_ROWS = before
            backend.arrow_reads = False
            want = [np.concatenate(c) for c in zip(*backend.numpy_chunks(conn, stmt, types))]
            backend.arrow_reads = True
            order, want_order = np.argsort(got[0]), np.argsort(want[0])
            np.testing.assert_array_equal(got[0][order], want[0][want_order])
            assert got[1][order].tobytes() == want[1][want_order].tobytes()
