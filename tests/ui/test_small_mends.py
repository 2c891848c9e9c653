"""Issue 49's smaller points, each on a store whose loss went NaN: `ranks` names where each rank's
NaN or inf began (never "No rank stands out" over them); in a real Chromium, the heatmap's hover
says "0.9 typical spreads below" (no minus sign before "below") and a run the store lacks shows
its error alone (no "computing…" under it, forever)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from multirank_logger.cli import main
from multirank_logger.store.sql_store import Store
from multirank_logger.write.buffer import RecordBuffer
from tests.helpers.ui_browser import chromium, served, wait_for

RANKS, STEPS, NAN_FROM, SPREAD_AT = 3, 60, 24, 26  # rank 2 NaN from step 24, the others from 26


@pytest.fixture(scope="module")
def nan_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`train_loss` logged every other step (the NaN's step a logged one, the table's gaps NaN too);
    rank 2 goes NaN at step 24, +inf at 30; ranks 0 and 1 follow at 26 (an all-reduce spreads it)."""
    db = tmp_path_factory.mktemp("nan_run") / "runs.sqlite"
    store = Store(db)
    run = store.create_run("nan_run", world_size=RANKS)
    for rank in range(RANKS):
        buffer = RecordBuffer()
        for step in range(0, STEPS, 2):
            loss = 2.0 - step / 100 + 0.01 * rank
            if step >= (NAN_FROM if rank == 2 else SPREAD_AT):
                loss = float("inf") if rank == 2 and step == 30 else float("nan")
            buffer.append(step, {"train_loss": loss, "epoch": step // 20})
        store.write(buffer.drain(run.id, rank))
    store.write_side({"decisions": [{"run_id": run.id, "rank": 0, "seq": 0, "step": 32, "callback": "StopOnAlert",
                                     "monitor": "non_finite:train_loss:rank 2", "vote": True, "decision": True,
                                     "time": 1.7e9}]})
    store.update_run(run.id, status="failed")
    store.close()
    return db


def cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_ranks_names_where_nan_began(nan_store: Path) -> None:
    out = cli("ranks", str(nan_store), "train_loss")
    assert "No rank stands out" not in out, out
    line = next(line for line in out.splitlines() if line.startswith("NaN or inf logged"))
    values = {r: (STEPS - (NAN_FROM if r == 2 else SPREAD_AT)) // 2 for r in range(RANKS)}
    assert line == ("NaN or inf logged: "
                    f"rank 2 from step {NAN_FROM} ({values[2]} values); rank 0 from step {SPREAD_AT} ({values[0]} values); "
                    f"rank 1 from step {SPREAD_AT} ({values[1]} values)."), line
    assert "Rank 2 logged one first" in out
    # a key without NaN keeps its words
    assert "NaN or inf logged" not in cli("ranks", str(nan_store), "epoch")


@pytest.fixture(scope="module")
def driver(nan_store: Path) -> Any:
    with served(str(nan_store)) as url, chromium(1300, 1400) as driver:
        driver.base_url = url
        yield driver


def test_heatmap_hover_says_below_without_a_minus(driver: Any) -> None:
    """Rank 0 sits below the ranks' median before the NaN: its hover reads "N typical spreads below".
    The header says why the run ended where it did (StopOnAlert), as the report's first line does."""
    driver.get(driver.base_url + "run/1")
    wait_for(driver, "return document.body.dataset.judged")
    stopped = driver.find_element("css selector", "#head #stopped").text
    assert stopped == ("Stopped by StopOnAlert at step 32 (non_finite alert: rank 2, train_loss): "
                       "the fit ended there on every rank.")
    texts = driver.execute_script("""
      const sec = document.querySelector("section[data-series=train_loss]"), cv = sec.querySelector("canvas.heatmap");
      const r = cv.getBoundingClientRect(), left = +cv.dataset.left, w = +cv.dataset.plotWidth, R = +cv.dataset.ranks;
      const tip = sec.querySelector(".tip"), out = [];
      for (let row = 0; row < R; row++) {
        cv.dispatchEvent(new MouseEvent("mousemove", {clientX: r.left + left + w * 0.1, clientY: r.top + (row + 0.5) / R * r.height, bubbles: true}));
        out.push(tip.textContent);
      }
      return out;""")
    assert texts[1].endswith("): at the ranks' median"), texts  # rank 1 is the median of three
    assert texts[0].startswith("rank 0 ") and "typical spreads below the ranks' median" in texts[0], texts
    assert not any("-" + "0123456789"[d] in t.split(":")[-1] for t in texts for d in range(10)), texts  # no "-0.9"


def test_a_run_the_store_lacks_shows_its_error_alone(driver: Any) -> None:
    driver.get(driver.base_url + "run/99")
    error = wait_for(driver, "const e = document.querySelector('#head .error'); return e && e.textContent")
    assert "99" in error
    findings = driver.find_element("css selector", "#findings")
    assert not findings.is_displayed() and "computing" not in driver.find_element("tag name", "body").text


@pytest.mark.parametrize(("first", "last", "steps", "said"), [
    (1, 9, 9, "from step 1 to 9 (9 steps)"),  # off at every step of the stretch
    (8, 199, 117, "from step 8 to 199 (off at 117 of these steps)"),  # back in line at some: said so
    (5, 5, 1, "from step 5"),
])
def test_a_stretch_says_at_how_many_of_its_steps_the_rank_was_off(first: int, last: int, steps: int, said: str) -> None:
    from multirank_logger.judgement.sentences import finding_sentence

    item = {"rank": 1, "key": "loss", "first_step": first, "last_step": last, "steps": steps, "excess": 0.5,
            "ratio": 2.0, "spreads": 9.0}
    assert f"rank 1 loss departs from the other ranks {said}: " in finding_sentence("departure", item)


def test_plot_marks_where_a_line_ends_at_nan(nan_store: Path, tmp_path: Path) -> None:
    """`plot` of a key that went NaN: an x (pure red, matplotlib's "red") where the first ranks'
    lines end, and the words say which; a key without NaN has none."""
    import io

    import numpy as np
    from PIL import Image

    def red_pixels(png: Path) -> int:
        pixels = np.asarray(Image.open(io.BytesIO(png.read_bytes())).convert("RGB")).astype(int)
        return int(((pixels[..., 0] > 230) & (pixels[..., 1] < 30) & (pixels[..., 2] < 30)).sum())

    out = cli("plot", str(nan_store), "train_loss", "-o", str(tmp_path / "loss.png"))
    assert f"NaN/inf marked x: rank 2 from step {NAN_FROM}, rank 0 from step {SPREAD_AT}" in out, out
    assert red_pixels(tmp_path / "loss.png") > 50
    out = cli("plot", str(nan_store), "epoch", "-o", str(tmp_path / "epoch.png"))
    assert "NaN" not in out and red_pixels(tmp_path / "epoch.png") == 0
