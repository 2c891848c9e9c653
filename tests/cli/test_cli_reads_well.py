"""What a new user reads in the terminal (issue 40 points 14-17), asserted on the commands' text:
StepTimer's series in `ranks` and `plot`, `report` and `ranks` on 2 ranks, one duration format in
`runs` and `report`, `decisions` without disagreement, `sql`'s times as times, `export -o -`."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from multirank_logger.cli import main
from tests.helpers import new_user_store as nu


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("cli_reads_well")
    return nu.build(root / "three.sqlite", runs=1), nu.build(root / "two.sqlite", runs=1, ranks=2)


def cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_stepTimer_series_in_ranks_and_plot(stores: tuple[Path, Path], tmp_path: Path) -> None:
    three, _ = stores
    out = cli("ranks", str(three), "timing:data_s")
    assert "timing:data_s in new_user/version_0 (run 1): 3 ranks, 60 steps" in out
    assert f"Rank {nu.SLOW_RANK} stands out" in out and "infx" not in out
    png = tmp_path / "rss.png"
    assert "Wrote" in cli("plot", str(three), "timing:rss", "-o", str(png)) and png.read_bytes()[:4] == b"\x89PNG"
    result = CliRunner().invoke(main, ["ranks", str(three), "timing:nope"])
    assert result.exit_code != 0 and "timing:data_s" in result.output  # the series there are, named


def test_report_and_ranks_on_two_ranks_say_what_they_cannot_tell(stores: tuple[Path, Path]) -> None:
    _, two = stores
    report = cli("report", str(two))
    outliers = report.split("Outlier ranks:\n", 1)[1].split("\n\n", 1)[0]
    assert outliers.strip().startswith("not judged: it takes 3 ranks or more, and this run has 2"), outliers
    assert "none" not in outliers and report.count("3 ranks or more") == 1
    ranks = cli("ranks", str(two), "train_loss")
    assert "1x the other ranks' distance" not in ranks and "cannot be told from two" in ranks


def test_one_duration_format_and_decision_words(stores: tuple[Path, Path]) -> None:
    three, two = stores
    runs = cli("runs", str(three))
    report = cli("report", str(three))
    assert " 1m30s " in runs  # the run's, ended_at - started_at (the page's header writes it alike)
    rank_lines = [line for line in report.splitlines() if line.startswith("  rank ") and "logged steps" in line]
    assert rank_lines and all("its part took 1m30s" in line for line in rank_lines), rank_lines
    assert "saved; votes rank 0 yes, rank 1 yes, rank 2 no" in report and "True" not in report
    alike = cli("decisions", str(two))
    assert "1 decisions, the ranks voted alike in each" in alike and "(!)" not in alike
    assert "1 where the ranks voted differently (marked !)" in cli("decisions", str(three))


def test_sql_shows_times_as_times(stores: tuple[Path, Path]) -> None:
    three, _ = stores
    out = cli("sql", str(three), "SELECT id, started_at, ended_at, world_size FROM runs")
    assert "e+09" not in out
    row = out.splitlines()[1].split()
    assert row[0] == "1" and row[1].startswith("20") and row[2].count(":") == 2 and row[-1] == "3", out
    assert float(cli("sql", str(three), "SELECT started_at FROM runs", "--format", "csv").splitlines()[1]) > 1e9  # csv: numbers


def test_export_dash_writes_standard_output(stores: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    three, _ = stores
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["export", str(three), "-o", "-"])
    assert result.exit_code == 0 and result.output.startswith("epoch,step,train_loss,val_loss"), result.output[:200]
    assert not (tmp_path / "-").exists()
    refused = CliRunner().invoke(main, ["export", str(three), "--all-ranks", "-o", "-"])
    assert refused.exit_code != 0 and "pass -o DIR" in refused.output


def test_a_duckdb_store_of_20_values_is_small(tmp_path: Path) -> None:
    """Point 18: DuckDB's 256 KiB blocks made a store of 20 values 5.3 MB (each table's index and
    each checkpoint's metadata hold a block of their own); new stores take BLOCK_SIZE blocks."""
    import duckdb

    from multirank_logger.store.backends.duckdb import BLOCK_SIZE
    from multirank_logger.store.sql_store import Store
    from multirank_logger.write.buffer import RecordBuffer

    db = tmp_path / "runs.duckdb"
    store = Store(db)
    run = store.create_run("tiny", world_size=2)
    for rank in range(2):
        store.register_rank(run.id, rank, status="success")
        buffer = RecordBuffer()
        for step in range(10):
            buffer.append(step, {"loss": 1.0 / (step + 1)})
        store.write(buffer.drain(run.id, rank))
    store.update_run(run.id, status="success")
    store.close()
    con = duckdb.connect(str(db), read_only=True)
    block_size = con.execute("SELECT block_size FROM pragma_database_size()").fetchone()[0]
    assert con.execute("SELECT count(*) FROM metrics").fetchone()[0] == 20
    con.close()
    assert block_size == BLOCK_SIZE == 2**16
    # 256 KiB blocks: 3.9 MB (then 14 tables); each table holds blocks of its own: 2.04 MB at 17 tables
    assert db.stat().st_size < 2_400_000, db.stat().st_size
