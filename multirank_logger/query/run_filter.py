"""Which runs to list (``runs --name/--status/--since/--until/--param``): SQL conditions over the
``runs`` table alone (its name, status, start and ``hparams`` JSON), never a metric row; and the
chosen hyperparameters as columns (``runs --show-params``).

The rule for ``--param KEY=VALUE`` (the page's filter box follows it too: ui/static/run_filter.js):
KEY is the path of a value in the run's stored hyperparameters, nested keys joined by dots
(``optimizer.lr``; a key holding a dot in quotes: rows/param_path.py); a string matches VALUE as its own
characters, a number matches a VALUE of the same number (``lr=0.0003`` and ``lr=3e-4`` alike),
true, false and null match those words, a list or an object its JSON text.
"""

from __future__ import annotations

import calendar
import datetime
import json
import math
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from multirank_logger.rows.param_path import split_key_value, split_path, split_words
from multirank_logger.rows.schema import runs
from multirank_logger.store.status import FAILED, INCOMPLETE, INTERRUPTED, RUNNING, SUCCESS

__all__ = ["RUN_STATUSES", "RunFilter", "param_text", "parse_param", "parse_shown", "parse_when", "read_hparams"]

#: what ``--since``/``--until`` take (UTC): a day, a minute or a second
WHEN_FORMATS = (("%Y-%m-%d", 86400), ("%Y-%m-%d %H:%M", 60), ("%Y-%m-%dT%H:%M", 60),
                ("%Y-%m-%d %H:%M:%S", 1), ("%Y-%m-%dT%H:%M:%S", 1))
_GLOB = "*?"
#: the statuses a run's row holds (store/status.py)
RUN_STATUSES = (RUNNING, SUCCESS, FAILED, INTERRUPTED, INCOMPLETE)


def parse_when(text: str, *, end: bool = False) -> float:
    """``YYYY-MM-DD[ HH:MM[:SS]]`` (UTC) as Unix seconds: where that day, minute or second starts,
    or with `end` where it ends (``--until 2026-03-05`` keeps the runs started that day).

    Raises:
        ValueError: for any other text.
    """
    for fmt, span in WHEN_FORMATS:
        try:
            moment = datetime.datetime.strptime(text.strip(), fmt)
        except ValueError:
            continue
        return float(calendar.timegm(moment.timetuple()) + (span if end else 0))
    raise ValueError(f"{text!r}: give a date as YYYY-MM-DD, YYYY-MM-DD HH:MM or YYYY-MM-DD HH:MM:SS (UTC)")


def parse_param(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` as (KEY, VALUE), split at the first ``=`` outside a quoted key; KEY a path
    (rows/param_path.py).

    Raises:
        ValueError: without ``=``, with an empty KEY, or a KEY that is no path.
    """
    key, value = split_key_value(text)
    if "=" not in text or not key.strip():
        raise ValueError(f"{text!r}: give KEY=VALUE, e.g. lr=0.001 (optimizer.lr=0.001 for a nested key)")
    keys = split_path(key.strip())  # raises, saying how to write the path
    if any(not k or '"' in k or "\\" in k for k in keys):  # SQLite's JSON paths cannot name them
        raise ValueError(f"{key.strip()!r}: a key that is empty or holds a double quote or a backslash cannot be "
                         "searched; list the runs with --format json and pick them from its hparams")
    return key.strip(), value.strip()


def parse_shown(text: str) -> tuple[str, ...]:
    """``--show-params KEY,KEY`` as its paths, split at the commas outside quotes (``"a,b"`` is
    one key: model/param_path.split_words).

    Raises:
        ValueError: for a KEY that is no path (model/param_path.split_path says how to write it).
    """
    shown = tuple(k.strip() for k in split_words(text, ",") if k.strip())
    for key in shown:
        split_path(key)
    return shown


def _number(text: str) -> float | None:
    """`text` as a finite number, else None (NaN, inf and words compare as text)."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


#: LIKE's escape: not a backslash, which an inlined DuckDB literal doubles (store/backends/duckdb_params.py)
_ESCAPE = "!"


def _spellings(value: str) -> list[str]:
    """`value` as given and, for a list or an object, as JSON spelled with and without spaces (a
    database writes its JSON text one way or the other: PostgreSQL's jsonb ``[1, 2]``, SQLite ``[1,2]``)."""
    try:
        parsed = json.loads(value)
    except ValueError:
        return [value]
    if not isinstance(parsed, list | dict):
        return [value]
    return sorted({value, json.dumps(parsed), json.dumps(parsed, separators=(",", ":"))})


def _like_escaped(text: str) -> str:
    return "".join(_ESCAPE + ch if ch in f"%_{_ESCAPE}" else ch for ch in text)


@dataclass(frozen=True)
class RunFilter:
    """The runs to list: every field left empty keeps every run.

    name: a substring of the run's name (case-insensitive), or a glob with ``*`` and ``?``
        matched against the whole name. statuses: any of these (``success``, ``failed``...).
    since, until: the run started at or after `since`, before `until` (Unix seconds).
    params: (KEY, VALUE) pairs the run's hyperparameters all hold (the module's rule).
    """

    name: str | None = None
    statuses: tuple[str, ...] = ()
    since: float | None = None
    until: float | None = None
    params: tuple[tuple[str, str], ...] = ()

    def conditions(self, backend: Any) -> list[Any]:
        """SQL conditions on the ``runs`` table; `backend` (store/backends) reads the JSON."""
        c = runs.c
        out: list[Any] = []
        if self.name:
            pattern = _like_escaped(self.name.lower())
            if any(ch in self.name for ch in _GLOB):
                pattern = pattern.replace("*", "%").replace("?", "_")
            else:
                pattern = f"%{pattern}%"
            out.append(sa.func.lower(c.name).like(pattern, escape=_ESCAPE))
        if self.statuses:
            out.append(c.status.in_([s.lower() for s in self.statuses]))
        if self.since is not None:
            out.append(c.started_at >= self.since)
        if self.until is not None:
            out.append(c.started_at < self.until)
        for key, value in self.params:
            text, number = backend.json_member(c.hparams, split_path(key))
            wanted = _number(value)
            out.append(text.in_(_spellings(value)) if wanted is None else sa.or_(text == value, number == wanted))
        return out

    def __bool__(self) -> bool:
        return bool(self.name or self.statuses or self.since is not None or self.until is not None or self.params)


def read_hparams(fetch_arrow: Any, run_ids: list[int]) -> dict[int, dict[str, Any]]:
    """Per run of `run_ids`: its stored hyperparameters (``runs.hparams``), {} where none or not JSON."""
    if not run_ids:
        return {}
    found = fetch_arrow(sa.select(runs.c.id, runs.c.hparams).where(runs.c.id.in_(run_ids))).to_pylist()
    out: dict[int, dict[str, Any]] = {}
    for row in found:
        try:
            parsed = json.loads(row["hparams"]) if row["hparams"] else {}
        except ValueError:
            parsed = {}
        out[int(row["id"])] = parsed if isinstance(parsed, dict) else {}
    return out


def param_text(value: Any) -> str:
    """A hyperparameter as ``--show-params`` prints it: a string as it is, anything else as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), allow_nan=True)
