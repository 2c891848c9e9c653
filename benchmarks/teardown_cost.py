"""What a process that imported Lightning spends ending, and what the suite's quick exit saves.

    .venv/bin/python benchmarks/teardown_cost.py [--rounds 5] [--launches 3]

The test suite starts hundreds of Python processes that import Lightning (every rank of every real
launch); tests/helpers/quick_exit/sitecustomize.py makes each freeze the garbage collector as its
last exit hook, so that the collections of the interpreter's teardown skip what was alive then.
Each case is a fresh interpreter, rounds interleaved, its CPU seconds (user + system) the median of
the rounds, with the ratio to its own end:

- ``import lightning.pytorch, its own end``: the import, then the interpreter's whole teardown;
- ``..., gc.freeze at the end``: the same with the quick exit's hook;
- ``..., os._exit``: no teardown at all (the floor: what the import alone costs).

Then a real 2-rank DDP launch (tests/scripts/logger_train.py, 10 steps, DuckDB), with and without
the quick exit's folder on PYTHONPATH, `--launches` times interleaved: its CPU is the whole
machine's busy time over the launch (/proc/stat: both ranks, whoever reaps them), so run it on a
quiet machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._harness import free_port  # noqa: E402
from benchmarks.plain_start import cpu_seconds  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
QUICK_EXIT = ROOT / "tests" / "helpers" / "quick_exit"
IMPORT = "import lightning.pytorch, atexit, gc, os"
CASES = {
    "import lightning.pytorch, its own end": IMPORT,
    "..., gc.freeze at the end": IMPORT + "; atexit.register(gc.freeze)",
    "..., os._exit": IMPORT + "; os._exit(0)",
}


def _busy_seconds() -> float:
    """The machine's busy CPU seconds so far (user + nice + system, every core)."""
    with open("/proc/stat") as fh:
        fields = fh.readline().split()[1:4]
    return sum(int(f) for f in fields) / os.sysconf("SC_CLK_TCK")


def launch_cpu(quick_exit: bool) -> float:
    """The machine's busy CPU seconds over one 2-rank DDP launch of logger_train.py."""
    paths = [str(QUICK_EXIT)] if quick_exit else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, str(ROOT)]), "PYTHONWARNINGS": "ignore",
           "MASTER_PORT": str(free_port())}
    with tempfile.TemporaryDirectory() as tmp:
        before = _busy_seconds()
        subprocess.run([sys.executable, str(ROOT / "tests" / "scripts" / "logger_train.py"), "--db", f"{tmp}/runs.duckdb",
                        "--save-dir", tmp, "--steps", "10"], check=True, env=env, cwd=tmp, capture_output=True)
        time.sleep(0.2)  # the ranks' last ticks counted
        return _busy_seconds() - before


def _row(name: str, values: list[float], base: float) -> str:
    median = statistics.median(values)
    return f"| {name} | {median:.2f} ({min(values):.2f}-{max(values):.2f}) | {median / base:.2f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--launches", type=int, default=3)
    args = parser.parse_args()
    samples: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.rounds):
        for name, code in CASES.items():
            samples[name].append(cpu_seconds(code))
    base = statistics.median(samples[next(iter(CASES))])
    print(f"| case | CPU s, median of {args.rounds} (min-max) | x of its own end |")
    print("| --- | --- | --- |")
    for name, values in samples.items():
        print(_row(name, values, base))
    launches: dict[str, list[float]] = {"2-rank DDP launch, its own end": [], "2-rank DDP launch, quick exit": []}
    for _ in range(args.launches):
        for name, quick in zip(launches, (False, True)):
            launches[name].append(launch_cpu(quick))
    base = statistics.median(launches["2-rank DDP launch, its own end"])
    for name, values in launches.items():
        print(_row(name + f" (machine busy CPU s, median of {args.launches})", values, base))


if __name__ == "__main__":
    main()
