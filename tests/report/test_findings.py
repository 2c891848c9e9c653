"""The robust departure test behind outlier ranks and stragglers, and the plots, on step x rank tables.

The DDP runs in tests/runs/test_report_ddp.py check the whole report; here the detection meets many
noisy runs (seeded), so a false alarm on the normal spread of shards would show.
"""

from __future__ import annotations

import struct
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from multirank_logger.report.findings import departures
from tests.helpers.built_stores import fill_side_store
from tests.helpers.planted_rows import noisy_losses

pytest.importorskip("matplotlib", reason="the plot tests need matplotlib (pip install -e '.[test]')")


def _table(values: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame(values, index=pd.Index(np.arange(len(values)), name="step"), columns=range(values.shape[1]))


@pytest.mark.parametrize("ranks", [3, 4, 8, 32])
def test_no_departure_in_normal_shard_noise(ranks: int) -> None:
    """50 seeded runs of noisy, decaying losses (each shard its own noise and offset): no finding."""
    found = [(seed, departures(_table(noisy_losses(seed, ranks)))) for seed in range(50)]
    assert [f for f in found if f[1]] == []


@pytest.mark.parametrize("ranks", [3, 8, 32])
def test_runaway_rank_found_from_its_first_step(ranks: int) -> None:
    """One rank at 20x from step 120: found, from step 120, about 20x the median."""
    values = noisy_losses(1, ranks)
    values[120:, ranks - 1] *= 20
    (item,) = departures(_table(values))
    assert item["rank"] == ranks - 1 and item["first_step"] == 120 and item["last_step"] == 199
    assert 10 < item["ratio"] < 30


def test_small_persistent_shift_found() -> None:
    """A rank shifted by several widths of the shards' noise from step 50 (less than its value) is found."""
    values = noisy_losses(2, 8)
    shifted = values.copy()
    shifted[50:, 3] += 15 * 0.2 * 0.3 * 1.5  # well past the noise, a fraction of the value
    assert [i["rank"] for i in departures(_table(shifted))] == [3]


# data_s (ms) of a 3-rank run whose rank 1 waits 30 ms for every batch, steps 1-13 as a fresh-clone
# `make test` measured them on a loaded 2-core machine: at steps 5-7 the other ranks waited too
_LOADED_STEPS = [
    (7.6, 35.8, 2.8), (1.1, 34.0, 2.9), (2.7, 37.3, 4.2), (0.8, 35.3, 4.3), (21.4, 38.1, 19.0), (18.0, 37.3, 0.8),
    (20.5, 31.1, 10.7), (4.2, 42.3, 0.6), (2.1, 34.5, 3.5), (2.1, 37.6, 2.6), (4.2, 41.7, 16.0), (2.8, 36.5, 2.2),
    (13.8, 35.9, 0.6),
]


def test_a_straggler_is_found_from_its_first_step_through_a_few_noisy_steps() -> None:
    """A slow shard from step 1, with steps 5-7 where the other ranks were slow too (the host was
    busy): one straggler from step 1, not from step 8, where its uninterrupted stretch begins."""
    rng = np.random.default_rng(0)
    steady = np.abs(3.0 + 1.5 * rng.standard_normal((36, 3))) + np.array([0.0, 32.0, 0.0])
    values = np.vstack([np.array(_LOADED_STEPS), steady]) / 1000
    (item,) = departures(_table(values), higher_only=True)
    assert (item["rank"], item["first_step"], item["last_step"]) == (1, 0, 48)
    assert 0.025 < item["excess"] < 0.040


def test_a_short_stretch_alone_is_no_finding() -> None:
    """Four departing steps, then the rank back among the others: no persistent departure."""
    values = noisy_losses(4, 4)
    values[100:104, 1] *= 30
    assert departures(_table(values)) == []


def test_spikes_are_not_persistent() -> None:
    """Single-step spikes on one rank (every 10th step) are not a persistent departure."""
    values = noisy_losses(3, 4)
    values[::10, 2] *= 50
    assert departures(_table(values)) == []


def test_higher_only_ignores_faster_ranks() -> None:
    """For timings, a rank far *below* the others (a fast rank) is no straggler."""
    values = np.full((60, 4), 0.010) + 0.0005 * np.random.default_rng(0).standard_normal((60, 4))
    values[:, 0] = 0.0001
    assert departures(_table(values), higher_only=True) == []
    assert [i["rank"] for i in departures(_table(values))] == [0]


def test_two_ranks_and_identical_ranks_give_nothing() -> None:
    """Fewer than 3 ranks at a step, or ranks equal at every step (synced values): no departure."""
    assert departures(_table(noisy_losses(0, 2))) == []
    assert departures(_table(np.tile(np.arange(100.0)[:, None], (1, 5)))) == []


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_plot_one_line_per_rank() -> None:
    """Up to MAX_LINES ranks: one line per rank, the outlier labelled; the PNG has SIZE_PX pixels."""
    from multirank_logger.report.plots import SIZE_PX, figure_png, plot_key

    figure = plot_key(_table(noisy_losses(0, 4)), "train_loss", outliers=[2])
    (ax,) = figure.axes
    assert [line.get_label() for line in ax.lines] == ["rank 0", "rank 1", "rank 2 (outlier)", "rank 3"]
    assert [t.get_text() for t in ax.texts] == ["rank 2"]
    assert _png_size(figure_png(figure)) == SIZE_PX


def test_plot_says_when_every_rank_logged_the_same_values() -> None:
    """A synced value draws one line over the others: the title says why only one shows."""
    from multirank_logger.report.plots import plot_key

    table = _table(noisy_losses(0, 3))
    synced = table.copy()
    for rank in synced.columns:
        synced[rank] = table[0]
    synced.iloc[3, 1] = float("nan")  # a rank's missing value is no difference
    assert plot_key(synced, "mean_loss", title="t").axes[0].get_title() == "t: every rank logged the same values"
    assert plot_key(table, "train_loss", title="t").axes[0].get_title() == "t"


def test_plot_many_ranks_as_a_band() -> None:
    """Past MAX_LINES ranks: the others' range as a band and their median, the outliers drawn on top."""
    from multirank_logger.report.plots import MAX_LINES, plot_key

    figure = plot_key(_table(noisy_losses(0, MAX_LINES * 4)), "train_loss", outliers=[5, 17])
    (ax,) = figure.axes
    assert [line.get_label() for line in ax.lines] == ["their median", "rank 5 (outlier)", "rank 17 (outlier)"]
    assert len(ax.collections) == 1 and "range of 30 ranks" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_missing_matplotlib_says_how_to_install() -> None:
    """Without matplotlib, a plot fails with MissingExtra naming the extra to install."""
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "import pandas as pd\n"
        "from multirank_logger.report.plots import plot_key\n"
        "try:\n    plot_key(pd.DataFrame({0: [1.0]}), 'k')\n"
        "except ImportError as exc:\n    print(type(exc).__name__, exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert out.startswith("MissingExtra Plots need matplotlib") and "Install it with: pip install matplotlib" in out
    # the package is not on the index yet: its own name is never the command given
    assert "pip install 'multirank-logger[" not in out and "pip install './multirank-logger[plot]'" in out


@pytest.fixture
def side_store(any_db):
    """A real store (each backend) holding one 3-rank run (`fill_side_store`)."""
    return fill_side_store(any_db)


def test_report_reads_decisions_logs_and_memory(side_store) -> None:
    """From the side tables: the decision the ranks split on (and only it), warnings and errors
    once per message with their ranks (the error first), rank 0's memory, NaN and +-inf per key and rank."""
    from multirank_logger import open_store
    from multirank_logger.report import find

    with open_store(side_store) as reader:
        found = find(reader)
    assert [(d["step"], d["votes"], d["ranks"]) for d in found.decisions] == [(20, {0: True, 1: False, 2: False}, [0])]
    assert [(m["level"], m["message"], m["ranks"], m["count"]) for m in found.log_messages] == [
        ("ERROR", "CUDA error", [2], 1), ("WARNING", "slow batch", [0, 1, 2], 3)
    ]
    assert [(m["rank"], m["measure"], m["ratio"]) for m in found.memory] == [(0, "rss", 2.0)]
    assert [(n["key"], n["rank"], n["first_step"], n["nan"], n["inf"]) for n in found.non_finite] == [
        ("grad", 2, 3, 0, 2), ("loss", 1, 7, 2, 0)
    ]
    assert found.stragglers == [] and found.outliers == [] and found.problems


@pytest.mark.parametrize(("rank0_mib", "flagged"), [(700, False), (1500, True)])
def test_rank_0_of_a_gather_run_may_hold_the_stores_memory(side_store, rank0_mib: int, flagged: bool) -> None:
    """Rank 0 of a gather run writes every rank's rows: its RSS above the others' by what the store
    costs (WRITER_RSS_ALLOWANCE) is no finding (a clean DuckDB run said "Memory" before); well past
    it, rank 0 still stands out. The others' peak is 400 MiB."""
    from multirank_logger import open_store
    from multirank_logger.report import find
    from multirank_logger.rows.schema import runs, step_timing
    from multirank_logger.store.sql_store import Store

    store = Store(side_store)
    with store.begin() as conn:
        conn.execute(runs.update().values(transport="gather"))
        conn.execute(step_timing.update().where(step_timing.c.rank == 0).values(rss=rank0_mib * 2**20))
    store.close()
    with open_store(side_store) as reader:
        found = find(reader)
    assert [m["rank"] for m in found.memory] == ([0] if flagged else [])


def test_report_on_a_psycopg2_store(postgres_url: str) -> None:
    """`report` on a PostgreSQL store opened through psycopg2 (SQLAlchemy's driver for
    postgresql://): the report's own queries do not go through `sql()`'s guard for users' SQL,
    which needs psycopg 3 (before: `report` failed there while every other command worked)."""
    from click.testing import CliRunner
    from sqlalchemy.engine import make_url

    from multirank_logger.cli import main

    url = make_url(postgres_url).set(drivername="postgresql+psycopg2").render_as_string(hide_password=False)
    fill_side_store(url)
    result = CliRunner().invoke(main, ["report", url])
    assert result.exit_code == 0, result.output
    assert "CUDA error" in result.output and "rss" in result.output


def test_the_terminal_verdict_blames_a_rank_only_for_a_numeric_finding() -> None:
    """Warnings every rank logged alike are worth reading but name no rank; a straggler does."""
    from multirank_logger.report.findings import Findings
    from multirank_logger.report.render import findings_text

    warning = {"level": "WARNING", "logger": "py.warnings", "message": "deprecated", "ranks": [0, 1], "count": 2}
    straggler = {"rank": 1, "phase": "data", "excess_s": 0.1, "share_of_step": 0.5, "first_step": 1,
                 "last_step": 9, "steps": 9}
    quiet = findings_text(Findings(run="r/version_0", run_id=1, world_size=2))
    only_logs = findings_text(Findings(run="r/version_0", run_id=1, world_size=2, log_messages=[warning]))
    both = findings_text(Findings(run="r/version_0", run_id=1, world_size=2, log_messages=[warning],
                                  stragglers=[straggler]))
    assert quiet.endswith("Nothing stands out.")
    assert "WARNING on ranks [0, 1] (2x): deprecated" in only_logs
    assert only_logs.endswith("No rank stands out in the numbers; read the warnings and errors above.")
    assert "rank 1 straggles in data from step 1 to 9 (9 steps): 100 ms longer than the other ranks per step" in both
    assert both.endswith("See above: which rank, from which step, how much.")


def test_library_warnings_every_rank_raised_alike_are_notices() -> None:
    """A library's warnings.warn raised alike on every rank (Lightning's own FutureWarning), or by
    Lightning on rank 0 alone (rank_zero_warn), names no rank: a notice shown apart, and the clean
    run still says nothing stands out. The user's own warnings, and a library's on some ranks only, stay findings."""
    from multirank_logger.report.findings import Findings, library_notice
    from multirank_logger.report.render import findings_text

    def warning(path: str, ranks: list[int], logger: str = "py.warnings", level: str = "WARNING") -> dict:
        message = f"{path}:21: FutureWarning: `isinstance(treespec, LeafSpec)` is deprecated"
        return {"level": level, "logger": logger, "message": message, "ranks": ranks, "count": len(ranks)}

    lightning = "/venv/lib/python3.11/site-packages/lightning/pytorch/utilities/_pytree.py"
    other_lib = "C:\\venv\\Lib\\site-packages\\torch\\nn\\modules\\module.py"
    assert library_notice(warning(lightning, [0, 1]), 2) and library_notice(warning(other_lib, [0, 1, 2]), 3)
    assert library_notice(warning(lightning, [0]), 2)  # Lightning's rank_zero_warn
    assert not library_notice(warning(other_lib, [0]), 2)  # one rank of two: which one is the question
    assert not library_notice(warning(lightning, [1]), 2)
    assert not library_notice(warning("/home/me/train.py", [0, 1]), 2)  # the user's own code
    assert not library_notice(warning(lightning, [0, 1], level="ERROR"), 2)
    assert not library_notice(warning(lightning, [0, 1], logger="lightning.pytorch"), 2)
    notice = warning(lightning, [0, 1])
    text = findings_text(Findings(run="r/version_0", run_id=1, world_size=2, library_warnings=[notice]))
    assert "Notices (library warnings that name no rank; no finding):\n  WARNING on ranks [0, 1] (2x)" in text
    assert "Warnings and errors" not in text and text.endswith("Nothing stands out.")


@pytest.mark.parametrize("ranks", [4, 64])
def test_a_plot_of_many_steps_draws_buckets(ranks: int) -> None:
    """20,000 steps: at most MAX_POINTS points per line (a bucket's mean; the band's min, median
    and max), the outlier still standing out; the PNG's size is the same as for 200 steps."""
    from multirank_logger.report.plots import MAX_POINTS, SIZE_PX, figure_png, plot_key

    values = np.random.default_rng(0).random((20_000, ranks))
    values[10_000:, 3] += 3
    figure = plot_key(_table(values), "loss", outliers=[3])
    (ax,) = figure.axes
    assert all(len(line.get_xdata()) <= MAX_POINTS for line in ax.lines)
    (out,) = [line for line in ax.lines if line.get_label() == "rank 3 (outlier)"]
    assert np.nanmin(out.get_ydata()[len(out.get_ydata()) // 2 + 1 :]) > 3
    if ranks > 8:
        (band,) = ax.collections
        assert band.get_paths()[0].vertices[:, 1].max() == np.delete(values, 3, axis=1).max()
    big, small = figure_png(figure), figure_png(plot_key(_table(values[:200]), "loss", outliers=[3]))
    assert _png_size(big) == SIZE_PX and len(big) < 3 * len(small)


def test_the_rank_list_of_many_ranks_names_only_those_that_differ() -> None:
    """256 ranks: one line of counts per status, then only the ranks whose status or logged
    steps differ from the most; up to COMPACT_RANKS ranks, one line each as before."""
    from multirank_logger.report.findings import Findings
    from multirank_logger.report.render import COMPACT_RANKS, findings_text

    def rank(r: int) -> dict:
        status = "failed" if r == 200 else "success"
        return {"rank": r, "status": status, "host": f"node{r // 8}", "steps": 900 if r == 7 else 1000,
                "last_step": 999, "duration_s": 60.0}

    text = findings_text(Findings(run="r/version_0", run_id=1, world_size=256, ranks=[rank(r) for r in range(256)]))
    section = text.split("Ranks:\n")[1].split("\n\n")[0].splitlines()
    assert section == [
        "  256 ranks on 32 host(s): 255 success, 1 failed; 254 with 1000 logged steps; 2 differ:",
        "  rank 7: success on node0, 900 logged steps, its part took 1m00s",
        "  rank 200: failed on node25, 1000 logged steps, its part took 1m00s",
    ]
    few = findings_text(Findings(run="r/version_0", run_id=1, world_size=3, ranks=[rank(r) for r in range(3)]))
    assert few.split("Ranks:\n")[1].split("\n\n")[0].count("\n") == 2 and COMPACT_RANKS >= 3
