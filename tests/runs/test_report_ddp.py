"""`multirank-logger report` on real 3-rank DDP runs over gloo on CPU, with StepTimer.

One store, two launches of tests/scripts/report_train.py on the same model: `faulty` (rank 1's data
loader sleeps 100 ms per batch, rank 2's train_loss is 20x from step 20, rank 2 logs NaN for
weight_norm from step 25) and `clean` (nothing injected).
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from multirank_logger import open_store
from multirank_logger.cli import main
from multirank_logger.report import find
from tests.helpers.kept_verdict import LOAD_REASONS, assert_served_as_judged
from tests.helpers.launches import SCRIPTS, run_ranks_forked
from tests.helpers.logger_helpers import query, train_env

TRAIN = SCRIPTS / "report_train.py"
STEPS = 50


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("report")
    db = root / "runs.sqlite"
    for name, extra in (("faulty", ["--faults"]), ("clean", [])):
        args = ["--db", str(db), "--save-dir", str(root), "--name", name, "--steps", str(STEPS), *extra]
        proc = run_ranks_forked(TRAIN, args, nproc=3, cwd=root, env=train_env(), timeout=240)
        assert proc.returncode == 0, proc.stdout[-8000:]
    return db


def test_step_timer_records_every_rank_and_step(db: Path) -> None:
    """StepTimer stored one row per rank and step: the step's parts, the batch size, the RSS."""
    rows = query(
        db,
        "SELECT rank, COUNT(DISTINCT step), MIN(forward_s), MIN(rest_s), MIN(batch_size), MAX(batch_size), "
        "MIN(rss), COUNT(data_s) FROM step_timing WHERE run_id = 1 GROUP BY rank ORDER BY rank",
    )
    assert [r[0] for r in rows] == [0, 1, 2]
    for _, steps, forward, rest, bs_min, bs_max, rss, data in rows:
        assert steps == STEPS and forward > 0 and rest > 0 and bs_min == bs_max == 8
        assert rss > 50 * 2**20 and data == STEPS - 1  # the first batch has no previous one to wait from


def test_report_names_the_faulty_ranks(db: Path) -> None:
    """Rank 1 the data straggler, rank 2 the train_loss outlier from step 20, rank 2's first NaN at 25."""
    with open_store(db) as reader:
        found = find(reader, run="faulty")
    assert [(s["rank"], s["phase"]) for s in found.stragglers] == [(1, "data")]
    assert found.stragglers[0]["first_step"] <= 3 and 0.080 < found.stragglers[0]["excess_s"] < 0.150
    assert [(o["rank"], o["key"]) for o in found.outliers] == [(2, "train_loss")]
    assert 19 <= found.outliers[0]["first_step"] <= 21 and found.outliers[0]["last_step"] == STEPS - 1
    assert found.outliers[0]["ratio"] > 5
    assert [(n["rank"], n["key"], n["first_step"], n["nan"]) for n in found.non_finite] == [
        (2, "weight_norm", 25, STEPS - 25)
    ]
    assert [r["status"] for r in found.ranks] == ["success"] * 3 and all(r["steps"] == STEPS for r in found.ranks)


@pytest.mark.parametrize("run", ["faulty", "clean"])
def test_the_verdict_the_watch_kept_is_served_and_is_the_reports(db: Path, run: str) -> None:
    """Each run's end was judged whole by rank 0's watch: `report` serves its kept verdict (no pass
    over the rows), and it says what the pass over the rows says, every finding and number (on a
    loaded machine a rank's rows may come too late for the watch to hold the whole run: then the
    pass runs and says so)."""
    with open_store(db) as reader:
        served, judged = find(reader, run=run), find(reader, run=run, from_rows=True)
    assert_served_as_judged(served, judged)
    text = CliRunner().invoke(main, ["report", str(db), "--run", run, "--format", "json"]).output
    rows = CliRunner().invoke(main, ["report", str(db), "--run", run, "--format", "json", "--from-rows"]).output
    assert (json.loads(text)["judged_from"], json.loads(rows)["judged_from"]) == (served.judged_from, "rows")


def test_clean_run_reports_nothing(db: Path) -> None:
    """The same model with no fault injected: no straggler, no outlier, no NaN, no memory finding."""
    with open_store(db) as reader:
        found = find(reader, run="clean")
    assert found.stragglers == [] and found.outliers == [] and found.non_finite == [] and found.memory == []
    assert not found.problems and len(found.timing) == 3


def test_the_watch_alerted_what_the_report_finds_and_nothing_in_the_clean_run(db: Path) -> None:
    """The watch (on by default; direct transport: it read the SQLite store while the ranks wrote it)
    raised each finding of the faulty run once during it, with the report's rank, key and first
    step; in the clean run it raised nothing (no false alarm)."""
    with open_store(db) as reader:
        found = find(reader, run="faulty")
        clean = reader.alerts("clean")
    assert sorted((a["kind"], a["rank"], a["key"], a["first_step"]) for a in found.alerts) == sorted(
        [("straggler", s["rank"], f"timing:{s['phase']}_s", s["first_step"]) for s in found.stragglers]
        + [("departure", o["rank"], o["key"], o["first_step"]) for o in found.outliers]
        + [("non_finite", n["rank"], n["key"], n["first_step"]) for n in found.non_finite]
    )
    assert all(a["in_report"] for a in found.alerts) and all(a["step_seen"] < STEPS for a in found.alerts)
    assert clean.empty, clean.to_string()


def test_report_json_lists(db: Path) -> None:
    """--format json: top-level stragglers, outliers, non_finite, each item with rank (key, first_step)."""
    result = CliRunner().invoke(main, ["report", str(db), "--run", "faulty", "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [s["rank"] for s in data["stragglers"]] == [1]
    assert [(o["rank"], o["key"]) for o in data["outliers"]] == [(2, "train_loss")]
    assert [(n["rank"], n["key"], n["first_step"]) for n in data["non_finite"]] == [(2, "weight_norm", 25)]


def test_report_text(db: Path) -> None:
    """The terminal report says which rank, from which step; the clean run says nothing stands out."""
    result = CliRunner().invoke(main, ["report", str(db), "--run", "faulty"])
    assert result.exit_code == 0, result.output
    assert "rank 1 straggles in data" in result.output and "rank 2 train_loss departs" in result.output
    assert "rank 2 weight_norm NaN from step 25" in result.output
    clean = CliRunner().invoke(main, ["report", str(db), "--run", "clean"])
    assert clean.exit_code == 0 and "Nothing stands out." in clean.output


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_plot_command_writes_png(db: Path, tmp_path: Path) -> None:
    """`plot DB KEY -o FILE`: a PNG of the documented size, naming the outlier rank."""
    from multirank_logger.report.plots import SIZE_PX

    out = tmp_path / "loss.png"
    result = CliRunner().invoke(main, ["plot", str(db), "train_loss", "--run", "faulty", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "outlier ranks: 2" in result.output
    assert _png_size(out.read_bytes()) == SIZE_PX


def test_html_report_is_the_ui_page_in_one_file(db: Path, tmp_path: Path) -> None:
    """report -o FILE: the ui's page of the run in one self-contained file, opened from disk in a
    real headless Chromium: it draws the straggler's data wait, the outlier's key and the NaN's
    key, names ranks 1 and 2, and asks for nothing but the file itself."""
    import numpy as np
    from PIL import Image

    from tests.helpers.ui_browser import chromium, requested_urls

    page = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["report", str(db), "--run", "faulty", "-o", str(page)])
    assert result.exit_code == 0, result.output
    assert "window.MRL_STATIC" in page.read_text() and "<script src=" not in page.read_text()
    with chromium(1100, 2400) as driver:
        driver.get(page.as_uri())
        for _ in range(600):
            if driver.execute_script("return document.body.dataset.drawn"):
                break
            time.sleep(0.1)
        flagged = driver.execute_script(
            "return Object.fromEntries(Array.from(document.querySelectorAll('section.series'), s => [s.dataset.series, s.dataset.flagged]))"
        )
        assert flagged["train_loss"] == "2" and flagged["weight_norm"] == "2" and "1" in flagged["timing:data_s"].split(",")
        findings = driver.find_element("id", "findings").text
        assert "rank 2 train_loss departs" in findings and "rank 1 straggles in data" in findings
        assert driver.execute_script("return document.querySelectorAll('canvas.heatmap').length") >= 3
        assert {u for u in requested_urls(driver) if not u.startswith("data:")} == {page.as_uri()}
        shot = tmp_path / "shot.png"
        driver.save_screenshot(str(shot))
    pixels = np.asarray(Image.open(shot).convert("RGB"), dtype=np.int32)
    coloured = int((pixels.max(axis=2) - pixels.min(axis=2) > 80).sum())  # the ranks' lines, the heatmaps
    assert coloured > 5000, coloured


@pytest.mark.parametrize("run", ["faulty", "clean"])
def test_the_page_names_the_ranks_the_report_names(db: Path, run: str) -> None:
    """Under every chart, the live page and the HTML report name the ranks the report names, and
    no other: the page's own rule once said "ranks departing: 0, 1, 2" under timing:forward_s of
    such a run, where the report found no straggler."""
    from tests.helpers.page_agreement import page_and_report

    compared = page_and_report(db, run)
    assert [item for item in compared if list(item[1]) != list(item[2])] == []
    if run == "faulty":
        assert ("train_loss", [2], [2]) in compared and ("timing:data_s", [1], [1]) in compared
        assert ("weight_norm NaN/inf", [2], [2]) in compared


def _cost_by_hand(db: Path, run_name: str, phase: str, first: int, last: int) -> tuple[float, int]:
    """The definition (judgement/cost.py), from the stored StepTimer rows: per step from `first` to
    `last` timed by 3 ranks or more, the slowest rank's seconds in `phase` minus the median rank's,
    summed; and those steps."""
    rows = query(db, f"SELECT t.rank, t.step, t.{phase}_s FROM step_timing t JOIN runs r ON r.id = t.run_id "
                     f"WHERE r.name = :name AND t.{phase}_s IS NOT NULL", name=run_name)
    by_step: dict[int, dict[int, float]] = {}
    for rank, step, seconds in rows:
        by_step.setdefault(int(step), {})
        by_step[int(step)][int(rank)] = by_step[int(step)].get(int(rank), 0.0) + float(seconds)
    waited, steps = 0.0, 0
    for step in range(first, last + 1):
        times = sorted(by_step.get(step, {}).values())
        if len(times) >= 3:
            middle = len(times) // 2
            median = times[middle] if len(times) % 2 else (times[middle - 1] + times[middle]) / 2
            waited += times[-1] - median
            steps += 1
    return waited, steps


def test_a_stragglers_cost_in_its_alert_its_kept_verdict_and_runs(db: Path) -> None:
    """The watch's alert says what rank 1's data wait cost so far, the kept verdict what it cost
    through its stretch, and `runs` that figure: each equal to the definition computed here from
    the stored step times (per step the slowest rank's time minus the median's, times the ranks)."""
    with open_store(db) as reader:
        [alert] = [a for a in reader.alerts("faulty").to_dict("records") if a["kind"] == "straggler"]
        [kept] = [f for f in reader.findings("faulty").to_dict("records") if f["kind"] == "straggler"]
        rows = {r["run"].split("/")[0]: r for r in reader.run_rows()}
    ranks = rows["faulty"]["world_size"]
    said = json.loads(alert["detail"])
    waited, steps = _cost_by_hand(db, "faulty", "data", int(alert["first_step"]), said["last_step"])
    assert said["waited_s"] == pytest.approx(waited, rel=1e-9) and said["cost_steps"] == steps > 0
    assert said["rank_hours"] == pytest.approx(waited * ranks / 3600, rel=1e-9) and said["hours_unit"] == "rank-hours"
    assert f"{said['cost_steps']} steps: " in alert["message"] and "rank-hours (CPU ranks) lost so far" in alert["message"]
    detail = json.loads(kept["detail"])
    waited, steps = _cost_by_hand(db, "faulty", "data", int(kept["first_step"]), detail["last_step"])
    assert detail["last_step"] >= said["last_step"] and detail["cost_steps"] == steps >= said["cost_steps"]
    assert detail["waited_s"] == pytest.approx(waited, rel=1e-9)
    assert detail["rank_hours"] == pytest.approx(waited * ranks / 3600, rel=1e-9)
    # the report, reading every stored row at the end, counts the same steps (those timed by 3 ranks
    # or more) by the same definition: its figure is the kept one where its stretch is
    with open_store(db) as reader:
        report = find(reader, "faulty")
    [item] = [s for s in report.to_dict()["stragglers"] if s["rank"] == 1 and s["phase"] == "data"]
    waited, steps = _cost_by_hand(db, "faulty", "data", item["first_step"], item["last_step"])
    assert item["waited_s"] == pytest.approx(waited, rel=1e-9) and item["cost_steps"] == steps
    if report.judged_from == "kept verdict":  # the watch held the whole run: one stretch, one figure
        assert (item["first_step"], item["last_step"]) == (int(kept["first_step"]), detail["last_step"])
        assert item["waited_s"] == pytest.approx(detail["waited_s"], rel=1e-9)
    else:  # a loaded machine: a rank's last rows came after the watch judged their step (it says so)
        assert any(reason in (report.verdict_not_served or "") for reason in LOAD_REASONS), report.verdict_not_served
        assert item["first_step"] == int(kept["first_step"]) and detail["last_step"] <= item["last_step"]
    # runs: the kept figure (one straggler), from one read of the kept verdicts; "-" where none
    assert rows["faulty"]["lost_hours"] == pytest.approx(detail["rank_hours"], rel=1e-12)
    assert rows["clean"]["lost_hours"] is None
    table = CliRunner().invoke(main, ["runs", str(db)]).output
    assert "lost GPU-h" in table.splitlines()[0]
    from multirank_logger._util.readable import number_text

    faulty_line = next(line for line in table.splitlines() if "faulty/" in line)
    assert faulty_line.rstrip().endswith(f"{number_text(detail['rank_hours'])} (CPU)"), faulty_line
    clean_line = next(line for line in table.splitlines() if "clean/" in line)
    assert clean_line.rstrip().endswith("-"), clean_line


def test_tensorboard_export_is_one_run_with_its_ranks_and_their_timing(db: Path, tmp_path: Path) -> None:
    """`export --format tensorboard` of the faulty run, read back by TensorBoard's reader: one
    TensorBoard run (its ranks' median, min, max) with a sub-run per rank, and StepTimer's
    series (``timing:data_s`` ...) beside the keys at every step each rank timed; rank 1's slow
    data loader is there in its own data_s and in the run's max."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    out = tmp_path / "tb"
    result = CliRunner().invoke(main, ["export", str(db), "--format", "tensorboard", "--run", "faulty", "-o", str(out)])
    assert result.exit_code == 0, result.output
    (folder,) = (p.relative_to(out) for p in out.glob("faulty/*") if p.is_dir())
    assert sorted(EventMultiplexer().AddRunsFromDirectory(str(out)).Runs()) == [
        str(folder), *(f"{folder}/rank_{r}" for r in range(3))]
    timed = dict(query(db, "SELECT rank, COUNT(data_s) FROM step_timing WHERE run_id = 1 GROUP BY rank"))
    slow: dict[int, float] = {}
    for rank in range(3):
        acc = EventAccumulator(str(out / folder / f"rank_{rank}"), size_guidance={"scalars": 0})
        acc.Reload()
        assert {"train_loss", "timing:data_s", "timing:forward_s", "timing:rest_s", "timing:rss"} <= set(acc.Tags()["scalars"])
        assert [e.step for e in acc.Scalars("timing:forward_s")] == list(range(STEPS))
        assert [e.step for e in acc.Scalars("train_loss")] == list(range(STEPS))  # no step dropped by a step going back
        data = acc.Scalars("timing:data_s")
        assert len(data) == timed[rank]
        slow[rank] = sorted(e.value for e in data)[len(data) // 2]
    assert slow[1] > 0.08 > max(slow[0], slow[2])  # rank 1's loader sleeps 100 ms a batch
    run = EventAccumulator(str(out / folder), size_guidance={"scalars": 0})
    run.Reload()
    assert {"timing:data_s", "ranks_max/timing:data_s", "ranks_min/timing:data_s"} <= set(run.Tags()["scalars"])
    highest = sorted(e.value for e in run.Scalars("ranks_max/timing:data_s"))
    assert highest[len(highest) // 2] > 0.08


def _blue(pixels: Any) -> Any:
    """Run 1's line colour on the compare page (#08519c), also antialiased; not its pale band."""
    r, g, b = pixels[..., 0], pixels[..., 1], pixels[..., 2]
    return (r < 140) & (b - r > 60) & (b > g)


def test_compare_draws_the_rank_picked_per_run_and_a_wall_time_axis(db: Path) -> None:
    """The compare page in Chromium on the two real runs: run 1's (faulty) rank 2 against run 2's
    (clean) rank 2 draws rank 2's line (run 1's colour at its values, 20x the others' from step 20),
    not the median (picking the median moves the line there); the wall-time axis puts each run's
    values at the seconds since its own start, labelled as `runs` writes durations."""
    import io

    import numpy as np
    from PIL import Image

    from tests.helpers.ui_browser import chromium, served, wait_for

    def painted() -> Any:
        over = driver.find_element("css selector", "section[data-series=train_loss] .u-over")
        return _blue(np.asarray(Image.open(io.BytesIO(over.screenshot_as_png)).convert("RGB")).astype(int))

    def near(mask: Any, x: float, y: float, r: int = 3) -> bool:
        return bool(mask[max(0, int(y) - r) : int(y) + r + 1, max(0, int(x) - r) : int(x) + r + 1].any())

    # a point of run 1's line (series 2: its q3, line, q1 come first) late in the run, in plot pixels
    point = ("const u = MRL_CHARTS.train_loss, k = u.data[2].map((v, j) => v === null ? -1 : j).filter((j) => j >= 0).pop();"
             " return [u.data[0][k], u.data[2][k], u.valToPos(u.data[0][k], 'x'), u.valToPos(u.data[2][k], 'y'), u.series[2].label];")
    with served(str(db)) as url, chromium(1300, 1200) as driver:
        driver.get(url + "compare?runs=1,2&rank=1:2,2:2")
        wait_for(driver, "return document.body.dataset.drawn && MRL_CHARTS.train_loss")
        box = driver.find_element("css selector", "section[data-series=train_loss] .band")
        assert box.get_attribute("data-lines") == "1:2,2:2"
        step, value, x, y, label = driver.execute_script(point)
        assert label == "1: faulty/version_0 rank 2" and step > 20
        with open_store(db) as reader:
            ranks = reader.per_rank("train_loss", run="faulty")
        assert value > 5 * float(ranks.loc[step, [0, 1]].max())  # rank 2's outlying value, not the median's
        assert near(painted(), x, y)
        # the median picked for run 1: its line leaves rank 2's place for the median's
        driver.execute_script("const s = document.querySelector('select.pick-rank[data-run=\"1\"]'); s.value = '';"
                              " s.dispatchEvent(new Event('change'));")
        wait_for(driver, "return document.querySelector('section[data-series=train_loss] .band').dataset.lines === '1:median,2:2'")
        assert "rank=2:2" in driver.current_url and "1:2" not in driver.current_url
        _, median, mx, my, label = driver.execute_script(point)
        assert label == "1: faulty/version_0" and median < value / 5 and my - y > 20
        # (the median's own pixels may lie under run 2's line: the two runs' typical losses are alike)
        assert not near(painted(), x, y)
        # the wall-time axis: seconds since each run's own start (run 2 started after run 1 ended)
        driver.get(url + "compare?runs=1,2&x=time")
        wait_for(driver, "return document.body.dataset.drawn && MRL_CHARTS.train_loss"
                         " && document.querySelector('section[data-series=train_loss] .band').dataset.x === 'time'")
        xs, first_two, labels = driver.execute_script(
            "const u = MRL_CHARTS.train_loss; return [u.data[0], u.data[5].findIndex((v) => v !== null), u.axes[0]._values];")
        assert 0 <= xs[0] < 30 and xs == sorted(xs) and max(xs) < 600
        assert xs[first_two] < 30  # run 2's values from its own start, beside run 1's
        assert labels and all(label.endswith("s") for label in labels), labels  # 0.0s, 5.0s, 1m30s
        assert driver.find_element("id", "x-axis").get_attribute("value") == "time"
