"""Imported at the start of every Python process the suite launches (tests/conftest.py puts this
folder first on PYTHONPATH): the process's last exit hook freezes the garbage collector.

Why: an interpreter that imported Lightning spends most of a second of CPU in its own end, the
final garbage collections walking every object of torch's and Lightning's modules, and the suite
starts hundreds of such processes on 2 cores (benchmarks/RESULTS.md, "A launched process's end";
benchmarks/teardown_cost.py). The hook is registered first, so it runs after every other
exit hook (the logger's, Lightning's, logging's): what a process does at its end is unchanged;
only the collections of the interpreter's teardown skip the objects that were alive then (they are
still freed where nothing else holds them). The tests whose subject is that teardown (an abort or
a hang at a process's end: tests/runs/test_exit_paths.py) launch without it
(`tests.helpers.quick_exit.with_real_teardown`).
"""

import atexit
import gc
import importlib.util
import os
import sys

atexit.register(gc.freeze)


def _chain() -> None:
    """Run the sitecustomize this one shadows (one further along sys.path), if any."""
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        path = os.path.join(entry or ".", "sitecustomize.py")
        if os.path.abspath(entry or ".") != here and os.path.isfile(path):
            spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", path)
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


_chain()
