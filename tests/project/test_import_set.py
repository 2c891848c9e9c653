"""What a cold `multirank-logger hosts` imports (issue 51: the command answers in about a second on
10,000 runs, and its time was imports, benchmarks/RESULTS.md "Hosts ledger"). The package's names
are lazy (PEP 562) and the ledger reads the driver's rows, not Arrow (pyarrow 26 imports pandas on
its first ``pa.array``): pandas, torch and lightning stay out. Checked in a fresh interpreter, as a
user runs the command; the set of modules, not a time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.ledger_store import build_ledger_store

#: never needed to list the hosts (pandas alone was ~1 s of the cold command on the loaded machine)
HEAVY = ("pandas", "torch", "lightning", "alembic", "matplotlib", "polars")
#: nor, on a SQLite or DuckDB file, these: its engine's own driver reads it (store/backends/store_files.py)
EMBEDDED_NOT_NEEDED = ("sqlalchemy", "pyarrow")

_RUN_HOSTS = """
import json, sys
from multirank_logger.cli import main
try:
    main(sys.argv[1:], standalone_mode=False)
finally:
    print(json.dumps(sorted(m for m in sys.modules if "." not in m)), file=sys.stderr)
"""


def _modules_after(*args: str) -> tuple[str, set[str]]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-c", _RUN_HOSTS, *args], capture_output=True, text=True, env=env,
                          check=True, timeout=120)
    return done.stdout, set(json.loads(done.stderr.strip().splitlines()[-1]))


@pytest.mark.parametrize("suffix", [".sqlite", ".duckdb"])
def test_hosts_imports_no_pandas(tmp_path: Path, suffix: str) -> None:
    db = build_ledger_store(str(tmp_path / f"runs{suffix}"), runs=40)
    out, modules = _modules_after("hosts", db, "--format", "json")
    assert json.loads(out)["hosts"], out  # it did list the hosts
    assert not modules & {*HEAVY, *EMBEDDED_NOT_NEEDED}, sorted(modules & {*HEAVY, *EMBEDDED_NOT_NEEDED})


def test_the_package_imports_nothing_heavy() -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    code = "import sys, multirank_logger; print(' '.join(sorted(m for m in sys.modules if '.' not in m)))"
    modules = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                                 check=True, timeout=120).stdout.split())
    assert not modules & {*HEAVY, "sqlalchemy", "pyarrow", "numpy"}, modules
    # the lazy names still resolve
    code = "import multirank_logger as m; print(m.open_store.__name__, m.StoreReader.__name__, m.Store.__name__)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True,
                          timeout=120).stdout.split() == ["open_store", "StoreReader", "Store"]
