"""The files under ``save_dir`` (metrics.csv, hparams.yaml), local or remote, as CSVLogger's.

CSVLogger writes its files through fsspec (Lightning's `get_filesystem`: `filesystem` here), so ``save_dir`` may be
``s3://...``, ``gs://...`` or ``memory://...``. Ours go the same way. The store does not:
SQLite and DuckDB need a local file (their locking and their writes are a file system's), so
a store on a remote filesystem is refused with a message that says what to pass instead.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsspec.core import url_to_fs
from fsspec.registry import known_implementations
from fsspec.utils import get_protocol

from multirank_logger.errors import DirNotWritable, RemoteStore
from multirank_logger.store.backends import names_a_store

if TYPE_CHECKING:
    from multirank_logger.query.reader import StoreReader

__all__ = ["DEFAULT_DB_NAME", "SaveDir", "check_dir_writable", "check_store_is_local", "filesystem", "is_remote"]

#: the store's file inside save_dir when no db is given (SQLite: see the README's "Which store")
DEFAULT_DB_NAME = "runs.sqlite"
_LOCAL = ("file", "local")


def is_remote(path: str | os.PathLike[str]) -> bool:
    """True for a URL of a remote filesystem fsspec knows (``s3://``, ``memory://``...)."""
    protocol = get_protocol(os.fspath(path))
    return protocol not in _LOCAL and protocol in known_implementations


def check_store_is_local(db: str | None, save_dir: str | os.PathLike[str] | None = None) -> str:
    """`db` (or, with `db` None, `save_dir`, which will hold the default store), refused when remote.

    Raises:
        RemoteStore: for a path on a remote filesystem.
    """
    if db is None:
        assert save_dir is not None
        save_dir = os.fspath(save_dir)
        if is_remote(save_dir):
            raise RemoteStore(os.path.join(save_dir, DEFAULT_DB_NAME), get_protocol(save_dir), save_dir)
        if names_a_store(save_dir) and not os.path.isdir(save_dir):
            # db was the first parameter before CSVLogger's order was taken: say so, rather
            # than make a directory named like the store
            raise TypeError(
                f"save_dir={save_dir!r} names a store, not a directory: db is a keyword now, as in "
                f"MultiRankLogger(db={save_dir!r}) (save_dir is then its directory) or "
                f"MultiRankLogger('logs', db={save_dir!r})."
            )
        return save_dir
    if is_remote(db):
        raise RemoteStore(db, get_protocol(db))
    return db


def check_dir_writable(path: str, argument: str, use: str) -> None:
    """Fail at construction, not at the first file an hour in, when `path` cannot be written.

    Creates nothing that stays: the directory may not exist yet (it is made when first
    needed), so the probe is a temporary file in its nearest existing ancestor. A real file,
    not ``os.access``, which says yes to root on a read-only mount.

    Raises:
        DirNotWritable: naming the argument, what goes there and why it cannot.
    """
    ancestor = Path(os.path.abspath(path))
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise DirNotWritable(argument, path, use, f"{ancestor} is not a directory")
    try:
        with tempfile.NamedTemporaryFile(dir=ancestor, prefix=".multirank-probe-"):
            pass
    except OSError as exc:
        raise DirNotWritable(argument, path, use, f"{ancestor}: {exc.strerror or exc}") from exc


def filesystem(path: str) -> Any:
    """The fsspec filesystem of `path` (a local path or a URL), as Lightning's ``get_filesystem``
    gives CSVLogger's: the same call, without importing Lightning (the plain API never does)."""
    return url_to_fs(str(path))[0]


class SaveDir:
    """Writes under one ``save_dir`` through its fsspec filesystem.

    Args:
        save_dir: a local path or a fsspec URL.
    """

    def __init__(self, save_dir: str) -> None:
        self.remote = is_remote(save_dir)
        self.fs: Any = filesystem(save_dir)

    def makedirs(self, path: str) -> None:
        self.fs.makedirs(path, exist_ok=True)

    def export_csv(self, reader: StoreReader, path: str, *, run: int, rank: int) -> int:
        """`StoreReader.export_csv` to `path`, also on a remote filesystem (written locally, then
        uploaded whole: the store's rows stream into a local file, which a remote one is not)."""
        if not self.remote:
            return reader.export_csv(path, run=run, rank=rank)
        with tempfile.TemporaryDirectory(prefix="multirank-export-") as tmp:
            local = os.path.join(tmp, os.path.basename(path))
            written = reader.export_csv(local, run=run, rank=rank)
            if os.path.exists(local):
                self.fs.put_file(local, path)
            return written
