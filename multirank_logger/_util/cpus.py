"""The CPUs this process may run on."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """The CPUs this process may run on: `os.cpu_count()` (and DuckDB's own default) counts every
    core of the machine, also where the job was given a few of them (a SLURM allocation, taskset,
    a container's cpuset)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # no sched_getaffinity (macOS)
        return os.cpu_count() or 1
