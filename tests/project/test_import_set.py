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


#: the modules that import Lightning: its front-end and callbacks (and the frameworks' integrations,
#: which need their own framework; Ray's, Accelerate's and Transformers' import none of Lightning)
LIGHTNING_FRONT = ("multirank_logger/logger/multi_rank_logger.py", "multirank_logger/callbacks/")
NEEDS_A_FRAMEWORK = ("multirank_logger/integrations/accelerate_tracker.py",
                     "multirank_logger/integrations/transformers_callback.py", "multirank_logger/integrations/ray_train.py")

_PLAIN_SCRIPT = """
import json, math, sys
import multirank_logger
with multirank_logger.init(db=sys.argv[1], name="plain", export_csv=True) as run:
    for step in range(30):
        run.log({"loss": math.nan if step >= 20 else 1.0 / (step + 1)}, step=step)
    run.logger.record("decisions", step=29, callback="user", decision=True, path="a plain script")
    assert run.flush(30)
for path in sys.argv[2:]:
    __import__(path)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("lightning", "pytorch_lightning"))), file=sys.stderr)
"""


def test_a_plain_api_script_never_imports_lightning(tmp_path: Path) -> None:
    """`multirank_logger.init` (torchrun scripts, Accelerate, Transformers) builds the logger's
    Lightning-free core: a run with its watch, a NaN alert, metrics.csv and a side row imports no
    Lightning, nor does any module of the package outside Lightning's front-end and callbacks
    (the gather and node transports' included), each imported by name after the run."""
    root = Path(__file__).resolve().parents[2]
    modules = [
        ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        for path in sorted((root / "multirank_logger").rglob("*.py"))
        if not str(path.relative_to(root)).startswith((*LIGHTNING_FRONT, *NEEDS_A_FRAMEWORK))
    ]
    assert "multirank_logger.write.sinks" in modules and "multirank_logger.channel.row_channel" in modules
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONWARNINGS": "ignore"}
    db = tmp_path / "runs.duckdb"
    done = subprocess.run([sys.executable, "-c", _PLAIN_SCRIPT, str(db), *modules], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    assert json.loads(done.stderr.strip().splitlines()[-1]) == [], done.stderr[-3000:]
    # what Lightning's rank-zero line said under a Trainer, the console still says (stderr, rank 0)
    assert f"MultiRankLogger: run plain/version_0 (id 1) in {db}, 1 rank(s)" in done.stderr, done.stderr[-3000:]
    assert "NaN" in done.stderr, done.stderr[-3000:]  # the watch's alert on the console
    assert (tmp_path / "plain" / "version_0" / "metrics.csv").read_text().count("\n") == 31
    from tests.helpers.logger_helpers import query

    assert query(db, "SELECT count(*), count(DISTINCT step) FROM metrics") == [(30, 30)]
    assert query(db, "SELECT decision, path FROM decisions") == [(True, "a plain script")]
    assert query(db, "SELECT status FROM runs") == [("success",)]


_PANDAS_AFTER_A_RUN = """
import json, math, sys
import multirank_logger
with multirank_logger.init(db=sys.argv[1], name="plain", export_csv=True, config={"lr": 0.1}) as run:
    for step in range(40):  # two summary buckets, a NaN (an alert, a NULL value), a key every 3 steps
        run.log({"loss": math.nan if step >= 30 else 1.0 / (step + 1), **({"acc": 0.5} if step % 3 == 0 else {})}, step=step)
    run.logger.record("decisions", step=39, callback="user", decision=True, path="a plain script")
    assert run.flush(30)
print(json.dumps("pandas" in sys.modules), file=sys.stderr)
"""


def test_a_run_on_sqlite_never_imports_pandas(tmp_path: Path) -> None:
    """The write path builds its Arrow arrays from buffers and reads them back the same way
    (rows/batch.py, _util/arrow_numpy.py): pyarrow 26 imports pandas on any ``pa.array`` or
    ``to_numpy``, ~0.4 s of CPU in the writer's or the watch's thread mid-training. A run on SQLite
    (its rows, summaries at both levels, a NaN the watch alerts on, a side row, metrics.csv, the
    end) imports none. (A DuckDB store's own Arrow scan imports pyarrow.dataset, and with it pandas.)"""
    db = tmp_path / "runs.sqlite"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, "-c", _PANDAS_AFTER_A_RUN, str(db)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "NaN" in done.stderr, done.stderr[-3000:]  # the watch judged the rows
    assert json.loads(done.stderr.strip().splitlines()[-1]) is False, done.stderr[-3000:]
    from tests.helpers.logger_helpers import query

    assert query(db, "SELECT count(*) FROM metrics") == [(40 + 14,)]
    assert query(db, "SELECT count(*) FROM coarse_summaries") == [(2,)]
    assert query(db, "SELECT status FROM runs") == [("success",)]
