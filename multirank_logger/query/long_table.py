"""The long table of a run (``StoreReader.metrics``) built in Arrow, then handed over as the
caller asks: a ``pyarrow.Table``, a ``polars.DataFrame`` (from the Arrow buffers, no copy through
pandas) or a pandas DataFrame (as it always was).

A value a later launch logged again for the same (rank, key, step) supersedes the earlier one
(``StoreReader.metrics``): found with Arrow's own group-by and join, not pandas'.
"""

from __future__ import annotations

from typing import Any

from multirank_logger.errors import MissingExtra
from multirank_logger.rows.schema import DTYPE_NEG_ZERO, SEQ_ATTEMPT_SHIFT

__all__ = ["FRAMES", "TIME_COLUMNS", "as_frame", "long_table", "utc_timestamps"]

#: what ``frame=`` takes
FRAMES = ("pandas", "arrow", "polars")
#: the store's unix-time columns (seconds, a float), handed out as UTC timestamps to the microsecond
TIME_COLUMNS = frozenset({"time", "started_at", "ended_at", "seen_at", "found_at", "imported_at", "recorded_at",
                          "last_time"})


def long_table(found: Any, all_attempts: bool) -> Any:
    """`found` (the metrics columns, sorted by rank, seq) with ``value`` as logged (NaN, -0.0) and
    ``attempt``, ``time`` as a UTC timestamp; without superseded rows unless `all_attempts`. A pyarrow Table."""
    import pyarrow as pa
    import pyarrow.compute as pc

    value = pc.fill_null(found.column("value").cast(pa.float64()), float("nan"))
    value = pc.if_else(pc.equal(found.column("dtype").cast(pa.int16()), DTYPE_NEG_ZERO), pa.scalar(-0.0), value)
    table = utc_timestamps(found.set_column(found.schema.get_field_index("value"), "value", value))
    seq = table.column("seq").cast(pa.int64())
    table = table.append_column("attempt", pc.shift_right(seq, SEQ_ATTEMPT_SHIFT))
    if all_attempts or table.num_rows == 0 or pc.max(table.column("attempt")).as_py() == 0:
        return table
    latest = table.group_by(["rank", "key", "step"]).aggregate([("attempt", "max")])
    joined = table.join(latest, keys=["rank", "key", "step"])
    kept = joined.filter(pc.equal(joined.column("attempt"), joined.column("attempt_max")))
    return kept.select(table.column_names).sort_by([("rank", "ascending"), ("seq", "ascending")])


def utc_timestamps(table: Any) -> Any:
    """`table` (pyarrow) with each of its `TIME_COLUMNS` that is a float (unix seconds) as
    ``timestamp[us, tz=UTC]``, rounded to the microsecond (a float's seconds near 2026 hold about
    a quarter of one): the Parquet export's files and the long table's frames."""
    import pyarrow as pa
    import pyarrow.compute as pc

    utc = pa.timestamp("us", tz="UTC")
    for i, field in enumerate(table.schema):
        if field.name in TIME_COLUMNS and pa.types.is_floating(field.type):
            micros = pc.round(pc.multiply(table.column(i), 1e6)).cast(pa.int64())
            table = table.set_column(i, field.with_type(utc), micros.cast(utc))
    return table


def as_frame(table: Any, frame: str) -> Any:
    """`table` (pyarrow) as `frame`: ``"arrow"`` itself, ``"polars"``, ``"pandas"``.

    Raises:
        ValueError: for another `frame`.
        MissingExtra: polars is not installed.
    """
    if frame == "arrow":
        return table
    if frame == "polars":
        try:
            import polars as pl
        except ImportError:
            raise MissingExtra("Polars frames", "polars", "polars") from None
        return pl.from_arrow(table, rechunk=False)
    if frame == "pandas":
        return table.to_pandas()
    raise ValueError(f"frame={frame!r}: pass one of {', '.join(map(repr, FRAMES))}.")
