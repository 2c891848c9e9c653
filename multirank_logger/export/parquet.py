"""Runs as a Hive-partitioned Parquet dataset, for the engines that spread over many machines
(Spark, Trino, DuckDB, Polars, pyarrow): ``multirank-logger export DB --format parquet -o DEST``.

The layout, one folder per table and one ``run_uuid=UUID`` folder per run under it::

    DEST/metrics/run_uuid=<uuid>/part-<token>-00000.parquet   run_id, key, step, rank, value, dtype, seq, time
    DEST/runs/run_uuid=<uuid>/...        the run's row (run_id, name, version, status, world_size, hparams...)
    DEST/attempts/run_uuid=<uuid>/...    its launches
    DEST/ranks/run_uuid=<uuid>/...       its registered ranks (host, pid, status...)
    DEST/decisions/run_uuid=<uuid>/...   DecisionAudit's rows; logs/, step_timing/ likewise
    DEST/alerts/run_uuid=<uuid>/...      what the watch raised during the run (the `alerts` table)
    DEST/findings/run_uuid=<uuid>/...    the run's verdict kept at its end (the `findings` table)

A run is keyed by its UUID (``runs.run_uuid``; one derived for a run from before UUIDs:
``export/run_identity.py``), not by its store's id: many stores (each with a run 1, a store made
again) and many jobs export into one lake and never meet. ``run_id`` in every file is the store's
id of the run (the store's own column name, and the reader's frames'), for joins within one
store's runs; across stores join on ``run_uuid``.

Times are timestamps, UTC, to the microsecond (``timestamp[us, tz=UTC]``; Parquet's
TIMESTAMP(MICROS, adjusted to UTC)): ``time``, ``started_at``, ``ended_at``, ``seen_at``... (the
store keeps them as unix seconds, a float). A lake written before this naming (its files'
``run`` column, times as floats) is refused, not mixed: a reader unions files by their columns.

Every stored row is there once, with the store's columns: ``value`` is the value logged (NaN and
-0.0 included), ``dtype`` what Python type it had (``rows/schema.py``), ``seq`` the rank's call
number (the launch, ``attempt``, in its bits from ``SEQ_ATTEMPT_SHIFT`` up). Read them with any
engine's Hive partitioning (``read_parquet('DEST/metrics/**/*.parquet', hive_partitioning=true)``,
``spark.read.parquet('DEST/metrics')``, ``pl.scan_parquet('DEST/metrics/**/*.parquet', hive_partitioning=True)``).

Sorted for the read users make, one key across ranks and steps: the rows are read a window of
steps at a time (``query/row_windows.py``: memory bounded by the window, not the run) and each
window is sorted by (key, step, rank, seq) and written as row groups of ``ROW_GROUP_ROWS``, so a
key's rows sit together and each row group's min/max of ``key`` lets a reader skip the others.
zstd; the sort makes ``key``, ``step``, ``rank`` and ``time`` runs that cost next to nothing:
``value`` is most of a row's bytes (benchmarks/bench_export.py).

A run exported again (a nightly ``--since``, a run that was still running) replaces exactly its
own files, those of its UUID's folders: the new ones are written first, then the old ones
removed; other runs, of this store or any other, are left as they are. A file appears under its
name only once whole (``export/destination.py``). A lake of the layout before UUIDs
(``runs/run=ID/``) is refused, not mixed: two partition keys in one dataset break every reader.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from multirank_logger._util.prefetch import prefetched
from multirank_logger.errors import ExportFailed
from multirank_logger.export.destination import Destination
from multirank_logger.export.run_identity import run_identity
from multirank_logger.query.long_table import utc_timestamps
from multirank_logger.query.row_windows import metric_schema, run_table, window_orders
from multirank_logger.rows.run_ref import RunRef
from multirank_logger.rows.schema import (
    alerts,
    attempts,
    decisions,
    findings,
    logs,
    ranks,
    runs,
    step_timing,
    verdicts,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from multirank_logger.query.reader import StoreReader

__all__ = ["FILE_ROWS", "PARTITION", "ROW_GROUP_ROWS", "RUN_COLUMN", "WINDOW_ROWS", "ParquetExport",
           "export_parquet"]

#: the Hive partition key of every table: a run's folder is ``run_uuid=<its UUID>``
PARTITION = "run_uuid"
#: the column of every file that holds the store's id of the run
RUN_COLUMN = "run_id"
#: that column's name in lakes written before issue 49 (their times floats): refused in a lake
OLD_RUN_COLUMN = "run"
#: the partition key of the layout before UUIDs (``run=<store id>``): refused in a lake (see the module docstring)
OLD_PARTITION = "run"

#: rows per row group: of a window of `WINDOW_ROWS` sorted by key, a row group spans one or two
#: keys of a 10-key run, so a read of one key skips most (65,536: 0.015 B/row more than 131,072)
ROW_GROUP_ROWS = 65_536
#: rows read, sorted and written at once (two windows in memory: the next is read meanwhile):
#: peak RSS of the export of 5.12M rows 313 MiB at 262,144, ~380 at 524,288, 477 at 1M
WINDOW_ROWS = 524_288
#: rows per file: a new file past this many (several files per run: an engine reads them in parallel)
FILE_ROWS = 8_000_000
#: the run's own tables beside its metrics: (folder, table, its run column)
RUN_TABLES = (
    ("runs", runs, runs.c.id),
    ("attempts", attempts, attempts.c.run_id),
    ("ranks", ranks, ranks.c.run_id),
    ("decisions", decisions, decisions.c.run_id),
    ("logs", logs, logs.c.run_id),
    ("step_timing", step_timing, step_timing.c.run_id),
    ("alerts", alerts, alerts.c.run_id),
    ("findings", findings, findings.c.run_id),
    ("verdicts", verdicts, verdicts.c.run_id),
)
#: the metric rows' order in each window (see the module docstring)
METRIC_ORDER = ("key", "step", "rank", "seq")


@dataclass
class ParquetExport:
    """What an export wrote."""

    destination: str
    runs: list[RunRef] = field(default_factory=list)
    #: metric rows written, per run id
    rows: dict[int, int] = field(default_factory=dict)
    files: int = 0
    bytes: int = 0


def export_parquet(
    reader: StoreReader,
    refs: Iterable[RunRef],
    dest: str,
    *,
    window_rows: int = WINDOW_ROWS,
    progress: Callable[[RunRef, int], None] | None = None,
    **storage_options: Any,
) -> ParquetExport:
    """Write each run of `refs` under `dest` (a directory or an fsspec URL): see the module docstring.

    Args:
        reader: the store.
        refs: the runs (``reader.resolve_run``'s).
        dest: a local directory or an fsspec URL; made when missing.
        window_rows: about how many rows are held at once.
        progress: called with each run and its metric rows once written.
        storage_options: passed to the fsspec filesystem.

    Raises:
        ExportFailed: the destination cannot be written (its URL's secrets left out).
    """
    target = Destination(dest, **storage_options)
    _refuse_old_layout(target)
    _refuse_old_columns(target)
    out = ParquetExport(target.public)
    for ref in refs:
        token = uuid.uuid4().hex[:12]
        partition = f"{PARTITION}={run_identity(ref)}"
        old = {folder: target.files(folder, partition) for folder, _, _ in RUN_TABLES}
        old["metrics"] = target.files("metrics", partition)
        try:
            rows = _write_metrics(reader, ref, target, partition, token, window_rows, out)
            for folder, table, run_column in RUN_TABLES:
                rows_of_run = run_table(reader, table, run_column, ref)
                if PARTITION in rows_of_run.column_names:  # the runs row's UUID: its folder holds it (two would clash)
                    rows_of_run = rows_of_run.drop_columns([PARTITION])
                _write_file(target, (folder, partition, f"part-{token}-00000.parquet"), _with_run(rows_of_run, ref), out)
        except BaseException:
            _remove_written(target, partition, token)  # the earlier export stays whole, never doubled by half of this one
            raise
        for stale in old.values():  # only now: the run is never missing to a reader meanwhile
            target.remove(stale)
        out.runs.append(ref)
        out.rows[ref.id] = rows
        if progress is not None:
            progress(ref, rows)
    return out


def _refuse_old_layout(target: Destination) -> None:
    """A lake of the layout before UUIDs (``runs/run=ID/``) is refused: one dataset of two
    partition keys reads as NULLs or an error in every engine, and its runs' UUIDs are unknown."""
    found = [name for name in target.folders("runs") if name.startswith(f"{OLD_PARTITION}=")]
    if found:
        raise ExportFailed(target.public, f"it holds runs in the layout before run UUIDs ({target.shown('runs', found[0])}, "
                           f"{len(found)} run folder(s)); this export writes runs/{PARTITION}=UUID/",
                           "Export to a new directory (or export the stores those runs came from again into one).")


def _refuse_old_columns(target: Destination) -> None:
    """A lake whose runs' files have the column names before issue 49 (``run``, float times) is
    refused: engines read a dataset by one schema (DuckDB, Polars: the first file's), so its
    runs would read as NULL ``run_id`` or fail on ``time``'s type."""
    import pyarrow.parquet as pq

    for name in target.folders("runs"):
        for path in target.files("runs", name)[:1]:
            with target.errors_told(), target.fs.open(path, "rb") as fp:
                names = pq.read_schema(fp).names
            if OLD_RUN_COLUMN in names and RUN_COLUMN not in names:
                raise ExportFailed(target.public, f"its runs were exported before run_id and UTC timestamps "
                                   f"({target.shown('runs', name)} has a '{OLD_RUN_COLUMN}' column)",
                                   "Export to a new directory (docs/export.md says what changed), or export "
                                   "the stores those runs came from again into one.")
        return  # one run's file tells: every export writes one naming


def _remove_written(target: Destination, partition: str, token: str) -> None:
    """The files of a failed export of one run (those of its `token`), as far as the filesystem lets."""
    for folder in ("metrics", *(name for name, _, _ in RUN_TABLES)):
        with contextlib.suppress(Exception):
            target.remove([path for path in target.files(folder, partition) if f"/part-{token}-" in path])


def _with_run(table: pa.Table, ref: RunRef) -> pa.Table:
    """`table` with the store's run id as its first column, `RUN_COLUMN` (int32, as ``runs.id``),
    and its times as UTC timestamps (``query/long_table.utc_timestamps``)."""
    import pyarrow as pa

    return utc_timestamps(table).add_column(0, pa.field(RUN_COLUMN, pa.int32(), nullable=False),
                                            pa.repeat(pa.scalar(ref.id, pa.int32()), table.num_rows))



def _write_metrics(reader: StoreReader, ref: RunRef, target: Destination, partition: str, token: str, window_rows: int,
                   out: ParquetExport) -> int:
    """The run's metric rows, window by window, into files of about `FILE_ROWS` rows each."""
    import pyarrow.parquet as pq

    # the next window is read and its order found on a thread of its own while this one is taken
    # in order, compressed and written (DuckDB, Arrow and zstd release the GIL): one window more
    # in memory, the work about even between the two
    windows = (_with_run(rows.take(order), ref)
               for rows, order in prefetched(lambda: window_orders(reader, ref, METRIC_ORDER, window_rows)))
    pending = next(windows, None)
    if pending is None:  # a run with no metric row: one empty file, so that every engine finds the columns
        _write_file(target, ("metrics", partition, f"part-{token}-00000.parquet"), _with_run(metric_schema().empty_table(), ref), out)
        return 0
    total = 0
    number = 0
    while pending is not None:
        parts = ("metrics", partition, f"part-{token}-{number:05d}.parquet")
        with target.writing(*parts) as fp, pq.ParquetWriter(fp, pending.schema, **_METRIC_OPTIONS) as writer:
            in_file = 0
            while pending is not None and in_file < FILE_ROWS:
                writer.write_table(pending, row_group_size=ROW_GROUP_ROWS)
                in_file += pending.num_rows
                pending = next(windows, None)
        total += in_file
        out.files += 1
        out.bytes += target.size(*parts)
        number += 1
    return total


def _write_file(target: Destination, parts: tuple[str, ...], table: pa.Table, out: ParquetExport) -> None:
    import pyarrow.parquet as pq

    with target.writing(*parts) as fp:
        pq.write_table(table, fp, **_WRITE_OPTIONS)
    out.files += 1
    out.bytes += target.size(*parts)


#: zstd; statistics for every column (the min/max a reader skips row groups by); no Arrow schema
#: stored: ``key`` (dictionary-encoded in memory) reads back as the string it is, in every engine
_WRITE_OPTIONS: dict[str, Any] = {"compression": "zstd", "write_statistics": True, "store_schema": False}
#: the metrics' encodings: dictionaries for the few-valued columns only (key, rank, dtype: trying one
#: on every column costs bytes and write time), the doubles' bytes split by position
#: (BYTE_STREAM_SPLIT: zstd then finds the exponents alike), step and seq as deltas; what is left is
#: the values themselves, which no encoding removes (bytes per row each: benchmarks/RESULTS.md,
#: "Figures the source cites")
_METRIC_OPTIONS: dict[str, Any] = {
    **_WRITE_OPTIONS,
    "use_dictionary": [RUN_COLUMN, "key", "rank", "dtype"],  # the run id: one value a file, its runs next to nothing
    "column_encoding": {"step": "DELTA_BINARY_PACKED", "seq": "DELTA_BINARY_PACKED",
                        "value": "BYTE_STREAM_SPLIT", "time": "DELTA_BINARY_PACKED"},
}
