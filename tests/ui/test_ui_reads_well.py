"""What a new user sees on the page (issue 40), in a real headless Chromium: a 3-rank run with a
bad shard (its loss spikes to 25,000), a slow rank, ``val_loss`` at 3 epoch ends, ``epoch``
alike on every rank, RSS in bytes (tests/helpers/new_user_store.py), and a second run.

Axis labels read in full with units, integer steps, sparse series drawn as points and lines,
the heatmap aligned with its chart and following its zoom, with a colour legend, colours kept on
a click, log scale and smoothing, the runs list and several runs overlaid, log records and
decisions as the terminal words them, and the report's file without a link to file:///.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import new_user_store as nu
from tests.helpers.ui_browser import chromium, served, wait_for

SHOTS = Path(__file__).resolve().parents[2] / "docs" / "img"


@pytest.fixture(scope="module")
def page_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    db = nu.build(tmp_path_factory.mktemp("reads_well") / "runs.sqlite")
    with served(str(db)) as url:
        yield url


def _ticks(driver: Any, series: str, axis: int) -> list[str]:
    """The tick labels the chart drew (after its layout: uPlot lays out a new chart a moment later)."""
    return wait_for(driver, f"return MRL_CHARTS[{series!r}].axes[{axis}]._values", timeout=10)


def _labels_fit(driver: Any, series: str) -> bool:
    """Every y tick label is narrower than the axis that holds it (uPlot's 50 px cut "25,000")."""
    return driver.execute_script(
        "const u = MRL_CHARTS[arguments[0]], a = u.axes[1], c = document.createElement('canvas').getContext('2d');"
        "c.font = a.font[0].replace(/[\\d.]+px/, (px) => parseFloat(px) / (window.devicePixelRatio || 1) + 'px');"
        "return a._values.every((v) => c.measureText(v).width + a.ticks.size + a.gap <= a._size);",
        series,
    )


def _pixel(driver: Any, series: str, step: float, value: float) -> list[int]:
    """The RGBA of the chart's canvas where (step, value) is drawn."""
    return driver.execute_script(
        "const u = MRL_CHARTS[arguments[0]], r = window.devicePixelRatio || 1;"
        "const x = Math.round(u.bbox.left + u.valToPos(arguments[1], 'x') * r), y = Math.round(u.bbox.top + u.valToPos(arguments[2], 'y') * r);"
        "return Array.from(u.ctx.getImageData(x, y, 1, 1).data);",
        series, step, value,
    )


def _heat_pixel(driver: Any, series: str, fraction: float, row: int, rows: int) -> list[int]:
    """The RGBA of a heatmap at `fraction` across its plot area, in the middle of rank row `row`."""
    return driver.execute_script(
        "const c = document.querySelector(`section[data-series='${arguments[0]}'] canvas.heatmap`), r = window.devicePixelRatio || 1;"
        "const x = (parseFloat(c.dataset.left) + arguments[1] * parseFloat(c.dataset.plotWidth)) * r;"
        "const y = ((arguments[2] + 0.5) / arguments[3]) * c.height;"
        "return Array.from(c.getContext('2d').getImageData(Math.round(x), Math.round(y), 1, 1).data);",
        series, fraction, row, rows,
    )


def test_the_run_page_reads_well_at_3_ranks(page_url: str, tmp_path: Path) -> None:
    with chromium(1300, 1400) as driver:
        # the runs list is shown, also to a store's first visitor; two different runs ticked
        driver.get(page_url)
        wait_for(driver, "return document.querySelectorAll('#runs tr[data-run]').length === 2")
        assert driver.execute_script("return location.pathname") == "/"
        assert sorted(driver.execute_script("return document.getElementById('compare').dataset.runs").split(",")) == ["1", "2"]
        driver.find_element("css selector", "#runs a[href='/run/1']").click()
        wait_for(driver, "return location.pathname === '/run/1' && document.body.dataset.judged")
        assert ", 1m30s, " in driver.find_element("id", "head").text  # the duration `runs` writes (point 15)

        # 4: a 25,000 peak's labels in full; RSS in MiB, StepTimer's seconds in ms
        assert "25k" in _ticks(driver, "train_loss", 1) and _labels_fit(driver, "train_loss")
        rss = _ticks(driver, "timing:rss", 1)
        assert all(t.endswith(" MiB") for t in rss) and len(set(rss)) == len(rss) > 2, rss
        assert all(float(t.split()[0]).is_integer() for t in rss), rss  # round MiB, not 619.9
        assert _labels_fit(driver, "timing:rss")
        assert all(t.endswith(" ms") for t in _ticks(driver, "timing:data_s", 1)[1:])
        # 6: integer steps only
        steps = _ticks(driver, "train_loss", 0)
        assert steps and all("." not in t for t in steps), steps
        # 5: val_loss (3 epoch ends) draws its 3 points, joined, and fills its heatmap
        assert driver.execute_script("return MRL_CHARTS.val_loss.data[3].filter((v) => v !== null).length") == 3
        for step in nu.VAL_STEPS:
            median = driver.execute_script(f"const d = MRL_CHARTS.val_loss.data; return d[3][d[0].indexOf({step})]")
            r, g, b, a = _pixel(driver, "val_loss", step, median)
            assert a > 200 and b > r + 40, (step, r, g, b)  # the median's dark blue point
        middle = driver.execute_script("const d = MRL_CHARTS.val_loss.data; return (d[3][d[0].indexOf(19)] + d[3][d[0].indexOf(39)]) / 2")
        assert _pixel(driver, "val_loss", 29, middle)[3] > 0  # a line between the points
        assert _heat_pixel(driver, "val_loss", 0.05, 0, nu.RANKS)[:3] != [235, 235, 235]

        # 7: the heatmap lies under its chart's plot area, a colour legend under it; epoch is said equal
        for series in ("train_loss", "val_loss", "timing:rss"):
            chart, heat = driver.execute_script(
                "const s = document.querySelector(`section[data-series='${arguments[0]}']`);"
                "const o = s.querySelector('.u-over').getBoundingClientRect(), c = s.querySelector('canvas.heatmap');"
                "const h = c.getBoundingClientRect();"
                "return [[o.left, o.width, o.bottom], [h.left + parseFloat(c.dataset.left), parseFloat(c.dataset.plotWidth), h.top]]",
                series,
            )
            assert abs(chart[0] - heat[0]) <= 1 and abs(chart[1] - heat[1]) <= 1, (series, chart, heat)
            assert 0 <= heat[2] - chart[2] <= 40, (series, chart, heat)  # just under the chart's x axis
            legend = driver.find_element("css selector", f"section[data-series='{series}'] .heat-legend").text
            assert "NaN/inf" in legend and "no value" in legend and "median" in legend
        epoch = driver.find_element("css selector", "section[data-series=epoch]")
        # a key alike on every rank is folded into one line (test_constant_keys), drawn on a click
        assert epoch.get_attribute("data-folded") == "1" and "the same on every rank" in epoch.text
        assert "Drag across a chart to zoom" in driver.find_element("id", "toolbar").text
        # the heatmap follows the chart's zoom: at step 0 rank 2 is near the median, from step 30 far above
        left = _heat_pixel(driver, "train_loss", 0.01, nu.BAD_RANK, nu.RANKS)
        driver.execute_script("MRL_CHARTS.train_loss.setScale('x', {min: 31, max: 50})")
        zoomed = _heat_pixel(driver, "train_loss", 0.01, nu.BAD_RANK, nu.RANKS)
        assert zoomed[0] - zoomed[2] > left[0] - left[2] + 50, (left, zoomed)  # deep red now
        driver.execute_script("MRL_CHARTS.train_loss.setScale('x', {min: 0, max: 60})")

        # 9: a click on rank 0's row adds its line; rank 2 keeps its colour
        def colour(rank: int) -> str:
            return driver.execute_script(
                "const s = MRL_CHARTS.train_loss.series.find((s) => s.label === 'rank ' + arguments[0]); return s && s._stroke",
                rank,
            )

        before = colour(nu.BAD_RANK)
        driver.execute_script(
            "const c = document.querySelector('section[data-series=train_loss] canvas.heatmap'), r = c.getBoundingClientRect();"
            "c.dispatchEvent(new MouseEvent('click', {clientX: r.left + parseFloat(c.dataset.left) + 20, clientY: r.top + r.height / 6}));"
        )
        wait_for(driver, "return MRL_CHARTS.train_loss.series.some((s) => s.label === 'rank 0')")
        assert before and colour(nu.BAD_RANK) == before and colour(0) != before

        # 8: log scale and smoothing
        driver.find_element("id", "log-scale").click()
        assert driver.execute_script("return MRL_CHARTS.train_loss.scales.y.distr") == 3
        assert "10k" in _ticks(driver, "train_loss", 1) or "1e4" in " ".join(_ticks(driver, "train_loss", 1))
        driver.find_element("id", "log-scale").click()
        raw = driver.execute_script("return MRL_CHARTS.train_loss.data[3].slice()")
        driver.execute_script("const s = document.getElementById('smoothing'); s.value = 0.9; s.dispatchEvent(new Event('input'));")
        smooth = driver.execute_script("return MRL_CHARTS.train_loss.data[3]")
        assert smooth[0] == pytest.approx(raw[0], rel=1e-6) and smooth[40] > raw[40] * 1.05  # the spike, carried on

        # 12: the model summary keeps its lines; decisions in the terminal's words
        logs = driver.find_element("id", "logs")
        message = logs.find_element("css selector", "pre.message").text
        assert "Trainable params\n" in message and "| Name" in message.splitlines()[0]
        rows = [r.text for r in logs.find_elements("css selector", "table:not(.logs) tr")[1:]]
        assert rows and all(r.endswith(" saved") for r in rows) and any(" no saved" in r for r in rows), rows
        assert not any("true" in r or "false" in r for r in rows)
        driver.save_screenshot(str(tmp_path / "run3.png"))

        # 10: several runs overlaid, each key's median and band per run
        driver.get(page_url + "compare?runs=1,2")
        wait_for(driver, "return document.body.dataset.drawn")
        overlaid = driver.execute_script("return Array.from(document.querySelectorAll('section.series .band'), (b) => b.dataset.runs)")
        assert overlaid and all(r == "1,2" for r in overlaid), overlaid
        labels = driver.execute_script("return MRL_CHARTS.train_loss.series.map((s) => s.label)")
        assert "1: new_user/version_0" in labels and "2: new_user/version_1" in labels
        driver.find_element("id", "log-scale").click()  # the overlay takes the toolbar too
        assert driver.execute_script("return MRL_CHARTS.train_loss.scales.y.distr") == 3


def test_the_report_file_links_nowhere_outside_it(tmp_path: Path) -> None:
    """report -o FILE: the header names the tool without a link (it went to file:///)."""
    from click.testing import CliRunner

    from multirank_logger.cli import main

    db, page = nu.build(tmp_path / "runs.sqlite", runs=1), tmp_path / "report.html"
    result = CliRunner().invoke(main, ["report", str(db), "-o", str(page)])
    assert result.exit_code == 0, result.output
    with chromium(1100, 900) as driver:
        driver.get(page.as_uri())
        wait_for(driver, "return document.body.dataset.drawn")
        links = driver.execute_script("return Array.from(document.querySelectorAll('a[href]'), (a) => a.href)")
        assert not any(link.rstrip("/") == "file:" or link == "file:///" for link in links), links
        assert driver.find_element("id", "home").tag_name == "span"
