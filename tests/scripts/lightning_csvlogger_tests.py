"""Lightning's own CSVLogger tests with MultiRankLogger in CSVLogger's place (a script, not
collected by pytest: it needs a Lightning source tree).

From a checkout of the tag matching the installed Lightning, Lightning's test trees
(``tests/tests_pytorch``, ``tests/tests_fabric``, with their conftest.py, which fails a test that
leaks an environment variable or leaves a thread without ``stop()``) are copied and run:

- ``tests_pytorch/loggers/test_csv.py`` and ``tests_fabric/loggers/test_csv.py``, whole;
- every other test function of ``tests_pytorch`` that names ``CSVLogger`` (in its body or its
  parametrization, or through ``ALL_LOGGER_CLASSES``).

In each of these files the name ``CSVLogger`` is rebound, right after its import, to a subclass
of MultiRankLogger whose store is a file of the chosen backend, one per save_dir. The result is
in docs/drop-in.md ("Lightning's own tests").

Usage (LSRC needs only its ``tests/`` folder; two of the test files import cloudpickle, and
rich and scikit-learn let three more tests run):
    git clone --branch 2.6.5 --depth 1 https://github.com/Lightning-AI/pytorch-lightning LSRC
    pip install cloudpickle rich scikit-learn
    python tests/scripts/lightning_csvlogger_tests.py LSRC [--backend sqlite|duckdb] [pytest args...]
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: the CSVLogger test files, run whole
WHOLE = ("tests_pytorch/loggers/test_csv.py", "tests_fabric/loggers/test_csv.py")
#: what marks a test elsewhere as one that constructs a CSVLogger
MENTIONS = ("CSVLogger", "ALL_LOGGER_CLASSES")

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


def swap_import(text: str) -> str | None:
    """`text` with ``CSVLogger`` rebound to the swap right after it is imported (None: not imported)."""
    tree = ast.parse(text)
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and any(alias.name == "CSVLogger" and alias.asname is None for alias in node.names):
            lines = text.splitlines(keepends=True)
            lines.insert(node.end_lineno or node.lineno, "from csvlogger_swap import CSVLogger  # noqa: E402,F811\n")
            return "".join(lines)
    return None


def tests_naming_csvlogger(text: str) -> list[str]:
    """The module-level test functions whose body or decorators name `MENTIONS`."""
    names = []
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
            source = "".join(ast.get_source_segment(text, part) or "" for part in (node, *node.decorator_list))
            if any(word in source for word in MENTIONS):
                names.append(node.name)
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("lightning_src", type=Path, help="a checkout of Lightning (its tests/ folder is read)")
    parser.add_argument("--backend", choices=("sqlite", "duckdb"), default="sqlite")
    args, pytest_args = parser.parse_known_args()
    src = args.lightning_src / "tests"
    with tempfile.TemporaryDirectory(prefix="lightning-csv-tests-") as work:
        root = Path(work)
        for tree in ("tests_pytorch", "tests_fabric"):
            shutil.copytree(src / tree, root / tree, ignore=shutil.ignore_patterns("__pycache__"))
        (root / "csvlogger_swap.py").write_text(SWAP.format(backend=args.backend))
        selected: list[str] = []
        for path in sorted(root.glob("tests_*/**/test_*.py")):
            rel = path.relative_to(root).as_posix()
            text = path.read_text()
            swapped = swap_import(text)
            if swapped is None:
                continue
            if rel in WHOLE:
                selected.append(rel)
            elif rel.startswith("tests_pytorch/") and (names := tests_naming_csvlogger(text)):
                selected.extend(f"{rel}::{name}" for name in names)
            else:
                continue
            path.write_text(swapped)
        assert all(rel in selected for rel in WHOLE), f"no CSVLogger import to swap in {WHOLE} (another Lightning version?)"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
        cmd = [sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider", "-q", "-rfE",
               "-o", "addopts=", *selected, *pytest_args]
        return subprocess.run(cmd, cwd=root, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
