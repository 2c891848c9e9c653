"""``multirank-logger export --format parquet|tensorboard``: which runs, and what the command prints.

One run (``--run``, the latest by default), every run (``--all-runs``), or a run and every later
one (``--since RUN``: a nightly job passes the last run it exported, which may have been
running then; the Parquet export replaces that run's files).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from multirank_logger.rows.run_ref import RunRef

if TYPE_CHECKING:
    from multirank_logger.query.reader import StoreReader

__all__ = ["export_runs", "runs_asked"]


def runs_asked(reader: StoreReader, run: str | None = None, all_runs: bool = False, since: str | None = None
               ) -> list[RunRef]:
    """The runs an export writes, in id order.

    Raises:
        LookupFailed: for a run (``run``, ``since``) the store does not hold.
    """
    if not all_runs and since is None:
        return [reader.resolve_run(run)]
    first = reader.resolve_run(since).id if since is not None else 0
    return [reader.resolve_run(i) for i in reader.run_ids() if i >= first]


def export_runs(reader: StoreReader, fmt: str, dest: str, *, run: str | None = None, all_runs: bool = False,
                since: str | None = None) -> Iterator[str]:
    """Export the runs asked (`runs_asked`) as `fmt` (``parquet`` or ``tensorboard``) to `dest`;
    yields the lines to print (the destination without its URL's secrets)."""
    refs = runs_asked(reader, run, all_runs, since)
    if fmt == "parquet":
        from multirank_logger.export.parquet import export_parquet

        done = export_parquet(reader, refs, dest)
        for ref in done.runs:
            yield f"Wrote {done.rows[ref.id]:,} metric rows of {ref.label} (run {ref.id}) to {done.destination}"
        rows = sum(done.rows.values())
        per_row = f", {done.bytes / rows:.2f} B/row" if rows else ""
        yield f"{len(done.runs)} run(s), {done.files} file(s), {done.bytes / 1e6:.1f} MB{per_row} (Parquet, zstd)"
        return
    from multirank_logger.export.tensorboard import export_tensorboard

    tb = export_tensorboard(reader, refs, dest)
    for ref in refs:
        ranks = tb.ranks[ref.id]
        yield (f"Wrote {tb.rows[ref.id]:,} values of {ref.label} (run {ref.id}), {len(ranks)} rank(s), "
               f"to {tb.folders[ref.id]}/ (the run; each rank in rank_K/)")
    yield f"See them with: tensorboard --logdir {tb.destination}"
