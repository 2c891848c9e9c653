"""Lightning's own CSVLogger tests with MultiRankLogger in CSVLogger's place (a script, not
collected by pytest: it needs a Lightning source tree).

Lightning's ``tests/tests_pytorch/loggers/test_csv.py`` and ``tests/tests_fabric/loggers/test_csv.py``
(with their conftest.py, which fails a test that leaves a thread without ``stop()``) are
copied from a checkout of the tag matching the installed Lightning, their ``CSVLogger``
import rewritten to a subclass of MultiRankLogger whose store is a file of the chosen backend
in a temporary directory, and run. The result is in docs/drop-in.md ("Lightning's own tests").

Usage:
    git clone --branch 2.6.5 --depth 1 https://github.com/Lightning-AI/pytorch-lightning LSRC
    python tests/lightning_csvlogger_tests.py LSRC [--backend sqlite|duckdb] [pytest args...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: the test files run, and the import each has of the CSVLogger it tests
TESTS = {
    "tests_pytorch/loggers/test_csv.py": "from lightning.pytorch.loggers import CSVLogger",
    "tests_fabric/loggers/test_csv.py": "from lightning.fabric.loggers import CSVLogger",
}
#: what the copied tests import besides: their packages' conftest and helpers
SUPPORT = ("tests_pytorch/__init__.py", "tests_pytorch/conftest.py", "tests_pytorch/helpers",
           "tests_pytorch/loggers/__init__.py", "tests_pytorch/loggers/conftest.py", "tests_fabric/__init__.py",
           "tests_fabric/conftest.py", "tests_fabric/helpers", "tests_fabric/loggers/__init__.py")  # fmt: skip

SWAP = '''"""CSVLogger's name, MultiRankLogger's code; the store is a {backend} file, one per save_dir
(a user keeps one store for their runs: a second logger on a directory finds the first one's run)."""
import hashlib
import os
import tempfile

from multirank_logger import MultiRankLogger

_STORES = tempfile.mkdtemp(prefix="csvlogger-swap-")


class CSVLogger(MultiRankLogger):
    def __init__(self, save_dir=None, name="lightning_logs", version=None, prefix="", flush_logs_every_n_steps=100,
                 *, root_dir=None):  # root_dir: Fabric's CSVLogger's name for save_dir
        save_dir = root_dir if save_dir is None else save_dir
        key = hashlib.sha1(os.path.abspath(os.fspath(save_dir)).encode()).hexdigest()[:16]
        db = os.path.join(_STORES, f"runs-{{key}}.{backend}")
        super().__init__(save_dir, name, version, prefix, flush_logs_every_n_steps, db=db)
'''


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("lightning_src", type=Path, help="a checkout of Lightning (its tests/ folder is read)")
    parser.add_argument("--backend", choices=("sqlite", "duckdb"), default="sqlite")
    args, pytest_args = parser.parse_known_args()
    src = args.lightning_src / "tests"
    with tempfile.TemporaryDirectory(prefix="lightning-csv-tests-") as work:
        root = Path(work)
        for rel in (*SUPPORT, *TESTS):
            source, target = src / rel, root / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, target)
            elif source.exists():
                shutil.copy(source, target)
        (root / "csvlogger_swap.py").write_text(SWAP.format(backend=args.backend))
        for rel, line in TESTS.items():
            path = root / rel
            text = path.read_text()
            assert line in text, f"{rel}: no {line!r} to swap (another Lightning version?)"
            path.write_text(text.replace(line, "from csvlogger_swap import CSVLogger"))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
        cmd = [sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider", "-q", "-rfE",
               "-o", "addopts=", *TESTS, *pytest_args]  # fmt: skip
        return subprocess.run(cmd, cwd=root, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
