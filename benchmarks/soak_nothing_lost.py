"""A long soak of the "nothing lost" property tests (tests/runs/test_nothing_lost_properties.py).

    .venv/bin/python benchmarks/soak_nothing_lost.py [--examples N] [--only embedded|postgresql|gather]

Runs the same properties as `make test` with N examples per in-process test (default 500) and
N/10 real 2-rank gather runs per case (SQLite and DuckDB, PostgreSQL; ending with finalize, or
both ranks through their exit hooks), random each time (no derandomize): random log calls with
adversarial keys, values and steps, with the store deleted, replaced or held by another process
mid-run, or its disk filling up (N per backend, in a mount namespace: needs root).
Hypothesis prints the smallest failing sequence it finds. Exits as pytest does.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=500, help="examples per in-process test (gather: a tenth)")
    parser.add_argument("--only", choices=["embedded", "postgresql", "gather", "full_disk", "exit-hooks"], help="one of the tests")
    args = parser.parse_args()
    env = {**os.environ, "NOTHING_LOST_EXAMPLES": str(args.examples), "HYPOTHESIS_PROFILE": "default"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:logging",
           "--hypothesis-show-statistics", str(REPO / "tests" / "runs" / "test_nothing_lost_properties.py")]
    if args.only:
        cmd += ["-k", args.only]
    return subprocess.call(cmd, cwd=REPO, env=env)


if __name__ == "__main__":
    sys.exit(main())
