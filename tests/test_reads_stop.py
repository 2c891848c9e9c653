"""Reads stop (issue 38 point 8): Ctrl-C (a real SIGINT to a real process) stops `multirank-logger
report` within seconds, exit 130, one line saying so, no traceback; before, the report's pass over
the rows (query/run_scan.py: reader threads on connections of their own) ran on to its end. The
page (`multirank-logger ui`) stops on Ctrl-C while a request's query runs, and a request's reads
are bounded (`--request-timeout`: 503 with a message saying so).
"""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from multirank_logger.errors import ReadsStopped
from multirank_logger.model.schema import METRIC_COLUMNS
from multirank_logger.store.backends.base import driver_connection
from multirank_logger.store.sql_store import Store
from tests.helpers.stores import keep_summaries
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
        keep_summaries(conn, run.id)
    store.close()
    return db


#: ranks of the big store per backend: DuckDB reads its rows several times faster than SQLite
BIG_RANKS = {".sqlite": 32, ".duckdb": 256}
#: a stopped report must end within this after SIGINT (it stops in well under a second unloaded)
STOPS_WITHIN_S = 3.0
#: ui --request-timeout of the 503 test, per backend (see the test)
REQUEST_BOUND_S = {".sqlite": 4, ".duckdb": 0.5}


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


def _start_ui(db: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    """`multirank-logger ui DB --port 0 ARGS`; the process and the URL it prints."""
    proc = subprocess.Popen([sys.executable, "-m", "multirank_logger.cli", "ui", str(db), "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    line = proc.stdout.readline() if proc.stdout else ""
    if "http://127.0.0.1:" not in line:
        proc.kill()
        raise AssertionError(line + proc.communicate()[1])
    return proc, line.split()[2]


def _get(url: str, answers: list[tuple[int, str]]) -> None:
    """GET url; its status and body appended to ``answers`` (an error status too; 0: no answer)."""
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            answers.append((response.status, response.read().decode()))
    except urllib.error.HTTPError as exc:
        answers.append((exc.code, exc.read().decode()))
    except (OSError, http.client.HTTPException) as exc:  # the server stopped under the request
        answers.append((0, str(exc)))


def test_page_request_past_its_timeout_answers_503(big: Path) -> None:
    """ui --request-timeout: the findings of the big run (seconds of reads) answer 503 about the
    bound later, saying so; the server answers the next request. The bound is below the findings'
    time (~11 s on SQLite, ~1.6 s on DuckDB, quiet, since the report's pass lays windows out as it
    reads them) and above the runs list's (~0.6 s on SQLite, quiet; over 1 s beside the suite's
    trainings; DuckDB's comes from the step summaries: milliseconds)."""
    bound = REQUEST_BOUND_S[big.suffix]
    proc, url = _start_ui(big, "--request-timeout", str(bound))
    try:
        answers: list[tuple[int, str]] = []
        start = time.monotonic()
        _get(f"{url}api/run/1/findings", answers)
        took = time.monotonic() - start
        status, body = answers[0]
        assert status == 503 and f"ran past {bound} s and were stopped" in json.loads(body)["error"], answers
        assert took < bound + STOPS_WITHIN_S, f"answered {took:.1f} s later"
        _get(f"{url}api/runs", answers)
        assert answers[1][0] == 200 and json.loads(answers[1][1])[0]["id"] == 1, answers[1]
    finally:
        proc.kill()
        proc.communicate()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_stops_the_page_while_a_request_reads(big: Path) -> None:
    """SIGINT while a request's findings are being read: its queries are interrupted, the request
    answered (503: the server is stopping; before, the connection was dropped unanswered), and the
    server ends within seconds, exit 0, no traceback."""
    proc, url = _start_ui(big)  # the default bound (60 s) is far off
    answers: list[tuple[int, str]] = []
    client = threading.Thread(target=_get, args=(f"{url}api/run/1/findings", answers), daemon=True)
    try:
        client.start()
        time.sleep(0.5)  # the request's pass under way (its store opened at start-up already; DuckDB's takes ~1.6 s)
        assert not answers, answers
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0 and "Traceback" not in err and "terminate called" not in err, (proc.returncode, err)
    assert took < STOPS_WITHIN_S, f"ran on {took:.1f} s after SIGINT"
    client.join(10)
    assert len(answers) == 1 and answers[0][0] == 503, answers
    assert json.loads(answers[0][1])["error"] == "The server is stopping (Ctrl-C)."
