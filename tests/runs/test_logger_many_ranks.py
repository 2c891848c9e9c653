"""8 ranks writing one SQLite file at once (transport="direct"): no lock error, no row lost.

Eight plain processes over gloo (tests/scripts/logger_many_ranks.py) rather than eight Lightning
ranks: the same store traffic, without eight Trainers on a 2-core machine.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.launches import forkserver, spawn_ranks
from tests.helpers.logger_helpers import query, ranks_stderr
from tests.scripts.logger_many_ranks import rank_main, value

pytestmark = pytest.mark.timeout(240)
WORLD = 8
CALLS = 300
JOIN_TIMEOUT_S = 150


def test_eight_ranks_write_one_sqlite_file_directly(tmp_path: Path) -> None:
    db, out = tmp_path / "runs.sqlite", tmp_path / "out"
    out.mkdir()
    ctx = forkserver("tests.scripts.logger_many_ranks")
    args = (str(db), CALLS, str(out), "direct", 1, None, None, True)  # stderr to out/rank{r}.err
    assert spawn_ranks(rank_main, WORLD, *args, join_s=JOIN_TIMEOUT_S, ctx=ctx) == [0] * WORLD
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert {(r["transport"], r["run_id"]) for r in reports} == {("direct", 1)}
    assert "database is locked" not in ranks_stderr(out)
    counts = query(db, "SELECT rank, count(*) FROM metrics WHERE key = 'value' GROUP BY rank ORDER BY rank")
    assert counts == [(r, CALLS) for r in range(WORLD)]
    for r in range(WORLD):
        rows = query(db, "SELECT step, value FROM metrics WHERE rank = :r AND key = 'value' ORDER BY seq", r=r)
        assert rows == [(c, value(r, c)) for c in range(CALLS)]
    assert query(db, "SELECT count(*) FROM ranks WHERE status = 'success'") == [(WORLD,)]
    assert query(db, "SELECT status, transport, world_size FROM runs") == [("success", "direct", WORLD)]
