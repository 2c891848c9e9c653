"""RecordBuffer: this rank's logged values in memory, appended on the hot path and drained
into Arrow record batches (batch.py) by a background thread. No I/O here.

The hot path (`RecordBuffer.append`) checks types and appends one tuple to a deque.
`deque.append` and `deque.popleft` are atomic under the GIL, so the training thread
and the writer thread share the buffer without a lock.
"""

from __future__ import annotations

import math
import operator
import sys
import time
from collections import deque
from collections.abc import Iterable, Mapping
from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np
import pyarrow as pa

from multirank_logger.errors import InvalidMetric
from multirank_logger.rows.batch import metrics_batch
from multirank_logger.rows.schema import BIGINT_MAX, BIGINT_MIN, DTYPE_FLOAT, DTYPE_NAN, DTYPE_NEG_ZERO, DTYPE_OF_TYPE

__all__ = ["MAX_KEY_BYTES", "STEP_MAX", "STEP_MIN", "RecordBuffer", "to_scalar", "to_step"]

_SCALARS = (float, int, bool)
#: the largest int stored (as the float64 every value column holds); past it float() overflows
_INT_LIMIT = int(sys.float_info.max)
# the fields of one buffered call: (seq, step, time, metrics)
_SEQ, _STEP, _TIME, _METRICS = (itemgetter(i) for i in range(4))
#: the step column is a signed 64-bit integer in every backend (and in the Arrow batch)
STEP_MIN, STEP_MAX = BIGINT_MIN, BIGINT_MAX
#: a key's longest UTF-8 form: PostgreSQL's index on (run_id, key) refuses entries past ~2.7 kB
MAX_KEY_BYTES = 1024
#: keys already checked, kept per buffer up to this many (a run logging a new key per call stays bounded)
_KNOWN_KEYS_LIMIT = 100_000


def to_scalar(key: str, value: Any, step: int | None = None) -> bool | int | float:
    """Turn a one-element tensor or NumPy scalar into a Python number.

    Raises:
        InvalidMetric: for anything that is not one number (a list, a 2-element tensor, a string),
            or an int past a float64's range; it names the key and `step`.
    """
    scalar = _scalar_or_none(value)
    # an int past float64's range: float(value) would fail in the writer thread
    if scalar is None or (type(scalar) is int and not -_INT_LIMIT <= scalar <= _INT_LIMIT):
        raise InvalidMetric(key, scalar if type(scalar) is int else value, step)
    return scalar


def _scalar_or_none(value: Any) -> bool | int | float | None:
    if type(value) in _SCALARS:
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
    return None


def to_step(step: Any, keys: Iterable[Any]) -> int:
    """The step of a log call as the int the store's 64-bit step column holds.

    An integer of any kind (NumPy, a 0-d tensor, a bool) and a float holding a whole number
    (``3.0``) are taken as that int; anything else is refused, before the call is recorded.

    Raises:
        InvalidMetric: for NaN, inf, a fraction, a number past int64, or no number at all; it
            names the call's keys and the step.
    """
    try:
        whole = operator.index(step)  # int, bool, NumPy integers, integer tensors
    except TypeError:
        whole = None
        if not isinstance(step, (str, bytes)):
            try:
                number = float(step)  # floats, NumPy floats, 0-d float tensors
            except (TypeError, ValueError, OverflowError):
                number = math.nan
            if number.is_integer():
                whole = int(number)
    if whole is None or not STEP_MIN <= whole <= STEP_MAX:
        raise InvalidMetric(_shown_keys(keys), step, step, problem="step")
    return whole


def check_key(key: Any, step: int) -> None:
    """Refuse, at the call, a key the writer, a store or metrics.csv cannot take.

    Raises:
        InvalidMetric: for a key (or a non-str key's ``str``) holding a lone surrogate (not
            UTF-8: what ``os.listdir`` returns for a file name that is not), a NUL character
            (PostgreSQL's text refuses it; CSV readers stop at it), or longer than `MAX_KEY_BYTES`.
    """
    text = key if type(key) is str else str(key)  # drain stores a non-str key as its str
    try:
        size = len(text.encode())
    except UnicodeEncodeError as exc:
        raise InvalidMetric(text, None, step, problem=f"surrogate:{exc.start}") from None
    nul = text.find("\x00")
    if nul >= 0:
        raise InvalidMetric(text, None, step, problem=f"nul:{nul}")
    if size > MAX_KEY_BYTES:
        raise InvalidMetric(text, None, step, problem=f"long:{size}")


def _shown_keys(keys: Iterable[Any]) -> str:
    shown = [repr(str(k)) for k in keys]
    return ", ".join(shown[:5]) + (f", ... ({len(shown)} keys)" if len(shown) > 5 else "")


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
        self.csv_calls: deque[tuple[int | float, Mapping[Any, Any]]] | None = None
        #: keys `check_key` passed: a call of known keys costs one C-level set test, not a check per key
        self._known_keys: set[Any] = set()

    def append(self, step: Any, metrics: Mapping[str, Any]) -> int:
        """Record one log call, whole or not at all. Hot path: no I/O, no lock.

        Returns:
            The step recorded (an int; `step` as given when it already was one).

        Raises:
            InvalidMetric: if the step is not an int64, a key cannot be stored, or a value is not
                a single number; it names the key and step, and nothing of the call is recorded.
        """
        given = step
        if type(step) is not int or not STEP_MIN <= step <= STEP_MAX:
            step = to_step(step, metrics)
        if not self._known_keys.issuperset(metrics):
            self._check_keys(metrics, step)
        for value in metrics.values():
            kind = type(value)
            # as cheap per value as a membership test; an int must also fit a float64
            if kind is float or kind is bool or (kind is int and -_INT_LIMIT <= value <= _INT_LIMIT):
                continue
            metrics = {k: to_scalar(k, v, step) for k, v in metrics.items()}
            break
        else:
            metrics = dict(metrics)  # the caller may reuse its dict
        self._calls.append((self._next_seq, step, time.time(), metrics))
        if metrics:  # a call with no value stores no row: a seq of its own would read as a call never stored
            self._next_seq += 1
        csv_calls = self.csv_calls
        if csv_calls is not None:
            # a whole float step stays as given there: CSVLogger writes it as str() of what it got ("3.0")
            csv_calls.append((given if type(given) is float else step, metrics))
        return step

    def _check_keys(self, metrics: Mapping[Any, Any], step: int) -> None:
        """Check the keys not seen before (all of them or none become known)."""
        new = [key for key in metrics if key not in self._known_keys]
        for key in new:
            check_key(key, step)
        if len(self._known_keys) > _KNOWN_KEYS_LIMIT:
            self._known_keys.clear()
        self._known_keys.update(new)

    @property
    def calls_pending(self) -> int:
        """Log calls recorded and not drained yet."""
        return len(self._calls)

    @property
    def calls_recorded(self) -> int:
        """Log calls with values recorded so far, drained or not (a call with none takes no seq)."""
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
        return self.encode(self.take(), run_id, rank)

    def take(self) -> list[tuple[int, int, float, dict[str, bool | int | float]]]:
        """Remove every call recorded so far, oldest first, for `encode`."""
        popleft = self._calls.popleft
        return [popleft() for _ in range(len(self._calls))]

    def encode(self, calls: list[tuple[int, int, float, dict[str, bool | int | float]]], run_id: int, rank: int) -> pa.RecordBatch:
        """The rows of `calls` (from `take`) as one batch, in call order (see `drain`)."""
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
