"""The suite's quick exit (tests/helpers/quick_exit): every process the suite launches freezes the
garbage collector at its very end, after its own exit hooks; `with_real_teardown` launches one as
a user's ends."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers import quick_exit

#: a process that says whose sitecustomize it imported, and what its own exit hook sees of the collector
_PROBE = """
import atexit, gc, sys
site = sys.modules.get("sitecustomize")
print(getattr(site, "__file__", None))
atexit.register(lambda: print("frozen at my exit hook:", gc.get_freeze_count()))
gc.collect()
"""


def _probe(env: dict[str, str]) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    return proc.stdout.splitlines()


def test_a_launched_process_freezes_only_after_its_own_exit_hooks() -> None:
    """Under the suite (tests/conftest.py switched it on) a process imports the quick exit's
    sitecustomize, and its own exit hooks still run with nothing frozen."""
    site, hook = _probe(dict(os.environ))
    assert site == os.path.join(quick_exit.FOLDER, "sitecustomize.py")
    assert hook == "frozen at my exit hook: 0"


def test_with_real_teardown_launches_without_it() -> None:
    """Off for the tests about a process's end: the folder leaves PYTHONPATH, the rest stays."""
    env = quick_exit.with_real_teardown({**os.environ, "PYTHONPATH": os.pathsep.join([quick_exit.FOLDER, "/elsewhere"])})
    assert env["PYTHONPATH"] == "/elsewhere"
    site, hook = _probe(env)
    assert site != os.path.join(quick_exit.FOLDER, "sitecustomize.py")
    assert hook == "frozen at my exit hook: 0"
    assert "PYTHONPATH" not in quick_exit.with_real_teardown({"PYTHONPATH": quick_exit.FOLDER})
