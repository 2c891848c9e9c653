"""Lightning under both of its package names: ``lightning`` (``lightning.pytorch``) and the
standalone ``pytorch_lightning``, published from the same source with classes of their own.

A user's Trainer, callbacks and type checks come from one of them (often ``pytorch_lightning``),
and an ``isinstance`` against one package's class is False for the other's object. So wherever
this package asks what a Lightning object is, it asks against the classes of every package
imported, and the logger says it is each one's ``Logger`` (and ``CSVLogger``: Trainer.log_dir).

``lightning`` is a dependency (always imported). ``pytorch_lightning`` is never imported here
(it adds ~2.4 s to every rank's start): its classes are taken once the user's code has imported
it, which it has before any of its Trainers or callbacks exist.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

__all__ = ["PACKAGES", "adopt", "classes"]

#: the package names Lightning is published under, in the order their classes are listed
PACKAGES = ("lightning.pytorch", "pytorch_lightning")

#: (class, package) pairs already registered by `adopt`
_adopted: set[tuple[type, str]] = set()


def _imported() -> list[str]:
    """The packages imported in this process (``lightning.pytorch`` always: we depend on it)."""
    return [PACKAGES[0], *(name for name in PACKAGES[1:] if name in sys.modules)]


def classes(module: str, name: str) -> tuple[type[Any], ...]:
    """The class `name` of `module` (under the package, e.g. ``"callbacks"``) in every imported
    package: the tuple to pass to ``isinstance``."""
    return tuple(getattr(importlib.import_module(f"{package}.{module}"), name) for package in _imported())


def adopt(cls: type, *bases: tuple[str, str]) -> None:
    """Make `cls` a virtual subclass of each ``(module, name)`` of `bases` (ABCs) in every
    imported package; cheap and idempotent, so called wherever a check may come next."""
    for package in _imported():
        if (cls, package) in _adopted:
            continue
        for module, name in bases:
            base = getattr(importlib.import_module(f"{package}.{module}"), name)
            if not issubclass(cls, base):
                base.register(cls)
        _adopted.add((cls, package))
