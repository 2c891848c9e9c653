"""Rank 0's run identity in the environment of the children Lightning's launcher starts, and
only there.

With ``strategy="ddp"`` (the Trainer) or ``Fabric.launch()``, Lightning's subprocess launcher
starts ranks 1..N-1 by running the script again with a copy of ``os.environ``, at the start of
``fit`` (``launch``), before any process group is up. A child that reads ``logger.version``
before ``fit`` learns rank 0's run from that copy (channel/identity.py, channel 2). So the
variables go into ``os.environ`` while the launcher starts its children and come out right
after: a logger kept alive and never finalized (a failed test's traceback holds it, a notebook)
leaves no variable in this process, nor in every subprocess it starts later.

The launcher has no hook for this: its ``_call_children_scripts`` (unchanged from Lightning
2.2 to 2.6) is wrapped, in each Lightning package imported (``lightning``, and the standalone
``pytorch_lightning`` and ``lightning_fabric`` once the user's code has imported them).
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable
from typing import Any

from multirank_logger.channel.identity import children_environment

__all__ = ["hook_launchers"]

#: the packages whose subprocess launcher starts children, each with its launcher's module
_LAUNCHERS = {
    package: f"{package}.strategies.launchers.subprocess_script"
    for package in ("lightning.pytorch", "lightning.fabric", "pytorch_lightning", "lightning_fabric")
}
_METHOD = "_call_children_scripts"
_hooked: set[str] = set()


def hook_launchers() -> bool:
    """Wrap the subprocess launcher of every Lightning package imported (cheap, idempotent).

    Returns:
        False when a launcher has no `_METHOD` (a Lightning this was not written for): the
        caller then leaves the variable in ``os.environ`` until its run ends, the one way left
        to reach that launcher's children.
    """
    hooked_all = True
    for package, module in _LAUNCHERS.items():
        if package in _hooked or package not in sys.modules:
            continue
        launcher = getattr(importlib.import_module(module), "_SubprocessScriptLauncher", None)
        original = getattr(launcher, _METHOD, None)
        if original is None:
            hooked_all = False
            continue
        if not getattr(original, "_multirank_hooked", False):
            setattr(launcher, _METHOD, _with_children_environment(original))
        _hooked.add(package)
    return hooked_all


def _with_children_environment(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def call_children_scripts(self: Any, *args: Any, **kwargs: Any) -> Any:
        with children_environment():
            return original(self, *args, **kwargs)

    call_children_scripts._multirank_hooked = True  # type: ignore[attr-defined]
    return call_children_scripts
