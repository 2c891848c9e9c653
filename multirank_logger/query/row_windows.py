"""A run's stored rows as Arrow, a window of steps at a time, in the store's own column types:
what an export (``export/``) writes, with memory bounded by the window, never by the run.

The windows are cut as the report's pass cuts them (``query/run_scan.py``): from the run's step
range and row count, about ``WINDOW_ROWS`` rows each, bounds inclusive, the ranks named where the
backend's index serves only a read that names them (PostgreSQL). Each window is one SELECT in
the order asked, sorted by the engine over that window's rows only.

Also here: a side table's rows of one run, and the Arrow schema of any table of ``rows/schema.py``
(the same types from every backend: SQLite hands back Python values, of no type when all NULL).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from multirank_logger.rows.run_ref import RunRef
from multirank_logger.rows.schema import DTYPE_NAN, DTYPE_NEG_ZERO, metrics

if TYPE_CHECKING:
    import pyarrow as pa

    from multirank_logger.query.reader import StoreReader

__all__ = ["METRIC_COLUMNS", "WINDOW_ROWS", "arrow_schema", "metric_schema", "metric_windows", "run_table",
           "window_orders"]

#: the columns of `metric_windows`' tables
METRIC_COLUMNS = ("key", "step", "rank", "value", "dtype", "seq", "time")
#: rows read at once (about 60 bytes each in Arrow while a window is sorted and written)
WINDOW_ROWS = 1_000_000


def arrow_schema(table: sa.Table, leave_out: Sequence[str] = (), only: Sequence[str] | None = None) -> pa.Schema:
    """The Arrow schema of a table of ``rows/schema.py``: its columns' SQL types as Arrow types
    (``only``: these columns, in this order)."""
    import pyarrow as pa

    fields = []
    for column in table.columns if only is None else [table.c[name] for name in only]:
        if column.name in leave_out:
            continue
        kind = column.type
        if isinstance(kind, sa.Boolean):
            arrow = pa.bool_()
        elif isinstance(kind, sa.SmallInteger):
            arrow = pa.int16()
        elif isinstance(kind, sa.BigInteger):
            arrow = pa.int64()
        elif isinstance(kind, sa.Integer):
            arrow = pa.int32()
        elif isinstance(kind, sa.Float):
            arrow = pa.float64()
        else:
            arrow = pa.string()
        fields.append(pa.field(column.name, arrow, nullable=column.nullable or False))
    return pa.schema(fields)


def metric_schema() -> pa.Schema:
    """The schema of `metric_windows`' tables (``value`` never NULL: a logged NaN is NaN)."""
    schema = arrow_schema(metrics, only=METRIC_COLUMNS)
    return schema.set(schema.get_field_index("value"), schema.field("value").with_nullable(False))


def run_table(reader: StoreReader, table: sa.Table, run_column: sa.Column[Any], ref: RunRef) -> pa.Table:
    """One run's rows of `table` (``WHERE run_column = ref.id``), its run column left out, in the
    Arrow types of `arrow_schema`. For the small tables: runs, attempts, ranks and the side tables."""
    schema = arrow_schema(table, leave_out=(run_column.name,))
    stmt = sa.select(*(table.c[name] for name in schema.names)).where(run_column == ref.id)
    found = reader.fetch_arrow(stmt)
    return _as_schema(found, schema)


def metric_windows(reader: StoreReader, ref: RunRef, order_by: Sequence[str], window_rows: int = WINDOW_ROWS
                   ) -> Iterator[pa.Table]:
    """Run `ref`'s metric rows, a window of steps at a time, each window sorted by `order_by`
    (`window_orders`, each taken in its order)."""
    for rows, order in window_orders(reader, ref, order_by, window_rows):
        yield rows.take(order)


def window_orders(reader: StoreReader, ref: RunRef, order_by: Sequence[str], window_rows: int = WINDOW_ROWS
                  ) -> Iterator[tuple[pa.Table, Any]]:
    """Run `ref`'s metric rows, a window of steps at a time, each with its rows' order by
    `order_by` (``rows.take(order)`` sorts it: a thread of a pipeline may do that apart).

    Columns: key (dictionary-encoded: its strings once per window), step, rank, value, dtype,
    seq, time. ``value`` is the value logged: NaN where NaN was logged (stored as NULL), -0.0
    where -0.0 was (stored as 0.0). No empty window.

    The sort is Arrow's, on integers (the key by its place among the window's sorted keys): an
    ORDER BY on the key's strings took DuckDB 27 times its unsorted read of the same window.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = list(METRIC_COLUMNS)
    schema = metric_schema()
    read_as = arrow_schema(metrics, only=columns)
    where = metrics.c.run_id == ref.id
    with reader._connect() as conn:
        reader.store.backend.hold_snapshot(conn)  # one state of a store still written: every window from it
        low, high, count = conn.execute(
            sa.select(sa.func.min(metrics.c.step), sa.func.max(metrics.c.step), sa.func.count()).where(where)
        ).one()
        if not count:
            return
        low, high = int(low), int(high)
        span = max(1, (high - low + 1) * window_rows // int(count))
        named = reader.store.backend.window_ranks(conn, ref.id)  # PostgreSQL: its index serves the windows
        if named is not None:
            where = sa.and_(where, metrics.c.rank.in_(named))
        for start in range(low, high + 1, span):
            reader.check_stopped()
            # bounds inclusive and within [low, high]: `start + span` may pass int64 (run_scan.py)
            stmt = sa.select(*(metrics.c[name] for name in columns)).where(
                where, metrics.c.step >= start, metrics.c.step <= min(start + span - 1, high)
            )
            window = _as_schema(reader.store.backend.fetch_arrow(conn, stmt), read_as)
            if window.num_rows == 0:
                continue
            key = pc.dictionary_encode(window.column("key").combine_chunks())
            value = _as_logged(window.column("value"), window.column("dtype"))
            out = pa.Table.from_arrays([key, *window.columns[1:3], value, *window.columns[4:]],
                                       schema=schema.set(0, pa.field("key", key.type, nullable=False)))
            yield out, _sort_indices(out, key, order_by)


def _as_logged(value: Any, dtype: Any) -> Any:
    """The stored values as logged: NULL (a logged NaN) as NaN, 0.0 of a logged -0.0 as -0.0;
    the column itself where there is neither (most windows: one pass over dtype, no copy)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if value.null_count:
        value = pc.if_else(pc.equal(dtype, DTYPE_NAN), pa.scalar(float("nan")), value)
    negative = pc.equal(dtype, DTYPE_NEG_ZERO)
    if pc.any(negative).as_py():
        value = pc.if_else(negative, pa.scalar(-0.0), value)
    return value


def _sort_indices(table: pa.Table, key: pa.DictionaryArray, order_by: Sequence[str]) -> Any:
    """The rows' order by `order_by`, the key by its place among the sorted dictionary's strings.

    Where every column's range fits in 63 bits together (a window's steps, ranks and seqs span
    little), the columns are packed into one integer and sorted as one (NumPy, a few times faster
    than Arrow's sort on several columns); else Arrow sorts on the columns."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    place = pc.take(pc.rank(key.dictionary, sort_keys="ascending"), key.indices)
    columns = [place if name == "key" else table.column(name) for name in order_by]
    arrays = [np.asarray(c.to_numpy() if isinstance(c, pa.Array) else c.combine_chunks().to_numpy()) for c in columns]
    lows = [int(a.min()) for a in arrays]
    widths = [max(1, (int(a.max()) - low).bit_length()) for a, low in zip(arrays, lows)]
    if sum(widths) <= 63:
        packed = np.zeros(len(arrays[0]), np.uint64)
        for array, low, width in zip(arrays, lows, widths):
            packed <<= np.uint64(width)
            packed |= (array - low).astype(np.uint64)
        return np.argsort(packed)  # unique: (rank, seq, key) is a row's identity, so no tie to keep stable
    by = pa.table({name: column for name, column in zip(order_by, columns)})
    return pc.sort_indices(by, sort_keys=[(name, "ascending") for name in order_by])


def _as_schema(found: pa.Table, schema: pa.Schema) -> pa.Table:
    """`found` in `schema`'s column types (a backend's own integer widths, or no type at all)."""
    import pyarrow as pa

    arrays = []
    for field in schema:
        column = found.column(field.name)
        if column.type != field.type:
            column = column.cast(field.type) if not pa.types.is_null(column.type) else pa.nulls(len(column), field.type)
        arrays.append(column)
    return pa.Table.from_arrays(arrays, schema=schema.remove_metadata()) if arrays else pa.table({})
