"""Runs as TensorBoard event files, one directory per rank: ``multirank-logger export DB
--format tensorboard -o DIR``, then ``tensorboard --logdir DIR`` shows every rank.

The layout: a folder per run, then one per rank (each one of TensorBoard's "runs", so a key's
chart holds every rank)::

    DIR/NAME/version_N-1a2b3c4d/rank_0/events.out.tfevents...   rank 0's scalars: each key a tag, at its step
    DIR/NAME/version_N-1a2b3c4d/rank_1/...
    DIR/NAME/version_N-1a2b3c4d/ranks_median/  ranks_min/  ranks_max/   per key and step, over the ranks
    DIR/NAME/version_N-1a2b3c4d/run_uuid      the run's whole UUID (TensorBoard reads event files only)

A run's folder is its label plus the first hex digits of its UUID (``export/run_identity.py``),
so two runs never share one: not two stores' ``lightning_logs/version_0``, nor two names that
clean to one folder. A folder of that name that holds another run (its ``run_uuid`` file says
so), or that this export did not write, is left alone: the run goes to ``version_N-<whole UUID>``.

A run exported again replaces its folder, never appends to it: the run is written into a hidden
folder beside it (``.version_N-1a2b3c4d.tmp-<token>``), then the old folder is moved aside, the
new one moved in, and the old one removed (a live TensorBoard may list the hidden one meanwhile).

The median and min/max series are written for a run of two or more ranks: at hundreds of ranks,
TensorBoard's run filter ``ranks_`` shows the spread alone, and ``rank_12$`` the one rank it
points at.

The rows are read a window of steps at a time (``query/row_windows.py``), so memory does not
grow with the run. A step's values of one rank go in one event, at the wall time of its call.
A value is kept as TensorBoard keeps scalars (float32). Written with TensorBoard's own event
writer (``pip install tensorboard``, the ``tensorboard`` extra).
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

from multirank_logger.errors import ExportFailed, MissingExtra
from multirank_logger.export.destination import Destination
from multirank_logger.export.run_identity import run_identity, short_identity
from multirank_logger.model.run_ref import RunRef
from multirank_logger.query.row_windows import metric_windows

if TYPE_CHECKING:
    import pyarrow as pa

    from multirank_logger.query.reader import StoreReader

__all__ = ["IDENTITY_FILE", "SPREAD_SERIES", "WINDOW_ROWS", "TensorBoardExport", "export_tensorboard"]

#: rows read at once: each becomes Python objects on the way to its event (~100 B a row held)
WINDOW_ROWS = 131_072
#: the folders of the ranks' spread, beside rank_K/
SPREAD_SERIES = ("ranks_median", "ranks_min", "ranks_max")
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
                       ) -> TensorBoardExport:  # fmt: skip
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
                           "Export to a local DIR, then copy it (TensorBoard reads s3:// and gs:// logdirs itself).")  # fmt: skip
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
                       "Move it away, or export to another directory.")  # fmt: skip


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
    """One run's rows into `folder`/rank_K/ and the spread folders; (rows, the ranks written)."""
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writers: dict[str, Any] = {}

    def writer(name: str) -> Any:
        if name not in writers:
            try:
                os.makedirs(folder / name, exist_ok=True)
            except OSError as exc:
                raise ExportFailed(str(folder / name), exc.strerror or type(exc).__name__,
                                   "Pass a directory you can write to.") from None  # fmt: skip
            writers[name] = EventFileWriter(str(folder / name), max_queue_size=1024, flush_secs=30)
        return writers[name]

    rows = 0
    ranks: set[int] = set()
    try:
        for window in metric_windows(reader, ref, ("rank", "step", "seq"), window_rows):
            rows += window.num_rows
            ranks.update(_write_ranks(window, writer))
            if ref.world_size > 1 or len(ranks) > 1:
                _write_spread(window, writer)
    finally:
        for events in writers.values():
            events.close()
    return rows, sorted(ranks)


def _write_ranks(window: pa.Table, writer: Any) -> set[int]:
    """Each (rank, step) of the window (sorted by rank, step, seq) as one event of its keys."""
    columns = window.select(["rank", "step", "key", "value", "time"]).to_pydict()
    rank, step, key, value, time = (columns[name] for name in ("rank", "step", "key", "value", "time"))
    start = 0
    for i in range(1, len(rank) + 1):
        if i == len(rank) or rank[i] != rank[start] or step[i] != step[start]:
            writer(f"rank_{rank[start]}").add_event(_event(step[start], time[i - 1], key[start:i], value[start:i]))
            start = i
    return set(rank)


def _write_spread(window: pa.Table, writer: Any) -> None:
    """Per (key, step) of the window, the median, min and max over its ranks (NaN left out)."""
    df = window.select(["step", "key", "value", "time"]).to_pandas()
    stats = df.groupby(["step", "key"], sort=True, observed=True).agg(
        ranks_median=("value", "median"), ranks_min=("value", "min"), ranks_max=("value", "max"), time=("time", "max")
    )
    steps = stats.index.get_level_values(0).tolist()
    keys = stats.index.get_level_values(1).tolist()
    times = stats["time"].tolist()
    for name in SPREAD_SERIES:
        values = stats[name].tolist()
        start = 0
        for i in range(1, len(steps) + 1):
            if i == len(steps) or steps[i] != steps[start]:
                writer(name).add_event(_event(steps[start], times[i - 1], keys[start:i], values[start:i]))
                start = i


def _event(step: int, wall_time: float, keys: list[str], values: list[float]) -> Any:
    from tensorboard.compat.proto import event_pb2, summary_pb2

    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in zip(keys, values)])
    return event_pb2.Event(wall_time=wall_time, step=step, summary=summary)


def _safe_parts(label: str) -> list[str]:
    """A run's label as folders: no part that climbs out of DIR or hides (``..``, ``.x``)."""
    return [re.sub(r"^\.+", "_", part) or "_" for part in label.split("/")]
