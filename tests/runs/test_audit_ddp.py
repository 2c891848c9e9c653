"""Real 2-rank DDP trainings where the ranks disagree (tests/scripts/audit_train.py): DecisionAudit and log capture.

Two launches: SQLite (direct transport) with the plain console, DuckDB (gather transport: rank
1's rows travel to rank 0) with the rank-aware console. Each test reads one behaviour.
"""

from __future__ import annotations

import pandas as pd
import pytest
from click.testing import CliRunner

from multirank_logger import open_store
from multirank_logger.cli import main as cli
from tests.helpers.launches import SCRIPTS, run_ranks_forked
from tests.helpers.logger_helpers import query, train_env
from tests.scripts.audit_train import BANNER

SCRIPT = SCRIPTS / "audit_train.py"
CKPT = "lightning_logs/version_0/checkpoints"


@pytest.fixture(scope="module", params=[("sqlite", False), ("duckdb", True)], ids=["sqlite-plain", "duckdb-console"])
def launch(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    backend, console = request.param
    root = tmp_path_factory.mktemp(f"audit-{backend}")
    db = root / f"runs.{backend}"
    args = ["--db", str(db), "--save-dir", str(root), *(["--console"] if console else [])]
    # one stream, as a job's console log holds both
    proc = run_ranks_forked(SCRIPT, args, nproc=2, cwd=root, env=train_env(), timeout=240)
    assert proc.returncode == 0, proc.stdout[-6000:]
    return {"backend": backend, "console": console, "db": db, "root": root, "output": proc.stdout}


def _decisions(launch: dict, callback: str) -> dict[int, dict[int, dict]]:
    """epoch -> rank -> the row, for one callback."""
    with open_store(launch["db"]) as reader:
        df = reader.decisions()
    out: dict[int, dict[int, dict]] = {}
    for row in df[df.callback == callback].to_dict("records"):
        out.setdefault(row["epoch"], {})[row["rank"]] = row
    return out


# -- DecisionAudit ---------------------------------------------------------------------------


def test_refused_checkpoint_shows_each_ranks_vote(launch: dict) -> None:
    """Epoch 2: rank 0 improved (3 < 4) and voted save, rank 1 did not (4.5 > 4): not saved."""
    epoch2 = _decisions(launch, "ModelCheckpoint")[2]
    assert {r: (row["value"], row["vote"], row["decision"]) for r, row in epoch2.items()} == {
        0: (3.0, True, False),
        1: (4.5, False, False),
    }
    assert all(
        pd.isna(row["path"]) and row["monitor"] == "val_score" and row["mode"] == "min" for row in epoch2.values()
    )
    assert {r: row["best"] for r, row in epoch2.items()} == {0: 4.0, 1: 4.0}  # each rank's best is still epoch 1's


def test_saves_where_both_improved_show_path_and_best(launch: dict) -> None:
    """Epochs 0 (first save: no vote needed), 1 and 3: both ranks voted yes, saved, with the path."""
    saves = _decisions(launch, "ModelCheckpoint")
    assert sorted(saves) == [0, 1, 2, 3]  # EarlyStopping ended the run after epoch 3
    for epoch, step, best in ((0, 2, {0: 5.0, 1: 5.0}), (1, 4, {0: 4.0, 1: 4.0}), (3, 8, {0: 2.0, 1: 3.0})):
        rows = saves[epoch]
        assert all(row["vote"] and row["decision"] for row in rows.values()), rows
        expected = str(launch["root"] / CKPT / f"epoch={epoch}-step={step}.ckpt")
        assert {r: row["path"] for r, row in rows.items()} == {0: expected, 1: expected}
        assert {r: row["best"] for r, row in rows.items()} == best
        assert {row["step"] for row in rows.values()} == {step}
    assert [p.name for p in (launch["root"] / CKPT).iterdir()] == ["epoch=3-step=8.ckpt"]  # top-1 kept


def test_early_stopping_records_each_ranks_stop_vote(launch: dict) -> None:
    """EarlyStopping reduces with any(): rank 1 alone voted stop at epoch 3, and the run stopped."""
    stops = _decisions(launch, "EarlyStopping")
    assert {e: {r: (row["vote"], row["decision"]) for r, row in rows.items()} for e, rows in stops.items()} == {
        0: {0: (False, False), 1: (False, False)},
        1: {0: (False, False), 1: (False, False)},
        2: {0: (False, False), 1: (False, False)},
        3: {0: (False, True), 1: (True, True)},
    }
    assert {r: row["value"] for r, row in stops[3].items()} == {0: 1.0, 1: 2.5}


def test_every_rank_numbers_decisions_alike(launch: dict) -> None:
    """One decision has one seq on every rank, with the same step, epoch and callback."""
    rows = query(launch["db"], "SELECT seq, rank, step, epoch, callback FROM decisions ORDER BY seq, rank")
    by_seq: dict[int, list] = {}
    for seq, rank, *what in rows:
        by_seq.setdefault(seq, []).append((rank, tuple(what)))
    assert sorted(by_seq) == list(range(8))
    for seq, seen in by_seq.items():
        assert [r for r, _ in seen] == [0, 1] and seen[0][1] == seen[1][1], (seq, seen)


def test_decisions_cli_flags_where_ranks_disagreed(launch: dict) -> None:
    result = CliRunner().invoke(cli, ["decisions", str(launch["db"])])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "lightning_logs/version_0 (run 1): 8 decisions, 2 where the ranks voted differently (marked !)"
    flagged = [line.split() for line in lines[2:-1] if line.startswith("!")]
    assert flagged == [
        ["!", "6", "2", "ModelCheckpoint(val_score,", "min)", "not", "saved", "3", "yes", "4.5", "no", "4", "-"],
        ["!", "8", "3", "EarlyStopping(val_stop,", "min)", "stop", "1", "no", "2.5", "yes", "1", "-"],
    ]
    saved = [line for line in lines if " saved " in line and "not saved" not in line]
    assert len(saved) == 3 and saved[-1].endswith(f"{CKPT}/epoch=3-step=8.ckpt")


# -- every rank's log ------------------------------------------------------------------------


def test_store_keeps_every_ranks_records(launch: dict) -> None:
    """The banner from both ranks, each rank's own line, and rank 1's warnings (logging and warnings.warn)."""
    with open_store(launch["db"]) as reader:
        logs = reader.logs()
    mine = logs[logs.logger.isin(["audit_train", "py.warnings"])]
    seen = sorted((r.rank, r.level, r.message.split(": ", 2)[-1] if r.logger == "py.warnings" else r.message)
                  for r in mine.itertuples())
    assert seen == [
        (0, "INFO", BANNER),
        (0, "INFO", "rank 0 has its own line"),
        (1, "INFO", BANNER),
        (1, "INFO", "rank 1 has its own line"),
        (1, "WARNING", "rank 1 alone: a warnings.warn"),
        (1, "WARNING", "rank 1 alone: this shard is slow"),
    ]
    # Lightning's own records too (they do not propagate to the root logger): each rank's own
    assert sorted(logs[logs.message.str.startswith("Initializing distributed")]["rank"]) == [0, 1]


def test_logs_cli_prints_a_banner_every_rank_logged_once(launch: dict) -> None:
    result = CliRunner().invoke(cli, ["logs", str(launch["db"])])
    assert result.exit_code == 0, result.output
    banners = [line for line in result.output.splitlines() if BANNER in line]
    assert len(banners) == 1 and banners[0].endswith(f"INFO     [ranks 0-1] audit_train: {BANNER}")
    own = [line.split(" ", 1)[1] for line in result.output.splitlines() if "has its own line" in line]
    assert sorted(own) == ["INFO     [rank 0] audit_train: rank 0 has its own line",
                           "INFO     [rank 1] audit_train: rank 1 has its own line"]


def test_logs_cli_filters_by_rank_and_level(launch: dict) -> None:
    result = CliRunner().invoke(cli, ["logs", str(launch["db"]), "--rank", "1", "--level", "warning"])
    assert result.exit_code == 0, result.output
    assert [line.split(" ", 1)[1] for line in result.output.splitlines()] == [
        "WARNING  [rank 1] audit_train: rank 1 alone: this shard is slow",
        f"WARNING  [rank 1] py.warnings: {SCRIPT}:52: RankWarning: rank 1 alone: a warnings.warn",
    ]
    result = CliRunner().invoke(cli, ["logs", str(launch["db"]), "--rank", "0", "--level", "WARNING"])
    assert "audit_train" not in result.output  # rank 0 warned nothing of its own


def test_console_shows_banner_once_and_rank_1_warnings_tagged(launch: dict) -> None:
    """Rank-aware console: the banner once, rank 1's warnings with its rank, its INFO line left to the store.
    Plain console (the control): every rank prints the banner."""
    out = launch["output"]
    if not launch["console"]:
        assert out.count(BANNER) == 2
        assert "INFO audit_train: rank 1 has its own line" in out and "[rank " not in out
        return
    assert out.count(BANNER) == 1
    assert "[rank 1] WARNING audit_train: rank 1 alone: this shard is slow" in out
    assert f"[rank 1] {SCRIPT}:52: RankWarning: rank 1 alone: a warnings.warn" in out
    assert "rank 1 has its own line" not in out and "INFO audit_train: rank 0 has its own line" in out
    assert "Initializing distributed: GLOBAL_RANK: 1" not in out  # Lightning's per-rank INFO line, rank 0's kept
    assert "Initializing distributed: GLOBAL_RANK: 0" in out
