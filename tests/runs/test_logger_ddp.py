"""Real 2-rank DDP trainings over gloo on CPU: SQLite (direct), DuckDB (gather), PostgreSQL (direct).

One launch per backend (module scope) logs with CSVLogger first and MultiRankLogger second,
with asymmetric logging (per-rank keys, rank_zero_only keys, a rank skipping a key); the
tests below each read one behaviour from it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from multirank_logger.channel.identity import ENV_PREFIX
from multirank_logger.store.backends import resolve_url
from multirank_logger.store.sql_store import Store
from tests.helpers.logger_helpers import query, rank_reports, run_training
from tests.helpers.stores import new_postgres_database, with_password

STEPS = 6
EXPECTED_TRANSPORT = {"sqlite": "direct", "duckdb": "gather", "postgresql": "direct"}


@pytest.fixture(scope="module", params=["sqlite", "duckdb", "postgresql"])
def launch(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    backend = request.param
    root = tmp_path_factory.mktemp(f"ddp-{backend}")
    secret = None
    if backend == "postgresql":  # a new database on the session's server (conftest.py), as a role with a password
        server = request.getfixturevalue("postgres_server")
        db, secret = with_password(server, new_postgres_database(server))
    else:
        db = root / ("runs.sqlite" if backend == "sqlite" else "runs.duckdb")
    proc = run_training(
        db, root, "--mode", "asym", "--steps", str(STEPS), "--csv-dir", str(root / "csv"),
        "--read-version", "--report", str(root / "report"), "--dump-env", str(root / "dumped"), "--device-stats",
    )
    return {"backend": backend, "db": db, "root": root, "output": proc.stdout + proc.stderr, "secret": secret}


def _values(db: Path, key: str) -> dict[int, list[tuple[int, float]]]:
    rows = query(db, "SELECT rank, step, value FROM metrics WHERE key = :key ORDER BY rank, seq", key=key)
    out: dict[int, list[tuple[int, float]]] = {}
    for rank, step, value in rows:
        out.setdefault(rank, []).append((step, value))
    return out


def test_each_rank_records_its_own_value(launch: dict) -> None:
    """rank k's rows hold rank k's own unsynced value, step by step."""
    values = _values(launch["db"], "rank_value")
    assert sorted(values) == [0, 1]
    for rank in (0, 1):
        assert values[rank] == [(step, float(1000 * rank + step)) for step in range(STEPS)]


def test_synced_value_recorded_on_every_rank(launch: dict) -> None:
    """A sync_dist=True value (the mean of 0 and 1) is recorded on both ranks."""
    values = _values(launch["db"], "synced")
    assert {rank: [v for _, v in rows] for rank, rows in values.items()} == {0: [0.5] * STEPS, 1: [0.5] * STEPS}


def test_asymmetric_logging_is_recorded_per_rank(launch: dict) -> None:
    """Per-rank keys, a rank_zero_only key and a key one rank skips all land where they were logged."""
    keys = query(launch["db"], "SELECT rank, key, COUNT(*) FROM metrics GROUP BY rank, key")
    counts = {(rank, key): n for rank, key, n in keys}
    assert counts[(0, "only_rank_0")] == STEPS and counts[(1, "only_rank_1")] == STEPS
    assert (1, "only_rank_0") not in counts and (0, "only_rank_1") not in counts
    assert counts[(0, "zero_only")] == STEPS and (1, "zero_only") not in counts
    # Lightning re-sends a key's last value at a step where it was not logged, so rank 1's
    # skipped steps still have a row: what matters is that the run did not hang
    assert counts[(0, "sometimes")] == STEPS and counts[(1, "sometimes")] >= STEPS // 2


def test_device_stats_monitor_stored_per_rank(launch: dict) -> None:
    """Lightning's DeviceStatsMonitor calls every logger on every rank: with ours, both ranks'
    own device statistics (CPU here: psutil's) are stored, each under its rank, at every step."""
    rows = query(launch["db"], "SELECT rank, key, step, value FROM metrics WHERE key LIKE 'DeviceStatsMonitor%'")
    keys = {key for _, key, _, _ in rows}
    assert "DeviceStatsMonitor.on_train_batch_start/cpu_percent" in keys, sorted(keys)
    assert "DeviceStatsMonitor.on_train_batch_end/cpu_vm_percent" in keys, sorted(keys)
    for rank in (0, 1):
        mine = [(key, step, value) for r, key, step, value in rows if r == rank]
        assert {key for key, _, _ in mine} == keys  # every statistic, from each rank itself
        assert len({step for _, step, _ in mine}) >= STEPS - 1
        assert all(0.0 <= value <= 100.0 for key, _, value in mine if key.endswith("_percent"))


def test_run_finishes_with_success_and_transport(launch: dict) -> None:
    """The run ends as success, with every rank's status and the transport chosen."""
    runs = query(launch["db"], "SELECT id, status, world_size, transport FROM runs")
    assert runs == [(1, "success", 2, EXPECTED_TRANSPORT[launch["backend"]])]
    assert query(launch["db"], "SELECT rank, status FROM ranks ORDER BY rank") == [(0, "success"), (1, "success")]
    assert f"transport={EXPECTED_TRANSPORT[launch['backend']]}" in launch["output"]


def test_ranks_agree_on_version(launch: dict) -> None:
    """Both ranks report the same version and log_dir, before fit (printed) and after."""
    reports = rank_reports(launch["root"] / "report")
    assert sorted(reports) == [0, 1]
    assert reports[0]["version"] == reports[1]["version"] == 0
    assert reports[0]["log_dir"] == reports[1]["log_dir"]
    assert reports[0]["pid"] != reports[1]["pid"]
    before = [line for line in launch["output"].splitlines() if line.startswith("version before fit:")]
    assert len(before) == 2 and len(set(before)) == 1


def test_metrics_csv_identical_to_csvlogger(launch: dict) -> None:
    """Rank 0's metrics.csv is byte for byte the one CSVLogger wrote in the same Trainer."""
    ours = launch["root"] / "lightning_logs" / "version_0" / "metrics.csv"
    theirs = launch["root"] / "csv" / "lightning_logs" / "version_0" / "metrics.csv"
    assert ours.read_bytes() == theirs.read_bytes()


def test_hparams_yaml_identical_to_csvlogger(launch: dict) -> None:
    """hparams.yaml is byte for byte CSVLogger's, and the run row holds the same hyperparameters."""
    ours = launch["root"] / "lightning_logs" / "version_0" / "hparams.yaml"
    theirs = launch["root"] / "csv" / "lightning_logs" / "version_0" / "hparams.yaml"
    assert ours.read_bytes() == theirs.read_bytes()
    (hparams,) = query(launch["db"], "SELECT hparams FROM runs")[0]
    assert '"mode": "asym"' in hparams and '"lr": 0.1' in hparams


def test_no_secret_leaves_the_process(launch: dict) -> None:
    """The store's password (PostgreSQL: a role with one) is in no rank's environment, no TCPStore
    value, no console line, no row of any table and no file under save_dir; ranks still agree on
    the store by its URL less the password."""
    dumps = {}
    for path in launch["root"].glob("dumped.*"):
        dumps[int(path.suffix[1:])] = json.loads(path.read_text())
    assert sorted(dumps) == [0, 1]
    identity = json.loads(dumps[0]["identity"])
    assert identity == json.loads(dumps[1]["identity"]) and identity["run"]["version"] == 0
    # rank 1 was launched by rank 0 after it took the run (--read-version): it inherited the identity,
    # which rank 0's own environment held only while Lightning's launcher started rank 1 (issue 29)
    held = {rank: {k: v for k, v in dump["environ"].items() if k.startswith(ENV_PREFIX)} for rank, dump in dumps.items()}
    assert held == {0: {}, 1: {f"{ENV_PREFIX}0": dumps[0]["identity"]}}
    assert make_url(identity["db"]).database == resolve_url(launch["db"]).database
    secret = launch["secret"]
    if secret is None:
        return  # a file store: nothing secret to look for
    assert secret not in identity["db"] and make_url(identity["db"]).username == make_url(launch["db"]).username
    assert not [k for dump in dumps.values() for k, v in dump["environ"].items() if secret in v]
    assert "MultiRankLogger: run" in launch["output"] and secret not in launch["output"]
    store = Store(launch["db"])
    try:
        with store.begin() as conn:
            tables = sa.inspect(conn).get_table_names()
            assert "logs" in tables
            logged = conn.execute(sa.text("SELECT message FROM logs")).scalars().all()
            assert any("MultiRankLogger: run" in m for m in logged)  # the console line was captured
            leaking = [t for t in tables for row in conn.execute(sa.text(f'SELECT * FROM "{t}"')) if secret in str(tuple(row))]
    finally:
        store.close()
    assert leaking == []
    files = [p for p in launch["root"].rglob("*") if p.is_file()]
    assert files and [p for p in files if secret.encode() in p.read_bytes()] == []
