"""Rows for the side tables (decisions, logs, step_timing): kept in memory until the writer drains them.

The callbacks and the log capture call `MultiRankLogger.record(table, **values)`; that only
appends here (no I/O, no lock that I/O holds), and the logger's background writer hands
the drained rows to its sink with the metrics: straight into the store where this rank
writes it, or to rank 0 over the run's channel (gather). `run_id`, `rank` and `seq` are
filled in at drain time, when the run is known.
"""

from __future__ import annotations

import json
import numbers
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from multirank_logger.rows.schema import BIGINT_MAX, SIDE_TABLES

__all__ = ["SideRecords", "decode_side", "encode_side"]

#: rows kept at most per process while the run is not known yet or the store is unreachable;
#: past that the oldest are dropped (and counted: `take_dropped`): these tables are diagnostics,
#: never worth the training's memory
MAX_PENDING = 200_000
# each table's column names, once: SQLAlchemy's ColumnCollection.keys() costs more than the
# rest of add() (StepTimer records a row every step; see benchmarks/RESULTS.md's cited figures)
_COLUMNS = {name: frozenset(table.columns.keys()) for name, table in SIDE_TABLES.items()}
#: each table's NOT NULL columns a caller gives (run_id, rank and seq are filled at drain; a
#: missing ``time`` is the time of the call): a row without one would be refused by the store at
#: the writer's insert, long after the call returned, and its batch spilled
_REQUIRED = {name: tuple(c.name for c in table.columns if not c.nullable and c.name not in ("run_id", "rank", "seq", "time"))
             for name, table in SIDE_TABLES.items()}
_TIMED = frozenset(name for name, table in SIDE_TABLES.items() if "time" in table.columns)


def _python_kind(column: sa.Column[Any]) -> type:
    """The Python type a column's value is stored from (every side column is one of these four)."""
    for sql_type, kind in ((sa.Boolean, bool), (sa.Integer, int), (sa.Float, float), (sa.String, str)):
        if isinstance(column.type, sql_type):  # BigInteger is an Integer, Text a String
            return kind
    raise TypeError(f"{column}: no Python type for {column.type}")


#: each column's Python type: a value of another is refused at the call (the store would refuse
#: it at the writer's insert, with its batch, long after the call returned)
_KINDS = {name: {c.name: _python_kind(c) for c in table.columns} for name, table in SIDE_TABLES.items()}
#: the types taken as they are, per kind (the common case: one dict lookup and a set test)
_AS_IS: dict[type, frozenset[type]] = {bool: frozenset({bool}), int: frozenset({int}), float: frozenset({float, int}),
                                       str: frozenset({str})}
_WORDS = {bool: "True or False", int: "a whole number", float: "a number", str: "a str"}
#: the largest magnitude each whole-number column holds: 64 bits for BIGINT, 32 for INTEGER
#: (DuckDB's and PostgreSQL's INTEGER; a wider value fails the insert there, and its batch with it)
_INT_MAX = {name: {c.name: BIGINT_MAX if isinstance(c.type, sa.BigInteger) else 2**31 - 1
                   for c in table.columns if _KINDS[name][c.name] is int} for name, table in SIDE_TABLES.items()}
#: the NOT NULL number columns (``time``): SQLite stores a NaN as NULL, which such a column refuses
_NOT_NAN = {(name, c.name) for name, table in SIDE_TABLES.items() for c in table.columns
            if _KINDS[name][c.name] is float and not c.nullable}


def _checked(table: str, name: str, value: Any) -> Any:
    """`value` as column `name` of `table` stores it (`_converted`), within what the column holds:
    a whole number within its 32 or 64 bits, no NaN where NULL is refused. Else a ValueError."""
    if value is None:
        return None
    kind = _KINDS[table][name]
    stored = value if type(value) in _AS_IS[kind] else _converted(table, name, kind, value)
    if kind is int and not -_INT_MAX[table][name] - 1 <= stored <= _INT_MAX[table][name]:
        raise ValueError(f"{table}.{name}={stored} is past what the column holds "
                         f"(+-2**{_INT_MAX[table][name].bit_length()}): nothing of this row was kept")
    if kind is float and stored != stored and (table, name) in _NOT_NAN:
        raise ValueError(f"{table}.{name} cannot be NaN: nothing of this row was kept")
    return stored


def _converted(table: str, name: str, kind: type, value: Any) -> Any:
    """A value not of `kind` itself: a NumPy scalar or another number as the Python number; 0 or 1
    for a boolean column. Else a TypeError that names the column. (A tensor is refused: its
    ``.item()`` waits for its device, not something to do behind a call.)"""
    if type(value).__module__ == "numpy" and hasattr(value, "item") and type(value.item()) in _AS_IS[kind]:
        return value.item()
    if kind is bool and type(value) is int and value in (0, 1):
        return bool(value)
    if kind is int and isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if kind is float and isinstance(value, numbers.Real):
        return float(value)
    hint = "; a tensor: pass tensor.item()" if hasattr(value, "item") else ""
    raise TypeError(f"{table}.{name} takes {_WORDS[kind]} (or None), not {value!r} ({type(value).__name__}){hint} "
                    "(nothing of this row was kept)")


class SideRecords:
    """This rank's side-table rows, in the order they were recorded."""

    def __init__(self) -> None:
        self._rows: deque[tuple[str, dict[str, Any]]] = deque()
        self._next_seq: dict[str, int] = {}
        self._lock = threading.Lock()  # several threads record (logging from any thread)
        #: added to the seq of every row `drain` returns: this launch's attempt in the high bits
        self.seq_base = 0
        self._dropped = 0  # rows dropped past MAX_PENDING, not yet taken by `take_dropped`

    def add(self, table: str, values: Mapping[str, Any]) -> None:
        """Keep one row of `table` (a name in `rows.schema.SIDE_TABLES`).

        Raises:
            KeyError: for a table or a column the schema does not have.
            ValueError: for a row without a value the table needs (``time`` is the call's when not given).
            TypeError: for a value the column cannot store (a str for a boolean, a tensor).
            ValueError: for a number past what its column holds (2**63 for a BIGINT, 2**31 for an
                INTEGER), or a NaN where the column refuses NULL (``time``).
        """
        unknown = values.keys() - _COLUMNS[table]
        if unknown:
            columns = list(SIDE_TABLES[table].columns.keys())
            raise KeyError(f"{table} has no column(s) {sorted(unknown)}; its columns are {columns}")
        if missing := [name for name in _REQUIRED[table] if values.get(name) is None]:
            raise ValueError(f"a {table} row needs {', '.join(missing)}: pass {', '.join(f'{m}=...' for m in missing)} "
                             f"(nothing of this row was kept)")
        row = {name: _checked(table, name, value) for name, value in values.items()}
        row["seq"] = 0
        if table in _TIMED and row.get("time") is None:
            row["time"] = time.time()
        with self._lock:
            seq = self._next_seq.get(table, 0)
            self._next_seq[table] = seq + 1
            row["seq"] = seq
            self._rows.append((table, row))
            if len(self._rows) > MAX_PENDING:
                self._rows.popleft()
                self._dropped += 1

    def __len__(self) -> int:
        return len(self._rows)

    def take_dropped(self) -> int:
        """Rows dropped (oldest first, past `MAX_PENDING`) since the last call."""
        with self._lock:
            dropped, self._dropped = self._dropped, 0
        return dropped

    def drain(self, run_id: int, rank: int) -> dict[str, list[dict[str, Any]]]:
        """Every row kept so far, by table, with its run, rank and seq (offset by `seq_base`)."""
        seq_base = self.seq_base
        with self._lock:
            rows, self._rows = self._rows, deque()
        out: dict[str, list[dict[str, Any]]] = {}
        for table, values in rows:
            # a row may name its rank (an alert names the rank it is about): else this rank's
            out.setdefault(table, []).append({"rank": rank, **values, "run_id": run_id, "seq": seq_base + values["seq"]})
        return out


def encode_side(tables: Mapping[str, list[dict[str, Any]]]) -> bytes:
    """The wire form of drained side rows (JSON: they are few, and text anyway)."""
    return json.dumps(tables, separators=(",", ":")).encode()


def decode_side(data: bytes) -> dict[str, list[dict[str, Any]]]:
    tables = json.loads(data)
    if not isinstance(tables, dict) or not set(tables) <= set(SIDE_TABLES):
        raise ValueError("not a side-record payload")
    return tables
