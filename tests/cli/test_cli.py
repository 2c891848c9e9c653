"""The read commands of `multirank-logger` (runs, export, ranks, sql) on real store files."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from multirank_logger import open_store
from multirank_logger.cli import main
from multirank_logger.store.sql_store import Store
from multirank_logger.write.buffer import RecordBuffer
from tests.helpers.logged_calls import csvlogger_file, store_calls, trainer_calls

T0 = 1_767_225_600.0  # 2026-01-01 00:00:00 UTC


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.fixture
def store(any_db: str) -> str:
    """Two ranks of trainer_calls, the run finished after 75 s (on each backend, the server too)."""
    run_id = store_calls(any_db, {0: trainer_calls(0), 1: trainer_calls(1)})
    writer = Store(any_db)
    writer.update_run(run_id, status="success", started_at=T0, ended_at=T0 + 75)
    writer.close()
    return any_db


@pytest.fixture
def spread_store(db_path: Path) -> Path:
    """Three ranks logging `loss`; rank 2 is off by 0.5 at every step."""
    writer = Store(db_path)
    run = writer.create_run("lightning_logs", world_size=3)
    for rank in range(3):
        buffer = RecordBuffer()
        for step in range(12):
            buffer.append(step, {"loss": step + (0.5 if rank == 2 else 0.01 * rank)})
        writer.write(buffer.drain(run.id, rank))
    writer.close()
    return db_path


def test_runs_prints_one_line_per_run(store: str) -> None:
    code, out = _invoke("runs", str(store))
    assert code == 0
    assert out.splitlines() == [
        " id                      run  status  ranks       started (UTC) duration  steps  keys lost GPU-h",
        "  1 lightning_logs/version_0 success      2 2026-01-01 00:00:00    1m15s     60    10          -",
    ]


def test_runs_table_is_laid_out_as_pandas_lays_it_out() -> None:
    """`runs` lays its table out without pandas (its import was most of the command's time):
    the text is pandas' own, for numbers and text of every width, a column of each first."""
    import pandas as pd

    from multirank_logger._util.readable import text_table

    texts = ["a", "bench/version_0", "success", "running (last value 4.2s ago)", "-", "2026-11-26 22:58:41"]
    numbers = [0, 1, 7, 42, 1024, 123_456_789]
    for case in range(40):
        columns = {f"c{i}" if (case + i) % 3 else "started (UTC)": [
            (numbers if (case >> i) & 1 else texts)[(case * 7 + 3 * i + row) % 6] for row in range(1 + case % 4)
        ] for i in range(1 + case % 5)}
        assert text_table(columns) == pd.DataFrame(columns).to_string(index=False, line_width=None), columns


def test_runs_on_a_store_without_runs(db_path: Path) -> None:
    Store(db_path).close()
    assert _invoke("runs", str(db_path)) == (0, f"No runs in {db_path}.\n")


def test_export_writes_rank0_csv_to_stdout(store: str, tmp_path: Path) -> None:
    """Without -o the bytes go to stdout, \\r\\n included: CSVLogger's file exactly."""
    result = CliRunner().invoke(main, ["export", str(store)])
    assert result.exit_code == 0
    assert result.stdout_bytes == csvlogger_file(tmp_path, trainer_calls(0))


def test_export_rank_to_a_file(store: str, tmp_path: Path) -> None:
    out = tmp_path / "rank1.csv"
    code, text = _invoke("export", str(store), "--rank", "1", "--run", "lightning_logs/version_0", "-o", str(out))
    assert (code, text) == (0, f"Wrote {len(trainer_calls(1))} rows of rank 1 (lightning_logs/version_0) to {out}\n")
    assert out.read_bytes() == csvlogger_file(tmp_path, trainer_calls(1))


def test_export_all_ranks_writes_one_file_per_rank(store: str, tmp_path: Path) -> None:
    out = tmp_path / "per_rank"
    code, text = _invoke("export", str(store), "--all-ranks", "-o", str(out))
    assert code == 0
    assert text.splitlines() == [
        f"Wrote {len(trainer_calls(r))} rows of rank {r} (lightning_logs/version_0) to {out / f'metrics_rank_{r}.csv'}"
        for r in (0, 1)
    ]
    for rank in (0, 1):
        expected = csvlogger_file(tmp_path / str(rank), trainer_calls(rank))
        assert (out / f"metrics_rank_{rank}.csv").read_bytes() == expected


def test_export_all_ranks_needs_a_directory(store: str) -> None:
    code, text = _invoke("export", str(store), "--all-ranks")
    assert code == 2
    assert text.splitlines()[-1] == "Error: --all-ranks writes one file per rank: pass -o DIR."


def test_export_unknown_run_lists_the_runs(store: str) -> None:
    code, text = _invoke("export", str(store), "--run", "lightning_logs/version_7")
    assert (code, text) == (
        1,
        "Error: No run 'lightning_logs/version_7' in this store. Available: lightning_logs/version_0 (id 1)\n",
    )


def test_ranks_shows_the_table_and_the_rank_that_stands_out(spread_store: Path) -> None:
    code, text = _invoke("ranks", str(spread_store), "loss")
    assert code == 0
    lines = text.splitlines()
    assert lines[0] == "loss in lightning_logs/version_0 (run 1): 3 ranks, 12 steps"
    assert lines[2].split() == ["rank", "rank", "0", "rank", "1", "rank", "2"]
    assert any(line.split()[:1] == ["..."] for line in lines)  # 12 steps: the middle is elided
    assert "Spread across ranks (max - min at a step): mean 0.5, largest 0.5 at step 0." in lines
    assert lines[-1] == (
        "Rank 2 stands out: 0.49 from the per-step median of the ranks on average, 98x the other ranks' (0.005)."
    )


def test_ranks_csv_is_the_whole_table(spread_store: Path) -> None:
    code, text = _invoke("ranks", str(spread_store), "loss", "--format", "csv")
    assert code == 0
    lines = text.splitlines()
    assert lines[0] == "step,0,1,2" and lines[1] == "0,0.0,0.01,0.5" and len(lines) == 13


def test_ranks_unknown_key_lists_the_keys(store: str) -> None:
    code, text = _invoke("ranks", str(store), "no_such_key")
    assert code == 1
    assert text.startswith("Error: No key 'no_such_key' in this store. Available: ")
    assert "rank_value, train_loss, train_loss_epoch, val_loss" in text and text.count("\n") == 1


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        ("table", " rank  n\n    0  3\n    1  3\n"),
        ("csv", "rank,n\n0,3\n1,3\n"),
        ("json", '[{"rank":0,"n":3},{"rank":1,"n":3}]\n'),
    ],
)
def test_sql_formats(store: str, fmt: str, expected: str) -> None:
    query = "SELECT rank, count(*) AS n FROM metrics WHERE key = 'val_loss' GROUP BY rank ORDER BY rank"
    assert _invoke("sql", str(store), query, "--format", fmt) == (0, expected)


def test_sql_write_is_refused_and_changes_nothing(store: str) -> None:
    count = "SELECT count(*) AS n FROM metrics"
    before = open_store(store).sql(count)["n"].tolist()
    code, text = _invoke("sql", str(store), "DELETE FROM metrics WHERE rank = 1")
    assert (code, text) == (
        1,
        "Error: Refused: the query path is read-only, and this statement would change the store: "
        "'DELETE FROM metrics WHERE rank = 1'. Use a SELECT (or WITH ... SELECT) query.\n",
    )
    assert open_store(store).sql(count)["n"].tolist() == before


def test_sql_error_shows_the_engines_message_without_traceback(store: str) -> None:
    code, text = _invoke("sql", str(store), "SELEC 1")
    engine = {".duckdb": "DuckDB", ".sqlite": "SQLite"}.get(Path(store).suffix, "postgresql")
    assert code == 1
    assert text.startswith(f"Error: {engine} rejected the query: ") and "syntax error" in text
    assert "Traceback" not in text


def test_console_script_entry_point(store: str) -> None:
    """The installed `multirank-logger` script runs every command group end to end."""
    script = shutil.which("multirank-logger", path=str(Path(sys.executable).parent))
    assert script is not None

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([script, *args], capture_output=True, text=True, timeout=120)

    assert run("db", "current", str(store)).stdout.endswith("(head)\n")
    assert run("db", "upgrade", str(store)).stdout.endswith("(head).\n")
    assert run("runs", str(store)).stdout.splitlines()[1].split()[:3] == ["1", "lightning_logs/version_0", "success"]
    assert run("ranks", str(store), "rank_value", "--format", "csv").stdout.splitlines()[1] == "0,0.0,1000.0"
    refused = run("sql", str(store), "DROP TABLE metrics")
    assert refused.returncode == 1 and refused.stderr.startswith("Error: Refused:")
    exported = subprocess.run([script, "export", str(store)], capture_output=True, timeout=120)
    assert exported.returncode == 0 and exported.stdout.startswith(b"epoch,")


def test_ranks_says_when_no_rank_stands_out(store: str) -> None:
    """Ranks that agree everywhere: no rank is singled out."""
    code, text = _invoke("ranks", str(store), "epoch")
    assert code == 0
    assert text.splitlines()[-1] == "No rank stands out: the ranks agree at every step."
