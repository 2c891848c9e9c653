"""One pass over a run's metric rows, a window of steps at a time: what the report needs.

A report of 256 ranks x 20,000 steps x 10 keys (51.2M rows) cannot hold its rows: per key a
step x rank table is 41 MB, and pandas' medians over it take seconds. DuckDB's own ``median``
per (key, step) group took 5 s for one key here (2 cores), so the medians are taken in NumPy,
on the rows of a window of steps (about ``WINDOW_ROWS`` rows) at a time. What stays is per key
and step (the ranks' count, median, typical spread, min and max), per rank, and the few rows
that may depart from the others: memory grows with the steps, not with the ranks or the rows.

The per-key statistics are the judgement's: each window's steps x ranks table of a key goes to
its ``DepartureWindows`` (``judgement/ranks.py``), and the report judges on what it kept
(``judge_departures``). A rank's later call at a step wins (``per_rank``'s rule).

Non-finite values (NaN, inf) are counted per key and rank over every stored row, and each
rank's distinct steps and last step are counted: the report's ranks table.

Where the run's steps and ranks are dense (a training's), a window's rows are placed in its key x
step x rank grid a chunk at a time as they are read (``window_grid.GridBuilder``,
``Backend.numpy_chunks``): a window holds its grid (9 bytes a cell), not its rows, so windows are
``GRID_WINDOW_FACTOR`` times longer in the same memory, and fewer of them each scan a row group.

The SELECT is SQLAlchemy Core, the same on every backend; how its rows come back fastest (as
Arrow, several windows at once, one key at a time) is the backend's (``store/backends/``:
``numpy_columns``, ``window_readers``, ``value_or_nan``, ``scan_by_key``). SQLite's table is
clustered by key: a window is read one key at a time (a range read each, no CASE over every
row's key), through ADBC's C driver where installed (``sqlite_arrow.py``).
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import sqlalchemy as sa

from multirank_logger._util.cpus import usable_cpus
from multirank_logger._util.prefetch import prefetched
from multirank_logger.judgement.non_finite import FirstNonFinite
from multirank_logger.judgement.ranks import DEPART_SPREADS, SPREAD_WINDOW, DepartureWindows, KeySteps
from multirank_logger.query.key_numbers import KeyNumbers
from multirank_logger.query.step_buckets import BucketBuilder, BucketSummary, bucket_width
from multirank_logger.query.window_grid import GridBuilder, Window, lay_out
from multirank_logger.rows.run_ref import RunRef
from multirank_logger.rows.schema import metrics

if TYPE_CHECKING:
    from multirank_logger.query.reader import StoreReader

__all__ = ["BUCKET_CELLS_MAX", "RunScan", "WINDOW_ROWS", "scan_run"]

#: rows read at once (about 25 bytes each as NumPy columns, a few times that while computed)
WINDOW_ROWS = 1_000_000
#: where a run's steps and ranks are dense, a window is this many times `WINDOW_ROWS` in cells
#: (keys x steps x ranks, 9 bytes each), its rows placed a chunk at a time (window_grid.GridBuilder):
#: at 1,024 ranks x 10 keys a window of 1M rows is 98 steps, and each window's query scanned
#: every row group its steps fall in (a stretch of 1,000 steps of every rank in the scale
#: benchmark's store): twice the reading CPU of windows of 390 steps
GRID_WINDOW_FACTOR = 4
#: threads computing a window's keys (besides the one reading the next window)
KEY_THREADS = min(4, usable_cpus())
#: per-bucket summaries are built in the pass up to this many cells (keys x ranks x buckets), 13 B each
BUCKET_CELLS_MAX = 24_000_000


@dataclass
class RunScan:
    """What one pass over a run's rows found (see the module docstring)."""

    keys: list[str]
    #: rank -> (distinct steps it logged, its last step)
    rank_steps: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: one dict per (key, rank) with NaN or inf: key, rank, first_step, count, nan, inf
    non_finite: list[dict[str, Any]] = field(default_factory=list)
    per_key: dict[str, KeySteps] = field(default_factory=dict)
    #: per key, what the ui draws (``scan_run``'s ``bucket_columns``): each rank's summary per bucket
    buckets: dict[str, BucketSummary] = field(default_factory=dict)


def scan_run(
    reader: StoreReader,
    ref: RunRef,
    *,
    spread_window: int = SPREAD_WINDOW,
    depart_spreads: float = DEPART_SPREADS,
    window_rows: int = WINDOW_ROWS,
    bucket_columns: int = 0,
) -> RunScan:
    """Read every metric row of run ``ref`` once, a window of steps at a time.

    Three windows at once, on two cores: the next but one is read on a thread of its own
    (``_util/prefetch.py``), the next laid out as a key x step x rank grid (as it is read, where
    the steps and ranks are dense), and this one's keys computed, each on a thread of a pool
    (NumPy and the drivers release the GIL).

    Args:
        reader: the store.
        ref: the run.
        spread_window: steps each side whose spreads are pooled (``judgement.ranks.SPREAD_WINDOW``).
        depart_spreads: spreads past which a value may depart (``judgement.ranks.DEPART_SPREADS``).
        window_rows: about how many rows to hold at once.
        bucket_columns: when set, also each key's per-rank, per-bucket summary in at most that
            many buckets (``RunScan.buckets``): what the ui draws, from the same pass.
    """
    keys = reader.keys(ref.id)
    scan = RunScan(keys)
    if not keys:
        return scan
    if bucket_columns and len(keys) * max(1, ref.world_size) * bucket_columns > BUCKET_CELLS_MAX:
        bucket_columns = 0  # the caller summarizes each key on its own (step_buckets.summarize)
    state: _Scan | None = None
    with ThreadPoolExecutor(KEY_THREADS, thread_name_prefix="multirank-logger-scan") as pool, \
            contextlib.ExitStack() as later:
        seq_conn: sa.Connection | None = None

        def take(where: tuple[Any, ...], window_future: Future[Window | None]) -> None:
            nonlocal seq_conn
            assert state is not None
            window = window_future.result()
            if window is None:  # a rank logged a key twice at one step here: its later call wins, by seq
                seq_conn = seq_conn or later.enter_context(reader._connect())  # this thread's own
                window = lay_out(len(keys), *_fetch(reader, seq_conn, state.names, where, with_seq=True))
                assert window is not None
            state.add(window, pool)

        held: tuple[tuple[Any, ...], Future[Window | None]] | None = None
        for item in prefetched(lambda: _windows(reader, ref, keys, window_rows, bucket_columns)):
            if isinstance(item, _Span):
                state = _Scan(keys, spread_window, depart_spreads, item, bool(bucket_columns))
                continue
            where, columns = item
            window_future: Future[Window | None]
            if isinstance(columns, _Laid):  # laid out as it was read
                window_future = Future()
                window_future.set_result(columns.window)
            else:
                window_future = pool.submit(lay_out, len(keys), *columns)  # beside the previous window's keys
            del item, columns  # the rows go with their layout, not at the next window
            if held is not None:
                take(*held)
            held = (where, window_future)
        if held is not None:
            take(*held)
    return scan if state is None else state.finish(scan)


@dataclass
class _Laid:
    """A window's rows laid out as they were read; None: a cell repeats (decided by seq)."""

    window: Window | None


@dataclass
class _Span:
    """The run's steps, the buckets they are cut into and how rows name their key (the first
    item of ``_windows``)."""

    first: int
    last: int
    width: int
    ranks: int
    names: KeyNumbers


def _windows(reader: StoreReader, ref: RunRef, keys: list[str], window_rows: int, bucket_columns: int) -> Iterator[Any]:
    """The run's `_Span`, then its rows a window of steps at a time: (the window's WHERE, its
    columns). Run on the prefetch thread, which alone uses this connection. Windows are whole
    buckets, so no bucket spans two."""
    where = metrics.c.run_id == ref.id
    with reader._connect() as conn:
        reader.store.backend.hold_snapshot(conn)
        low, high, count, low_rank, high_rank = conn.execute(
            sa.select(sa.func.min(metrics.c.step), sa.func.max(metrics.c.step), sa.func.count(),
                      sa.func.min(metrics.c.rank), sa.func.max(metrics.c.rank)).where(where)
        ).one()
        if not count:
            return
        low, high = int(low), int(high)
        width = bucket_width(low, high, bucket_columns) if bucket_columns else 1
        names = KeyNumbers(reader, conn, keys)
        yield _Span(low, high, width, ref.world_size, names)
        ranks = (int(low_rank), int(high_rank))
        layer = len(keys) * (ranks[1] - ranks[0] + 1)  # cells of a step
        # dense (a training's steps and ranks): windows laid out as read, in a grid of their cells
        grid = not names.by_name and layer * (high - low + 1) <= 4 * int(count) + 1024
        span = max(1, GRID_WINDOW_FACTOR * window_rows // layer if grid else (high - low + 1) * window_rows // int(count))
        span = -(-span // width) * width
        named = reader.store.backend.window_ranks(conn, ref.id)  # PostgreSQL: its index serves the windows
        where_ranks = where if named is None else sa.and_(where, metrics.c.rank.in_(named))
        # each window's bounds inclusive and within [low, high]: `start + span` past the last step can
        # pass int64 (steps of microsecond timestamps), which SQLite's driver refuses as a parameter
        windows = [(start, min(start + span - 1, high)) for start in range(low, high + 1, span)]

        def read(bounds: tuple[int, int], conn: sa.Connection) -> tuple[tuple[Any, ...], Any]:
            clauses = (where_ranks, metrics.c.step >= bounds[0], metrics.c.step <= bounds[1])
            if not grid:
                return clauses, _fetch(reader, conn, names, clauses, with_seq=False)
            return clauses, _read(reader, conn, names, clauses, (*bounds, *ranks))

        readers = reader.store.backend.window_readers
        if readers == 1:
            for bounds in windows:
                if (done := read(bounds, conn))[1] is not None:
                    yield done
            return
    # several windows read at once, each on a connection of its own (the backend's window_readers)
    with ThreadPoolExecutor(readers, thread_name_prefix="multirank-logger-read") as fetching, \
            contextlib.ExitStack() as connections:
        own = threading.local()
        opening = threading.Lock()

        def fetch(bounds: tuple[int, int]) -> tuple[tuple[Any, ...], Any]:
            if not hasattr(own, "conn"):
                with opening:
                    own.conn = connections.enter_context(reader._connect())
            return read(bounds, own.conn)

        reading: deque[Future[tuple[tuple[Any, ...], Any]]] = deque()
        for bounds in windows:
            reading.append(fetching.submit(fetch, bounds))
            if len(reading) >= readers:
                if (done := reading.popleft().result())[1] is not None:
                    yield done
        for future in reading:
            if (done := future.result())[1] is not None:
                yield done


def _read(reader: StoreReader, conn: sa.Connection, names: KeyNumbers, where: tuple[Any, ...],
          cells: tuple[int, int, int, int]) -> _Laid | None:
    """A window's rows laid out a chunk at a time as they are read, in the grid of `cells` (the
    window's first and last step, the run's lowest and highest rank); None without a row."""
    reader.check_stopped()  # stopped (Ctrl-C, the page's bound): no window's query starts after
    ranks = cells[2:]
    grid = GridBuilder(len(names.keys), *cells)
    for chunk in _chunks(reader, conn, names, where, with_seq=False):
        if chunk[1].min() < ranks[0] or chunk[1].max() > ranks[1]:  # a rank that came after the pass began
            keep = (chunk[1] >= ranks[0]) & (chunk[1] <= ranks[1])
            chunk = [col[keep] for col in chunk]
        grid.add(*chunk)
        del chunk
    return _Laid(grid.window()) if grid.rows else None


def _chunks(reader: StoreReader, conn: sa.Connection, names: KeyNumbers, where: tuple[Any, ...],
            with_seq: bool) -> Iterator[list[np.ndarray]]:
    """A window's rows as NumPy columns, a chunk at a time: key number, rank, step, value (NaN for
    NULL: a logged NaN)[, seq]; only the keys the pass knows."""
    backend = reader.store.backend
    cols = [metrics.c.rank, metrics.c.step, backend.value_or_nan(metrics.c.value), *([metrics.c.seq] if with_seq else [])]
    types = [np.int64, np.int64, np.float64, *([np.int64] if with_seq else [])]
    if backend.scan_by_key:  # one range read per key along the primary key: no key column read, no CASE
        for number, key in enumerate(names.keys):
            reader.check_stopped()  # and no key's query either
            for chunk in backend.numpy_chunks(conn, sa.select(*cols).where(*where, metrics.c.key == key), types):
                yield [np.full(len(chunk[0]), number, np.int64), *chunk]
        return
    stmt = sa.select(names.column().label("key"), *cols).where(*where)
    for chunk in backend.numpy_chunks(conn, stmt, [object if names.by_name else np.int64, *types]):
        chunk[0], keep = names.numbers(chunk[0])
        yield chunk if keep is None else [col[keep] for col in chunk]


def _fetch(reader: StoreReader, conn: sa.Connection, names: KeyNumbers, where: tuple[Any, ...],
           with_seq: bool) -> Any:
    """A window's rows as NumPy columns: key number, rank, step, value (NaN for NULL: a logged NaN)[, seq]."""
    reader.check_stopped()  # stopped (Ctrl-C, the page's bound): no window's query starts after
    backend = reader.store.backend
    if backend.scan_by_key:
        parts = list(_chunks(reader, conn, names, where, with_seq))
        return [np.concatenate(col) for col in zip(*parts)] if parts else None
    cols = [names.column().label("key"), metrics.c.rank, metrics.c.step, backend.value_or_nan(metrics.c.value)]
    stmt = sa.select(*cols, *([metrics.c.seq] if with_seq else [])).where(*where)
    key_type = object if names.by_name else np.int64
    out = backend.numpy_columns(conn, stmt, [key_type, np.int64, np.int64, np.float64, np.int64][: len(cols) + with_seq])
    if out is None:
        return None
    out[0], keep = names.numbers(out[0])
    return out if keep is None else [col[keep] for col in out]


class _Scan:
    """The pass's state across windows (see scan_run)."""

    def __init__(self, keys: list[str], spread_window: int, depart_spreads: float, span: _Span, buckets: bool) -> None:
        self.keys = keys
        self.names = span.names
        self.steps_by_rank: dict[int, int] = {}
        self.last_by_rank: dict[int, int] = {}
        self.bad = FirstNonFinite()  # by key's index
        self.departures = [DepartureWindows(spread_window, depart_spreads) for _ in keys]
        self.buckets = [BucketBuilder(k, span.first, span.last, span.width, span.ranks) for k in keys] if buckets else None

    def add(self, w: Window, pool: ThreadPoolExecutor) -> None:
        """Take one window's rows; its keys on `pool`'s threads."""
        self.bad.add(w.bad_key.tolist(), w.bad_rank, w.bad_step, w.bad_kind)  # over every stored row, repeats too
        logged = np.asarray(w.logged.any(axis=0))  # (step, rank): any key
        per_rank = logged.sum(axis=0)
        last = len(w.steps) - 1 - np.argmax(logged[::-1], axis=0)
        for r, n, i in zip(w.ranks.tolist(), per_rank.tolist(), last.tolist()):
            if n:
                self.steps_by_rank[r] = self.steps_by_rank.get(r, 0) + n
                self.last_by_rank[r] = max(self.last_by_rank.get(r, int(w.steps[i])), int(w.steps[i]))
        present = np.flatnonzero(w.logged.any(axis=(1, 2))).tolist()
        # the keys are independent: NumPy releases the GIL in the sorts and sums that take the time
        for _ in pool.map(lambda k: self._add_window_key(w, k), present):
            pass

    def _add_window_key(self, w: Window, k: int) -> None:
        if self.buckets is not None:
            mine = w.bad_key == k
            self.buckets[k].add(w.steps, w.ranks, w.grid[k], w.logged[k],
                                (w.bad_rank[mine], w.bad_step[mine], w.bad_kind[mine]))
        self.departures[k].add(w.steps, w.ranks, w.grid[k])

    def finish(self, scan: RunScan) -> RunScan:
        for name, departures in zip(self.keys, self.departures):
            if (steps := departures.result()) is not None:
                scan.per_key[name] = steps
        for built in self.buckets or ():
            if built.any:
                scan.buckets[built.series] = built.summary()
        scan.rank_steps = {r: (self.steps_by_rank[r], self.last_by_rank[r]) for r in sorted(self.steps_by_rank)}
        scan.non_finite = self.bad.items(name=lambda k: self.keys[k])
        return scan
