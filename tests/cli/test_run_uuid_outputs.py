"""A run's UUID in what the read side writes out: runs(), `runs --format`, `report --format json`, `report -o`."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import sqlalchemy as sa
from click.testing import CliRunner

from multirank_logger import open_store
from multirank_logger.cli import main
from multirank_logger.rows.schema import runs
from multirank_logger.store.sql_store import Store
from tests.helpers.logged_calls import store_calls, trainer_calls

_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _two_runs(db: Path) -> list[str]:
    """Two runs of two ranks; their UUIDs as the runs table holds them, in id order."""
    for _ in range(2):
        store_calls(db, {0: trainer_calls(0, steps=4), 1: trainer_calls(1, steps=4)})
    store = Store(db)
    with store.engine.connect() as conn:
        uuids = list(conn.execute(sa.select(runs.c.run_uuid).order_by(runs.c.id)).scalars())
    store.close()
    assert len(set(uuids)) == 2 and all(_UUID.match(u) for u in uuids)
    return uuids


def test_reader_runs_has_each_runs_uuid(db_path: Path) -> None:
    """StoreReader.runs() has a uuid column: each run's run_uuid."""
    uuids = _two_runs(db_path)
    with open_store(db_path) as reader:
        assert reader.runs()["uuid"].tolist() == uuids


def test_runs_json_and_csv_have_the_uuid_and_the_table_does_not(db_path: Path) -> None:
    """runs --format json / csv: every column, uuid included; the default table stays as it was."""
    uuids = _two_runs(db_path)
    result = CliRunner().invoke(main, ["runs", str(db_path), "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [(r["id"], r["run"], r["uuid"]) for r in rows] == [(1, "lightning_logs/version_0", uuids[0]),
                                                              (2, "lightning_logs/version_1", uuids[1])]
    assert rows[0]["started"].endswith("+00:00") and rows[0]["steps"] == 4
    result = CliRunner().invoke(main, ["runs", str(db_path), "--format", "csv"])
    assert result.exit_code == 0, result.output
    assert [r["uuid"] for r in csv.DictReader(io.StringIO(result.output))] == uuids
    table = CliRunner().invoke(main, ["runs", str(db_path)]).output
    assert table.splitlines()[0].split() == ["id", "run", "status", "ranks", "started", "(UTC)", "duration", "steps", "keys",
                                         "lost", "GPU-h"]
    assert uuids[0] not in table


def test_report_json_names_the_runs_uuid(db_path: Path) -> None:
    """report --format json: run_uuid beside run and run_id."""
    uuids = _two_runs(db_path)
    result = CliRunner().invoke(main, ["report", str(db_path), "--run", "1", "--format", "json"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.output)
    assert (found["run_id"], found["run_uuid"]) == (1, uuids[0])


def test_report_html_header_shows_the_runs_uuid(db_path: Path, tmp_path: Path) -> None:
    """report -o FILE.html: the page's header names the run's UUID (the file may travel alone)."""
    uuids = _two_runs(db_path)
    page = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["report", str(db_path), "-o", str(page)])
    assert result.exit_code == 0, result.output
    header = re.search(r"<header>(.*?)</header>", page.read_text(encoding="utf-8"), re.S)
    assert header is not None and f"<span id='run-uuid'>run {uuids[1]}</span>" in header[1]
    assert uuids[0] not in header[1]


def test_page_runs_view_has_the_uuid(db_path: Path) -> None:
    """The page's /api/runs rows (and so a run's header) carry the run's uuid."""
    from multirank_logger.ui import views

    uuids = _two_runs(db_path)
    with open_store(db_path) as reader:
        assert [r["uuid"] for r in views.runs_view(reader)] == uuids[::-1]
