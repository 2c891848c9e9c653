"""Ctrl-C stops `multirank-logger report` (a real SIGINT to a real process) within seconds, exit
130, one line saying so, no traceback (issue 38 point 8). Before, the report's pass over the rows
(query/run_scan.py: reader threads on connections of their own) ran on to its end.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from multirank_logger.errors import ReadsStopped
from multirank_logger.model.schema import METRIC_COLUMNS
from multirank_logger.store.backends.base import driver_connection
from multirank_logger.store.sql_store import Store
from tests.test_sql_stops import _wait_until_reading

#: the big store's shape: rows enough that the report's pass takes several seconds on 2 cores
RANKS, STEPS, KEYS = 16, 40_000, 4


def big_store(db: Path, ranks: int = RANKS, steps: int = STEPS, keys: int = KEYS) -> Path:
    """A finished run of ``ranks x steps x keys`` rows, inserted by the engine itself in one
    statement (seconds, where the logger's path takes minutes)."""
    store = Store(db)
    run = store.create_run("lightning_logs", world_size=ranks)
    store.update_run(run.id, status="success")
    cols = ", ".join(f'"{c}"' for c in METRIC_COLUMNS)
    if db.suffix == ".duckdb":
        numbers, r, s, k = "", f"range({ranks}) r(i)", f"range({steps}) s(i)", f"range({keys}) k(i)"
    else:  # SQLite: a counting CTE per dimension; keys, ranks, then seq: its primary key's order
        count = "{0}(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM {0} WHERE i < {1})"
        numbers = f"WITH RECURSIVE {count.format('r', ranks - 1)}, {count.format('s', steps - 1)}, {count.format('k', keys - 1)} "
        r, s, k = "r", "s", "k"
    # seq = step * keys + key: each (rank, key, step) a call of its own, in call order
    sql = (f"INSERT INTO metrics ({cols}) {numbers}"
           f"SELECT {run.id}, r.i, s.i * {keys} + k.i, s.i, 'metric_' || k.i, (s.i % 97) * 0.01 + r.i * 0.001, 0, "
           f"1.7e9 + s.i * 0.01 FROM {k}, {r}, {s}")  # fmt: skip
    with store.begin() as conn:
        driver_connection(conn).execute(sql)
    store.close()
    return db


#: ranks of the big store per backend: DuckDB reads its rows several times faster than SQLite
BIG_RANKS = {".sqlite": 32, ".duckdb": 128}
#: a stopped report must end within this after SIGINT (it stops in well under a second unloaded)
STOPS_WITHIN_S = 3.0


@pytest.fixture(scope="module", params=[".sqlite", ".duckdb"])
def big(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store whose report takes several seconds (SQLite ~10 s, DuckDB ~3 s on an idle core)."""
    suffix = request.param
    return big_store(tmp_path_factory.mktemp("big") / f"runs{suffix}", ranks=BIG_RANKS[suffix])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_stops_a_running_report(big: Path) -> None:
    """SIGINT while the report's pass reads: the process ends within seconds, exit 130, one line saying so."""
    proc = subprocess.Popen([sys.executable, "-m", "multirank_logger.cli", "report", str(big)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        _wait_until_reading(proc, big)  # the store open, and a second more: the pass is under way
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130 and "Stopped (Ctrl-C)" in err and "Traceback" not in err, (proc.returncode, err)
    assert took < STOPS_WITHIN_S, f"ran on {took:.1f} s after SIGINT"
    assert out == ""


def test_interrupt_stops_the_pass_on_every_connection(big: Path) -> None:
    """StoreReader.interrupt from another thread mid-pass: find() raises ReadsStopped at once, every
    connection the pass opened is given back and no thread of the pass is left running."""
    from multirank_logger import open_store
    from multirank_logger.report.findings import find

    reader = open_store(big)
    before = set(threading.enumerate())
    threading.Timer(0.5, reader.interrupt, args=("stopped by the test",)).start()
    start = time.monotonic()
    with pytest.raises(ReadsStopped, match="stopped by the test"):
        find(reader)
    assert time.monotonic() - start < 0.5 + STOPS_WITHIN_S
    assert reader._in_use == {}
    time.sleep(0.2)  # the Timer's own thread ends
    assert [t.name for t in set(threading.enumerate()) - before] == []
    reader.close()
