"""Rebuild CSVLogger's ``metrics.csv`` layout from one rank's long rows. Pure: no SQL here.

The layout is the one Lightning's ``_ExperimentWriter`` (``fabric/loggers/csv_logs.py``)
leaves on disk at the end of a run: one row per ``log_metrics`` call in call order,
columns the sorted union of every key seen plus ``step``, a missing value an empty
field, values written by ``csv.DictWriter`` (``str()`` of the Python scalar), lines
ended by ``\\r\\n``. The header goes through the same ``csv`` writer (a key may hold a
comma or a quote). Data rows are joined by hand from the same Python scalars: every field
is an int, a float, a bool or empty, which that writer writes as its ``str()`` and never
quotes, so the bytes are the same; tests/logger/test_dropin.py and tests/query/test_query.py compare
whole files with CSVLogger's.

Speed: the rows are placed into a 2-D object grid with one NumPy fancy assignment
per chunk, instead of building a dict per log call as CSVLogger does.

Memory: a rank's rows come as a stream of pieces, each holding whole calls, so a long
run's export holds a few fetches at once, not every row the rank logged.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import IO, Any

import numpy as np

from multirank_logger.rows.schema import DTYPE_BOOL, DTYPE_INT, DTYPE_NEG_ZERO

__all__ = [
    "STEP_COLUMN", "LongRows", "csv_columns", "format_calls", "in_call_order", "to_frame", "whole_calls", "write_csv",
    "write_header", "write_rows",
]

STEP_COLUMN = "step"
# |int| from which NumPy's int64 overflows: such an int goes through a Python int
_INT64_BOUND = 2.0**63
# CSV rows per grid: each is a Python list while the chunk is written, so this bounds the
# lists alive at once. 64k of them kept the cyclic collector running full passes (over
# torch's heap too) through the export (benchmarks/RESULTS.md, query: export_csv).
_CHUNK_ROWS = 2_048
# how csv.writer's excel dialect separates fields and ends lines, as in CSVLogger's file
_FIELD_SEPARATOR, _LINE_END = ",", "\r\n"
# the columns of a driver row (seq, step, key, value, dtype), for LongRows.from_rows
_SEQ, _STEP, _KEY, _VALUE, _DTYPE = (itemgetter(i) for i in range(5))
# the NumPy types of seq, step, value, dtype
_ROW_TYPES = (np.int64, np.int64, np.float64, np.int16)


@dataclass
class LongRows:
    """One rank's rows of the ``metrics`` table, sorted by ``seq`` (call order).

    Attributes:
        seq: the rank's log-call counter per row (int64, non-decreasing).
        step: the step passed to ``log_metrics`` (int64).
        code: index of the row's key in ``keys`` (int32).
        keys: the distinct key names.
        value: the stored value, NaN where the store holds NULL (float64).
        dtype: the ``schema.DTYPE_*`` code per row (int16).
    """

    seq: np.ndarray
    step: np.ndarray
    code: np.ndarray
    keys: list[str]
    value: np.ndarray
    dtype: np.ndarray

    @classmethod
    def from_arrow(cls, table: Any) -> LongRows:
        """Build from a pyarrow Table or RecordBatch with columns seq, step, key, value, dtype
        (any row order).

        Columns are read straight from their Arrow buffers: pyarrow's own ``to_numpy``
        imports pandas (a third of a second), which would land in rank 0's finalize.
        """
        import pyarrow as pa
        import pyarrow.compute as pc

        from multirank_logger.rows.batch import column_numpy_copy

        keys = pc.dictionary_encode(table.column("key"))
        if hasattr(keys, "combine_chunks"):  # a Table's column is chunked; a RecordBatch's is not
            keys = keys.combine_chunks()
        rows = cls(
            seq=column_numpy_copy(table.column("seq").cast(pa.int64()), np.int64),
            step=column_numpy_copy(table.column("step").cast(pa.int64()), np.int64),
            code=column_numpy_copy(keys.indices.cast(pa.int32()), np.int32),
            keys=keys.dictionary.to_pylist(),
            value=column_numpy_copy(table.column("value").cast(pa.float64()), np.float64, null=np.nan),
            dtype=column_numpy_copy(table.column("dtype").cast(pa.int16()), np.int16),
        )
        return rows._in_call_order()

    @classmethod
    def from_rows(cls, chunks: Iterable[Sequence[Any]]) -> LongRows:
        """Build from driver rows ``(seq, step, key, value, dtype)`` (any row order), given a
        chunk at a time (e.g. ``cursor.fetchmany``).

        The path for stores that hand back Python rows (a server's): each chunk becomes
        NumPy columns before the next is fetched, ~30 bytes per row instead of five Python
        objects (~300 bytes). pyarrow.array on the rows would import pandas.
        """
        index: dict[str, int] = {}
        parts = []
        for chunk in chunks:
            if not chunk:
                continue
            seq, step, value, dtype = row_columns(chunk, _ROW_TYPES, (_SEQ, _STEP, _VALUE, _DTYPE))
            code = np.fromiter((index.setdefault(k, len(index)) for k in map(_KEY, chunk)), np.int32, len(chunk))
            parts.append((seq, step, code, value, dtype))
        if parts:
            columns = [np.concatenate(col) for col in zip(*parts)]
        else:
            columns = [np.zeros(0, k) for k in (np.int64, np.int64, np.int32, np.float64, np.int16)]
        seq, step, code, value, dtype = columns
        return cls(seq=seq, step=step, code=code, keys=list(index), value=value, dtype=dtype)._in_call_order()

    @classmethod
    def empty(cls) -> LongRows:
        return cls.from_rows([])

    @classmethod
    def concat(cls, parts: Sequence[LongRows]) -> LongRows:
        """One LongRows from several (e.g. one per fetched batch), keys merged, in call order."""
        index: dict[str, int] = {}
        codes = []
        for part in parts:
            remap = np.array([index.setdefault(k, len(index)) for k in part.keys], np.int32)
            codes.append(remap[part.code] if len(part.code) else part.code)
        if not parts:
            return cls.from_rows([])
        return cls(
            seq=np.concatenate([p.seq for p in parts]),
            step=np.concatenate([p.step for p in parts]),
            code=np.concatenate(codes).astype(np.int32, copy=False),
            keys=list(index),
            value=np.concatenate([p.value for p in parts]),
            dtype=np.concatenate([p.dtype for p in parts]),
        )._in_call_order()

    def _in_call_order(self) -> LongRows:
        seq = self.seq
        if len(seq) > 1 and not bool(np.all(seq[1:] >= seq[:-1])):
            # stable: the order of keys inside one call does not matter, but keep it anyway
            return self.take(np.argsort(seq, kind="stable"))
        return self

    def take(self, index: np.ndarray) -> LongRows:
        return LongRows(
            self.seq[index], self.step[index], self.code[index], self.keys, self.value[index], self.dtype[index]
        )

    def __len__(self) -> int:
        return len(self.seq)

    def columns(self) -> list[str]:
        """CSVLogger's header for these rows (see `csv_columns`)."""
        return csv_columns(self.keys)

    def split(self, at: int) -> tuple[LongRows, LongRows]:
        """Rows ``[:at]`` and ``[at:]`` (views, not copies)."""
        head, tail = slice(0, at), slice(at, None)
        return self.take(head), self.take(tail)  # type: ignore[arg-type]

    def call_starts(self) -> np.ndarray:
        """Index of the first row of each log call (one CSV row per call)."""
        if len(self.seq) == 0:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(np.r_[True, self.seq[1:] != self.seq[:-1]])

    def scalars(self, lo: int, hi: int) -> np.ndarray:
        """The logged Python scalars of rows ``lo:hi`` as an object array (what CSVLogger holds)."""
        value = self.value[lo:hi]
        dtype = self.dtype[lo:hi]
        out = value.astype(object)  # Python floats; NaN (NULL) prints as `nan` like math.nan
        ints = np.flatnonzero(dtype == DTYPE_INT)
        if len(ints):
            wide = np.abs(value[ints]) >= _INT64_BOUND  # past int64: through Python's own int
            out[ints[~wide]] = value[ints[~wide]].astype(np.int64).astype(object)
            out[ints[wide]] = [int(v) for v in value[ints[wide]].tolist()]
        bools = np.flatnonzero(dtype == DTYPE_BOOL)
        if len(bools):
            out[bools] = (value[bools] != 0).astype(object)
        negzero = np.flatnonzero(dtype == DTYPE_NEG_ZERO)
        if len(negzero):
            out[negzero] = -0.0  # SQLite drops the sign; CSVLogger prints `-0.0`
        return out


def csv_columns(keys: Iterable[str]) -> list[str]:
    """CSVLogger's header: the sorted union of the keys, ``step`` among them."""
    return sorted(set(keys) | {STEP_COLUMN})


def in_call_order(streams: Iterable[Iterator[LongRows]]) -> Iterator[LongRows]:
    """Merge streams that are each in call order (e.g. one per key) into pieces of whole
    calls, in call order.

    Each round cuts every stream's held rows at the *frontier*, the smallest last ``seq``
    among them: no row of a later fetch can come before it. The stream that set it is used
    up, so every round moves on by at least one fetch, and at most one fetch per stream is
    held at once. A stream is only refilled once used up, so a finished one holds nothing
    and is dropped. A stream must not repeat a ``seq`` across its pieces (one key logs once
    per call).
    """
    live: list[tuple[Iterator[LongRows], LongRows | None]] = [(iter(stream), LongRows.empty()) for stream in streams]
    while True:
        refilled = []
        for rest, rows in live:
            while rows is not None and not len(rows):
                rows = next(rest, None)
            if rows is not None:
                refilled.append((rest, rows))
        if not refilled:
            return
        frontier = min(int(rows.seq[-1]) for _, rows in refilled)
        taken, live = [], []
        for rest, rows in refilled:
            head, tail = rows.split(int(np.searchsorted(rows.seq, frontier, side="right")))
            if len(head):
                taken.append(head)
            live.append((rest, tail))
        yield LongRows.concat(taken)


def whole_calls(parts: Iterable[LongRows]) -> Iterator[LongRows]:
    """Re-cut pieces of a stream in call order (e.g. fetched batches) so that no call is
    split across two: the rows of each piece's last call wait for the next piece."""
    carry = LongRows.empty()
    for part in parts:
        if len(carry):
            part = LongRows.concat([carry, part])
        if not len(part):
            continue
        done, carry = part.split(int(np.searchsorted(part.seq, part.seq[-1], side="left")))
        if len(done):
            yield done
    if len(carry):
        yield carry


def row_columns(
    chunk: Sequence[Sequence[Any]], types: Sequence[Any], fields: Sequence[Callable[[Any], Any]] | None = None
) -> list[np.ndarray]:
    """Columns of driver rows as NumPy arrays of `types` (field i of each row, or `fields[i]`).

    One column at a time through C-level maps: ``zip(*chunk)`` over a 64k-row chunk costs
    several times as much. A NULL (None) in a float64 column becomes NaN.
    """
    n = len(chunk)
    fields = fields or [itemgetter(i) for i in range(len(types))]
    return [
        np.array(list(map(get, chunk)), kind) if kind is np.float64 else np.fromiter(map(get, chunk), kind, n)
        for get, kind in zip(fields, types)
    ]


def _grids(rows: LongRows, columns: list[str], chunk_rows: int) -> Iterator[list[list[Any]]]:
    """Yield the CSV rows (lists of Python scalars, '' where missing), a chunk at a time."""
    col_of_key = np.array([columns.index(k) for k in rows.keys], dtype=np.int64)
    step_col = columns.index(STEP_COLUMN)
    starts = rows.call_starts()
    bounds = np.r_[starts, len(rows)]
    for first in range(0, len(starts), chunk_rows):
        last = min(first + chunk_rows, len(starts))
        lo, hi = int(bounds[first]), int(bounds[last])
        counts = np.diff(bounds[first : last + 1])
        row_of = np.repeat(np.arange(last - first), counts)
        grid = np.full((last - first, len(columns)), "", dtype=object)
        grid[row_of, col_of_key[rows.code[lo:hi]]] = rows.scalars(lo, hi)
        # last, so it wins: CSVLogger sets row["step"] from the step argument, over any key "step"
        grid[:, step_col] = rows.step[starts[first:last]].astype(object)
        yield grid.tolist()


def write_csv(fp: IO[str], keys: Iterable[str], pieces: Iterable[LongRows], chunk_rows: int = _CHUNK_ROWS) -> int:
    """Write one rank's rows to ``fp`` (a text file opened with ``newline=""``) in metrics.csv
    layout: the header from ``keys`` (every key of the rows), then ``pieces`` in call order,
    each holding whole calls (`in_call_order`, `whole_calls`).

    Returns:
        The number of data rows written (log calls).
    """
    columns = csv_columns(keys)
    write_header(fp, columns)
    return write_rows(fp, columns, pieces, chunk_rows)


def write_header(fp: IO[str], columns: Sequence[str]) -> None:
    """CSVLogger's header line for `columns` (see `csv_columns`)."""
    # through the dialect csv.DictWriter uses (excel: QUOTE_MINIMAL, "\r\n"): a key may hold
    # a comma or a quote
    csv.writer(fp).writerow(columns)


def write_rows(fp: IO[str], columns: list[str], pieces: Iterable[LongRows], chunk_rows: int = _CHUNK_ROWS) -> int:
    """The data rows of `pieces` (whole calls, in call order) under an existing header of
    `columns`, which must hold every key of the rows. Returns the rows written."""
    join = _FIELD_SEPARATOR.join
    written = 0
    for rows in pieces:
        for grid in _grids(rows, columns, chunk_rows):
            # Every field of a data row is an int, a float, a bool or '' (missing): csv.writer
            # would write each as its str() (repr() for a float: the same text), and quote
            # none, as none holds a comma, a quote or a line end. Joined here, without
            # csv.writer's own per-field checks (query: export_csv). The step keeps a row from being one
            # empty field, which csv.writer would write as "".
            fp.write("".join([join(map(str, row)) + _LINE_END for row in grid]))
            written += len(grid)
    return written


def format_calls(columns: Sequence[str], calls: Iterable[tuple[int | float, Mapping[str, Any]]]) -> str:
    """The data lines of log calls as recorded, ``(step, values)`` with Python scalars, under
    an existing header of `columns` (which holds every key of the calls).

    The same text as `write_rows` for the same calls: each field the ``str()`` of the value
    (csv.writer would write it so, unquoted), empty where the call has no value, the step
    argument in ``step`` (over any key ``"step"``, as CSVLogger sets it last).
    """
    step_at = columns.index(STEP_COLUMN)
    lines = []
    for step, values in calls:
        get = values.get
        fields = [str(get(name, "")) for name in columns]
        fields[step_at] = str(step)
        lines.append(_FIELD_SEPARATOR.join(fields))
    lines.append("")
    return _LINE_END.join(lines)


def to_frame(rows: LongRows) -> Any:
    """The metrics.csv layout as a pandas DataFrame: one row per call, sorted columns with step.

    An all-int key becomes a nullable ``Int64`` column, an all-bool key a ``boolean`` one,
    anything else ``float64`` (NaN where missing), as ``pandas.read_csv`` would mostly infer.
    """
    import pandas as pd

    columns = rows.columns()
    starts = rows.call_starts()
    row_of = np.cumsum(np.r_[0, (rows.seq[1:] != rows.seq[:-1]).astype(np.int64)]) if len(rows) else starts
    data: dict[str, Any] = {}
    for name in columns:
        if name == STEP_COLUMN:
            data[name] = rows.step[starts]
            continue
        mask = rows.code == rows.keys.index(name)
        kinds = set(np.unique(rows.dtype[mask]).tolist())
        col = np.full(len(starts), np.nan)
        col[row_of[mask]] = np.where(rows.dtype[mask] == DTYPE_NEG_ZERO, -0.0, rows.value[mask])
        if kinds == {DTYPE_INT} and not (np.abs(col[row_of[mask]]) >= _INT64_BOUND).any():
            data[name] = pd.array(col, dtype="Float64").astype("Int64")
        elif kinds == {DTYPE_BOOL}:
            data[name] = pd.array(col, dtype="Float64").astype("boolean")
        else:
            data[name] = col
    return pd.DataFrame(data, columns=columns)
