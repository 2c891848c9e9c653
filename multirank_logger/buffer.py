"""RecordBuffer: this rank's logged values in memory, appended on the hot path and drained
into columnar MetricBatch objects by a background thread. No I/O here.

The hot path (`RecordBuffer.append`) checks types and appends one tuple to a deque.
`deque.append` and `deque.popleft` are atomic under the GIL, so the training thread
and the writer thread share the buffer without a lock.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from itertools import chain
from operator import itemgetter
from typing import Any

from multirank_logger.errors import InvalidMetric
from multirank_logger.schema import DTYPE_FLOAT, DTYPE_NAN, DTYPE_NEG_ZERO, DTYPE_OF_TYPE, METRIC_COLUMNS, encode_value

__all__ = ["MetricBatch", "RecordBuffer", "as_arrow", "concat_batches", "metrics_table", "stamp_run_id", "to_scalar"]

_SCALARS = (float, int, bool)
#: the largest int stored (as the float64 every value column holds); past it float() overflows
_INT_LIMIT = int(sys.float_info.max)
# the fields of one buffered call: (seq, step, time, metrics)
_SEQ, _STEP, _TIME, _METRICS = (itemgetter(i) for i in range(4))


@dataclass
class MetricBatch:
    """Rows of the `metrics` table, column by column (see schema.metrics)."""

    run_id: list[int] = field(default_factory=list)
    rank: list[int] = field(default_factory=list)
    seq: list[int] = field(default_factory=list)
    step: list[int] = field(default_factory=list)
    key: list[str] = field(default_factory=list)
    value: list[float | None] = field(default_factory=list)
    dtype: list[int] = field(default_factory=list)
    time: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.key)

    def columns(self, names: Sequence[str] = METRIC_COLUMNS) -> list[list[Any]]:
        """The column lists, in the order of `names`."""
        return [getattr(self, name) for name in names]

    def extend(self, other: MetricBatch) -> None:
        """Append `other`'s rows to this batch."""
        for f in fields(self):
            getattr(self, f.name).extend(getattr(other, f.name))

    def last_value_per_key(self) -> MetricBatch:
        """This batch with one row per (seq, key), the last: two keys of one call that print
        alike (``1`` and ``"1"``) are one column, and a store keyed by (seq, key) takes one."""
        last = {row: i for i, row in enumerate(zip(self.seq, self.key))}
        if len(last) == len(self):
            return self
        keep = sorted(last.values())
        return MetricBatch(**{f.name: [getattr(self, f.name)[i] for i in keep] for f in fields(self)})

    @classmethod
    def concat(cls, batches: Iterable[MetricBatch]) -> MetricBatch:
        out = cls()
        for batch in batches:
            out.extend(batch)
        return out

    @classmethod
    def from_arrow(cls, table: Any) -> MetricBatch:
        """The rows of a pyarrow Table of the metrics columns (drain_arrow, decode_table), to spill them."""
        columns = table.select(list(METRIC_COLUMNS)).to_pydict()  # dictionary keys come back as str
        return cls(**{name: columns[name] for name in METRIC_COLUMNS})

    def to_arrow(self) -> Any:
        """A pyarrow.Table with the metrics table's column types (keys dictionary-encoded).

        Built from NumPy buffers: ``pyarrow.array`` on Python lists imports pandas (~0.3 s
        and ~60 MiB), which would land in the writer thread in the middle of training.
        """
        import numpy as np

        n = len(self)
        index: dict[str, int] = {}
        codes = np.fromiter((-1 if k is None else index.setdefault(k, len(index)) for k in self.key), np.int32, n)
        value = np.array(self.value, np.float64)  # None (a NaN) becomes nan here...
        # ...and NULL in the table, as the schema stores NaN
        valid = np.array(self.dtype) != DTYPE_NAN if DTYPE_NAN in self.dtype else None
        return metrics_table(
            run_id=np.array(self.run_id, np.int32),
            rank=np.array(self.rank, np.int32),
            seq=np.array(self.seq, np.int64),
            step=np.array(self.step, np.int64),
            codes=codes,
            keys=list(index),
            value=value,
            valid=valid,
            dtype=np.array(self.dtype, np.int16),
            time=np.array(self.time, np.float64),
        )


def as_arrow(batch: MetricBatch | Any) -> Any:
    """A batch as a pyarrow.Table: a MetricBatch converted, a Table (drain_arrow, decode_table) as is."""
    return batch.to_arrow() if isinstance(batch, MetricBatch) else batch


def concat_batches(batches: list[Any]) -> Any:
    """One batch from several: MetricBatch objects stay one; any Arrow table among them
    makes the result one Arrow table (MetricBatch objects converted)."""
    if all(isinstance(b, MetricBatch) for b in batches):
        return MetricBatch.concat(batches)
    import pyarrow as pa

    # each table has its own key dictionary: unify them so a store reads one
    return pa.concat_tables([as_arrow(b) for b in batches]).unify_dictionaries()


def metrics_table(
    *, run_id: Any, rank: Any, seq: Any, step: Any, codes: Any, keys: list[str], value: Any, valid: Any, dtype: Any, time: Any
) -> Any:
    """The `metrics` rows as a pyarrow.Table, from NumPy columns of the schema's widths
    (int32 run_id, rank and codes; int64 seq, step; float64 value, time; int16 dtype).

    ``codes`` index ``keys`` (a code of -1 is a NULL key: the store's NOT NULL then refuses
    the batch as a whole); ``valid`` is False where the value is NULL (a NaN), or None.
    """
    import numpy as np
    import pyarrow as pa

    n = len(codes)
    names = [k.encode() for k in keys]
    offsets = np.zeros(len(names) + 1, np.int32)
    np.cumsum([len(b) for b in names], out=offsets[1:])
    dictionary = pa.Array.from_buffers(pa.string(), len(names), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(names))])
    key_valid = codes >= 0 if n and codes.min() < 0 else None

    def numeric(kind: Any, data: Any, validity: Any = None) -> Any:
        bits = None if validity is None else pa.py_buffer(np.packbits(validity, bitorder="little"))
        return pa.Array.from_buffers(kind, n, [bits, pa.py_buffer(np.ascontiguousarray(data))])

    arrays = [
        numeric(pa.int32(), run_id),
        numeric(pa.int32(), rank),
        numeric(pa.int64(), seq),
        numeric(pa.int64(), step),
        pa.DictionaryArray.from_arrays(numeric(pa.int32(), codes, key_valid), dictionary),
        numeric(pa.float64(), value, valid),
        numeric(pa.int16(), dtype),
        numeric(pa.float64(), time),
    ]
    return pa.Table.from_arrays(arrays, names=list(METRIC_COLUMNS))


def stamp_run_id(batch: MetricBatch | Any, run_id: int) -> MetricBatch | Any:
    """`batch` (a MetricBatch or a pyarrow Table) with every row under `run_id`: rank 0 files
    what it receives under its own run, whatever id the sender put there (an identity it
    allocated on its own would otherwise leave orphan rows)."""
    if isinstance(batch, MetricBatch):
        batch.run_id = [run_id] * len(batch)
        return batch
    import numpy as np
    import pyarrow as pa

    index = batch.schema.get_field_index("run_id")
    column = pa.array(np.full(batch.num_rows, run_id, np.int32))
    return batch.set_column(index, batch.schema.field(index), column)


def to_scalar(key: str, value: Any) -> bool | int | float:
    """Turn a one-element tensor or NumPy scalar into a Python number.

    Raises:
        InvalidMetric: for anything that is not one number (a list, a 2-element tensor, a string).
    """
    if type(value) in _SCALARS:
        if type(value) is int and not -_INT_LIMIT <= value <= _INT_LIMIT:
            raise InvalidMetric(key, value)  # float(value) would fail in the writer thread
        return value
    numel = getattr(value, "numel", None) or getattr(value, "size", None)
    count = numel() if callable(numel) else numel
    if count == 1 and hasattr(value, "item"):
        item = value.item()
        if type(item) in _SCALARS:
            return item
    for kind in (bool, int, float):  # subclasses such as IntEnum; bool first, it is an int
        if isinstance(value, kind):
            return kind(value)
    raise InvalidMetric(key, value)


class RecordBuffer:
    """This rank's log calls, in call order, waiting for the writer.

    Each call keeps its own `seq` (the rank's call counter), so a rank's rows can be
    rebuilt in call order whatever `step` the caller passed.
    """

    def __init__(self) -> None:
        self._calls: deque[tuple[int, int, float, dict[str, bool | int | float]]] = deque()
        self._next_seq = 0
        #: added to every drained row's seq: this launch's attempt in the high bits (run_lifecycle.py)
        self.seq_base = 0

    def append(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record one log call. Hot path: no I/O, no lock.

        Raises:
            InvalidMetric: if a value is not a single number; nothing is recorded then.
        """
        for value in metrics.values():
            kind = type(value)
            # as cheap per value as a membership test; an int must also fit a float64
            if kind is float or kind is bool or (kind is int and -_INT_LIMIT <= value <= _INT_LIMIT):
                continue
            metrics = {k: to_scalar(k, v) for k, v in metrics.items()}
            break
        else:
            metrics = dict(metrics)  # the caller may reuse its dict
        self._calls.append((self._next_seq, step, time.time(), metrics))
        self._next_seq += 1

    @property
    def calls_pending(self) -> int:
        """Log calls recorded and not drained yet."""
        return len(self._calls)

    @property
    def calls_recorded(self) -> int:
        """Log calls recorded so far, drained or not."""
        return self._next_seq

    def drain_arrow(self, run_id: int, rank: int) -> Any:
        """Like ``drain(run_id, rank).to_arrow()``, without a Python object per row.

        The path into a store that inserts from Arrow (DuckDB). The writer thread holds the
        GIL while it drains, and the training thread waits for it: here every per-row step
        is a C-level map or a NumPy operation (~0.1 us/row against ~0.5 for drain + to_arrow).
        """
        import numpy as np

        popleft = self._calls.popleft
        calls = [popleft() for _ in range(len(self._calls))]
        metrics = list(map(_METRICS, calls))
        keys = list(chain.from_iterable(metrics))
        index = {key: code for code, key in enumerate(dict.fromkeys(keys))}
        if not all(type(key) is str for key in index):  # once per distinct key, not per row
            # Fabric's log_dict takes any key: it is stored as its str, and of two keys of one
            # call that print alike (1 and "1") the later wins, as drain does
            metrics = [{str(key): value for key, value in m.items()} for m in metrics]
            keys = list(chain.from_iterable(metrics))
            index = {key: code for code, key in enumerate(dict.fromkeys(keys))}
        counts = np.fromiter(map(len, metrics), np.int64, len(calls))
        n = int(counts.sum())
        scalars = list(chain.from_iterable(map(dict.values, metrics)))
        value = np.fromiter(scalars, np.float64, n)  # ints and bools as floats, as encode_value
        dtype = np.fromiter(map(DTYPE_OF_TYPE.__getitem__, map(type, scalars)), np.int16, n)
        floats = dtype == DTYPE_FLOAT
        nan = floats & (value != value)
        negative_zero = floats & (value == 0.0) & np.signbit(value)
        dtype[nan] = DTYPE_NAN
        dtype[negative_zero] = DTYPE_NEG_ZERO
        value[negative_zero] = 0.0  # the schema stores -0.0 as 0.0 + DTYPE_NEG_ZERO
        return metrics_table(
            run_id=np.full(n, run_id, np.int32),
            rank=np.full(n, rank, np.int32),
            seq=np.repeat(np.fromiter(map(_SEQ, calls), np.int64, len(calls)) + self.seq_base, counts),
            step=np.repeat(np.fromiter(map(_STEP, calls), np.int64, len(calls)), counts),
            codes=np.fromiter(map(index.__getitem__, keys), np.int32, n),
            keys=list(index),
            value=value,
            valid=~nan if nan.any() else None,
            dtype=dtype,
            time=np.repeat(np.fromiter(map(_TIME, calls), np.float64, len(calls)), counts),
        )

    def drain(self, run_id: int, rank: int) -> MetricBatch:
        """Remove every call recorded so far and return its rows as one batch."""
        batch = MetricBatch()
        popleft = self._calls.popleft
        renamed = False
        base = self.seq_base
        for _ in range(len(self._calls)):
            seq, step, t, metrics = popleft()
            seq += base
            for key, scalar in metrics.items():
                if type(key) is not str:  # Fabric's log_dict takes any key: stored as its str
                    key = str(key)
                    renamed = True
                value, dtype = encode_value(scalar)
                batch.seq.append(seq)
                batch.step.append(step)
                batch.key.append(key)
                batch.value.append(value)
                batch.dtype.append(dtype)
                batch.time.append(t)
        n = len(batch)
        batch.run_id = [run_id] * n
        batch.rank = [rank] * n
        return batch.last_value_per_key() if renamed else batch
