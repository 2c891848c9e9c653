"""The suite's quick exit (sitecustomize.py here, whose docstring says why): on in every process the
suite launches, off where a test's subject is how a process ends."""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path

#: the folder put first on PYTHONPATH: Python imports its sitecustomize.py at every start
FOLDER = str(Path(__file__).resolve().parent)


def switch_on(environ: MutableMapping[str, str]) -> None:
    """`environ`'s PYTHONPATH with the folder first (once): what the processes started with it get."""
    environ["PYTHONPATH"] = os.pathsep.join([FOLDER, *_other_entries(environ)])


def with_real_teardown(env: MutableMapping[str, str]) -> dict[str, str]:
    """A copy of `env` without the folder: the process ends as a user's does, every garbage
    collection of the interpreter's teardown included."""
    out, entries = dict(env), _other_entries(env)
    if entries:
        out["PYTHONPATH"] = os.pathsep.join(entries)
    else:
        out.pop("PYTHONPATH", None)
    return out


def _other_entries(env: MutableMapping[str, str]) -> list[str]:
    """PYTHONPATH's entries in `env` but the folder."""
    return [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != FOLDER]
