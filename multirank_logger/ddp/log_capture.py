"""Every rank's `logging` records and `warnings` during a run, kept for the store's ``logs`` table.

`MultiRankLogger(capture_logs=...)` installs one `LogCapture` per process from construction
to `finalize`. It changes nothing the console shows and never touches the metrics hot path:

- a `logging.Handler` on the root logger, and on each logger that does not propagate to the
  root (Lightning's ``lightning.pytorch`` and ``lightning.fabric`` when the root had no
  handler at import): a record stops at the first of these, so it is kept once;
- Python's "last resort" (a WARNING with no handler anywhere is printed to stderr) is kept:
  adding a handler would otherwise silence it;
- ``warnings.showwarning`` wrapped: each warning shown (after the warning filters) is kept,
  then shown as before.

Capturing appends a row in memory (`SideRecords.add`); the logger's background writer
stores it with the metrics. A logger's own level still decides which records exist: the
capture never lowers a level, so it keeps what the program's logging emits at or above
the capture level, no more.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["LogCapture", "capture_level", "level_number"]

#: `capture_logs=True` means this level
DEFAULT_LEVEL = logging.INFO
#: a record's attribute saying its text was printed on the console already (watch/alerts.py's `say`)
SHOWN = "multirank_logger_shown"
_WARNINGS_LOGGER = "py.warnings"  # the name `logging.captureWarnings` gives warnings, reused here


def capture_level(capture_logs: bool | int | str | None) -> int | None:
    """The level `capture_logs` asks for, or None for no capture.

    Raises:
        ValueError: for a level name logging does not know.
    """
    if capture_logs is None or capture_logs is False:
        return None
    if capture_logs is True:
        return DEFAULT_LEVEL
    try:
        return level_number(capture_logs)
    except ValueError:
        raise ValueError(
            f"capture_logs={capture_logs!r}; expected a logging level (DEBUG, INFO, WARNING, ERROR, CRITICAL "
            "or a number), True for INFO, or False/None for no capture"
        ) from None


def level_number(level: int | str) -> int:
    """A logging level given by name (any case) or number, as its number.

    Raises:
        ValueError: for a name logging does not know.
    """
    if isinstance(level, int):
        return level
    found = logging.getLevelName(str(level).upper())
    if not isinstance(found, int):
        raise ValueError(f"unknown logging level {level!r}; expected DEBUG, INFO, WARNING, ERROR, CRITICAL or a number")
    return found


class LogCapture(logging.Handler):
    """Keeps this process's log records (at or above `level`) and shown warnings as ``logs`` rows.

    Args:
        add: where a row goes: ``add("logs", values)`` (the logger's `SideRecords.add`).
        level: the lowest level kept.
    """

    def __init__(self, add: Callable[[str, dict[str, Any]], None], level: int = DEFAULT_LEVEL) -> None:
        # the handler itself takes every record: a record below `level` must still reach
        # `emit`, which hands it to the last resort where we are its only handler
        super().__init__(logging.NOTSET)
        self.keep_level = level
        self._add = add
        self._loggers: list[logging.Logger] = []
        self._previous_showwarning: Any = None
        self._in_showwarning = threading.local()

    def install(self) -> None:
        """Start capturing (idempotent)."""
        if self._loggers:
            return
        self._loggers = [logging.getLogger(), *_non_propagating_loggers()]
        for target in self._loggers:
            target.addHandler(self)
        self._previous_showwarning = warnings.showwarning
        warnings.showwarning = self._showwarning  # type: ignore[assignment]  # same call, its tail as *rest

    def remove(self) -> None:
        """Stop capturing: the handler leaves every logger, warnings are shown as before."""
        for target in self._loggers:
            target.removeHandler(self)
        self._loggers = []
        if warnings.showwarning == self._showwarning:  # bound methods compare equal, never identical
            warnings.showwarning = self._previous_showwarning
        self._previous_showwarning = None

    # -- logging -------------------------------------------------------------------------

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if record.levelno >= self.keep_level and not (
                record.name == _WARNINGS_LOGGER and getattr(self._in_showwarning, "active", False)
            ):  # a warning that logging.captureWarnings turned into a record: our hook keeps it already
                message = record.getMessage()
                if record.exc_info:
                    message = f"{message}\n{logging.Formatter().formatException(record.exc_info)}"
                self._keep(record.created, record.levelname, record.levelno, record.name, message)
            if not self._others_in_chain(record) and not getattr(record, SHOWN, False):
                _last_resort(record)
        except Exception:  # noqa: BLE001 - logging's own policy for a failing handler
            self.handleError(record)

    def _others_in_chain(self, record: logging.LogRecord) -> bool:
        """Whether a handler besides this one sees `record` (as `Logger.callHandlers` counts them)."""
        logger: logging.Logger | None = logging.getLogger(record.name)
        while logger is not None:
            if any(h is not self for h in logger.handlers):
                return True
            logger = logger.parent if logger.propagate else None
        return False

    # -- warnings ------------------------------------------------------------------------

    def _showwarning(self, message: Any, category: type[Warning], filename: str, lineno: int, *rest: Any) -> None:
        self._in_showwarning.active = True
        try:
            text = f"{filename}:{lineno}: {category.__name__}: {message}"
            self._keep(time.time(), "WARNING", logging.WARNING, _WARNINGS_LOGGER, text)
            if self._previous_showwarning is not None:
                self._previous_showwarning(message, category, filename, lineno, *rest)
        finally:
            self._in_showwarning.active = False

    def _keep(self, when: float, level: str, levelno: int, name: str, message: str) -> None:
        self._add("logs", {"time": when, "level": level, "levelno": levelno, "logger": name, "message": message})


def _non_propagating_loggers() -> list[logging.Logger]:
    """Loggers whose records stop before the root (with or without handlers of their own)."""
    loggers = list(logging.Logger.manager.loggerDict.values())
    return [obj for obj in loggers if isinstance(obj, logging.Logger) and not obj.propagate]


def _last_resort(record: logging.LogRecord) -> None:
    """What logging does for a record no handler sees: print it (WARNING and up) to stderr."""
    resort = logging.lastResort
    if resort is not None and record.levelno >= resort.level:
        resort.handle(record)
