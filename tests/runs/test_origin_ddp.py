"""A NaN that starts on one rank and spreads through the gradient all-reduce (tests/scripts/origin_train.py,
a real 4-rank DDP training over gloo on CPU): every surface names the rank where it started.

Rank 2's batch is NaN at one step; every rank's loss is NaN from the next. The report lists rank 2
first and says the others followed; the watch raises rank 2's alert first, and by the time
`finalize` returns the alerts are the report's findings, (kind, rank, key, first step) for each,
even where the NaN came in the run's last flush interval; `StopOnAlert` stops for rank 2.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from multirank_logger import open_store
from multirank_logger.cli import main
from multirank_logger.judgement.sentences import finding_sentence, followers_sentence, sentence_groups
from multirank_logger.report import find
from tests.helpers.launches import SCRIPTS, run_ranks_forked
from tests.helpers.logger_helpers import query, train_env

TRAIN = SCRIPTS / "origin_train.py"
NAN_RANK = 2
SPREAD = ("rank 2 train_loss NaN from step {s}; followed by ranks 0-1,3 at step {t} "
          "(every other rank within 1 step: spread through the gradient all-reduce)")


def _train(root: Path, db: Path, *args: str) -> str:
    proc = run_ranks_forked(TRAIN, ["--db", str(db), "--save-dir", str(root), *args], nproc=4, cwd=root,
                            env=train_env(), timeout=300)
    assert proc.returncode == 0 and (root / "fit-returned").exists(), proc.stdout[-6000:]
    return proc.stdout


def _alerts(db: Path) -> list[tuple[str, int, str, int]]:
    return [tuple(r) for r in query(db, "SELECT kind, rank, key, first_step FROM alerts ORDER BY seq")]  # type: ignore[misc]


@pytest.mark.parametrize("suffix", [".sqlite", ".duckdb"])  # direct on SQLite, gather on DuckDB (their defaults)
def test_a_nan_in_the_last_steps_names_its_origin_everywhere(tmp_path: Path, suffix: str) -> None:
    """NaN from rank 2 at step 30 of 36, all inside the default 5 s flush interval: the alerts,
    raised by the time finalize returns, are the report's findings; rank 2 leads both."""
    db = tmp_path / f"runs{suffix}"
    out = _train(tmp_path, db, "--nan-step", "30", "--steps", "36")
    with open_store(db) as reader:
        found = find(reader)
    report = [("non_finite", n["rank"], n["key"], n["first_step"]) for n in found.non_finite]
    assert report == [("non_finite", 2, "train_loss", 30)] + [("non_finite", r, "train_loss", 31) for r in (0, 1, 3)]
    assert [n["origin"] for n in found.non_finite] == [True, False, False, False]
    assert found.non_finite[0]["spread"]["followers"] == [[0, 31], [1, 31], [3, 31]]
    # to the last row: by the time finalize returned, the alerts are the report's findings. Their
    # order is the origin's first when every rank's rows reach the watch within its close_after
    # (12 s here); a rank whose rows come later than that (a loaded host, the default 5 s flush)
    # lets a follower's alert go first, and the origin's then names the followers (docs/report.md)
    alerts = _alerts(db)
    assert sorted(alerts) == sorted(report)
    # the verdict kept at the run's end (the findings table): the report's findings, the origin
    # named, in the report's order, each with the report's sentence
    kept = query(db, "SELECT kind, rank, series, first_step, origin, origin_step, sentence FROM findings ORDER BY seq")
    assert [(k, r, s, f) for k, r, s, f, *_ in kept] == report
    assert [(bool(o), os) for *_, o, os, _ in kept] == [(True, 30), (False, 30), (False, 30), (False, 30)]
    # (the followers at one step keep their one sentence, as the report's text says them)
    said = [followers_sentence("non_finite", g) for g in sentence_groups("non_finite", found.non_finite) for _ in g]
    assert [sentence for *_, sentence in kept] == said
    assert said[0] == finding_sentence("non_finite", found.non_finite[0])
    with open_store(db) as reader:
        every = reader.findings(every_run=True)
    assert every["rank"].tolist() == [2, 0, 1, 3] and every["origin"].tolist() == [True, False, False, False]
    listed = CliRunner().invoke(main, ["findings", str(db), "--all-runs"]).output
    assert "non_finite origin   rank 2 train_loss NaN from step 30; followed by" in listed, listed
    assert "non_finite followed ranks 0-1,3 train_loss NaN from step 31, after rank 2 at step 30" in listed, listed
    assert listed.count("non_finite followed") == 1, listed
    assert all(a["in_report"] for a in found.alerts)
    text = CliRunner().invoke(main, ["report", str(db)]).output
    assert SPREAD.format(s=30, t=31) in text
    # the followers at one step in one line, after the origin's
    follow = "ranks 0-1,3 train_loss NaN from step 31, after rank 2 at step 30"
    assert text.index("rank 2 train_loss NaN from step 30") < text.index(follow), text
    # the console said each once; the origin's names itself as where it started
    lines = [line for line in out.splitlines() if line.startswith("multirank_logger alert: ")]
    assert len(lines) == 4 and sum(line.startswith("multirank_logger alert: rank 2 train_loss NaN from step 30;")
                                   for line in lines) == 1, lines
    listed = json.loads(CliRunner().invoke(main, ["alerts", str(db), "--format", "json"]).output)["alerts"]
    (origin,) = [a for a in listed if a["rank"] == NAN_RANK]
    assert origin["message"].startswith("rank 2 train_loss NaN from step 30; followed by ")


def test_stop_on_alert_stops_for_the_origin(tmp_path: Path) -> None:
    """StopOnAlert(kinds={"non_finite"}) on a 300-step run whose NaN starts on rank 2 at step 40:
    the fit stops early, for rank 2's alert, and `runs` and the report say so. (Gather at a 0.5 s
    flush: the ranks' rows reach the watch within about a second, far inside its 10 s close_after,
    past which a lagging rank's follower could be alerted first: see the test above.)"""
    db = tmp_path / "runs.duckdb"
    out = _train(tmp_path, db, "--nan-step", "40", "--steps", "300", "--flush-interval", "0.5", "--stop")
    # rank 0's line can run into another process's output on the shared pipe: read the digits only
    ended = int(re.search(r"TRAINING ENDS AT STEP (\d+)", out)[1])  # type: ignore[index]
    assert 41 < ended < 300, out[-3000:]
    assert _alerts(db)[0] == ("non_finite", NAN_RANK, "train_loss", 40)
    assert query(db, "SELECT rank, first_step FROM alerts WHERE kind = 'stop'") == [(NAN_RANK, 40)]
    stop = [line for line in out.splitlines() if "StopOnAlert ends the fit" in line]
    assert len(stop) == 1 and SPREAD.format(s=40, t=41) in stop[0], stop
    runs = CliRunner().invoke(main, ["runs", str(db)]).output
    assert "non_finite alert: rank 2, train_loss, from step 40" in runs, runs
    # the stop's step is the step the stopped batch's metrics are logged at: every rank's last
    # logged step, and the run's last step beside it ("stopped at step 211" by "last step 210" was
    # Lightning's global_step, counted before the batch is logged)
    (stop_step,) = {s for (s,) in query(db, "SELECT step FROM decisions WHERE callback = 'StopOnAlert'")}
    assert {s for (_, s) in query(db, "SELECT rank, max(step) FROM metrics GROUP BY rank")} == {stop_step}
    assert query(db, "SELECT step_seen FROM alerts WHERE kind = 'stop'") == [(stop_step,)]
    # (it logged every step from 0: its steps are its last step's number and one)
    (listed,) = json.loads(CliRunner().invoke(main, ["runs", str(db), "--format", "json"]).output)
    assert listed["steps"] == stop_step + 1 and f"at step {stop_step:,} (" in listed["stopped_by"], listed
