"""Where an export goes: a local directory or any fsspec URL (``s3://``, ``gs://``, ``abfs://``,
``memory://``) whose filesystem package is installed; and its name as printed, without secrets.

Files are written under a hidden name (``.NAME.tmp``: Spark, pyarrow.dataset, Polars and DuckDB's
``*.parquet`` globs all skip it) and moved to their name once whole, so a reader never meets a
half-written file. Credentials come as fsspec finds them (the environment, the filesystem's
own config files); one written into the URL (``s3://KEY:SECRET@bucket``, a ``?sig=`` token) is
passed on but never printed: `public_url`; never part of a path (``file://user:pw@/x`` is
refused, not written to ``./user:pw@/x``).

A file named by ``-o`` (`LocalFile`) is written only as what it is: a regular file (or none)
is replaced atomically; an existing FIFO or character device (``/dev/null``, ``/dev/stdout``)
is opened and written through, never replaced; a symlink is followed to its target, and said;
anything else (a directory, a socket, a path under ``/proc``) is one clear error.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from multirank_logger.errors import ExportFailed

__all__ = ["Destination", "LocalFile", "ends_with_process", "public_url", "url_secrets"]

#: fsspec filesystems that live in this process only: what a command writes there is gone at its exit
_PROCESS_FILESYSTEMS = frozenset({"memory"})


def ends_with_process(url: str) -> bool:
    """Whether `url` names a filesystem that ends with the process (fsspec's ``memory://``)."""
    match = _URL.match(url)
    return match is not None and match.group(1)[:-3].lower() in _PROCESS_FILESYSTEMS


_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)(?:([^/?#]*)@)?([^?#]*)(?:\?([^#]*))?")


def public_url(url: str) -> str:
    """`url` without what may be a secret: the user and password before ``@``, and the query string."""
    match = _URL.match(url)
    if match is None:
        return url  # a path
    return match.group(1) + match.group(3)


def url_secrets(url: str) -> list[str]:
    """What `public_url` leaves out of `url`: its user info (whole, and each part) and its query
    (whole, and each value); longest first, to be blotted out of any text that may quote them."""
    match = _URL.match(url)
    if match is None:
        return []
    found: list[str] = []
    if match.group(2):
        found += [match.group(2), *match.group(2).split(":")]
    if match.group(4):
        found.append(match.group(4))
        found += [pair.partition("=")[2] for pair in match.group(4).split("&")]
    return sorted({text for text in found if text}, key=len, reverse=True)


class Destination:
    """A directory of an export, local or remote, opened through fsspec."""

    def __init__(self, url: str, **storage_options: Any) -> None:
        import fsspec.core

        self.public = public_url(url)
        self._secrets = url_secrets(url)
        try:
            self.fs, self.root = fsspec.core.url_to_fs(url, **storage_options)
        except ImportError as exc:  # s3fs, gcsfs, adlfs: each filesystem's own package ("Install s3fs to access S3")
            raise ExportFailed(self.public, f"its filesystem's package is missing ({self.blotted(exc)})",
                               "Install it (pip install s3fs, gcsfs, adlfs...) or export to a local directory.") from None
        except ValueError as exc:  # a protocol fsspec does not know
            raise ExportFailed(self.public, f"fsspec cannot open it ({self.blotted(exc)})",
                               "Pass a local directory or a URL of a filesystem fsspec knows (s3://, gs://, abfs://).") from None
        except Exception as exc:  # noqa: BLE001 - zip://, ftp://...: each filesystem raises its own classes
            raise ExportFailed(self.public, f"fsspec cannot open it ({self.blotted(exc)})",
                               "Pass a local directory or a writable URL (s3://, gs://, abfs://).") from None
        self.root = self.root.rstrip("/") or "/"
        self.local = "file" in _protocols(self.fs)
        if any(secret in self.root for secret in self._secrets):  # file://user:pw@/x: fsspec makes it a path
            raise ExportFailed(self.public, "its credentials (user:password@) would become part of a file's path",
                               "Leave them out of the URL (file:///path for a local directory); a remote "
                               "filesystem takes them from its own configuration or the environment.")
        if self.local:
            _refuse_local_non_directory(self.public, self.root)

    def blotted(self, exc: BaseException) -> str:
        """An error's text with the URL's secrets blotted out (a driver may quote the URL it was given)."""
        text = f"{type(exc).__name__}: {exc}" if not isinstance(exc, OSError) or not exc.strerror else exc.strerror
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    @contextlib.contextmanager
    def errors_told(self) -> Iterator[None]:
        """The filesystem's errors in the block (a bucket refused, the network, a bad name) as
        `ExportFailed`, their text without the URL's secrets: no traceback quotes them."""
        try:
            yield
        except (ExportFailed, KeyboardInterrupt):
            raise
        except Exception as exc:  # noqa: BLE001 (each filesystem package raises its own classes)
            raise ExportFailed(self.public, self.blotted(exc), "Check the destination and its credentials.") from None

    def path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    def shown(self, *parts: str) -> str:
        """A path under the destination as printed (no secret)."""
        return posixpath.join(self.public.rstrip("/"), *parts)

    @contextlib.contextmanager
    def writing(self, *parts: str) -> Iterator[Any]:
        """A binary file at ``parts`` under the destination, in place once the block ends without
        an error (written under a hidden name until then; removed on an error)."""
        final = self.path(*parts)
        folder, name = posixpath.split(final)
        hidden = posixpath.join(folder, f".{name}.tmp")
        with self.errors_told():
            self.fs.makedirs(folder, exist_ok=True)
            fp = self.fs.open(hidden, "wb")
            try:
                with fp:
                    yield fp
            except BaseException:
                with contextlib.suppress(Exception):
                    self.fs.rm(hidden)
                raise
            self.fs.mv(hidden, final)

    def files(self, *parts: str) -> list[str]:
        """The files directly under ``parts`` (full paths), none when it is missing."""
        folder = self.path(*parts)
        with self.errors_told():
            try:
                return [p for p in self.fs.ls(folder, detail=False) if self.fs.isfile(p)]
            except FileNotFoundError:
                return []

    def folders(self, *parts: str) -> list[str]:
        """The names of the folders directly under ``parts``, none when it is missing."""
        folder = self.path(*parts)
        with self.errors_told():
            try:
                found = self.fs.ls(folder, detail=True)
            except FileNotFoundError:
                return []
        return [posixpath.basename(entry["name"].rstrip("/")) for entry in found if entry["type"] == "directory"]

    def size(self, *parts: str) -> int:
        with self.errors_told():
            return int(self.fs.size(self.path(*parts)))

    def remove(self, paths: list[str]) -> None:
        with self.errors_told():
            for path in paths:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm(path)


def _refuse_local_non_directory(shown: str, root: str) -> None:
    """A local export directory that is something else (a regular file, a FIFO, /dev/null), or under
    one: refused before anything is read or written, as what it is (the filesystem would say only
    "Not a directory", part-way through)."""
    path = Path(root)
    for at in (path, *path.parents):
        try:
            mode = os.stat(at).st_mode  # follows a symlink: its target is what would hold the files
        except (FileNotFoundError, NotADirectoryError):
            continue  # made by the export; or under a file, which a parent says
        except OSError as exc:
            raise ExportFailed(shown, exc.strerror or type(exc).__name__, _PASS_A_DIRECTORY) from None
        if stat.S_ISDIR(mode):
            return
        what = "a regular file" if stat.S_ISREG(mode) else "a FIFO" if stat.S_ISFIFO(mode) else (
            "a character device" if stat.S_ISCHR(mode) else "not a directory")
        where = "it is" if at == path else f"{at} is"
        raise ExportFailed(shown, f"{where} {what}, and this format writes a directory of files", _PASS_A_DIRECTORY)


_PASS_A_DIRECTORY = "Pass a directory's path (made when missing); nothing was written."


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


class LocalFile:
    """One local file an export writes (``export -o PATH``), written only as what it is.

    ``kind``: ``"file"`` (a regular file, or none yet: replaced atomically, its parent made as
    CSVLogger makes its log_dir), or ``"stream"`` (an existing FIFO or character device:
    opened and written through, never replaced). ``note``: what was followed, to be said (a
    symlink and its target), else empty.

    Raises:
        ExportFailed: for a path that cannot hold the file (a directory, a socket, a block
            device, a dangling symlink, a parent that cannot be made).
    """

    def __init__(self, path: str) -> None:
        self.shown = path
        self.note = ""
        try:
            if os.path.islink(path):
                target = os.readlink(path)
                self.note = f"{path} is a symlink to {target}: written there"
            mode = os.stat(path).st_mode  # follows a symlink: the target is what gets written
        except FileNotFoundError:
            if self.note:
                raise ExportFailed(path, f"it is a symlink to {target}, which does not exist",
                                   "Pass the target's path, or remove the symlink.") from None
            mode = None
        except OSError as exc:
            raise ExportFailed(path, exc.strerror or type(exc).__name__, _PASS_A_FILE) from None
        if mode is None or stat.S_ISREG(mode):
            self.kind = "file"
            # a symlink's target is replaced, the link kept: replacing the link would cut it
            self.path = Path(os.path.realpath(path)) if self.note else Path(path)
        elif stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
            self.kind = "stream"
            self.path = Path(path)  # opened by its own name: /dev/stdout is this process's stdout
        elif stat.S_ISDIR(mode):
            raise ExportFailed(path, "it is a directory",
                               "Pass a file's path (e.g. DIR/metrics.csv), or --all-ranks to write one file per rank into it.")
        else:
            raise ExportFailed(path, "it is neither a regular file, a FIFO nor a character device", _PASS_A_FILE)

    def open_stream(self) -> IO[str]:
        """A FIFO or character device opened for text, written through (``newline=""``: the csv
        module writes its own ``\\r\\n``); a FIFO's open waits for its reader, as a shell's ``>`` does."""
        return open(self.path, "w", newline="", encoding="utf-8")  # noqa: PTH123, SIM115 - the caller closes it

    @contextlib.contextmanager
    def errors_told(self) -> Iterator[None]:
        """An OSError in the block (a parent that cannot be made, /proc, a full disk) as one
        `ExportFailed` line, no traceback."""
        try:
            yield
        except OSError as exc:
            raise ExportFailed(self.shown, exc.strerror or type(exc).__name__, _PASS_A_FILE) from None


_PASS_A_FILE = "Pass the path of a regular file in a directory you can write (or -o - for standard output)."
