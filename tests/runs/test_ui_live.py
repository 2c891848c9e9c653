"""The ui while a real 2-rank DDP training (gloo, CPU) writes its DuckDB store: the page, opened
before the store exists, lists the run and its last step grows, without a reload; the run's own
page follows it the same way; the training loses nothing to the viewer. The training takes its
steps a few at a time, when the test lets it (logger_train.py --gate): each page sees the run go
on while it is open, however slow the machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers.launches import start_ranks_forked
from tests.helpers.logger_helpers import TRAIN, query, train_env
from tests.helpers.ui_browser import chromium, outside, requested_urls, wait_for

STEPS = 16


def _allow(gate: Path, steps: int) -> None:
    """Let the training go on to `steps` steps (written whole: the training reads the file as it polls)."""
    part = gate.with_suffix(".part")
    part.write_text(str(steps))
    part.replace(gate)


def test_a_training_started_while_the_page_is_open_appears_and_grows(tmp_path: Path) -> None:
    db = tmp_path / "live.duckdb"
    server = subprocess.Popen([sys.executable, "-m", "multirank_logger.cli", "ui", str(db), "--port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    training = None
    try:
        url = (server.stdout.readline() if server.stdout else "").split()[2]
        with chromium(1300, 1200) as driver:
            driver.get(url)
            wait_for(driver, "return document.querySelector('.error')?.innerText.includes('No store at')")
            driver.execute_script("window.notReloaded = true")  # gone if the page reloads
            gate = tmp_path / "gate"
            _allow(gate, 3)
            # its ranks forked as torchrun starts them (launches.start_ranks_forked): the page is what is tested
            training = start_ranks_forked(TRAIN, ["--db", str(db), "--save-dir", str(tmp_path), "--steps", str(STEPS),
                                                  "--gate", str(gate)], nproc=2, cwd=tmp_path, env=train_env())
            cell = "const c = document.querySelector('#runs tr[data-run] td:nth-child(7)'); return c && c.innerText !== '-' && +c.innerText"
            first_step = wait_for(driver, cell, timeout=120)
            _allow(gate, 7)
            wait_for(driver, cell.replace("&& +c.innerText", f"&& +c.innerText > {first_step}"), timeout=120)
            assert driver.execute_script("return window.notReloaded") is True
            status = driver.find_element("css selector", "#runs tr[data-run] td:nth-child(3)").text
            # the run's own page, opened while the run goes on: its header's last step grows too
            driver.get(url + "run/1")
            wait_for(driver, "return document.body.dataset.drawn")
            driver.execute_script("window.notReloaded = true")
            head = driver.find_element("id", "head").text
            _allow(gate, 11)
            wait_for(driver, f"return document.getElementById('head').innerText !== {head!r}", timeout=120)
            assert driver.execute_script("return window.notReloaded") is True
            assert outside(requested_urls(driver)) == []
        _allow(gate, STEPS)
        done = training.wait(180)
        assert done.returncode == 0, done.stdout[-6000:]
        assert status == "running"
    finally:
        if training is not None:
            training.kill()
        if server.poll() is None:
            server.terminate()
            server.wait(timeout=30)
    # nothing lost to the viewer: every rank's every step of train_loss is in the store
    rows = query(db, "SELECT rank, COUNT(DISTINCT step), COUNT(*) FROM metrics WHERE key = 'train_loss' GROUP BY rank ORDER BY rank")
    assert rows == [(0, STEPS, STEPS), (1, STEPS, STEPS)], rows
    assert query(db, "SELECT status, COALESCE(values_spilled, 0), COALESCE(values_lost, 0) FROM runs") == [("success", 0, 0)]
