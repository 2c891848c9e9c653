"""The hosts ledger (`multirank-logger hosts`, query/host_ledger.py, judgement/ledger.py).

A store of 200 runs built directly (runs, ranks and kept findings rows; no metric row): 4 ranks
a run, two on each of two hosts. ``gpu-bad`` takes every 4th run and is named as a straggler in
40 of its 50 (4 of its last 5); ``gpu-once`` takes 50 others and is named once (a NaN, run 102);
the last run kept a verdict in each of two launches: only its last launch's names a host.
"""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
from click.testing import CliRunner

from multirank_logger.cli import main
from multirank_logger.judgement.ledger import host_status
from tests.helpers.ledger_store import RUNS, T0, build_ledger_store


@pytest.fixture(params=[".sqlite", ".duckdb"])
def ledger_db(request: pytest.FixtureRequest, tmp_path) -> str:  # type: ignore[no-untyped-def]
    return build_ledger_store(str(tmp_path / f"runs{request.param}"))


def _invoke(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_a_chronic_host_and_a_one_off(ledger_db: str) -> None:
    from multirank_logger import open_store

    with open_store(ledger_db) as reader:
        rows = {r["host"]: r for r in reader.hosts()}
    assert sorted(rows) == ["gpu-bad", "gpu-once", *(f"node{i:02d}" for i in range(10))]
    bad, once = rows["gpu-bad"], rows["gpu-once"]
    assert (bad["runs"], bad["named"], bad["by_kind"], bad["named_last"], bad["last"], bad["status"]) == (
        50, 40, {"straggler": 40}, 4, 5, "chronic")
    assert (bad["first_seen"], bad["last_seen"]) == (T0, T0 + 196 * 3600)
    assert (once["runs"], once["named"], once["by_kind"], once["status"]) == (50, 1, {"non_finite": 1}, "one-off")
    # the resumed run's verdict is its last launch's: node04 named there, node09 (launch 0) not
    assert (rows["node04"]["named"], rows["node04"]["status"]) == (1, "one-off")
    assert rows["node09"]["named"] == 0 and rows["node09"]["status"] == "clean"
    assert {h for h, r in rows.items() if r["status"] == "clean"} == {f"node{i:02d}" for i in range(10)} - {"node04"}
    assert sum(r["runs"] for r in rows.values()) == 2 * RUNS  # two hosts a run


def test_the_hosts_command_formats_and_filters(ledger_db: str) -> None:
    assert _invoke("hosts", ledger_db, "--format", "slurm") == "--exclude=gpu-bad\n"
    # 1 of its last 5: node04 (named in its last run) too, in Slurm's comma-separated host list
    assert _invoke("hosts", ledger_db, "--format", "slurm", "--chronic", "1/5") == "--exclude=gpu-bad,node04\n"
    assert _invoke("hosts", ledger_db, "--format", "slurm", "--kind", "non_finite") == ""  # nothing to exclude
    table = _invoke("hosts", ledger_db)
    line = next(line for line in table.splitlines() if line.split()[0] == "gpu-bad")
    assert line.split() == ["gpu-bad", "50", "40", "0", "40", "2026-01-01", "00:00", "2026-01-09", "04:00",
                            "4/5", "chronic"]
    assert "chronic: named in 3 or more of its last 5 runs (1 host(s))" in table
    data = json.loads(_invoke("hosts", ledger_db, "--format", "json", "--kind", "non_finite"))
    by_host = {h["host"]: h for h in data["hosts"]}
    assert by_host["gpu-bad"]["status"] == "clean" and by_host["gpu-once"]["status"] == "one-off"
    assert data["chronic"] == {"k": 3, "n": 5}
    # since the start of run 150: gpu-bad's runs 152..196 (12), named in all but 160 and 180
    rows = list(csv.DictReader(io.StringIO(_invoke("hosts", ledger_db, "--format", "csv", "--since", "2026-01-07 06:00"))))
    bad = next(r for r in rows if r["host"] == "gpu-bad")
    assert (bad["runs"], bad["named"], bad["named_straggler"], bad["first_seen"], bad["status"]) == (
        "12", "10", "10", "2026-01-07 08:00", "chronic")
    result = CliRunner().invoke(main, ["hosts", ledger_db, "--chronic", "6/5"])
    assert result.exit_code == 2 and "give K/N with 1 <= K <= N" in result.output
    result = CliRunner().invoke(main, ["hosts", ledger_db, "--kind", "stop"])
    assert result.exit_code == 2 and "a kind is one of non_finite, departure, straggler, memory" in result.output


def test_an_empty_store_lists_no_host(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from multirank_logger.store.sql_store import Store

    db = str(tmp_path / "runs.sqlite")
    Store(db).close()
    assert _invoke("hosts", db, "--format", "slurm") == ""
    assert "No hosts" in _invoke("hosts", db)
    assert json.loads(_invoke("hosts", db, "--format", "json"))["hosts"] == []


def test_the_chronic_rule() -> None:
    flags = np.array([1, 0, 0, 0, 0, 1, 1, 0, 1], bool)
    assert host_status(flags, 3, 5) == ("chronic", 3, 5)
    assert host_status(flags, 4, 5) == ("intermittent", 3, 5)
    assert host_status(np.array([0, 1, 0], bool), 3, 5) == ("one-off", 1, 3)
    assert host_status(np.zeros(7, bool)) == ("clean", 0, 5)
    with pytest.raises(ValueError, match="1 <= K <= N"):
        host_status(flags, 0, 5)


def test_hosts_in_natural_order(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """node2 before node10 (numbers inside a name as numbers), in the table, JSON and Slurm's list."""
    import sqlalchemy as sa

    from multirank_logger._util.readable import natural_key
    from multirank_logger.rows.schema import findings, ranks
    from multirank_logger.rows.schema import runs as runs_table
    from multirank_logger.store.sql_store import Store

    hosts = ["node10", "node2", "gpu-a10", "node1", "gpu-a9", "node02"]
    db = str(tmp_path / "runs.sqlite")
    store = Store(db)
    try:
        with store.begin() as conn:
            conn.execute(sa.insert(runs_table), [{"id": 1, "name": "n", "version": 0, "status": "success",
                                                  "world_size": len(hosts), "started_at": T0}])
            conn.execute(sa.insert(ranks), [{"run_id": 1, "rank": r, "host": h, "node_rank": r, "local_rank": 0,
                                             "status": "success", "started_at": T0} for r, h in enumerate(hosts)])
            conn.execute(sa.insert(findings), [
                {"run_id": 1, "rank": r, "seq": r, "kind": "straggler", "series": "timing:data_s", "first_step": 10,
                 "origin": True, "origin_step": 10, "value": 0.1, "detail": "{}", "sentence": "-", "found_at": T0}
                for r in range(len(hosts))])
    finally:
        store.close()
    natural = ["gpu-a9", "gpu-a10", "node1", "node02", "node2", "node10"]
    assert sorted(hosts, key=natural_key) == natural
    assert _invoke("hosts", db, "--format", "slurm", "--chronic", "1/1") == f"--exclude={','.join(natural)}\n"
    assert [h["host"] for h in json.loads(_invoke("hosts", db, "--format", "json"))["hosts"]] == natural
    assert [line.split()[0] for line in _invoke("hosts", db).splitlines()[1 : 1 + len(natural)]] == natural


def test_the_drivers_read_is_the_stores(ledger_db: str) -> None:
    """`multirank-logger hosts` reads a SQLite or DuckDB file through its engine's own driver
    (no SQLAlchemy: its cold start); the ledger is the one `StoreReader.hosts` reads, whatever the filters."""
    from multirank_logger import open_store
    from multirank_logger.query import host_ledger
    from multirank_logger.report.host_list import read_hosts
    from multirank_logger.rows.schema import SEQ_ATTEMPT_SHIFT
    from multirank_logger.store.backends.store_files import driver_rows

    assert host_ledger.SEQ_ATTEMPT_SHIFT == SEQ_ATTEMPT_SHIFT  # the ledger's own copy of the constant
    with driver_rows(ledger_db) as fetch:
        assert fetch is not None  # the driver's way was taken, not the fallback
    since = T0 + 150 * 3600
    with open_store(ledger_db) as reader:
        for kwargs in ({}, {"since": since}, {"kinds": ["straggler"]}, {"since": since, "chronic": (1, 3)}):
            assert read_hosts(ledger_db, **kwargs) == reader.hosts(**kwargs), kwargs  # type: ignore[arg-type]


def test_a_store_the_driver_cannot_serve_is_opened_the_usual_way(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A store at another schema revision: the usual open says what to do (upgrade), not a driver's error."""
    import sqlite3

    from multirank_logger.errors import SchemaOutdated
    from multirank_logger.report.host_list import read_hosts
    from multirank_logger.store.backends.store_files import driver_rows

    db = build_ledger_store(str(tmp_path / "runs.sqlite"), runs=8)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0001'")
    conn.close()
    with driver_rows(db) as fetch:
        assert fetch is None
    with pytest.raises(SchemaOutdated, match="db upgrade"):
        read_hosts(db)
    with driver_rows(str(tmp_path / "missing.sqlite")) as fetch:
        assert fetch is None
    result = CliRunner().invoke(main, ["hosts", str(tmp_path / "missing.sqlite")])
    assert result.exit_code == 1 and "No store at" in result.output, result.output


def _build_gpu_store(db: str) -> str:
    """30 runs of 4 ranks on two hosts, a GPU each. ``GPU-bad`` sits in nodeA for runs 0-14, then
    in nodeB (moved), and a straggler on it is named in runs 3, 9, 16, 21, 26, 27 and 29 (3 of its
    last 5, 4 of them on nodeB); no other GPU is ever named. nodeB's ranks record Slurm's name ``snB``."""
    import sqlalchemy as sa

    from multirank_logger.rows.schema import findings, ranks
    from multirank_logger.rows.schema import runs as runs_table
    from multirank_logger.store.sql_store import Store

    named_runs = (3, 9, 16, 21, 26, 27, 29)

    def places(i: int) -> list[tuple[str, str]]:
        """(host, GPU UUID) of run i's ranks 0-3."""
        a, b = ["GPU-a0", "GPU-a1"], ["GPU-b0", "GPU-b1"]
        (a if i < 15 else b)[1] = "GPU-bad"
        return [("nodeA", a[0]), ("nodeA", a[1]), ("nodeB", b[0]), ("nodeB", b[1])]

    store = Store(db)
    try:
        with store.begin() as conn:
            conn.execute(sa.insert(runs_table), [{"id": i + 1, "name": "g", "version": i, "status": "success",
                                                  "world_size": 4, "started_at": T0 + i * 60} for i in range(30)])
            conn.execute(sa.insert(ranks), [
                {"run_id": i + 1, "rank": r, "host": host, "gpu_uuid": uuid, "gpu_index": r % 2, "gpu_name": "NVIDIA H200",
                 "slurm_node": "snB" if host == "nodeB" else None, "status": "success", "started_at": T0 + i * 60}
                for i in range(30) for r, (host, uuid) in enumerate(places(i))])
            conn.execute(sa.insert(findings), [
                {"run_id": i + 1, "rank": [u for _, u in places(i)].index("GPU-bad"), "seq": 0, "kind": "straggler",
                 "series": "timing:data_s", "first_step": 10, "origin": True, "origin_step": 10, "value": 0.1,
                 "detail": "{}", "sentence": "-", "found_at": T0} for i in named_runs])
    finally:
        store.close()
    return db


@pytest.mark.parametrize("suffix", [".sqlite", ".duckdb"])
def test_a_chronic_gpu_by_its_uuid_wherever_it_moved(tmp_path, suffix: str) -> None:  # type: ignore[no-untyped-def]
    from multirank_logger import open_store

    db = _build_gpu_store(str(tmp_path / f"runs{suffix}"))
    data = json.loads(_invoke("hosts", db, "--by", "gpu", "--format", "json"))
    gpus = {g["gpu"]: g for g in data["gpus"]}
    assert sorted(gpus) == ["GPU-a0", "GPU-a1", "GPU-b0", "GPU-b1", "GPU-bad"]
    bad = gpus["GPU-bad"]
    assert (bad["runs"], bad["named"], bad["named_last"], bad["status"]) == (30, 7, 3, "chronic")
    assert (bad["hosts"], bad["host"], bad["slurm_node"], bad["gpu_name"]) == (["nodeA", "nodeB"], "nodeB", "snB", "NVIDIA H200")
    assert {g["status"] for u, g in gpus.items() if u != "GPU-bad"} == {"clean"}
    # the GPU's host now, by Slurm's name; by host, its named runs split between the two hosts
    assert _invoke("hosts", db, "--by", "gpu", "--format", "slurm") == "--exclude=snB\n"
    by_host = {h["host"]: h for h in json.loads(_invoke("hosts", db, "--format", "json"))["hosts"]}
    assert (by_host["nodeA"]["named"], by_host["nodeB"]["named"]) == (2, 5)
    assert (by_host["nodeA"]["slurm_node"], by_host["nodeB"]["slurm_node"]) == (None, "snB")
    rows = list(csv.DictReader(io.StringIO(_invoke("hosts", db, "--by", "gpu", "--format", "csv"))))
    assert [(r["gpu"], r["host"], r["slurm_node"], r["status"]) for r in rows if r["gpu"] == "GPU-bad"] == [
        ("GPU-bad", "nodeB", "snB", "chronic")]
    table = _invoke("hosts", db, "--by", "gpu")
    line = next(line for line in table.splitlines() if line.startswith("GPU-bad"))
    assert line.split()[:4] == ["GPU-bad", "NVIDIA", "H200", "nodeB"] and line.split()[-1] == "chronic", table
    assert "chronic: named in 3 or more of its last 5 runs (1 GPU(s))" in table
    from multirank_logger.report.host_list import read_hosts

    with open_store(db) as reader:  # the store's own read (PostgreSQL's way) agrees with the driver's
        assert reader.hosts(by="gpu") == read_hosts(db, by="gpu")
