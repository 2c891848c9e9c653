"""One pass over a run's metric rows, a window of steps at a time: what the report needs.

A report of 256 ranks x 20,000 steps x 10 keys (51.2M rows) cannot hold its rows: per key a
step x rank table is 41 MB, and pandas' medians over it take seconds. DuckDB's own ``median``
per (key, step) group took 5 s for one key here (2 cores), so the medians are taken in NumPy,
on the rows of a window of steps (about ``WINDOW_ROWS`` rows) at a time. What stays is per key
and step (the ranks' count, median, typical spread, min and max), per rank, and the few rows
that may depart from the others: memory grows with the steps, not with the ranks or the rows.

For each key and each step with at least 3 finite values (as ``report.findings.departures``):

- ``median``: the ranks' median; a rank's later call wins at a step (``per_rank``'s rule);
- ``mad``: the median of the ranks' absolute deviations from it;
- candidates: every row whose deviation is more than ``depart_spreads`` times the smallest
  ``mad`` within ``spread_window`` steps each side. The report's typical spread (a rolling
  median of ``mad``) is never below that minimum, so every row that departs is a candidate;
  the report decides exactly on them. Steps at a window's edge wait for the next window.

Non-finite values (NaN, inf) are counted per key and rank over every stored row, and each
rank's distinct steps and last step are counted: the report's ranks table.

The SELECT is SQLAlchemy Core, the same on every backend; DuckDB hands it over as Arrow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import sqlalchemy as sa

from multirank_logger.model.csv_layout import row_columns
from multirank_logger.model.run_ref import RunRef
from multirank_logger.model.schema import DTYPE_NAN, metrics
from multirank_logger.query.rank_spread import positions, repeats

if TYPE_CHECKING:
    from multirank_logger.query.reader import StoreReader

__all__ = ["KeySteps", "RunScan", "WINDOW_ROWS", "scan_run"]

#: rows read at once (about 25 bytes each as NumPy columns, a few times that while computed)
WINDOW_ROWS = 1_000_000
#: up to this many keys are numbered in SQL (a CASE); past it, the names are read and numbered here
_KEYS_IN_CASE = 64


@dataclass
class KeySteps:
    """One key, per step with at least 3 finite values, in step order; and its departure candidates."""

    steps: np.ndarray
    count: np.ndarray  # ranks with a finite value at the step
    median: np.ndarray
    mad: np.ndarray  # median absolute deviation from `median`
    low: np.ndarray  # the ranks' min
    high: np.ndarray  # the ranks' max
    # candidate rows: the position in `steps`, the rank, its value and its deviation from `median`
    cand_pos: np.ndarray
    cand_rank: np.ndarray
    cand_value: np.ndarray
    cand_dev: np.ndarray


@dataclass
class RunScan:
    """What one pass over a run's rows found (see the module docstring)."""

    keys: list[str]
    #: rank -> (distinct steps it logged, its last step)
    rank_steps: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: one dict per (key, rank) with NaN or inf: key, rank, first_step, count, nan, inf
    non_finite: list[dict[str, Any]] = field(default_factory=list)
    per_key: dict[str, KeySteps] = field(default_factory=dict)


def scan_run(
    reader: StoreReader,
    ref: RunRef,
    *,
    spread_window: int,
    depart_spreads: float,
    window_rows: int = WINDOW_ROWS,
) -> RunScan:
    """Read every metric row of run ``ref`` once, a window of steps at a time.

    Args:
        reader: the store.
        ref: the run.
        spread_window: steps each side whose spreads are pooled (the report's ``SPREAD_WINDOW``).
        depart_spreads: spreads past which a row may depart (the report's ``DEPART_SPREADS``).
        window_rows: about how many rows to hold at once.
    """
    keys = reader.keys(ref.id)
    scan = RunScan(keys)
    if not keys:
        return scan
    where = metrics.c.run_id == ref.id
    with reader._connect() as conn:
        reader.store.backend.hold_snapshot(conn)
        low, high, count = conn.execute(
            sa.select(sa.func.min(metrics.c.step), sa.func.max(metrics.c.step), sa.func.count()).where(where)
        ).one()
        if not count:
            return scan
        span = max(1, (int(high) - int(low) + 1) * window_rows // int(count))
        state = _Scan(keys, spread_window, depart_spreads)
        for start in range(int(low), int(high) + 1, span):
            window = (where, metrics.c.step >= start, metrics.c.step < start + span)
            columns = _fetch(reader, conn, keys, window, with_seq=False)
            if columns is not None and not state.add(*columns):
                # a rank logged a key twice at one step here: its later call wins, by seq
                state.add(*_fetch(reader, conn, keys, window, with_seq=True))
    return state.finish(scan)


def _fetch(reader: StoreReader, conn: sa.Connection, keys: list[str], where: tuple[Any, ...], with_seq: bool) -> Any:
    """A window's rows as NumPy columns: key number, rank, step, value (NaN for NULL), dtype[, seq]."""
    numbered = len(keys) <= _KEYS_IN_CASE
    key = sa.case({k: i for i, k in enumerate(keys)}, value=metrics.c.key) if numbered else metrics.c.key
    cols = [key.label("key"), metrics.c.rank, metrics.c.step, metrics.c.value, metrics.c.dtype]
    stmt = sa.select(*cols, *([metrics.c.seq] if with_seq else [])).where(*where)
    backend = reader.store.backend
    types = [np.int64 if numbered else object, np.int64, np.int64, np.float64, np.int16, np.int64][: len(cols) + with_seq]
    if backend.name == "duckdb":
        table = backend.fetch_arrow(conn, stmt)
        if table.num_rows == 0:
            return None
        out = [_arrow_numpy(table.column(i), kind) for i, kind in enumerate(types)]
    else:
        parts = [row_columns(chunk, types) for chunk in backend.row_chunks(conn, stmt)]
        if not parts:
            return None
        out = [np.concatenate(col) for col in zip(*parts)]
    if not numbered:
        index = {k: i for i, k in enumerate(keys)}
        out[0] = np.fromiter((index[k] for k in out[0]), np.int64, len(out[0]))
    return out


def _arrow_numpy(column: Any, kind: Any) -> np.ndarray:
    if kind is np.float64:
        return column.cast("double").fill_null(np.nan).to_numpy()  # NULL is a logged NaN
    if kind is object:
        return np.asarray(column.to_pylist(), object)
    return column.to_numpy().astype(kind, copy=False)


class _Scan:
    """The pass's state across windows (see scan_run)."""

    def __init__(self, keys: list[str], spread_window: int, depart_spreads: float) -> None:
        self.keys = keys
        self.sw = spread_window
        self.factor = depart_spreads * (1 - 1e-9)  # a candidate rule that never misses by rounding
        self.steps_by_rank: dict[int, int] = {}
        self.last_by_rank: dict[int, int] = {}
        self.bad: dict[tuple[int, int], list[int]] = {}  # (key, rank) -> [first step, count, nan]
        self.parts: list[list[tuple[np.ndarray, ...]]] = [[] for _ in keys]
        self.cands: list[list[tuple[np.ndarray, ...]]] = [[] for _ in keys]
        # per key: rows not yet judged (the last steps of the last window) and the spreads before them
        self.pending: list[tuple[np.ndarray, ...] | None] = [None] * len(keys)
        self.seen: list[int] = [0] * len(keys)  # counted steps so far, per key

    def add(self, key: np.ndarray, rank: np.ndarray, step: np.ndarray, value: np.ndarray, dtype: np.ndarray,
            seq: np.ndarray | None = None) -> bool:  # fmt: skip
        """Take one window's rows; False (and nothing taken) when a cell repeats and `seq` is missing."""
        steps, step_pos = positions(step)
        ranks, rank_pos = positions(rank)
        cell = (key * len(steps) + step_pos) * len(ranks) + rank_pos
        if seq is None and repeats(cell, len(steps) * len(ranks) * len(self.keys)):
            return False
        self._count_non_finite(key, rank, step, value, dtype)
        logged = np.zeros((len(steps), len(ranks)), bool)
        logged[step_pos, rank_pos] = True
        per_rank = logged.sum(axis=0)
        last = len(steps) - 1 - np.argmax(logged[::-1], axis=0)
        for r, n, i in zip(ranks.tolist(), per_rank.tolist(), last.tolist()):
            self.steps_by_rank[r] = self.steps_by_rank.get(r, 0) + n
            self.last_by_rank[r] = max(self.last_by_rank.get(r, int(steps[i])), int(steps[i]))
        flat = np.full(len(self.keys) * len(steps) * len(ranks), np.nan)
        if seq is not None:  # a rank's later call wins: of each cell's rows, the one with the largest seq
            order = np.lexsort((seq, cell))
            last_row = order[np.r_[cell[order][1:] != cell[order][:-1], True]]
            flat[cell[last_row]] = value[last_row]
        else:
            flat[cell] = value
        grid = flat.reshape(len(self.keys), len(steps), len(ranks))
        grid[~np.isfinite(grid)] = np.nan  # NaN/inf are the non-finite finding's
        for k in np.flatnonzero(np.bincount(key, minlength=len(self.keys))).tolist():
            self._add_key(k, steps, ranks, grid[k])
        return True

    def _count_non_finite(self, key: np.ndarray, rank: np.ndarray, step: np.ndarray, value: np.ndarray,
                          dtype: np.ndarray) -> None:  # fmt: skip
        is_nan = dtype == DTYPE_NAN
        bad = np.flatnonzero(is_nan | np.isinf(value))
        for k, r, s, n in zip(key[bad].tolist(), rank[bad].tolist(), step[bad].tolist(), is_nan[bad].tolist()):
            item = self.bad.setdefault((k, r), [s, 0, 0])
            item[0] = min(item[0], s)
            item[1] += 1
            item[2] += int(n)

    def _add_key(self, k: int, steps: np.ndarray, ranks: np.ndarray, table: np.ndarray) -> None:
        count = (~np.isnan(table)).sum(axis=1)
        counted = count >= 3
        table, steps, count = table[counted], steps[counted], count[counted]
        if not len(steps):
            return
        median, low, high = _medians(table, count)
        dev = table - median[:, None]
        mad = _medians(np.abs(dev), count)[0]
        self.parts[k].append((steps, count, median, mad, low, high))
        self._candidates(k, ranks, table, dev, mad)

    def _candidates(self, k: int, ranks: np.ndarray, table: np.ndarray, dev: np.ndarray, mad: np.ndarray,
                    final: bool = False) -> None:  # fmt: skip
        """Judge the rows whose spreads each side are known; keep the last `sw` steps' for later."""
        first = self.seen[k]
        self.seen[k] += len(mad)
        pos = np.arange(first, first + len(mad))
        cand_ranks = np.broadcast_to(ranks, dev.shape)
        held = self.pending[k]
        if held is not None:  # the previous window's last steps, and the spreads before them
            h_pos, h_ranks, h_table, h_dev, h_mad_pos, h_mad = held
            table, dev = _stack(h_table, table), _stack(h_dev, dev)
            cand_ranks = _stack(h_ranks, cand_ranks, fill=-1)
            pos = np.r_[h_pos, pos]
            mad_pos, all_mad = np.r_[h_mad_pos, np.arange(first, first + len(mad))], np.r_[h_mad, mad]
        else:
            mad_pos, all_mad = np.arange(first, first + len(mad)), mad
        lo = _rolling_min(all_mad, self.sw)[np.searchsorted(mad_pos, pos)]
        judged = len(pos) if final else max(0, len(pos) - self.sw)
        with np.errstate(invalid="ignore"):
            hit = (dev[:judged] != 0) & (np.abs(dev[:judged]) > self.factor * lo[:judged, None])
        rows, cols = np.nonzero(hit)
        if len(rows):
            self.cands[k].append((pos[rows], cand_ranks[rows, cols], table[rows, cols], dev[rows, cols]))
        keep = slice(judged, len(pos))
        self.pending[k] = None if final else (
            pos[keep], cand_ranks[keep], table[keep], dev[keep], mad_pos[-2 * self.sw :], all_mad[-2 * self.sw :]
        )  # fmt: skip

    def finish(self, scan: RunScan) -> RunScan:
        for k, name in enumerate(self.keys):
            if self.pending[k] is not None:
                self._flush(k)
            parts = self.parts[k]
            if not parts:
                continue
            cols = [np.concatenate(c) for c in zip(*parts)]
            cands = [np.concatenate(c) for c in zip(*self.cands[k])] if self.cands[k] else [
                np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0), np.zeros(0)]  # fmt: skip
            scan.per_key[name] = KeySteps(*cols, *cands)
        scan.rank_steps = {r: (self.steps_by_rank[r], self.last_by_rank[r]) for r in sorted(self.steps_by_rank)}
        scan.non_finite = [
            {"rank": r, "key": self.keys[k], "first_step": first, "count": n, "nan": nan, "inf": n - nan}
            for (k, r), (first, n, nan) in sorted(self.bad.items(), key=lambda item: (self.keys[item[0][0]], item[0][1]))
        ]  # fmt: skip
        return scan

    def _flush(self, k: int) -> None:
        """Judge the key's held rows: the run ends after them (fewer spreads on their right, as at
        the end of the report's rolling window)."""
        h_pos, h_ranks, h_table, h_dev, h_mad_pos, h_mad = self.pending[k]  # type: ignore[misc]
        lo = _rolling_min(h_mad, self.sw)[np.searchsorted(h_mad_pos, h_pos)]
        with np.errstate(invalid="ignore"):
            hit = (h_dev != 0) & (np.abs(h_dev) > self.factor * lo[:, None]) & (h_ranks >= 0)
        rows, cols = np.nonzero(hit)
        if len(rows):
            self.cands[k].append((h_pos[rows], h_ranks[rows, cols], h_table[rows, cols], h_dev[rows, cols]))
        self.pending[k] = None


def _medians(table: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row of `table` (NaN where no value): the median of its values, their min and max.

    As ``np.nanmedian`` computes them (the mean of the two middle values for an even count),
    without its slow path for rows with NaN: a sort puts NaN last, the count finds the middle.
    """
    if (count == table.shape[1]).all():  # no NaN: the two middle values by partition
        n = table.shape[1]
        part = np.partition(table, [(n - 1) // 2, n // 2], axis=1)
        middle = (part[:, (n - 1) // 2] + part[:, n // 2]) / 2
        return middle, table.min(axis=1), table.max(axis=1)
    ordered = np.sort(table, axis=1)
    rows = np.arange(len(table))
    middle = (ordered[rows, (count - 1) // 2] + ordered[rows, count // 2]) / 2
    return middle, ordered[:, 0], ordered[rows, count - 1]


def _rolling_min(values: np.ndarray, half: int) -> np.ndarray:
    """The min of `values` over `half` positions each side (fewer at the ends)."""
    padded = np.pad(values.astype(float), half, constant_values=np.inf)
    return np.lib.stride_tricks.sliding_window_view(padded, 2 * half + 1).min(axis=1)


def _stack(held: np.ndarray, new: np.ndarray, fill: float = np.nan) -> np.ndarray:
    """Rows of two windows, whose ranks may differ in number: the narrower padded with `fill`."""
    width = max(held.shape[1], new.shape[1])
    pad = [np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=fill) for a in (held, new)]
    return np.vstack(pad)

