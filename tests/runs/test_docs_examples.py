"""The README's and docs/' ```python blocks that launch DDP scripts, and every later block of
their file, run as a user runs them (tests/helpers/doc_blocks.py); the README's quick start read
back by the CLI."""

from __future__ import annotations

import re

import pytest

from tests.helpers.doc_blocks import block_params, file_run, run_cli


@pytest.mark.parametrize(("name", "index"), block_params(launching=True))
def test_python_block_runs(name: str, index: int, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each ```python block of README.md and docs/*.md runs as written (how: tests/helpers/doc_blocks.py)."""
    run = file_run(name, tmp_path_factory)
    run.run_through(index)
    if index in run.errors:
        pytest.fail(run.errors[index], pytrace=False)


@pytest.mark.xdist_group("docs README.md")  # with README's blocks: it reads what their run left
def test_readme_quick_start_trains_two_ranks_that_the_cli_reads(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The README's first python block, saved to a file in an empty directory and run, trains
    two ranks; `multirank-logger ranks DB KEY` shows both ranks' values, and `runs` the run as a
    success."""
    run = file_run("README.md", tmp_path_factory)
    first = run.blocks[0]
    assert first.script and not first.skip, "the README's first python block is the quick start script"
    db = re.search(r"MultiRankLogger\(db=\"([^\"]+)\"\)", first.code)
    key = re.search(r"self\.log\(\"([^\"]+)\"", first.code)
    assert db and key, "the quick start logs a key into MultiRankLogger(db=...)"
    run.run_through(0)
    assert 0 not in run.errors, run.errors[0]
    assert run.listing_before[0] == [], "the quick start ran in an empty directory"

    out = run_cli("ranks", db.group(1), key.group(1), cwd=run.cwd)
    assert f"{key.group(1)} in lightning_logs/version_0 (run 1): 2 ranks" in out, out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split() == ["rank", "rank", "0", "rank", "1"])
    rows = []
    for line in lines[header + 2:]:
        if not line.strip():
            break
        if line.strip() != "...":
            rows.append([float(x) for x in line.split()])
    assert rows and all(len(row) == 3 for row in rows), out
    assert all(row[1] == row[1] and row[2] == row[2] for row in rows), "a value for each rank at each step"

    runs = run_cli("runs", db.group(1), cwd=run.cwd)
    header_cols, row = runs.splitlines()[0].split(), runs.splitlines()[1].split()
    assert row[header_cols.index("run")] == "lightning_logs/version_0"
    assert row[header_cols.index("status")] == "success"
    assert row[header_cols.index("ranks")] == "2"
