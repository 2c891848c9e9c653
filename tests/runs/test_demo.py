"""`make demo`, the main job: examples/demo.py trains 3 ranks over gloo on CPU into a DuckDB
store, rank 1 slow and rank 2's shard bad, and prints the runs, a per-rank view and the report
naming both. Run here as `make demo` runs it, in a scratch working directory, once on a fresh
store and once on a store an older version left (a copy of the fresh run's, taken back to 0002).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from multirank_logger.store.sql_store import Store, head_revision
from tests.helpers.launches import free_port

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo.py"


def _path_without_venv() -> str:
    """PATH as in a shell where the venv is not active (make demo's: it runs .venv/bin/python)."""
    venv_bin = str(Path(sys.executable).parent)
    return os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin)


def _run_demo(cwd: Path) -> str:
    env = {**os.environ, "MASTER_PORT": str(free_port()), "PATH": _path_without_venv()}
    for var in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK"):
        env.pop(var, None)
    proc = subprocess.run([sys.executable, str(DEMO)], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def fresh_demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The demo once on a fresh store: its working directory and its output. The fresh case reads
    it; the older-store case starts from a copy of the directory it left (one demo launch, ~30 s
    on 2 cores, instead of two)."""
    cwd = tmp_path_factory.mktemp("fresh_demo")
    return cwd, _run_demo(cwd)


@pytest.mark.parametrize("older_store", [False, True], ids=["fresh", "store-at-0002"])
def test_demo_trains_three_ranks_and_names_its_problem_ranks(
    fresh_demo: tuple[Path, str], tmp_path: Path, older_store: bool
) -> None:
    """The demo prints the run, train_loss per rank around the bad step (a column for each rank,
    each its own values) and the report: rank 1 the straggler, rank 2 where the NaN started (the
    others following); it writes CSVLogger's files; a store an older demo left is upgraded first,
    its runs kept."""
    if older_store:  # what an older demo left: the fresh run's directory, its store taken back to 0002
        cwd = tmp_path / "older"
        shutil.copytree(fresh_demo[0], cwd)
        store = Store.for_upgrade(cwd / "demo_runs" / "runs.duckdb")
        store.downgrade("0002")
        store.close()
        out = _run_demo(cwd)
    else:
        cwd, out = fresh_demo
    db = cwd / "demo_runs" / "runs.duckdb"
    version = 1 if older_store else 0
    assert ("Upgraded the demo's store" in out) == older_store
    assert f"demo/version_{version}" in out and "success" in out
    table = out.split("(step x rank)\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert table[0].split() == ["rank", "0", "1", "2"] and table[1].split() == ["step"]
    rows = [line.split() for line in table[2:]]
    assert len(rows) == 6 and all(len(row) == 4 for row in rows)
    assert any(len(set(row[1:])) == 3 for row in rows)  # each rank's own shard: its own loss
    # the report names the planted ranks: rank 1 the straggler, rank 2 the NaN's origin
    report = out.split("== the report:", 1)[1]
    stragglers = report.split("Stragglers:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert [line.split()[:2] for line in stragglers] == [["rank", "1"]], stragglers
    non_finite = report.split("Non-finite values:\n", 1)[1].split("\n\n", 1)[0]
    assert "rank 2 train_loss NaN from step 25; followed by ranks 0-1 at step 26" in non_finite, non_finite
    assert (cwd / "demo_runs" / "demo" / f"version_{version}" / "metrics.csv").is_file()
    page = cwd / "demo_runs" / "report.html"  # the run's own report, pointed at at the end
    assert f"This run's report: {page}" in out and "window.MRL_STATIC" in page.read_text()
    # the commands printed work from the shell make demo ran in, the venv not active (issue 40 point 2)
    report_line = next(line for line in out.splitlines() if line.startswith("In the terminal: "))
    command = report_line.removeprefix("In the terminal: ")
    assert command.split()[0].endswith("multirank-logger") and " report demo_runs/runs.duckdb --run " in command
    shell = subprocess.run(command, shell=True, cwd=cwd, env={**os.environ, "PATH": _path_without_venv()},
                           capture_output=True, text=True, timeout=120)
    assert shell.returncode == 0 and "Report for demo/version_" in shell.stdout, shell.stderr[-2000:]
    assert out.rstrip().endswith("ui demo_runs/runs.duckdb")  # make demo ends with the ui command
    reader = Store(db, readonly=True)
    assert reader.current_revision() == head_revision()
    reader.close()
