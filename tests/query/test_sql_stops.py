"""`multirank-logger sql` stops: Ctrl-C (a real SIGINT to a real process) ends a long query
within seconds, and `--timeout SECONDS` ends it with an error saying so (issue 38 point 8).

Before: a query inside the engine's C code never came back to Python to see the signal; a
cross join ran on 20 s after SIGINT. The queries here would run for minutes (SQLite: a
recursive count without end; DuckDB: a 10**11-row cross join).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from multirank_logger import open_store
from multirank_logger.cli import main
from multirank_logger.errors import QueryTimedOut
from tests.helpers.built_stores import fill_loss_rows

ENDLESS = {
    ".sqlite": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) AS n FROM c",
    ".duckdb": "SELECT sum(a.range * b.range) AS n FROM range(100000) a, range(1000000) b",
}
#: a stopped query must end within this (raw DuckDB stops in 0.1 s; a loaded 2-core machine is slower)
STOPS_WITHIN_S = 5.0


def _wait_until_reading(proc: subprocess.Popen[str], db: Path, limit_s: float = 60) -> None:
    """Until the process has the store open (the query's start is a few statements later), and a bit."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            targets = [os.readlink(f"/proc/{proc.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{proc.pid}/fd")]
        except OSError:
            targets = []
        if str(db) in targets:
            time.sleep(1.0)
            return
        time.sleep(0.02)
    raise AssertionError(f"the sql process never opened {db}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("suffix", [".sqlite", ".duckdb"])
def test_ctrl_c_stops_a_running_sql_query(tmp_path: Path, suffix: str) -> None:
    """SIGINT while the query runs: the process ends within seconds, exit 130, one line saying so."""
    db = tmp_path / f"runs{suffix}"
    fill_loss_rows(str(db))
    proc = subprocess.Popen([sys.executable, "-m", "multirank_logger.cli", "sql", str(db), ENDLESS[suffix]],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_until_reading(proc, db)
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert took < STOPS_WITHIN_S, f"ran on {took:.1f} s after SIGINT"
    assert proc.returncode == 130 and "Stopped (Ctrl-C)" in err and "Traceback" not in err, err


@pytest.mark.parametrize("suffix", [".sqlite", ".duckdb"])
def test_sql_timeout_stops_the_query_with_a_clear_error(tmp_path: Path, suffix: str) -> None:
    """`sql --timeout 1`: the query ends about a second later, with one `Error:` line saying what to do."""
    db = tmp_path / f"runs{suffix}"
    fill_loss_rows(str(db))
    start = time.monotonic()
    result = CliRunner().invoke(main, ["sql", str(db), ENDLESS[suffix], "--timeout", "1"])
    assert time.monotonic() - start < 1 + STOPS_WITHIN_S
    assert result.exit_code == 1 and result.output.startswith("Error: The query ran past its timeout of 1 s"), result.output
    assert "--timeout" in result.output and result.exception is not None and "Traceback" not in result.output


def test_sql_timeout_leaves_a_quick_query_alone(tmp_path: Path) -> None:
    """A query that ends in time answers as without --timeout."""
    db = tmp_path / "runs.sqlite"
    fill_loss_rows(str(db))
    result = CliRunner().invoke(main, ["sql", str(db), "SELECT count(*) AS n FROM metrics", "--timeout", "30", "--format", "csv"])
    assert result.exit_code == 0 and result.output == "n\n20\n", result.output


def test_postgres_query_past_its_timeout_is_cancelled(postgres_url: str) -> None:
    """PostgreSQL: the timeout sends the server a cancel request; the reader answers the next query."""
    fill_loss_rows(postgres_url)
    reader = open_store(postgres_url)
    start = time.monotonic()
    with pytest.raises(QueryTimedOut):
        reader.sql("SELECT pg_sleep(60)", timeout=0.5)
    assert time.monotonic() - start < 0.5 + STOPS_WITHIN_S
    assert reader.sql("SELECT count(*) AS n FROM metrics")["n"].tolist() == [20]
