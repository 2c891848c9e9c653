"""RunSettings: what the logger was built with that its run needs, checked by the logger.

The logger (multi_rank_logger.py) checks its arguments and builds one; the run (rank_run.py)
and rank 0's CSVLogger files (csv_logger_files.py) read it. Frozen: it is pickled with the
run into ddp_spawn's workers and never changes.
"""

from __future__ import annotations

import dataclasses
import math
import os
from argparse import Namespace
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import URL

from multirank_logger.store.backends import public_name

__all__ = ["ALERT_URL_ENV", "DB_ENV", "RunSettings", "from_environment", "jsonable"]

#: where `db` comes from when the logger is given none: a URL with a password stays out of the
#: logger's arguments, so out of what LightningCLI saves (config.yaml) and of every log line
DB_ENV = "MULTIRANK_LOGGER_DB"
#: where `alert_url` comes from when the logger is given none (a webhook's path is a token)
ALERT_URL_ENV = "MULTIRANK_LOGGER_ALERT_URL"


def from_environment(given: Any, variable: str) -> Any:
    """`given`, or when it is None the environment's `variable` (None when unset or empty)."""
    return given if given is not None else (os.environ.get(variable) or None)


@dataclass(frozen=True)
class RunSettings:
    """What the logger was built with that the run needs (checked by the logger)."""

    #: the store's path or URL as the user gave it, less its password (shown in messages and
    #: import commands, and what ranks agree on: `store_identity`)
    db: str
    #: the URL this process connects with, password included: never shown, never sent to another rank
    url: URL
    name: str
    #: the version asked for: an int, a str for a named version, None for the next free one
    version: int | str | None
    resume: str
    run_key: str | None
    save_dir: str
    spill_dir: str
    #: the transport asked for: "direct", "gather", "node" or "auto"
    transport: str
    export_csv: bool
    timeout: float
    flush_interval: float
    flush_every: int
    #: the level of `logging` records kept in the logs table (None: none)
    capture_level: int | None
    #: the logger's repr, for the messages that name it
    owner: str
    #: what a rank > 0 that cannot learn the run's version yet should do (the front-end's words)
    version_advice: str
    #: the most processes that write a server store at once (None: its free connections say)
    max_writers: int | None = None
    #: the longest `finalize` may last (None: `finalize_bound`'s default)
    finalize_timeout: float | None = None
    #: the longest a rank > 0 waits for rank 0's run identity (None: `identity_wait`'s default)
    start_timeout: float | None = None
    #: rank 0 judges the steps as they arrive and raises alerts (watch/watch.py)
    watch: bool = True
    #: called with each alert on rank 0's watch thread
    on_alert: Any = None
    #: the alert webhook: its path is a token, never shown (alerts.redact_url), never sent to another rank
    alert_url: str | None = field(default=None, repr=False)

    def finalize_bound(self, timeout: float) -> float:
        """The longest `finalize` lasts, its end's own waits sharing `timeout` (the flush, the other
        ranks' last rows, the run's row): past it, what is unwritten goes to the spill file."""
        return self.finalize_timeout if self.finalize_timeout is not None else 2 * timeout + 30.0

    @property
    def identity_wait(self) -> float:
        """How long a rank > 0 waits for rank 0 to open the run. Rank 0's own open may wait
        `timeout` on a busy store, after its start-up (imports, CUDA, a slow filesystem): a peer
        that waited only `timeout` gave up on a rank 0 still inside its own bound (16 ranks and a
        server on 2 cores missed 5 s), so the default is `finalize_bound`'s ``2 * timeout + 30``."""
        return self.start_timeout if self.start_timeout is not None else 2 * self.timeout + 30.0

    @property
    def store_identity(self) -> str:
        """The store as ranks name it to each other: its resolved URL without the password (each
        rank brings its own credentials), so a stale identity for another store is never adopted."""
        return public_name(self.url)

    @property
    def root_dir(self) -> str:
        return os.path.join(self.save_dir, self.name)


#: a float JSON has no literal for, stored as a string of JavaScript's name for it (docs/schema.md)
_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def jsonable(value: Any) -> Any:
    """Nested Namespaces, dataclasses and mappings as dicts, so the stored JSON keeps their structure; NaN and
    infinities as the strings "NaN", "Infinity", "-Infinity" (Python's json writes bare ``NaN``,
    which is not JSON: other readers, DuckDB's and PostgreSQL's among them, refuse it)."""
    if isinstance(value, Namespace):
        value = vars(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # save_hyperparameters of a dataclass
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return _NON_FINITE[repr(float(value))]
    return value
