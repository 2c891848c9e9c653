"""Every series draws (issue 49): a key logged every other step (Lightning's ``log_every_n_steps=2``)
or at epoch ends is a line through its points on the page, in ``report -o``'s file and in ``plot``;
its heatmap has no grey column where no rank logged it; a NaN one rank logged stays a break in its
line and a ring on its heatmap row. Read in a real headless Chromium from screenshots: pixels of
the series' colour across the plot area, not only an element.

The store: 3 ranks x 40 steps written through the Store's own write path (as
tests/helpers/new_user_store.py), ``loss`` at even steps with rank 1 above the others and NaN at
step 20, ``val_loss`` at the 4 epoch ends, ``staggered`` logged by each rank at its own steps.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from multirank_logger.store.sql_store import Store
from multirank_logger.write.buffer import RecordBuffer
from tests.helpers.page_pixels import covered, median_blue, plot_x, shot
from tests.helpers.ui_browser import chromium, served, wait_for

RANKS, STEPS, NAN_RANK, NAN_STEP = 3, 40, 1, 20
EPOCH_ENDS = (9, 19, 29, 39)
EMPTY_GREY = (235, 235, 235)  # heatmap.js's cell where no value is
SHOTS = Path(__file__).resolve().parents[2] / "docs" / "img"


def _loss(step: int, rank: int) -> float:
    return 1 + math.exp(-step / 15) + (0.4 if rank == NAN_RANK else 0.01 * rank)


def build(db: Path) -> Path:
    store = Store(db)
    run = store.create_run("every_other_step", world_size=RANKS, transport="direct")
    for rank in range(RANKS):
        store.register_rank(run.id, rank, local_rank=rank, node_rank=0, host="node0", pid=0, status="success")
        buffer = RecordBuffer()
        for step in range(STEPS):
            values: dict[str, float] = {}
            if step % 2 == 0:
                values["loss"] = math.nan if (rank, step) == (NAN_RANK, NAN_STEP) else _loss(step, rank)
            if step in EPOCH_ENDS:
                values["val_loss"] = _loss(step, rank) * 1.1
            if step % RANKS == rank:
                values["staggered"] = math.nan if (rank, step) == (NAN_RANK, 19) else _loss(step, rank)
            if values:
                buffer.append(step, values)
        store.write(buffer.drain(run.id, rank))
    store.update_run(run.id, status="success", ended_at=time.time())
    store.close()
    return db


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("every_series") / "runs.sqlite")


@pytest.fixture(scope="module")
def page_url(db: Path) -> Iterator[str]:
    with served(str(db)) as url:
        yield url


def _near(pixels: np.ndarray, colour: tuple[int, int, int], tolerance: int) -> np.ndarray:
    return np.abs(pixels - np.array(colour)).sum(axis=-1) <= tolerance


def _rank_red(pixels: np.ndarray) -> np.ndarray:
    """A flagged rank's first line colour (#d62728), also antialiased over the grey band."""
    r, g, b = pixels[..., 0], pixels[..., 1], pixels[..., 2]
    return (r - g > 70) & (r - b > 70)


def _check_drawn(driver: Any) -> None:
    """The page's loss and val_loss charts, as drawn: lines through the logged steps, the NaN a break."""
    wait_for(driver, "return document.body.dataset.judged && MRL_CHARTS.loss && MRL_CHARTS.val_loss")
    loss = driver.find_element("css selector", "section[data-series=loss]")
    plot = shot(loss.find_element("css selector", ".u-over"))
    # the median: one line from the first logged step to the last, not a dot every other step
    blue = median_blue(plot)
    assert covered(blue, plot_x(driver, "loss", 0) + 2, plot_x(driver, "loss", STEPS - 2) - 2) > 0.95
    # rank 1 (flagged: its NaN) drawn as a line up to step 18 and from step 22, nothing between
    red = _rank_red(plot)
    assert covered(red, plot_x(driver, "loss", 0) + 2, plot_x(driver, "loss", NAN_STEP - 2) - 2) > 0.95
    assert covered(red, plot_x(driver, "loss", NAN_STEP + 2) + 2, plot_x(driver, "loss", STEPS - 2) - 2) > 0.95
    assert covered(red, plot_x(driver, "loss", NAN_STEP - 2) + 4, plot_x(driver, "loss", NAN_STEP + 2) - 4) == 0
    # its heatmap: no grey column where no rank logged, and the NaN ringed on rank 1's row
    heat = loss.find_element("css selector", "canvas.heatmap")
    left, width = (float(heat.get_attribute(f"data-{a}")) for a in ("left", "plot-width"))
    cells = shot(heat)[:, int(left) + 2 : int(left + width) - 2]
    assert _near(cells, EMPTY_GREY, 6).mean() < 0.01
    assert heat.get_attribute("data-ringed") == str(NAN_RANK)
    assert "Every rank logged the same" not in loss.text and "NaN/inf on ranks: 1" in loss.text
    # val_loss, 4 epoch ends: a line between them too
    val = median_blue(shot(driver.find_element("css selector", "section[data-series=val_loss] .u-over")))
    assert covered(val, plot_x(driver, "val_loss", EPOCH_ENDS[0]) + 4, plot_x(driver, "val_loss", EPOCH_ENDS[-1]) - 4) > 0.95


def test_the_page_draws_a_key_logged_every_other_step(page_url: str) -> None:
    with chromium(1300, 1400) as driver:
        driver.get(page_url + "run/1")
        _check_drawn(driver)
        SHOTS.mkdir(exist_ok=True)
        driver.find_element("css selector", "section[data-series=loss]").screenshot(str(SHOTS / "every_other_step.png"))


def test_the_report_file_draws_it_too(db: Path, tmp_path: Path) -> None:
    from multirank_logger.query.reader import open_store
    from multirank_logger.report import find
    from multirank_logger.ui.report_page import write_report

    page = tmp_path / "report.html"
    with open_store(str(db)) as store:
        write_report(store, find(store, run=1), page)
    with chromium(1300, 1400) as driver:
        driver.get(page.as_uri())
        _check_drawn(driver)


def test_plot_draws_each_rank_through_its_own_steps(db: Path) -> None:
    """`plot`'s lines: each rank's every logged value joined (the ranks log at different steps),
    rank 1's NaN at step 19 a break between its neighbours."""
    from multirank_logger.query.reader import open_store
    from multirank_logger.report.plots import not_logged_cells, plot_key

    with open_store(str(db)) as store:
        table = store.per_rank("staggered", 1)
        figure = plot_key(table, "staggered", not_logged=not_logged_cells(store, 1, "staggered", table))
    lines = {str(line.get_label()): line for line in figure.axes[0].lines}
    for rank in range(RANKS):
        xs, ys = lines[f"rank {rank}"].get_xdata(), lines[f"rank {rank}"].get_ydata()
        assert list(xs) == [s for s in range(STEPS) if s % RANKS == rank]
        assert np.isnan(ys).tolist() == [(rank, s) == (NAN_RANK, 19) for s in xs]
