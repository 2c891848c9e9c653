"""Smoke test of the benchmark suite (benchmarks/run.py), so that `make bench` keeps working.

What it checks: that every section runs end to end at tiny sizes (``--tiny --in-process``:
a few hundred calls, a 2-rank DDP launch of 10 steps, a 4,000-row store, 4 paced senders for
3 s, stores of 16 and 8 ranks x 200 steps, the ui's page in Chromium), and that
the table has every expected row with a positive, finite median, min <= median <= max,
a positive peak RSS, and a positive, finite ratio wherever the row names a peer.

What it does not check: any timing. The numbers at these sizes mean nothing, and this
machine is shared; no threshold on speed belongs in a test. The gather and gather_load
sections are left out: bench_gather.py owns its sizes, and tests/runs/test_gather_load.py runs
bench_gather_load's measure itself.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(600)  # the run below: ~2 min on 2 busy cores
SECTIONS = ("hotpath", "memory", "ingest", "e2e", "query", "scale", "read_scale", "ui")
EXPECTED = {
    "hotpath": [
        "no-op Logger (harness floor)",
        "CSVLogger",
        "TensorBoardLogger",
        "RecordBuffer.append (component)",
        "MultiRankLogger SQLite",
        "MultiRankLogger DuckDB",
        "MultiRankLogger SQLite, export_csv=False",
        "MultiRankLogger DuckDB, export_csv=False",
    ],
    "ingest": [
        "raw sqlite3 executemany",
        "Store.write SQLite",
        "raw DuckDB from Arrow",
        "Store.write DuckDB",
        "Store.write DuckDB in Store.writing()",
        "raw sqlite3 executemany, 1k-row batches",
        "Store.write SQLite, 1k-row batches",
        "raw DuckDB from Arrow, 1k-row batches",
        "Store.write DuckDB, 1k-row batches",
        "Store.write SQLite, 1k-row batches, without summaries",
        "Store.write DuckDB in Store.writing(), without summaries",
        "RecordBuffer.drain (component)",
        "raw sqlite3 executemany, beside a busy thread",
        "Store.write SQLite, beside a busy thread",
    ],
    "memory": ["CSVLogger", "MultiRankLogger SQLite", "MultiRankLogger DuckDB"],
    "e2e": ["logger=False", "no-op Logger (Lightning's floor)", "control: rank 0 busy 0.2 ms/step", "control: every rank busy 0.2 ms/step", "CSVLogger", "TensorBoardLogger", "MultiRankLogger direct", "MultiRankLogger gather"],
    "query": [
        "CSVLogger one save()",
        "CSVLogger per step",
        "export_csv rank 0 DuckDB",
        "raw DuckDB PIVOT",
        "per_rank(key) DuckDB",
        "export_csv rank 0 SQLite",
        "per_rank(key) SQLite",
    ],
    "scale": [
        "scale: 4 paced senders (10 calls/s x 10 keys) into one rank 0 (DuckDB)",
        "scale: node transport, 4 senders on 2 nodes: the launch's TCPStore's bytes",
    ],
    "ui": [
        "raw DuckDB GROUP BY one key",
        "ui first render of a run",
        "heatmap 64 x 200 draw",
        "uPlot 20 series draw",
        "2-rank DDP, no page",
        "2-rank DDP, ui page open",
    ],
}
# read_scale's rows are named by their store's shape (which its module sets per mode): each kind, in this order
KINDS = {
    "read_scale": ["raw DuckDB median per (key, step)", "report", "report -o", "per_rank", "rank_spread", "export", "runs", "page"]
    + ["raw DuckDB median per (key, step)", "report", "report -o", "per_rank", "rank_spread", "export"]
    + ["bytes/row DuckDB", "bytes/row sqlite", "bytes/row postgresql"],
}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], str]:
    """Run the suite once at tiny sizes; return its rows (JSON) and its markdown report."""
    out = tmp_path_factory.mktemp("bench")
    try:
        proc = subprocess.run(
            [sys.executable, "-u", "benchmarks/run.py", "--tiny", "--in-process", "--only", ",".join(SECTIONS),
             "--out", str(out / "RESULTS.md"), "--json", str(out / "rows.json")],
            cwd=ROOT, capture_output=True, text=True, timeout=480,
        )
    except subprocess.TimeoutExpired as exc:  # say which case it was in
        said = [(s or b"").decode(errors="replace") if isinstance(s, bytes) else (s or "") for s in (exc.stdout, exc.stderr)]
        pytest.fail(f"the tiny benchmark run did not end in 480 s; its output's end:\n{said[0][-3000:]}\n{said[1][-3000:]}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "rows.json").read_text()), (out / "RESULTS.md").read_text()


def _finite_positive(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.mark.parametrize("section", SECTIONS)
def test_section_has_every_row(tiny_run: tuple[list[dict], str], section: str) -> None:
    """Each section reports exactly its expected rows, and none failed."""
    rows, _ = tiny_run
    got = [r["case"] for r in rows if r["section"] == section]
    if section in KINDS:  # "report 16x200x3 (0.0096M rows)": the kind, less the shape
        got = [re.sub(r" \d+x\d+x\d+ \(.*\)$", "", case) for case in got]
        assert got == KINDS[section]
    else:
        assert got == EXPECTED[section]
    errors = {r["case"]: r["error"] for r in rows if r["section"] == section and r["error"]}
    assert errors == {}


def test_figures_are_positive_and_finite(tiny_run: tuple[list[dict], str]) -> None:
    """Median/min/max, peak RSS and peer ratios are sensible numbers (no timing threshold)."""
    rows, _ = tiny_run
    for row in rows:
        median, lo, hi = row["value"]
        # memory rows are RSS growth: zero or below when nothing grew
        ok = (lambda x: math.isfinite(x)) if row["section"] == "memory" else _finite_positive
        assert all(ok(x) for x in (median, lo, hi)), row
        assert lo <= median <= hi, row
        assert _finite_positive(row["rss_mib"][0]), row
        if row["peer"] is not None:
            assert row["ratio"] is not None and _finite_positive(row["ratio"][0]), row


def test_report_has_header_and_table(tiny_run: tuple[list[dict], str]) -> None:
    """The markdown report names the command, the machine and versions, and lists every row."""
    rows, report = tiny_run
    assert "- command: `python benchmarks/run.py --tiny" in report
    assert "cores" in report and "GiB memory" in report and "lightning " in report
    for row in rows:
        assert f"| {row['section']} | {row['case']} |" in report
    assert "## Targets" in report and "- hotpath / MultiRankLogger DuckDB: <= 5 us/call in the training loop: " in report
    assert "(loop_us=" in report and "(thread_us=" in report


def test_many_ranks_check_trains_checks_the_store_and_finds_the_planted_rank(tmp_path: Path) -> None:
    """benchmarks/many_ranks_check.py (run by hand at 64 ranks on a machine with cores) at 3 ranks:
    real DDP launches without a logger and with MultiRankLogger (CSVLogger's is left out here:
    each launch is ~14 s of the suite), the store checked (every rank's every step once,
    `success`) and the report naming the planted train_loss outlier, rank 2."""
    proc = subprocess.run(
        [sys.executable, "benchmarks/many_ranks_check.py", "--devices", "3", "--steps", "25", "--rounds", "1",
         "--variants", "logger=False,MultiRankLogger", "--out", str(tmp_path), "--timeout", "240"],
        cwd=ROOT, capture_output=True, text=True, timeout=560,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "success, 3 ranks x 25 steps x 3 keys once each, the report names rank 2" in proc.stdout
    assert "PROBLEM" not in proc.stdout
    assert "CSVLogger" not in proc.stdout
    for label in ("fit", "training loop"):
        assert re.search(rf"^MultiRankLogger: {label} median [\d.]+ s .*x of logger=False", proc.stdout, re.M)
