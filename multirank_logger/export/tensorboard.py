"""Runs as TensorBoard event files: ``multirank-logger export DB --format tensorboard -o DIR``,
then ``tensorboard --logdir DIR`` shows every rank.

The layout: one folder per run, which is that run's TensorBoard run, and in it one sub-run per
rank::

    DIR/NAME/version_N-1a2b3c4d/events.out.tfevents...   the run: per key and step, over its ranks,
                                                          the median (tag KEY), ranks_min/KEY, ranks_max/KEY
    DIR/NAME/version_N-1a2b3c4d/rank_0/events.out...     rank 0's scalars: each key a tag, at its step
    DIR/NAME/version_N-1a2b3c4d/rank_1/...
    DIR/NAME/version_N-1a2b3c4d/run_uuid                  the run's whole UUID (TensorBoard reads event files only)

Why ranks as sub-runs, not tags: TensorBoard draws one chart per tag with a line per run, so a
key's chart holds every rank of the run, and the run's own line (its ranks' median) among them:
the rank that departs is seen against the others. Ranks as tags (``train_loss/rank_3``) would
be a chart per rank, compared by eye across hundreds. Runs compare by their own line: the run
filter ``-[0-9a-f]{8}$`` keeps the runs' lines alone, ``rank_12$`` one rank of each. (Before,
the median, min and max were three sibling folders, each a pseudo-run beside the ranks.)

StepTimer's measures are there as its series are on the page (``timing:data_s``, ``timing:rss``
...), at the step of the batch they timed: each rank's in its folder, their spread in the run's.

A run's folder is its label plus the first hex digits of its UUID (``export/run_identity.py``),
so two runs never share one: not two stores' ``lightning_logs/version_0``, nor two names that
clean to one folder. A folder of that name that holds another run (its ``run_uuid`` file says
so), or that this export did not write, is left alone: the run goes to ``version_N-<whole UUID>``.

A run exported again replaces its folder, never appends to it: the run is written into a hidden
folder beside it (``.version_N-1a2b3c4d.tmp-<token>``), then the old folder is moved aside, the
new one moved in, and the old one removed (a live TensorBoard may list the hidden one meanwhile).

The median, min and max are written for a run of two or more ranks (of one, they are the rank's).

The rows are read a window of steps at a time (``query/row_windows.py``), so memory does not
grow with the run; StepTimer's rows of the same steps are read with each window, so that every
event file's steps only grow, as a training's own writer leaves them (TensorBoard's EventAccumulator
keeps steps out of order in these files; readers of the older file version purge past a step
that goes back, and a chart's points read in step order).
A step's values of one rank go in one event, at the wall time of its call. A value is kept as
TensorBoard keeps scalars (float32). Written with TensorBoard's own event writer
(``pip install tensorboard``, the ``tensorboard`` extra).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from multirank_logger.errors import ExportFailed, MissingExtra
from multirank_logger.export.destination import Destination
from multirank_logger.export.run_identity import run_identity, short_identity
from multirank_logger.query.row_windows import metric_windows
from multirank_logger.query.side_tables import TIMING_MEASURES
from multirank_logger.rows.run_ref import RunRef
from multirank_logger.rows.schema import step_timing

if TYPE_CHECKING:
    import pyarrow as pa

    from multirank_logger.query.reader import StoreReader

__all__ = ["IDENTITY_FILE", "RUN_EVENTS", "SPREAD_TAGS", "WINDOW_ROWS", "TensorBoardExport", "export_tensorboard"]

#: rows read at once: each becomes Python objects on the way to its event (~100 B a row held)
WINDOW_ROWS = 131_072
#: the run's own event folder (its TensorBoard run), relative to the run's folder: the folder itself
RUN_EVENTS = ""
#: the tag of a key's median, min and max over the ranks in the run's events ({} the key)
SPREAD_TAGS = {"median": "{}", "min": "ranks_min/{}", "max": "ranks_max/{}"}
#: the file in a run's folder that holds its whole UUID: whose the folder is, at the next export
IDENTITY_FILE = "run_uuid"


@dataclass
class TensorBoardExport:
    """What an export wrote: per run, its folder and the ranks written."""

    destination: str
    folders: dict[int, str] = field(default_factory=dict)
    ranks: dict[int, list[int]] = field(default_factory=dict)
    rows: dict[int, int] = field(default_factory=dict)


def export_tensorboard(reader: StoreReader, refs: Iterable[RunRef], dest: str, *, window_rows: int = WINDOW_ROWS
                       ) -> TensorBoardExport:
    """Write each run of `refs` under the local directory `dest`: see the module docstring.

    Raises:
        MissingExtra: tensorboard is not installed.
        ExportFailed: `dest` is a remote URL, or cannot be written.
    """
    try:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter  # noqa: F401
    except ImportError:
        raise MissingExtra("TensorBoard exports", "tensorboard", "tensorboard") from None
    target = Destination(dest)
    if not target.local:
        raise ExportFailed(target.public, "TensorBoard's event files are written to a local directory",
                           "Export to a local DIR, then copy it (TensorBoard reads s3:// and gs:// logdirs itself).")
    out = TensorBoardExport(target.public)
    for ref in refs:
        folder = _run_folder(Path(target.root), ref)
        with _replacing(folder) as staging:
            (staging / IDENTITY_FILE).write_text(run_identity(ref) + "\n", encoding="utf-8")
            rows, ranks = _write_run(reader, ref, staging, window_rows)
        out.folders[ref.id] = str(folder)
        out.ranks[ref.id] = ranks
        out.rows[ref.id] = rows
    return out


def _run_folder(root: Path, ref: RunRef) -> Path:
    """The run's own folder under `root`: its label, the last part followed by its short UUID;
    the whole UUID where that name is taken by anything but this run (see the module docstring)."""
    *parents, last = _safe_parts(ref.label)
    for suffix in (short_identity(ref), run_identity(ref)):
        folder = root.joinpath(*parents, f"{last}-{suffix}")
        if not folder.exists() or _holds_run(folder, ref):
            return folder
    raise ExportFailed(str(folder), "it exists and holds something other than this run's export",
                       "Move it away, or export to another directory.")


def _holds_run(folder: Path, ref: RunRef) -> bool:
    """Whether `folder` is an earlier export of this run (its identity file names the run's UUID)."""
    try:
        return (folder / IDENTITY_FILE).read_text(encoding="utf-8").strip() == run_identity(ref)
    except (OSError, UnicodeDecodeError):
        return False


@contextlib.contextmanager
def _replacing(folder: Path) -> Iterator[Path]:
    """A hidden folder beside `folder` to write the run into; once the block ends without an
    error, it takes `folder`'s place (the old one moved aside first, then removed); on an error
    it is removed and `folder` left as it was."""
    token = uuid.uuid4().hex[:12]
    staging = folder.with_name(f".{folder.name}.tmp-{token}")
    aside = folder.with_name(f".{folder.name}.old-{token}")
    try:
        os.makedirs(staging)
    except OSError as exc:
        raise ExportFailed(str(folder), exc.strerror or type(exc).__name__, "Pass a directory you can write to.") from None
    try:
        yield staging
        # rename() cannot replace a folder that holds files: the old one steps aside first
        had_old = folder.exists()
        if had_old:
            os.rename(folder, aside)
        try:
            os.rename(staging, folder)
        except OSError:
            if had_old:
                os.rename(aside, folder)  # the earlier export back in place
            raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def _write_run(reader: StoreReader, ref: RunRef, folder: Path, window_rows: int) -> tuple[int, list[int]]:
    """One run's rows into `folder` (the spread) and `folder`/rank_K/; (metric rows, the ranks written)."""
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writers: dict[str, Any] = {}

    def writer(name: str) -> Any:
        if name not in writers:
            try:
                os.makedirs(folder / name, exist_ok=True)
            except OSError as exc:
                raise ExportFailed(str(folder / name), exc.strerror or type(exc).__name__,
                                   "Pass a directory you can write to.") from None
            writers[name] = EventFileWriter(str(folder / name), max_queue_size=1024, flush_secs=30)
        return writers[name]

    rows = 0
    ranks: set[int] = set()
    try:
        for window, metric_rows in _windows(reader, ref, window_rows):
            rows += metric_rows
            ranks.update(_write_ranks(window, writer))
            if ref.world_size > 1 or len(ranks) > 1:
                _write_spread(window, writer)
    finally:
        for events in writers.values():
            events.close()
    return rows, sorted(ranks)


def _windows(reader: StoreReader, ref: RunRef, window_rows: int) -> Iterator[tuple[pa.Table, int]]:
    """The run's metric rows a window of steps at a time, each with StepTimer's rows up to its last
    step (``timing:COLUMN`` keys), sorted by (rank, step): (rank, step, key, value, time) and the
    window's metric rows."""
    import pyarrow as pa
    import pyarrow.compute as pc

    # StepTimer's rows of each window's steps are a query of their own (a range of the (run_id, step)
    # index, schema 0015; DuckDB's zone maps): a run without StepTimer asks once, here
    timed = reader.fetch_arrow(sa.select(step_timing.c.rank).where(step_timing.c.run_id == ref.id).limit(1)).num_rows > 0
    done: int | None = None  # the last step whose timing rows are written
    for window in metric_windows(reader, ref, ("rank", "step", "seq"), window_rows):
        high = pc.max(window.column("step")).as_py()
        rows = window.select(["rank", "step", "key", "value", "time"])
        rows = rows.set_column(2, "key", rows.column("key").cast(pa.string()))
        if not timed:
            yield rows, window.num_rows
            continue
        timing = _timing_rows(reader, ref, done, high)
        done = high
        if timing.num_rows:
            both = pa.concat_tables([rows, timing], promote_options="permissive")
            rows = both.take(pc.sort_indices(both, [("rank", "ascending"), ("step", "ascending")]))  # stable: seq's order kept
        yield rows, window.num_rows
    timing = _timing_rows(reader, ref, done, None) if timed else None
    if timing is not None and timing.num_rows:  # the steps past the last metric's (or a run with StepTimer's rows alone)
        yield timing.take(pc.sort_indices(timing, [("rank", "ascending"), ("step", "ascending")])), 0


def _timing_rows(reader: StoreReader, ref: RunRef, after: int | None, upto: int | None) -> pa.Table:
    """StepTimer's rows of the run with a step in (`after`, `upto`] (None: unbounded), as long
    rows (rank, step, key ``timing:COLUMN``, value, time): one per measure it holds."""
    import pyarrow as pa

    found = reader.fetch_arrow(_timing_select(ref, after, upto))
    parts = []
    for name in TIMING_MEASURES:
        value = found.column(name).cast(pa.float64())
        keep = value.is_valid()
        part = pa.table({"rank": found.column("rank").cast(pa.int32()), "step": found.column("step").cast(pa.int64()),
                         "value": value, "time": found.column("time").cast(pa.float64())}).filter(keep)
        parts.append(part.add_column(2, "key", pa.repeat(pa.scalar(f"timing:{name}"), part.num_rows)))
    return pa.concat_tables(parts)


def _timing_select(ref: RunRef, after: int | None, upto: int | None) -> sa.Select[Any]:
    """The read of `_timing_rows`: a range of the (run_id, step) index on SQLite and PostgreSQL."""
    where = [step_timing.c.run_id == ref.id]
    if after is not None:
        where.append(step_timing.c.step > after)
    if upto is not None:
        where.append(step_timing.c.step <= upto)
    columns = [sa.cast(step_timing.c[name], sa.Float(53)).label(name) for name in TIMING_MEASURES]
    return (sa.select(step_timing.c.rank, step_timing.c.step, step_timing.c.time, *columns)
            .where(*where).order_by(step_timing.c.rank, step_timing.c.seq))


def _write_ranks(window: pa.Table, writer: Any) -> set[int]:
    """Each (rank, step) of the window (sorted by rank, step) as one event of its keys."""
    columns = window.select(["rank", "step", "key", "value", "time"]).to_pydict()
    rank, step, key, value, time = (columns[name] for name in ("rank", "step", "key", "value", "time"))
    start = 0
    for i in range(1, len(rank) + 1):
        if i == len(rank) or rank[i] != rank[start] or step[i] != step[start]:
            writer(f"rank_{rank[start]}").add_event(_event(step[start], time[i - 1], key[start:i], value[start:i]))
            start = i
    return set(rank)


def _write_spread(window: pa.Table, writer: Any) -> None:
    """Per step of the window, one event in the run's own events: each key's median, min and max
    over its ranks (NaN left out), under `SPREAD_TAGS`."""
    df = window.select(["step", "key", "value", "time"]).to_pandas()
    stats = df.groupby(["step", "key"], sort=True, observed=True).agg(
        median=("value", "median"), min=("value", "min"), max=("value", "max"), time=("time", "max")
    )
    steps = stats.index.get_level_values(0).tolist()
    keys = stats.index.get_level_values(1).tolist()
    times = stats["time"].tolist()
    spread = {name: stats[name].tolist() for name in SPREAD_TAGS}
    start = 0
    for i in range(1, len(steps) + 1):
        if i == len(steps) or steps[i] != steps[start]:
            tags = [tag.format(k) for tag in SPREAD_TAGS.values() for k in keys[start:i]]
            values = [v for name in SPREAD_TAGS for v in spread[name][start:i]]
            writer(RUN_EVENTS).add_event(_event(steps[start], times[i - 1], tags, values))
            start = i


def _event(step: int, wall_time: float, keys: list[str], values: list[float]) -> Any:
    from tensorboard.compat.proto import event_pb2, summary_pb2

    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in zip(keys, values)])
    return event_pb2.Event(wall_time=wall_time, step=step, summary=summary)


def _safe_parts(label: str) -> list[str]:
    """A run's label as folders: no part that climbs out of DIR or hides (``..``, ``.x``)."""
    return [re.sub(r"^\.+", "_", part) or "_" for part in label.split("/")]
