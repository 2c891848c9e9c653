"""Constant keys folded (issue 49): a key every rank logged alike at every step (`flag`), or one that
counts alike on every rank (`epoch`), is one line on the page ("epoch: 0 -> 2, the same on every
rank"), its chart and heatmap drawn only on a click; a key that varies (`loss`) is drawn at once.
Decided from the step summaries (``ui/views.constant_key``). Read in a real headless Chromium:
pixels of the median's colour in the plot area after the click, no canvas before it. Log scale
on a key crossing 0 or all at 0 (`signed`, `zero`) still draws, an all-zero key not on a 0-100 axis.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from multirank_logger.query.step_buckets import BucketSummary
from multirank_logger.store.sql_store import Store
from multirank_logger.ui.views import constant_key
from multirank_logger.write.buffer import RecordBuffer
from tests.helpers.page_pixels import covered, median_blue, plot_x, shot
from tests.helpers.ui_browser import chromium, served, wait_for

RANKS, STEPS = 3, 60


def build(db: Path) -> Path:
    store = Store(db)
    run = store.create_run("constant_keys", world_size=RANKS, transport="direct")
    for rank in range(RANKS):
        store.register_rank(run.id, rank, local_rank=rank, node_rank=0, host="node0", pid=0, status="success")
        buffer = RecordBuffer()
        for step in range(STEPS):
            buffer.append(
                step,
                {
                    "epoch": float(step // 20),
                    "flag": 1.0,
                    "loss": 2.0 - step / STEPS + 0.05 * rank,
                    "zero": 0.0,
                    "signed": (step - 30) / 10 + 0.1 * rank,
                },
            )
        store.write(buffer.drain(run.id, rank))
    store.update_run(run.id, status="success", ended_at=time.time())
    store.close()
    return db


@pytest.fixture(scope="module")
def page_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with served(str(build(tmp_path_factory.mktemp("constant_keys") / "runs.sqlite"))) as url:
        yield url


def test_a_constant_key_is_one_line_until_clicked(page_url: str) -> None:
    with chromium(1300, 1400) as driver:
        driver.get(page_url + "run/1")
        wait_for(driver, "return document.body.dataset.judged && MRL_CHARTS.loss")
        epoch = driver.find_element("css selector", "section[data-series=epoch]")
        flag = driver.find_element("css selector", "section[data-series=flag]")
        assert epoch.text.startswith("epoch: 0 -> 2, the same on every rank")
        assert flag.text.startswith("flag: 1 at every step, the same on every rank")
        assert not epoch.find_elements("css selector", "canvas") and not flag.find_elements("css selector", "canvas")
        assert driver.execute_script("return !MRL_CHARTS.epoch")
        loss = driver.find_element("css selector", "section[data-series=loss]")
        assert loss.find_elements("css selector", "canvas.heatmap") and "the same on every rank" not in loss.text
        epoch.find_element("css selector", "button.folded").click()
        wait_for(driver, "return MRL_CHARTS.epoch")
        plot = shot(epoch.find_element("css selector", ".u-over"))
        # epoch 1 (steps 20-39) lies mid-plot, away from the axes' edges where 0 and 2 lie
        assert covered(median_blue(plot), plot_x(driver, "epoch", 20) + 2, plot_x(driver, "epoch", 39) - 2) > 0.95
        assert epoch.find_elements("css selector", "canvas.heatmap")
        # toggling the log scale redraws the opened chart, and leaves the folded one folded
        driver.find_element("id", "log-scale").click()
        assert epoch.find_elements("css selector", "canvas.heatmap") and not flag.find_elements(
            "css selector", "canvas"
        )


def _summary(mean: list[list[float]], lo: list[float], hi: list[float], bad: bool = False) -> BucketSummary:
    m = np.array(mean, dtype=float)
    return BucketSummary("k", list(range(m.shape[0])), [0, 16, 32], 16, m, np.array(lo), np.array(hi),
                         np.full(m.shape, bad))


def test_the_rule_folds_only_keys_alike_on_every_rank() -> None:
    alike = [[0, 1, 2], [0, 1, 2]]
    assert constant_key(_summary(alike, [0, 1, 2], [0, 1, 2])) == {"first": 0, "last": 2, "from": 0, "to": 47}
    assert constant_key(_summary([[3, 2, 1]] * 2, [3, 2, 1], [3, 2, 1]))["last"] == 1  # an lr decaying
    assert constant_key(_summary([[0, 1, 2], [0, 1.5, 2]], [0, 1, 2], [0, 1.5, 2])) is None  # one rank apart
    assert constant_key(_summary(alike, [0, 0, 2], [1, 2, 2])) is None  # bucket 1 goes below bucket 0
    assert constant_key(_summary([[0, 2, 1]] * 2, [0, 2, 1], [0, 2, 1])) is None  # up then down
    assert constant_key(_summary(alike, [0, 1, 2], [0, 1, 2], bad=True)) is None  # a NaN/inf
    sparse = _summary([[0, np.nan, 2], [0, np.nan, 2]], [0, np.nan, 2], [0, np.nan, 2])
    assert constant_key(sparse) == {"first": 0, "last": 2, "from": 0, "to": 47}


def test_log_scale_and_an_all_zero_key_still_draw(page_url: str) -> None:
    """Log y on a key crossing 0 draws its positive part; an all-zero key keeps a linear axis
    around 0 (not 0-100) and a line, on log scale too."""
    with chromium(1300, 1400) as driver:
        driver.get(page_url + "run/1")
        wait_for(driver, "return document.body.dataset.judged && MRL_CHARTS.signed")
        zero = driver.find_element("css selector", "section[data-series=zero]")
        zero.find_element("css selector", "button.folded").click()
        wait_for(driver, "return MRL_CHARTS.zero")
        lo, hi = driver.execute_script("const s = MRL_CHARTS.zero.scales.y; return [s.min, s.max]")
        assert lo < 0 < hi <= 1
        driver.find_element("id", "log-scale").click()
        wait_for(driver, "return MRL_CHARTS.zero.scales.y.distr === 1 && MRL_CHARTS.signed.scales.y.distr === 3")
        assert "no value above 0, drawn linear" in zero.text
        blue = median_blue(shot(zero.find_element("css selector", ".u-over")))
        assert covered(blue, plot_x(driver, "zero", 0) + 2, plot_x(driver, "zero", STEPS - 1) - 2) > 0.95
        signed = driver.find_element("css selector", "section[data-series=signed]")
        blue = median_blue(shot(signed.find_element("css selector", ".u-over")))
        assert covered(blue, plot_x(driver, "signed", 32) + 2, plot_x(driver, "signed", STEPS - 1) - 2) > 0.95
        assert "values at or below 0 are not drawn" in signed.text
