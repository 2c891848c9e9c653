"""The `multirank-logger` command: a thin layer over the store and the query module.

Each command parses its arguments, calls the library, and prints. Library errors
become one `Error: ...` line (click.ClickException), never a traceback.
"""

from __future__ import annotations

import functools
import io
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from multirank_logger._version import __version__
from multirank_logger.errors import MultiRankLoggerError
from multirank_logger.store import Store, head_revision

__all__ = ["main"]

F = TypeVar("F", bound=Callable[..., Any])


def _friendly_errors(fn: F) -> F:
    """Turn our errors (and a database driver's) into one clear `Error:` line."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except MultiRankLoggerError as exc:
            raise click.ClickException(str(exc)) from exc

    return wrapper  # type: ignore[return-value]


@click.group()
@click.version_option(__version__, prog_name="multirank-logger")
def main() -> None:
    """Every rank's metrics from Lightning DDP runs, in one SQL store."""


@main.group()
def db() -> None:
    """Schema of a store: its revision, and upgrades."""


@db.command("upgrade")
@click.argument("db_path", metavar="DB")
@_friendly_errors
def db_upgrade(db_path: str) -> None:
    """Bring the store DB to the schema this version needs (creates it when missing)."""
    store = Store.for_upgrade(db_path)
    before = store.current_revision()
    store.upgrade("head")
    after = store.current_revision()
    store.close()
    if before == after:
        click.echo(f"{db_path} is already at {after} (head).")
    else:
        click.echo(f"Upgraded {db_path} from {before or 'empty'} to {after} (head).")


@db.command("current")
@click.argument("db_path", metavar="DB")
@_friendly_errors
def db_current(db_path: str) -> None:
    """Print the store's schema revision, and whether it is this version's head."""
    store = Store.for_upgrade(db_path)
    found = store.current_revision()
    store.close()
    head = head_revision()
    state = "head" if found == head else f"behind head {head}" if found else "empty"
    click.echo(f"{found or '(none)'} ({state})")


@main.command("import")
@click.argument("db_path", metavar="DB")
@click.argument("files", metavar="FILE...", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@_friendly_errors
def import_spills(db_path: str, files: tuple[str, ...]) -> None:
    """Merge spill files (rows a rank could not send to rank 0) into the store DB.

    Importing a file again adds nothing again.
    """
    from multirank_logger.spill import import_spill  # the CLI's other commands never need it

    store = Store(db_path)
    try:
        for path in files:
            r = import_spill(store, path)
            run = f"run {r.name}/version_{r.version}, rank {r.rank}"
            if r.already_imported:
                click.echo(f"{path}: already imported ({run}); nothing added.")
            else:
                skipped = f" ({r.rows_skipped} already in the store)" if r.rows_skipped else ""
                click.echo(f"{path}: added {r.rows_added} rows to {run}{skipped}.")
    finally:
        store.close()


# -- reading a store: runs, export, ranks, sql (all read-only, over query.py) ------------

from multirank_logger.query import RankSpread, StoreReader, open_store  # noqa: E402

_TABLE_ROWS = 10  # rows shown by `ranks` before it elides the middle


def _frame_text(df: Any, index: bool = True, max_rows: int | None = None) -> str:
    """A DataFrame as a terminal table (pandas' own layout, wide enough not to wrap)."""
    return df.to_string(index=index, max_rows=max_rows, line_width=None)


def _duration(seconds: float) -> str:
    if seconds != seconds:  # NaN: not ended, nothing logged yet
        return "-"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


@main.command("runs")
@click.argument("db_path", metavar="DB")
@_friendly_errors
def runs_cmd(db_path: str) -> None:
    """List the runs in DB: status, ranks, start, duration, steps and keys."""
    with open_store(db_path) as reader:
        df = reader.runs()
        orphans = reader.orphans()
    for run_id, rows in orphans:
        # rows written under an identity this store never allocated: a rank that took itself for
        # rank 0 somewhere else (see run_lifecycle.py); they belong to no run shown below
        click.echo(f"Warning: {rows} metric row(s) under run id {run_id}, which has no runs row (orphans).", err=True)
    if df.empty:
        click.echo(f"No runs in {db_path}.")
        return
    df = df.drop(columns=["name", "version"])
    df["started"] = df["started"].dt.tz_convert(None).dt.strftime("%Y-%m-%d %H:%M:%S")
    df["duration_s"] = df["duration_s"].map(_duration)
    names = {"duration_s": "duration", "world_size": "ranks", "started": "started (UTC)"}
    click.echo(_frame_text(df.rename(columns=names), index=False))


@main.command("export")
@click.argument("db_path", metavar="DB")
@click.option("--run", default=None, help="Run id or NAME/version_N (default: the latest run).")
@click.option("--rank", type=int, default=None, help="The rank to export (default: 0).")
@click.option("--all-ranks", is_flag=True, help="Export every rank to DIR/metrics_rank_{k}.csv (needs -o DIR).")
@click.option(
    "-o", "--output", type=click.Path(), default=None, help="File (or directory with --all-ranks); default stdout."
)
@_friendly_errors
def export_cmd(db_path: str, run: str | None, rank: int | None, all_ranks: bool, output: str | None) -> None:
    """Write a rank's metrics in CSVLogger's metrics.csv layout, byte for byte."""
    if all_ranks and rank is not None:
        raise click.UsageError("Pass --rank K or --all-ranks, not both.")
    if all_ranks and output is None:
        raise click.UsageError("--all-ranks writes one file per rank: pass -o DIR.")
    with open_store(db_path) as reader:
        ref = reader.resolve_run(run)
        if all_ranks:
            folder = Path(output)  # type: ignore[arg-type]
            folder.mkdir(parents=True, exist_ok=True)
            for k in reader.ranks(ref.id):
                _export_one(reader, ref.id, ref.label, k, str(folder / f"metrics_rank_{k}.csv"))
        elif output is None:
            # the csv module writes its own "\r\n": no newline translation on the way out
            stream = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", newline="")
            reader.write_csv(stream, ref.id, rank or 0)
            stream.flush()
            stream.detach()
        else:
            _export_one(reader, ref.id, ref.label, rank or 0, output)


def _export_one(reader: StoreReader, run_id: int, label: str, rank: int, path: str) -> None:
    count = reader.export_csv(path, run_id, rank)
    if count:
        click.echo(f"Wrote {count} rows of rank {rank} ({label}) to {path}")
    else:
        click.echo(f"Rank {rank} of {label} logged nothing; no {path} written (CSVLogger writes none).")


@main.command("ranks")
@click.argument("db_path", metavar="DB")
@click.argument("key")
@click.option("--run", default=None, help="Run id or NAME/version_N (default: the latest run).")
@click.option("--all", "all_steps", is_flag=True, help=f"Print every step, not the first and last {_TABLE_ROWS // 2}.")
@click.option("--format", "fmt", type=click.Choice(["table", "csv"]), default="table", show_default=True,
              help="csv: the whole step x rank table, for other tools.")  # fmt: skip
@_friendly_errors
def ranks_cmd(db_path: str, key: str, run: str | None, all_steps: bool, fmt: str) -> None:
    """Show KEY per rank (step x rank) and how far the ranks spread."""
    with open_store(db_path) as reader:
        spread = reader.rank_spread(key, run)
    if fmt == "csv":
        click.echo(spread.table.to_csv(), nl=False)
        return
    click.echo(_spread_text(spread, None if all_steps else _TABLE_ROWS))


def _spread_text(s: RankSpread, max_rows: int | None) -> str:
    table = s.table.rename(columns=lambda r: f"rank {r}")
    lines = [
        f"{s.key} in {s.run.label} (run {s.run.id}): {table.shape[1]} ranks, {table.shape[0]} steps",
        "",
        _frame_text(table, max_rows=max_rows),
        "",
        _frame_text(s.summary.rename(columns={"from_median": "|x - median|"})),
        "",
    ]
    if s.spread_max_step is not None and table.shape[1] > 1:
        lines.append(
            f"Spread across ranks (max - min at a step): mean {s.spread_mean:.6g}, "
            f"largest {s.spread_max:.6g} at step {s.spread_max_step}."
        )
    if s.standout is not None:
        dist = s.summary["from_median"]
        lines.append(
            f"Rank {s.standout} stands out: {dist[s.standout]:.6g} from the per-step median of the ranks "
            f"on average, {s.ratio:.3g}x the other ranks' ({dist.drop(s.standout).median():.6g})."
        )
    elif s.farthest is not None:
        lines.append(
            f"No rank stands out: the farthest from the per-step median, rank {s.farthest}, is "
            f"{s.ratio:.3g}x the other ranks' distance (a rank stands out at {s.STANDOUT_RATIO:g}x)."
        )
    elif table.shape[1] > 1:
        lines.append("No rank stands out: the ranks agree at every step.")
    return "\n".join(lines)


@main.command("sql")
@click.argument("db_path", metavar="DB")
@click.argument("query")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True)
@_friendly_errors
def sql_cmd(db_path: str, query: str, fmt: str) -> None:
    """Run a read-only QUERY on DB; a statement that writes is refused and changes nothing."""
    with open_store(db_path) as reader:
        df = reader.sql(query)
    if fmt == "csv":
        click.echo(df.to_csv(index=False, lineterminator="\n"), nl=False)
    elif fmt == "json":
        click.echo(df.to_json(orient="records", force_ascii=False))
    elif df.columns.empty:
        click.echo("(no result)")
    else:
        click.echo(_frame_text(df, index=False))
