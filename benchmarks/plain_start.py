"""What a plain-API rank spends starting: the imports of a torchrun script, with and without Lightning.

    .venv/bin/python benchmarks/plain_start.py [--rounds 5]

A script of the plain API (``multirank_logger.init``: torchrun, Accelerate, Transformers) imports
torch and the package; `MultiRankLoggerCore` lets it run without Lightning, which every rank of
such a script used to import (the logger's class was Lightning's ``Logger``). Each case is a
fresh interpreter, rounds interleaved (A B C, A B C, ...), and its CPU seconds (user + system,
the interpreter's own: what a rank's start costs its core) are reported as the median of the
rounds, with each case's ratio to torch alone:

- ``torch``: ``import torch, torch.distributed`` (the floor: any distributed script pays it);
- ``plain API``: that, then ``from multirank_logger import init`` and the modules a run sets up
  (the writer's sinks, the channel), as a plain rank's start does;
- ``plain API + Lightning``: that, with ``import lightning.pytorch`` too (what it cost before,
  and what a Lightning user's rank pays anyway).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLAIN = ("import torch, torch.distributed; from multirank_logger import init; "
         "import multirank_logger.write.sinks, multirank_logger.channel.row_channel, multirank_logger.logger.core")
CASES = {
    "torch": "import torch, torch.distributed",
    "plain API": PLAIN,
    "plain API + Lightning": PLAIN + "; import lightning.pytorch",
}


def cpu_seconds(code: str) -> float:
    """CPU seconds (user + system) of a fresh interpreter running `code`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=ROOT)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    samples: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.rounds):
        for name, code in CASES.items():
            samples[name].append(cpu_seconds(code))
    floor = statistics.median(samples["torch"])
    print(f"| case | CPU s, median of {args.rounds} (min-max) | x of torch alone |")
    print("| --- | --- | --- |")
    for name, values in samples.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.2f} ({min(values):.2f}-{max(values):.2f}) | {median / floor:.2f} |")
    print(f"plain API saves {statistics.median(samples['plain API + Lightning']) - statistics.median(samples['plain API']):.2f}"
          " CPU s per rank's start")


if __name__ == "__main__":
    main()
