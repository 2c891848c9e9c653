"""`multirank-logger ui`: a real server on a free port, read by urllib and by a real headless Chromium.

The store: 16 ranks on two hosts x 300 steps x 3 keys (DuckDB), rank 11's ``loss`` 3 above the
others from step 150 on, rank 4's ``loss`` NaN at step 200. Bad stores (missing, being created,
of a newer schema, deleted under the server) each get an answer that says so; the server stays up.
"""

from __future__ import annotations

import http.client
import json
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from multirank_logger.ui.server import UiServer
from tests.helpers.ui_browser import chromium, outside, requested_urls, wait_for
from tests.helpers.ui_store import NAN_RANK, NAN_STEP, OUTLIER, RANKS, STEPS, build_store


@pytest.fixture(scope="module")
def store16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("ui") / "runs.duckdb")


@pytest.fixture(scope="module")
def cli_server(store16: Path) -> Iterator[str]:
    """`multirank-logger ui DB --port 0` as a user starts it; yields the URL it prints."""
    proc = subprocess.Popen([sys.executable, "-m", "multirank_logger.cli", "ui", str(store16), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert "http://127.0.0.1:" in line, line + (proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        yield line.split()[2]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def serve() -> Iterator[Any]:
    """In-process servers on free ports, for the bad stores; stopped after the test."""
    started: list[UiServer] = []

    def start(db: Path | str, allowed_hosts: tuple[str, ...] = ()) -> str:
        server = UiServer(str(db), "127.0.0.1", 0, allowed_hosts)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
        started.append(server)
        return server.url

    yield start
    for server in started:
        server.shutdown()
        server.server_close()


def get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            body = r.read()
            return r.status, json.loads(body) if r.headers.get_content_type() == "application/json" else body.decode()
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_cli_binds_localhost_and_serves_summaries_not_rows(cli_server: str) -> None:
    """The URL printed is 127.0.0.1's; a key's answer is per-bucket summaries and one byte per
    heatmap cell, naming the departing rank and the NaN's rank."""
    assert cli_server.startswith("http://127.0.0.1:")
    status, runs = get(cli_server + "api/runs")
    assert status == 200 and [(r["id"], r["ranks"], r["nodes"]) for r in runs] == [(1, RANKS, 2)]
    status, head = get(cli_server + "api/run/1?brief=1")  # what the open page polls: the header, no key list
    assert status == 200 and head["id"] == 1 and head["last_step"] == STEPS - 1 and "keys" not in head
    status, s = get(cli_server + "api/run/1/series?name=loss")
    assert status == 200
    status, found = get(cli_server + "api/run/1/findings")  # the ranks departing come with the report's findings
    assert status == 200 and found["departing"]["loss"] == [OUTLIER] and s["non_finite"] == [NAN_RANK]
    assert len(s["steps"]) == STEPS and len(s["ranks"]) == RANKS and s["nodes"] == [["host0 (node 0)", 8], ["host1 (node 1)", 8]]
    import base64

    codes = base64.b64decode(s["heatmap"])
    assert len(codes) == RANKS * STEPS and codes[NAN_RANK * STEPS + NAN_STEP] == 127  # the NaN's cell, marked
    outlier_row = [c if c < 128 else c - 256 for c in codes[OUTLIER * STEPS + STEPS // 2 : (OUTLIER + 1) * STEPS]]
    assert sum(c >= 80 for c in outlier_row) > 0.9 * len(outlier_row)  # >= 8 typical spreads above, nearly everywhere


def test_bad_stores_get_a_clear_answer_and_the_server_stays_up(tmp_path: Path, store16: Path, serve: Any) -> None:
    """Missing file, a store being created, a newer schema, an unknown run, the file deleted while
    the server runs: each an error naming the problem (never a traceback); the page still loads."""
    import duckdb

    missing = serve(tmp_path / "nope.duckdb")
    status, body = get(missing + "api/runs")
    assert status == 503 and "No store at" in body["error"] and "nope.duckdb" in body["error"]
    status, page = get(missing)
    assert status == 200 and "/static/app.js" in page

    creating = tmp_path / "creating.duckdb"
    duckdb.connect(str(creating)).close()  # the file exists; its schema is not there yet
    status, body = get(serve(creating) + "api/runs")
    assert status == 503 and "holds no multirank_logger schema" in body["error"]

    newer = tmp_path / "newer.duckdb"
    shutil.copy(store16, newer)
    con = duckdb.connect(str(newer))
    con.execute("UPDATE alembic_version SET version_num = 'ffff_from_the_future'")
    con.close()
    status, body = get(serve(newer) + "api/runs")
    assert status == 503 and "ffff_from_the_future" in body["error"] and "Traceback" not in body["error"]

    doomed = tmp_path / "doomed.duckdb"
    shutil.copy(store16, doomed)
    url = serve(doomed)
    assert get(url + "api/runs")[0] == 200
    status, body = get(url + "api/run/42")
    assert status == 404 and "No run '42'" in body["error"]
    status, body = get(url + "api/run/1/series?name=no_such_key")
    assert status == 404 and "no_such_key" in body["error"]
    doomed.unlink()
    status, body = get(url + "api/runs")
    assert status == 503 and "No store at" in body["error"]
    assert get(url + "static/app.js")[0] == 200 and get(url + "api/run/1")[0] == 503  # still up


def request(url: str, method: str = "GET", headers: dict[str, str] | None = None, timeout: float = 60) -> tuple[int, dict[str, str], bytes]:
    """One request with the headers given (a browser's Host and Origin): status, headers, body."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
    try:
        conn.request(method, parts.path + (f"?{parts.query}" if parts.query else ""), headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def test_a_host_not_its_own_is_refused(store16: Path, serve: Any) -> None:
    """DNS rebinding: a request naming another host (evil.example resolving to 127.0.0.1) gets a
    403 saying what to pass; its own names, and a name passed as --allow-host, are answered."""
    url = serve(store16, ("tunnel.example",))
    port = urlsplit(url).port
    status, _, body = request(url + "api/runs", headers={"Host": f"evil.example:{port}"})
    assert status == 403 and b"--allow-host evil.example" in body, body
    assert request(url, headers={"Host": f"evil.example:{port}"})[0] == 403  # the page too, not only the API
    assert request(url + "api/runs", headers={"Host": f"127.0.0.1:{port + 1}"})[0] == 403  # another port's name
    for own in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", f"LOCALHOST:{port}", f"tunnel.example:{port}"):
        assert request(url + "api/runs", headers={"Host": own})[0] == 200, own


def test_the_api_refuses_a_cross_site_origin(store16: Path, serve: Any) -> None:
    """A fetch from another site's page (its Origin) gets a 403; the page's own Origin is answered."""
    url = serve(store16)
    port = urlsplit(url).port
    for other in ("http://evil.example", f"http://evil.example:{port}", "null", f"https://127.0.0.1:{port}"):
        status, _, body = request(url + "api/runs", headers={"Origin": other})
        assert status == 403 and b"another site" in body, other
    assert request(url + "api/runs", headers={"Origin": f"http://localhost:{port}"})[0] == 200


def test_head_is_answered_like_get_without_a_body(store16: Path, serve: Any) -> None:
    """HEAD gets GET's status and headers (its Content-Length too), and no body."""
    url = serve(store16)
    for route in ("", "api/runs", "static/app.js", "api/run/42"):
        got_status, got_headers, got_body = request(url + route)
        status, headers, body = request(url + route, method="HEAD")
        assert (status, body) == (got_status, b"") and headers["Content-Length"] == str(len(got_body)), route


def test_200_concurrent_requests_are_all_answered(store16: Path) -> None:
    """200 requests arriving while the server is busy (its accept loop not running yet): every
    one answered in bounded time; with http.server's listen queue of 5, the kernel dropped the
    rest's connections, retried with backoff (11 of 200 unanswered after 90 s in issue 38)."""
    server = UiServer(str(store16), "127.0.0.1", 0)
    url = server.url

    def ask(i: int) -> int | str:
        try:
            return request(url + ("api/runs" if i % 2 else "static/app.js"), timeout=20)[0]
        except OSError as exc:
            return type(exc).__name__

    start = time.monotonic()
    try:
        with ThreadPoolExecutor(200) as pool:
            answers = [pool.submit(ask, i) for i in range(200)]
            time.sleep(1.0)  # every connection knocks before the server accepts one
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
            statuses = [answer.result() for answer in answers]
    finally:
        server.shutdown()
        server.server_close()
    assert statuses == [200] * 200, {s: statuses.count(s) for s in set(statuses)}
    assert time.monotonic() - start < 60


@pytest.mark.parametrize("suffix", [".sqlite", ".duckdb"])
def test_a_run_id_past_int64_is_a_404_without_a_traceback(tmp_path: Path, suffix: str, serve: Any, capfd: pytest.CaptureFixture[str]) -> None:
    """A run id no 64-bit integer holds names no run: a clear 404 (SQLite's driver raised
    OverflowError binding it: a 500 and a traceback), on both file backends."""
    from multirank_logger.store.sql_store import Store

    store = Store(tmp_path / f"runs{suffix}")
    store.create_run("lightning_logs", world_size=1)
    store.close()
    url = serve(tmp_path / f"runs{suffix}")
    for route in ("api/run/99999999999999999999", "api/run/9223372036854775808/series?name=loss",
                  "api/run/" + "9" * 5000, "api/run/" + "9" * 5000 + "/findings"):  # past int()'s 4,300 digits too
        status, body = get(url + route)
        assert status == 404 and "No run '9" in body["error"] and len(body["error"]) < 200, body
    status, body = get(url + "api/run/1/line?name=loss&rank=" + "9" * 5000)
    assert status == 404, body
    assert "Traceback" not in capfd.readouterr().err


def test_page_names_the_outlier_and_the_nan_rank_in_chromium(cli_server: str, tmp_path: Path, serve: Any) -> None:
    """The landing page lists the only run; its loss chart names rank 11 and rank 4 (band lines,
    legend, findings), the heatmap is drawn, a missing store's page and an unknown run's page say
    so, and not one request leaves 127.0.0.1."""
    with chromium(1300, 1500) as driver:
        driver.get(serve(tmp_path / "nope.duckdb"))
        shown = wait_for(driver, "const t = document.body.innerText; return t.includes('No store at') && t")
        assert "nope.duckdb" in shown and "Traceback" not in shown
        driver.get(cli_server + "run/42")
        shown = wait_for(driver, "const t = document.getElementById('head').innerText; return t.includes('42') && t")
        assert "No run '42'" in shown and "Traceback" not in shown
        driver.get(cli_server)  # the runs list, also of a store of one run (issue 40 point 10)
        wait_for(driver, "return document.querySelector('#runs a[href=\"/run/1\"]')").click()
        # judged: the findings arrived, and each chart drew the lines of the ranks they name
        wait_for(driver, "return location.pathname === '/run/1' && document.body.dataset.judged")
        flagged = driver.execute_script("return document.querySelector('section[data-series=loss]').dataset.flagged")
        assert set(flagged.split(",")) == {str(OUTLIER), str(NAN_RANK)}
        legend = driver.find_element("css selector", "section[data-series=loss] .u-legend").text
        assert f"rank {OUTLIER}" in legend and f"rank {NAN_RANK}" in legend
        canvas = driver.execute_script(
            "const c = document.querySelector('section[data-series=loss] canvas.heatmap');"
            "return c && [c.dataset.ranks, c.dataset.columns, c.width > 0]"
        )
        assert canvas == [str(RANKS), str(STEPS), True]
        # at 16 ranks on 2 hosts too, the heatmap lies under its chart's plot area
        chart, heat = driver.execute_script(
            "const s = document.querySelector('section[data-series=loss]'), c = s.querySelector('canvas.heatmap');"
            "const o = s.querySelector('.u-over').getBoundingClientRect(), h = c.getBoundingClientRect();"
            "return [[o.left, o.width], [h.left + parseFloat(c.dataset.left), parseFloat(c.dataset.plotWidth)]]"
        )
        assert abs(chart[0] - heat[0]) <= 1 and abs(chart[1] - heat[1]) <= 1, (chart, heat)
        findings = wait_for(driver, "const t = document.getElementById('findings').innerText; return !t.includes('computing') && t")
        assert f"rank {OUTLIER} loss departs" in findings and f"rank {NAN_RANK} loss NaN from step {NAN_STEP}" in findings
        # a click on rank 7's heatmap row draws its line on the band chart
        driver.execute_script(
            "const c = document.querySelector('section[data-series=lr] canvas.heatmap'), r = c.getBoundingClientRect();"
            "c.dispatchEvent(new MouseEvent('click', {clientX: r.left + r.width / 2, clientY: r.top + (7.5 / 16) * r.height}));"
        )
        wait_for(driver, "return document.querySelector('section[data-series=lr] .u-legend').innerText.includes('rank 7')")
        driver.save_screenshot(str(tmp_path / "run.png"))
        urls = requested_urls(driver)
        assert any("/api/run/1/series" in u for u in urls) and outside(urls) == [], outside(urls)


# keys that end, or keep open, a script element holding them when not escaped: "<!--<script>"
# enters the HTML parser's double-escaped state, where the JSON's own "</script>" ends nothing
HOSTILE_KEYS = ("a<!--<script>b", "c</script>d", "e<!--f", "g\u2028h\u2029i")


def _store_with_hostile_keys(db: Path) -> None:
    from multirank_logger.store.sql_store import Store
    from multirank_logger.write.buffer import RecordBuffer

    store = Store(db)
    run = store.create_run("lightning_logs", world_size=1)
    buffer = RecordBuffer()
    for step in range(5):
        buffer.append(step, {key: float(step + i) for i, key in enumerate(HOSTILE_KEYS)})
    store.write(buffer.drain(run.id, 0))
    store.close()


def test_embedded_json_escapes_what_would_end_or_hold_open_its_script(tmp_path: Path) -> None:
    """The JSON written into a script element carries no "<!--", "<script", "</script" and no
    raw U+2028/2029, and still reads back as the answers given."""
    from multirank_logger.ui.page import write_static_page

    page = tmp_path / "page.html"
    answers = {"keys": list(HOSTILE_KEYS)}
    write_static_page(page, "t", answers, "/run/1")
    text = page.read_text(encoding="utf-8")
    start = text.index("window.MRL_STATIC=") + len("window.MRL_STATIC=")
    embedded = text[start : text.index(";</script>", start)]
    for bad in ("<!--", "<script", "</script", "\u2028", "\u2029"):
        assert bad not in embedded.lower(), bad
    assert json.loads(embedded)["answers"] == answers


def test_report_page_with_a_key_holding_a_script_comment_draws_in_chromium(tmp_path: Path) -> None:
    """report -o FILE of a run whose keys hold "<!--<script>", "</script>", U+2028: the file,
    opened in a real Chromium, draws every key's chart (it rendered blank)."""
    from click.testing import CliRunner

    from multirank_logger.cli import main

    db, page = tmp_path / "runs.sqlite", tmp_path / "report.html"
    _store_with_hostile_keys(db)
    result = CliRunner().invoke(main, ["report", str(db), "-o", str(page)])
    assert result.exit_code == 0, result.output
    with chromium(1100, 1600) as driver:
        driver.get(page.as_uri())
        wait_for(driver, "return document.body.dataset.drawn", timeout=120)
        drawn = driver.execute_script("return Array.from(document.querySelectorAll('section.series'), s => s.dataset.series)")
        assert set(HOSTILE_KEYS) <= set(drawn), drawn


def test_page_marks_the_rank_where_a_spread_nan_started_in_chromium(tmp_path: Path, serve: Any) -> None:
    """Rank 2's NaN at step 150 spread to ranks 0, 1 and 3 at 151 (hundreds of NaN cells in the rows
    above it): the heatmap rings rank 2's first NaN and marks its row as the origin, and the
    findings list leads with its sentence (the report's, judgement/sentences.py)."""
    from multirank_logger.store.sql_store import Store
    from multirank_logger.write.buffer import RecordBuffer

    db = tmp_path / "runs.sqlite"
    store = Store(db)
    run = store.create_run("spread", world_size=4)
    for rank in range(4):
        buffer = RecordBuffer()
        for step in range(600):
            bad = step >= (150 if rank == 2 else 151)
            buffer.append(step, {"loss": float("nan") if bad else 1.0 + 0.01 * ((step * 7 + rank) % 5), "acc": 0.5})
        store.write(buffer.encode(buffer.take(), run.id, rank))
    store.update_run(run.id, status="success", ended_at=time.time())
    store.close()
    with chromium(1300, 1200) as driver:
        driver.get(serve(db) + "run/1")
        wait_for(driver, "return document.body.dataset.judged")
        marks = wait_for(driver, "const c = document.querySelector('section[data-series=loss] canvas.heatmap');"
                              "return c && c.dataset.origins && [c.dataset.origins, c.dataset.ringed]")
        assert marks[0] == "2" and "2" in marks[1].split(","), marks
        first = driver.execute_script("const li = document.querySelector('#findings li'); return [li.className, li.innerText]")
        assert first[0] == "origin" and first[1].startswith(
            "rank 2 loss NaN from step 150; followed by ranks 0-1,3 at step 151"), first
