"""RecordBuffer: this rank's logged values in memory, appended on the hot path and drained
into Arrow record batches (batch.py) by a background thread. No I/O here.

The hot path (`RecordBuffer.append`) checks types and appends one tuple to a deque.
`deque.append` and `deque.popleft` are atomic under the GIL, so the training thread
and the writer thread share the buffer without a lock.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Mapping
from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np
import pyarrow as pa

from multirank_logger.errors import InvalidMetric
from multirank_logger.model.batch import metrics_batch
from multirank_logger.model.schema import DTYPE_FLOAT, DTYPE_NAN, DTYPE_NEG_ZERO, DTYPE_OF_TYPE

__all__ = ["RecordBuffer", "to_scalar"]

_SCALARS = (float, int, bool)
#: the largest int stored (as the float64 every value column holds); past it float() overflows
_INT_LIMIT = int(sys.float_info.max)
# the fields of one buffered call: (seq, step, time, metrics)
_SEQ, _STEP, _TIME, _METRICS = (itemgetter(i) for i in range(4))


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
        #: when set, each call's (step, values) is also queued here for rank 0's metrics.csv, which
        #: takes them at save() (csv_logger_files.Rank0Files), whatever the writer thread drained meanwhile
        self.csv_calls: deque[tuple[int, Mapping[Any, Any]]] | None = None

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
        csv_calls = self.csv_calls
        if csv_calls is not None:
            csv_calls.append((step, metrics))

    @property
    def calls_pending(self) -> int:
        """Log calls recorded and not drained yet."""
        return len(self._calls)

    @property
    def calls_recorded(self) -> int:
        """Log calls recorded so far, drained or not."""
        return self._next_seq

    def pending_calls(self) -> list[tuple[int, dict[str, bool | int | float]]]:
        """(step, values) of each call not drained yet, oldest first: a copy."""
        return [(step, dict(values)) for _, step, _, values in list(self._calls)]

    def continue_numbering(self, other: RecordBuffer) -> None:
        """Number the next calls after ``other``'s (a forked child's fresh buffer after its parent's)."""
        self._next_seq = max(self._next_seq, other._next_seq)

    def drain(self, run_id: int, rank: int) -> pa.RecordBatch:
        """Remove every call recorded so far and return its rows as one batch, in call order.

        No Python object per row: the writer thread holds the GIL while it drains, and the
        training thread waits for it, so every per-row step here is a C-level map or a NumPy
        operation (benchmarks/bench_spill.py, case "drain+encode").
        """
        popleft = self._calls.popleft
        calls = [popleft() for _ in range(len(self._calls))]
        metrics = list(map(_METRICS, calls))
        keys = list(chain.from_iterable(metrics))
        index = {key: code for code, key in enumerate(dict.fromkeys(keys))}
        if not all(type(key) is str for key in index):  # once per distinct key, not per row
            # Fabric's log_dict takes any key: it is stored as its str, and of two keys of one
            # call that print alike (1 and "1") the later wins (a store takes one row per (seq, key))
            metrics = [{str(key): value for key, value in m.items()} for m in metrics]
            keys = list(chain.from_iterable(metrics))
            index = {key: code for code, key in enumerate(dict.fromkeys(keys))}
        counts = np.fromiter(map(len, metrics), np.int64, len(calls))
        n = int(counts.sum())
        scalars = list(chain.from_iterable(map(dict.values, metrics)))
        value = np.fromiter(scalars, np.float64, n)  # ints and bools as floats, as encode_value
        if set(map(type, scalars)) == {float}:  # the usual batch: no lookup per value
            dtype = np.full(n, DTYPE_FLOAT, np.int16)
        else:
            dtype = np.fromiter(map(DTYPE_OF_TYPE.__getitem__, map(type, scalars)), np.int16, n)
        first = keys[: len(metrics[0])] if metrics else []
        if len(index) == len(first) and keys == first * len(metrics):
            codes = np.tile(np.arange(len(first), dtype=np.int32), len(metrics))  # every call the same keys, in order
        else:
            codes = np.fromiter(map(index.__getitem__, keys), np.int32, n)
        floats = dtype == DTYPE_FLOAT
        nan = floats & (value != value)
        negative_zero = floats & (value == 0.0) & np.signbit(value)
        dtype[nan] = DTYPE_NAN
        dtype[negative_zero] = DTYPE_NEG_ZERO
        value[negative_zero] = 0.0  # the schema stores -0.0 as 0.0 + DTYPE_NEG_ZERO
        return metrics_batch(
            run_id=np.full(n, run_id, np.int32),
            rank=np.full(n, rank, np.int32),
            seq=np.repeat(np.fromiter(map(_SEQ, calls), np.int64, len(calls)) + self.seq_base, counts),
            step=np.repeat(np.fromiter(map(_STEP, calls), np.int64, len(calls)), counts),
            codes=codes,
            keys=list(index),
            value=value,
            valid=~nan if nan.any() else None,
            dtype=dtype,
            time=np.repeat(np.fromiter(map(_TIME, calls), np.float64, len(calls)), counts),
        )
