"""The watch on a real 4-rank DDP training over gloo on CPU (tests/scripts/watch_train.py, gather).

One training: rank 2 logs NaN for train_loss from step 40, rank 1's train_loss departs (x10) from
step 60; ``StopOnAlert(kinds={"departure"})`` ends the fit. Two loggers watch it: ``watched``,
whose webhook is a local HTTP server on 127.0.0.1, and ``hanging``, whose webhook accepts the
connection and never answers. The clean run (no alert) is tests/runs/test_report_ddp.py's.
"""

from __future__ import annotations

import http.server
import json
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from multirank_logger import open_store
from multirank_logger.cli import main
from multirank_logger.report import find
from tests.helpers.launches import SCRIPTS, run_ranks_forked
from tests.helpers.logger_helpers import query, train_env

TRAIN = SCRIPTS / "watch_train.py"
SECRET = "T0KEN-abc123"  # the webhooks' path: must never be shown or stored


class _Hook(http.server.BaseHTTPRequestHandler):
    received: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append({"path": self.path, "auth": self.headers.get("Authorization"), **json.loads(body)})
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, list[dict[str, Any]]]]:
    root = tmp_path_factory.mktemp("watch")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    dead = socket.socket()  # accepts connections (the kernel's backlog), never answers
    dead.bind(("127.0.0.1", 0))
    dead.listen(16)
    hook = f"http://bot:pw-{SECRET}@127.0.0.1:{server.server_address[1]}/hooks/{SECRET}"
    dead_hook = f"http://127.0.0.1:{dead.getsockname()[1]}/hooks/{SECRET}"
    db = root / "runs.sqlite"
    args = ["--db", str(db), "--save-dir", str(root), "--hook", hook, "--dead-hook", dead_hook, "--stop"]
    try:
        proc = run_ranks_forked(TRAIN, args, nproc=4, cwd=root, env=train_env(), timeout=240)
        assert proc.returncode == 0, proc.stdout[-6000:]
        yield db, proc.stdout, list(_Hook.received)
    finally:
        server.shutdown()
        dead.close()


def test_alerts_on_the_console_during_training(trained: tuple[Path, str, list[dict[str, Any]]]) -> None:
    """Both alerts on rank 0's console before the fit ends, each once per logger, with the first step."""
    _, out, _ = trained
    end = out.index("TRAINING ENDS AT STEP")
    nan = [m.start() for m in re.finditer(r"alert: rank 2 train_loss NaN from step 40 \(seen at step [\d,]+\)", out)]
    depart = [m.start() for m in re.finditer(r"alert: rank 1 train_loss departs from the other ranks from step 60 ", out)]
    # one per logger ("watched", "hanging"); the stop may come before "hanging"'s watch holds the
    # departure's stretch (the two loggers' writers cycle apart): it says it at its finalize, or not
    assert len(nan) == 2 and len(depart) in (1, 2), out[-4000:]
    assert max(nan) < end and depart[0] < end  # the first departure line is the one that stopped the fit
    # and StopOnAlert's, once (the "watched" logger's): nothing else, nothing twice
    assert out.count("multirank_logger alert: ") == 3 + len(depart)
    # on_alert was called on rank 0 with each; the NaN's latency (logged -> alert) is printed, not asserted
    seen = [line.split() for line in (trained[0].parent / "alerts-seen.txt").read_text().splitlines()]
    assert [tuple(s[:3]) for s in seen] == [("non_finite", "2", "40"), ("departure", "1", "60"), ("stop", "1", "60")]
    logged = float((trained[0].parent / "nan-logged-at.txt").read_text())
    print(f"NaN logged at step 40 -> alert on rank 0: {float(seen[0][3]) - logged:.2f} s (flush_interval 0.5 s)")


def test_alert_rows_agree_with_the_report(trained: tuple[Path, str, list[dict[str, Any]]]) -> None:
    """Each alert stored once, with the rank, key and first step the report gives after the run."""
    db, _, _ = trained
    rows = query(db, "SELECT kind, rank, key, first_step FROM alerts WHERE run_id = 1 ORDER BY seq")
    assert rows[:2] == [("non_finite", 2, "train_loss", 40), ("departure", 1, "train_loss", 60)]
    assert [r[0] for r in rows] == ["non_finite", "departure", "stop"]
    with open_store(db) as reader:
        found = find(reader, run="watched")
    assert [(n["rank"], n["key"], n["first_step"]) for n in found.non_finite] == [(2, "train_loss", 40)]
    assert [(o["rank"], o["key"], o["first_step"]) for o in found.outliers] == [(1, "train_loss", 60)]
    assert [a["in_report"] for a in found.alerts] == [True, True, None]
    page = db.parent / "watched.html"
    text = CliRunner().invoke(main, ["report", str(db), "--run", "watched", "-o", str(page)]).output
    assert "Alerts raised during the run:" in text and text.count("[found here too]") == 2
    html = page.read_text()  # the page in one file carries its alerts' answer and the block's script
    assert '"run/1/alerts":[{' in html and "Alerts raised during the run (" in html
    listed = CliRunner().invoke(main, ["alerts", str(db), "--run", "watched", "--format", "json"])
    assert listed.exit_code == 0, listed.output
    assert [(a["kind"], a["rank"], a["first_step"]) for a in json.loads(listed.output)["alerts"]][:2] == [
        ("non_finite", 2, 40), ("departure", 1, 60)]


def test_webhook_received_and_a_dead_one_said_once(trained: tuple[Path, str, list[dict[str, Any]]]) -> None:
    """The live webhook got each alert as JSON with `text` (credentials as basic auth); the one that
    never answers left the training alone (both runs succeeded), its failure said once; the
    token is on no console line and in no stored row."""
    db, out, received = trained
    texts = [r["text"] for r in received]
    assert any("rank 2 train_loss NaN from step 40" in t for t in texts), texts
    assert any("rank 1 train_loss departs" in t for t in texts) and any("StopOnAlert" in t for t in texts)
    assert all(r["path"] == f"/hooks/{SECRET}" and r["auth"].startswith("Basic ") for r in received)
    # each payload names its run (a channel many jobs share): the run's identity, and its text says it
    (uuid,) = query(db, "SELECT run_uuid FROM runs WHERE name = 'watched'")[0]
    assert {(r["run"]["name"], r["run"]["version"], r["run"]["uuid"], r["run"]["store"]) for r in received} == {
        ("watched", "version_0", uuid, f"sqlite:///{db}")}
    assert all(r["text"].startswith(f"multirank_logger: watched/version_0 on {r['run']['host']}: ") for r in received)
    # the dead hook: its first failure said at most once (the run may end first), its count once at the end
    assert len(re.findall(r"the alert webhook http://127\.0\.0\.1:\d+/… did not take", out)) <= 1
    assert len(re.findall(r"\d+ of \d+ alerts were not delivered to the webhook http://127\.0\.0\.1:\d+/…", out)) == 1
    assert query(db, "SELECT status FROM runs ORDER BY id") == [("success",), ("success",)]
    assert SECRET not in out
    for table, cols in (("alerts", "message || coalesce(detail, '')"), ("logs", "message"), ("runs", "coalesce(hparams, '')")):
        assert query(db, f"SELECT COUNT(*) FROM {table} WHERE {cols} LIKE '%{SECRET}%'") == [(0,)]


def test_stop_on_alert_stops_every_rank_at_one_step(trained: tuple[Path, str, list[dict[str, Any]]]) -> None:
    """Every rank ended at the same step, before max_steps, and each decided it; every row is stored."""
    db, _, _ = trained
    steps = {int((db.parent / f"steps-{r}.txt").read_text()) for r in range(4)}
    assert len(steps) == 1
    stop = steps.pop()
    assert 60 < stop < 250
    for run_id in (1, 2):  # each logger's run records the stop (the alerts are the first logger's)
        decisions = query(db, f"SELECT rank, step, vote, decision FROM decisions WHERE run_id = {run_id} "
                              "AND callback = 'StopOnAlert' ORDER BY rank")
        # the stop's step is the stopped batch's logged step: the Trainer's global_step at its end less one
        assert decisions == [(0, stop - 1, 1, 1), (1, stop - 1, 0, 1), (2, stop - 1, 0, 1), (3, stop - 1, 0, 1)]
    for run_id in (1, 2):
        counts = query(db, f"SELECT rank, COUNT(DISTINCT step), MAX(step), COUNT(*) FROM metrics WHERE run_id = {run_id} "
                           "AND key = 'train_loss' GROUP BY rank ORDER BY rank")
        assert counts == [(r, stop, stop - 1, stop) for r in range(4)]


def test_runs_and_report_say_the_run_was_stopped(trained: tuple[Path, str, list[dict[str, Any]]]) -> None:
    """`runs` and `report` say which step StopOnAlert stopped the run at, and for which alert, from
    the stored rows: the first logger's `stop` alert, the second's decision rows (no alert of its
    own); the status stays success."""
    db, _, _ = trained
    stop = int((db.parent / "steps-0.txt").read_text()) - 1  # the last logged step (global_step counts one more)
    why = f"stopped by StopOnAlert at step {stop:,} (departure alert: rank 1, train_loss"
    listed = CliRunner().invoke(main, ["runs", str(db)])
    assert listed.exit_code == 0, listed.output
    lines = [line for line in listed.output.splitlines() if "version_" in line]
    assert f"success, {why}, from step 60)" in lines[0] and f"success, {why})" in lines[1], listed.output
    data = json.loads(CliRunner().invoke(main, ["runs", str(db), "--format", "json"]).output)
    assert [(r["status"], r["stopped_by"]) for r in data] == [("success", f"{why}, from step 60)"), ("success", f"{why})")]
    for run, end in (("watched", ", from step 60)"), ("hanging", ")")):
        text = CliRunner().invoke(main, ["report", str(db), "--run", run]).output
        assert text.splitlines()[1] == f"S{why[1:]}{end}: the fit ended there on every rank.", text[:600]


def test_the_page_shows_alerts_live(trained: tuple[Path, str, list[dict[str, Any]]], tmp_path: Path) -> None:
    """Chromium on the run's page: its alerts at the top, and one stored while the page is open
    appears without a reload (the block polls its own route, run/ID/alerts)."""
    import sqlite3
    import time

    from multirank_logger.store.sql_store import Store
    from multirank_logger.ui.server import UiServer
    from tests.helpers.ui_browser import chromium

    db = tmp_path / "runs.sqlite"  # a copy: the row this test adds is not the other tests' to see
    with sqlite3.connect(trained[0]) as src, sqlite3.connect(db) as dst:
        src.backup(dst)
    server = UiServer(str(db), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    items = "return [...document.querySelectorAll('#alerts li')].map(li => li.dataset.kind + ' ' + li.dataset.rank)"
    try:
        with chromium() as driver:
            driver.get(server.url + "run/1")  # the "watched" logger's run (the other's departure may race the stop)
            shown = _until(driver, items, lambda got: len(got) == 3)
            assert shown == ["non_finite 2", "departure 1", "stop 1"]
            store = Store(db)
            try:
                store.write_side({"alerts": [{"run_id": 1, "rank": 3, "seq": 99, "kind": "non_finite", "key": "lr",
                                              "first_step": 7, "seen_at": time.time(), "message": "rank 3 lr is inf"}]})
            finally:
                store.close()
            assert _until(driver, items, lambda got: len(got) == 4)[-1] == "non_finite 3"
            assert "rank 3 lr is inf" in driver.find_element("css selector", "#alerts").text
    finally:
        server.shutdown()
        server.close()


def _until(driver: Any, script: str, done: Any, timeout: float = 20.0) -> Any:
    import time

    deadline = time.monotonic() + timeout
    while True:
        got = driver.execute_script(script)
        if done(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.2)
