"""Replace a file atomically, with the permissions the user's umask gives a new file.

``tempfile.mkstemp`` creates its file 0600 whatever the umask (it is meant for secrets), and
``os.replace`` keeps that mode: a ``metrics.csv`` written that way is unreadable to the
teammates who can read CSVLogger's (0644 under the usual umask 022). Creating the temporary
file with ``os.open(..., 0o666)`` lets the kernel apply the umask, as ``open(path, "w")`` does,
without reading the umask (``os.umask`` sets it too, racing other threads).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import IO

__all__ = ["replace_atomically"]

_ATTEMPTS = 100


@contextlib.contextmanager
def replace_atomically(path: str | os.PathLike[str], *, newline: str | None = None) -> Iterator[IO[str]]:
    """Yield a text file beside ``path``; on a clean exit it replaces ``path``, else it is removed.

    Args:
        path: the file to (re)write; its directory must exist.
        newline: as for ``open`` (``""`` for the csv module).
    """
    path = Path(path)
    fd, tmp = _create_beside(path)
    try:
        with os.fdopen(fd, "w", newline=newline, encoding="utf-8") as fp:
            yield fp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _create_beside(path: Path) -> tuple[int, str]:
    for _ in range(_ATTEMPTS):
        tmp = str(path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp"))
        try:
            # O_EXCL: never another process's file; 0o666 & ~umask: the mode open(path, "w") gives
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a temporary file beside {path}")
