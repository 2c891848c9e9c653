"""Write small stores through MultiRankLogger, then run the read commands on each, in one process.

tests/runs/test_dependency_floors.py runs this with an older duckdb or pandas first on PYTHONPATH: the
store is written and read by the versions under test. Every command's output, and any
FutureWarning it raised, is printed; the exit status is 1 when a command failed or warned.

Usage: python tests/scripts/floor_reads.py SAVE_DIR DB [DB ...]   (each DB's run under SAVE_DIR/logs-<its file name>)
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import sys
import traceback
import warnings

import duckdb
import pandas as pd
from click.testing import CliRunner

from multirank_logger import MultiRankLogger
from multirank_logger.cli import main as cli

#: the other packages whose version the first line names (tests/runs/test_dependency_floors.py checks them)
FLOORED = ("numpy", "pyarrow", "sqlalchemy", "duckdb-engine", "alembic", "fsspec", "click", "pyyaml")
#: each command with its arguments after the store
COMMANDS = [["runs"], ["ranks", "loss"], ["logs"], ["decisions"], ["report"]]


def write_store(db: str, save_dir: str) -> None:
    """A finished one-rank run: 5 steps of two keys, hyperparameters, a warning, a checkpoint decision."""
    logger = MultiRankLogger(save_dir, db=db, flush_interval=0.2)
    logger.log_hyperparams({"lr": 0.1, "layers": 2})
    for step in range(5):
        logger.log_metrics({"loss": 1.0 / (step + 1), "acc": 0.1 * step}, step=step)
    logging.getLogger("floor_reads").warning("a warning the logs command prints")
    logger.record("decisions", seq=0, step=4, epoch=0, callback="ModelCheckpoint", monitor="loss", mode="min",
                  value=0.2, vote=True, decision=True, path="epoch=0.ckpt", best=0.2, time=1.0)
    logger.finalize("success")


def main() -> int:
    save_dir, dbs = sys.argv[1], sys.argv[2:]
    versions = {name: importlib.metadata.version(name) for name in FLOORED}
    print(f"floor_reads: duckdb {duckdb.__version__}, pandas {pd.__version__}, "
          + ", ".join(f"{name} {version}" for name, version in versions.items()), flush=True)
    failed = []
    for db in dbs:  # one process for every store: an interpreter's start with Lightning is most of its time
        write_store(db, os.path.join(save_dir, f"logs-{os.path.basename(db)}"))
        failed += read_store(db)
    if failed:
        print(f"floor_reads: failed with duckdb {duckdb.__version__}, pandas {pd.__version__}: {', '.join(failed)}",
              file=sys.stderr)
        return 1
    return 0


def read_store(db: str) -> list[str]:
    """Each read command on `db`, its output printed; the commands that failed or warned."""
    failed = []
    for command in COMMANDS:
        args = [command[0], db, *command[1:]]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", FutureWarning)
            result = CliRunner().invoke(cli, args)
        future = [w for w in caught if issubclass(w.category, FutureWarning)]
        print(f"== multirank-logger {' '.join(args)}: exit {result.exit_code}\n{result.output}", flush=True)
        if result.exc_info is not None and result.exit_code != 0:
            traceback.print_exception(*result.exc_info)
        for w in future:
            print(f"FutureWarning at {w.filename}:{w.lineno}: {w.message}", file=sys.stderr, flush=True)
        if result.exit_code != 0 or future:
            failed.append(f"{args[0]} {db} (exit {result.exit_code}, {len(future)} FutureWarning)")
    return failed


if __name__ == "__main__":
    sys.exit(main())
