"""A rank-aware console: what every rank prints shown once, a rank's own warnings and errors with its rank.

In a DDP job every rank prints the same banners (versions, paths, configuration), so the
console holds each N times, and a warning from one rank looks like everyone's. After
`rank_aware_console()`, on the console handlers that exist at that moment:

- INFO and below print on rank 0 only: a message every rank logs shows once;
- WARNING and above print on every rank, prefixed ``[rank K]`` (when there are several
  ranks): a rank's own warning says whose it is, and an error from any rank always shows;
- `warnings` get the same prefix.

Only what the console shows changes. Files and other handlers, and the store's ``logs``
table (`MultiRankLogger(capture_logs=...)`), keep every rank's records, INFO included: what
rank 3 logged is ``multirank-logger logs DB --rank 3``. Nothing is exchanged between ranks
(no collective, no message): a WARNING that every rank emits shows once per rank, tagged.

Example::

    import logging
    from multirank_logger import rank_aware_console

    logging.basicConfig(level=logging.INFO)
    rank_aware_console()          # after the logging set-up: it adapts the handlers there are
"""

from __future__ import annotations

import logging
import sys
import warnings
from typing import Any, TextIO

from multirank_logger._util.dist_env import current_rank, current_world_size

__all__ = ["RankAwareConsole", "rank_aware_console"]

_CONSOLE_STREAMS = ("stdout", "stderr")


def rank_aware_console(everywhere_from: int = logging.WARNING) -> RankAwareConsole:
    """Make the console rank-aware (see the module's docstring); undo with ``.remove()``.

    Args:
        everywhere_from: the lowest level printed by every rank (with its rank); below it,
            rank 0 alone prints.

    Returns:
        The installed `RankAwareConsole` (also a context manager that removes itself).
    """
    console = RankAwareConsole(everywhere_from)
    console.install()
    return console


class RankAwareConsole(logging.Filter):
    """Filter and prefix for the console's logging handlers, and the same for `warnings`.

    The rank is read when a record is printed (a launcher sets it after the script starts).
    """

    def __init__(self, everywhere_from: int = logging.WARNING) -> None:
        super().__init__()
        self.everywhere_from = everywhere_from
        self._handlers: list[tuple[logging.Handler, logging.Formatter | None]] = []
        self._previous_showwarning: Any = None

    def install(self) -> None:
        if self._handlers:
            return
        for handler in _console_handlers():
            self._handlers.append((handler, handler.formatter))
            handler.addFilter(self)
            handler.setFormatter(_RankPrefix(self, handler.formatter))
        self._previous_showwarning = warnings.showwarning
        warnings.showwarning = self._showwarning

    def remove(self) -> None:
        for handler, formatter in self._handlers:
            handler.removeFilter(self)
            handler.setFormatter(formatter)
        self._handlers = []
        if warnings.showwarning == self._showwarning:
            warnings.showwarning = self._previous_showwarning

    def __enter__(self) -> RankAwareConsole:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def filter(self, record: logging.LogRecord) -> bool:
        # rank -1: "not rank 0, not known yet" (dist_env.current_rank), a rank like any other but 0
        return record.levelno >= self.everywhere_from or current_rank() == 0

    def prefix(self, levelno: int) -> str:
        if levelno < self.everywhere_from or current_world_size() <= 1:
            return ""
        rank = current_rank()
        return f"[rank {rank if rank >= 0 else '?'}] "

    def _showwarning(self, message: Any, category: type[Warning], filename: str, lineno: int,
                     file: TextIO | None = None, line: str | None = None) -> None:
        prefix = self.prefix(logging.WARNING)
        target = file if file is not None else sys.stderr
        out = _PrefixedStream(target, prefix) if prefix and target is not None else file
        self._previous_showwarning(message, category, filename, lineno, out, line)


class _RankPrefix(logging.Formatter):
    """A handler's own formatter, with the rank put in front of what it prints."""

    def __init__(self, console: RankAwareConsole, inner: logging.Formatter | None) -> None:
        super().__init__()
        self._console = console
        self._inner = inner or logging.Formatter()  # what Handler.format uses when it has none

    def format(self, record: logging.LogRecord) -> str:
        return self._console.prefix(record.levelno) + self._inner.format(record)


class _PrefixedStream:
    """A stream that puts `prefix` before each write (warnings are written in one call)."""

    def __init__(self, stream: TextIO, prefix: str) -> None:
        self._stream, self._prefix = stream, prefix

    def write(self, text: str) -> int:
        return self._stream.write(self._prefix + text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _console_handlers() -> list[logging.Handler]:
    """Handlers that print to the process's stdout or stderr, on every logger, and the last resort."""
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    found: list[logging.Handler] = []
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):  # loggerDict also holds PlaceHolders
            if _prints_to_console(handler) and handler not in found:
                found.append(handler)
    if logging.lastResort is not None and logging.lastResort not in found:
        found.append(logging.lastResort)  # prints WARNING+ that no handler took, to stderr
    return found


def _prints_to_console(handler: logging.Handler) -> bool:
    if not isinstance(handler, logging.StreamHandler) or isinstance(handler, logging.FileHandler):
        return False
    stream = handler.stream
    return any(stream is getattr(sys, name) or stream is getattr(sys, f"__{name}__") for name in _CONSOLE_STREAMS)
