"""The `multirank-logger` command: a thin layer over the store, the query side and the report.

Each command parses its arguments, calls the library, and prints. Library errors
become one `Error: ...` line (click.ClickException), never a traceback.
"""

from __future__ import annotations

import datetime
import functools
import io
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from multirank_logger._util.readable import times_as_times
from multirank_logger._version import __version__
from multirank_logger.errors import MultiRankLoggerError, SchemaTooNew, SpillsDamaged

# SQLAlchemy, pyarrow and the query modules are most of a cold command's start, and `hosts` needs
# none of them (tests/project/test_import_set.py): each command imports what it reads with
if TYPE_CHECKING:
    from multirank_logger.query.reader import StoreReader

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
    from multirank_logger.store.backends import public_name
    from multirank_logger.store.sql_store import Store, is_known_revision

    store = Store.for_upgrade(db_path)
    before = store.current_revision()
    if before is not None and not is_known_revision(before):
        store.close()  # before Alembic: it fails on a revision it cannot find, with a 36-frame traceback
        raise SchemaTooNew(public_name(db_path), before, __version__)
    store.upgrade("head")
    after = store.current_revision()
    store.close()
    if before == after:
        click.echo(f"{public_name(db_path)} is already at {after} (head).")
    else:
        click.echo(f"Upgraded {public_name(db_path)} from {before or 'empty'} to {after} (head).")


@db.command("current")
@click.argument("db_path", metavar="DB")
@_friendly_errors
def db_current(db_path: str) -> None:
    """Print the store's schema revision, and whether it is this version's head."""
    from multirank_logger.store.sql_store import Store, head_revision, is_known_revision

    store = Store.for_upgrade(db_path, newer_ok=True, create=False)
    found = store.current_revision()
    store.close()
    head = head_revision()
    if found is not None and not is_known_revision(found):
        state = f"unknown to multirank_logger {__version__}: written by a newer version"
    else:
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
    from multirank_logger.report.findings import holes_said  # the CLI's other commands never need these
    from multirank_logger.store.seq_spans import calls_not_stored
    from multirank_logger.store.spill_import import import_spill
    from multirank_logger.store.sql_store import Store

    # a mistyped path: an error, not an empty store left there; but the store the files' run was
    # logged to, deleted since, is created again (the command a spill prints always works)
    store = Store(db_path, create=_names_their_store(db_path, files))
    reports = []
    try:
        for path in files:
            r = import_spill(store, path)
            reports.append(r)
            run = f"run {r.name}/version_{r.version}, rank {r.rank}"
            if r.already_imported:
                click.echo(f"{path}: already imported ({run}); nothing added.")
            else:
                skipped = f" ({r.rows_skipped} already in the store)" if r.rows_skipped else ""
                click.echo(f"{path}: added {r.rows_added} rows to {run}{skipped}.")
            for part in r.damage:
                click.echo(str(part), err=True)
        # the calls its runs still lack (store/seq_spans.py), one line each (said, not an error)
        for run_id, label in sorted({r.run_id: f"{r.name}/version_{r.version}" for r in reports}.items()):
            with store.begin() as conn:
                holes = calls_not_stored(conn, run_id)
            click.echo("".join(f"run {label}: {line}\n" for line in holes_said(holes)), nl=False)
    finally:
        store.close()
    if damage := [part for r in reports for part in r.damage]:
        raise SpillsDamaged(len(damage), sum(d.values or 0 for d in damage), any(d.values is None for d in damage))


def _names_their_store(db_path: str, files: tuple[str, ...]) -> bool:
    """Whether `db_path` is the store file every one of `files` was spilled from (their header's ``store``)."""
    from multirank_logger.store.spill_file import read_spill_header

    wanted = Path(db_path).expanduser().resolve()
    headers = [read_spill_header(path) for path in files]
    return all(h is not None and h.get("store") and Path(h["store"]).resolve() == wanted for h in headers)


# -- reading a store: runs, export, ranks, sql (all read-only, over query/reader.py) -----


def open_store(db_path: str) -> StoreReader:
    """query/reader.py's `open_store`, imported by the first command that opens one."""
    from multirank_logger.query.reader import open_store as open_reader

    return open_reader(db_path)


_TABLE_ROWS = 10  # rows shown by `ranks` before it elides the middle


def _frame_text(df: Any, index: bool = True, max_rows: int | None = None) -> str:
    """A DataFrame as a terminal table (pandas' own layout, wide enough not to wrap)."""
    return df.to_string(index=index, max_rows=max_rows, line_width=None)


_WHEN = "YYYY-MM-DD[ HH:MM[:SS]], UTC"


@main.command("runs")
@click.argument("db_path", metavar="DB")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True,
              help="csv, json: every column, the run's uuid included (the table leaves it out).")
@click.option("--name", default=None, metavar="PATTERN",
              help="Runs whose name holds PATTERN (any case), or matches it whole as a glob with * and ?.")
@click.option("--status", "statuses", multiple=True, metavar="STATUS",
              help="Runs of this status (repeatable): running, success, failed, interrupted, incomplete.")
@click.option("--since", default=None, metavar="DATE", help=f"Runs started on or after DATE ({_WHEN}).")
@click.option("--until", default=None, metavar="DATE", help=f"Runs started on or before DATE ({_WHEN}; a day: to its end).")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
              help="Runs whose hyperparameter KEY is VALUE (repeatable, all must hold); KEY a nested key's path, "
                   "optimizer.lr, a key holding a dot in quotes, '\"a.b\"'; a string as its text, "
                   "a number as its value (lr=3e-4 matches 0.0003), true/false/null as those words, a list or object as its JSON.")
@click.option("--show-params", default="", metavar="KEY,KEY", help="Add these hyperparameters (paths, as --param's; a key holding a comma in quotes) as columns.")
@_friendly_errors
def runs_cmd(db_path: str, fmt: str, name: str | None, statuses: tuple[str, ...], since: str | None, until: str | None,
             params: tuple[str, ...], show_params: str) -> None:
    """List the runs in DB: status, ranks, start, duration, steps and keys; filter them by name,
    status, start date and hyperparameters."""
    from multirank_logger.query.run_filter import RUN_STATUSES, RunFilter, parse_param, parse_shown, parse_when
    from multirank_logger.report.run_table import runs_data_text, runs_table_text

    try:
        where = RunFilter(name=name, statuses=statuses, params=tuple(map(parse_param, params)),
                          since=None if since is None else parse_when(since),
                          until=None if until is None else parse_when(until, end=True))
        shown = parse_shown(show_params)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if unknown := sorted({s.lower() for s in statuses} - set(RUN_STATUSES)):
        raise click.BadParameter(f"{', '.join(unknown)}: a status is one of {', '.join(RUN_STATUSES)}", param_hint="--status")
    from multirank_logger.store.backends import public_name

    with open_store(db_path) as reader:
        # the table without pandas (its import was most of the command's time); csv, json: its frame
        rows = reader.run_rows(where) if fmt == "table" else []
        df = reader.runs(where) if fmt != "table" else None
        held = reader.hparams([r["id"] for r in rows] if df is None else df["id"]) if shown else {}
        orphans = reader.orphans()
    for run_id, n in orphans:
        # rows written under an identity this store never allocated: a rank that took itself for
        # rank 0 somewhere else (see store/run_lifecycle.py); they belong to no run shown below
        click.echo(f"Warning: {n} metric row(s) under run id {run_id}, which has no runs row (orphans).", err=True)
    if df is not None:
        click.echo(runs_data_text(df, fmt, held, shown), nl=False)
    elif not rows:
        click.echo(f"No runs in {public_name(db_path)}" + (" match these filters." if where else "."))
    else:
        click.echo(runs_table_text(rows, held, shown))


@main.command("export")
@click.argument("db_path", metavar="DB")
@click.option("--run", default=None, help="Run id or NAME/version_N (default: the latest run).")
@click.option("--rank", type=int, default=None, help="The rank to export (default: 0).")
@click.option("--all-ranks", is_flag=True, help="Export every rank to DIR/metrics_rank_{k}.csv (needs -o DIR).")
@click.option(
    "-o", "--output", type=click.Path(allow_dash=True), default=None,
    help="File (or directory with --all-ranks); default (and -o -): standard output."
)
@click.option("--format", "fmt", type=click.Choice(["csv", "parquet", "tensorboard"]), default="csv", show_default=True,
              help="parquet: a Hive-partitioned dataset at -o DIR or URL (s3://...); tensorboard: a TensorBoard run per run, a rank_K/ sub-run per rank.")
@click.option("--all-runs", is_flag=True, help="parquet, tensorboard: every run in DB.")
@click.option("--since", default=None, metavar="RUN", help="parquet, tensorboard: RUN and every later run (a nightly append).")
@_friendly_errors
def export_cmd(db_path: str, run: str | None, rank: int | None, all_ranks: bool, output: str | None, fmt: str,
               all_runs: bool, since: str | None) -> None:
    """Write a rank's metrics in CSVLogger's metrics.csv layout, byte for byte; or runs as Parquet or TensorBoard files."""
    if fmt != "csv" or all_runs or since is not None:
        _export_runs(db_path, fmt, run, all_runs, since, output, rank is not None or all_ranks)
        return
    if all_ranks and rank is not None:
        raise click.UsageError("Pass --rank K or --all-ranks, not both.")
    if all_ranks and output in (None, "-"):
        raise click.UsageError("--all-ranks writes one file per rank: pass -o DIR.")
    output = None if output == "-" else output  # -o -: standard output, as most tools read it
    with open_store(db_path) as reader:
        ref = reader.resolve_run(run)
        if all_ranks:
            folder = Path(output)  # type: ignore[arg-type]
            if folder.exists() and not folder.is_dir():
                raise click.ClickException(f"--all-ranks writes one file per rank into a directory, and {output} "
                                           "is not one: pass a directory's path (made when missing).")
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise click.ClickException(f"Cannot make the directory {output}: {exc.strerror}. "
                                           "Pass a directory you can write.") from None
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


def _export_runs(db_path: str, fmt: str, run: str | None, all_runs: bool, since: str | None, output: str | None,
                 ranks_chosen: bool) -> None:
    """`export --format parquet|tensorboard`: the runs asked for, every rank (export/)."""
    from multirank_logger.export.runs import export_runs

    if fmt == "csv":
        raise click.UsageError("--all-runs and --since export whole runs: pass --format parquet or tensorboard.")
    if ranks_chosen:
        raise click.UsageError(f"--format {fmt} writes every rank: leave out --rank and --all-ranks.")
    if sum((run is not None, all_runs, since is not None)) > 1:
        raise click.UsageError("Pass one of --run, --all-runs and --since.")
    if output is None or output == "-":
        raise click.UsageError(f"--format {fmt} writes a directory: pass -o DIR (parquet: or an fsspec URL, s3://...).")
    from multirank_logger.export.destination import ends_with_process, public_url

    if ends_with_process(output):  # the export would be gone when this command exits
        raise click.UsageError(f"{public_url(output)} is a filesystem that ends with this command's process: "
                               "pass a local directory or a lasting URL (s3://...); memory:// is for export_parquet "
                               "called from Python.")
    with open_store(db_path) as reader:
        for line in export_runs(reader, fmt, output, run=run, all_runs=all_runs, since=since):
            click.echo(line)


def _export_one(reader: StoreReader, run_id: int, label: str, rank: int, path: str) -> None:
    """One rank's CSV to `path`: a regular file replaced atomically, a FIFO or a character
    device written through (export/destination.py's `LocalFile`)."""
    from multirank_logger.export.destination import LocalFile

    target = LocalFile(path)
    said_on_stderr = target.kind == "stream"  # /dev/stdout, a FIFO: the CSV alone goes there
    if target.note:
        click.echo(target.note, err=said_on_stderr)
    with target.errors_told():
        if target.kind == "stream":
            with target.open_stream() as fp:
                count = reader.write_csv(fp, run_id, rank)
        else:
            count = reader.export_csv(target.path, run_id, rank)
    if count:
        click.echo(f"Wrote {count} rows of rank {rank} ({label}) to {path}", err=said_on_stderr)
    elif target.kind == "stream":
        click.echo(f"Rank {rank} of {label} logged nothing; nothing written to {path}.", err=True)
    else:
        click.echo(f"Rank {rank} of {label} logged nothing; no {path} written (CSVLogger writes none).")


@main.command("ranks")
@click.argument("db_path", metavar="DB")
@click.argument("key")
@click.option("--run", default=None, help="Run id or NAME/version_N (default: the latest run).")
@click.option("--all", "all_steps", is_flag=True, help=f"Print every step, not the first and last {_TABLE_ROWS // 2}.")
@click.option("--format", "fmt", type=click.Choice(["table", "csv"]), default="table", show_default=True,
              help="csv: the whole step x rank table, for other tools.")
@_friendly_errors
def ranks_cmd(db_path: str, key: str, run: str | None, all_steps: bool, fmt: str) -> None:
    """Show KEY per rank (step x rank) and how far the ranks spread."""
    with open_store(db_path) as reader:
        spread = reader.rank_spread(key, run)
    if fmt == "csv":
        click.echo(spread.table.to_csv(), nl=False)
        return
    from multirank_logger.report.spread_text import spread_text

    click.echo(spread_text(spread, None if all_steps else _TABLE_ROWS))


@main.command("sql")
@click.argument("db_path", metavar="DB")
@click.argument("query")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True)
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
              help="Stop the query after this many seconds (default: no limit; Ctrl-C stops it any time).")
@_friendly_errors
def sql_cmd(db_path: str, query: str, fmt: str, timeout: float | None) -> None:
    """Run a read-only QUERY on DB; a statement that writes is refused and changes nothing.

    The table shows the store's times (time, started_at, ended_at: Unix seconds) as UTC dates;
    csv and json keep the numbers. Ctrl-C stops a long query at once, as --timeout does."""
    with open_store(db_path) as reader:
        try:
            df = reader.sql(query, timeout=timeout)
        except KeyboardInterrupt:
            click.echo("Stopped (Ctrl-C): the query was interrupted; the store is unchanged.", err=True)
            sys.exit(130)  # the shell's code for a command ended by SIGINT
    if fmt == "csv":
        click.echo(df.to_csv(index=False, lineterminator="\n"), nl=False)
    elif fmt == "json":
        click.echo(df.to_json(orient="records", force_ascii=False))
    elif df.columns.empty:
        click.echo("(no result)")
    else:
        click.echo(_frame_text(times_as_times(df), index=False))


# -- which rank is the problem: report and plot (report/: findings.py, render.py, plots.py) ----


@main.command("report")
@click.argument("db_path", metavar="DB")
@click.option("--run", default=None, help="Run id or NAME/version_N (default: the latest run).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Also write the report to this HTML file: the ui's page of the run, self-contained, offline.")
@click.option("--from-rows", is_flag=True,
              help="Judge the run's rows even where the watch kept a verdict of the whole run (the same findings, slower).")
@_friendly_errors
def report_cmd(db_path: str, run: str | None, fmt: str, output: str | None, from_rows: bool) -> None:
    """Which rank is the problem: stragglers, outlier ranks, NaN/inf, memory, disagreements."""
    import json

    from multirank_logger.query.step_buckets import HEATMAP_COLUMNS
    from multirank_logger.report.findings import find_with_buckets
    from multirank_logger.report.render import findings_text

    def reads(reader: StoreReader) -> Any:
        # the page's per-bucket summaries come from the findings' own pass over the rows
        found, buckets = find_with_buckets(reader, run, HEATMAP_COLUMNS if output else 0, from_rows=from_rows)
        if output:
            from multirank_logger.ui.report_page import write_report

            write_report(reader, found, output, buckets)
        return found

    try:
        with open_store(db_path) as reader:
            # Ctrl-C interrupts every connection of the pass (its reader threads have their own)
            found = reader.stoppable(lambda: reads(reader))
    except KeyboardInterrupt:
        click.echo("Stopped (Ctrl-C): the report was interrupted; the store is unchanged.", err=True)
        sys.exit(130)  # the shell's code for a command ended by SIGINT
    click.echo(json.dumps(found.to_dict(), indent=2) if fmt == "json" else findings_text(found))
    if output:
        click.echo(f"Wrote {output}", err=fmt == "json")


@main.command("plot")
@click.argument("db_path", metavar="DB")
@click.argument("key")
@click.option("--run", default=None, help="Run id or NAME/version_N (default: the latest run).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="PNG file (default: KEY.png).")
@_friendly_errors
def plot_cmd(db_path: str, key: str, run: str | None, output: str | None) -> None:
    """Plot KEY against step, one line per rank (many ranks: their range, the outliers on top)."""
    from multirank_logger.report.findings import departures
    from multirank_logger.report.plots import figure_png, not_logged_cells, plot_key

    with open_store(db_path) as reader:
        ref = reader.resolve_run(run)
        spread = reader.rank_spread(key, ref.id)  # the table, and where each rank's NaN/inf began
        table = spread.table
        not_logged = not_logged_cells(reader, ref.id, key, table)
    outliers = [item["rank"] for item in departures(table)] if table.shape[1] >= 3 else []
    # a line that ends at a NaN ends with an x: the first ranks to log one (a few: 1,024 marks say nothing)
    marked = dict(sorted(((r, s) for r, (s, _) in spread.non_finite.items()), key=lambda rs: (rs[1], rs[0]))[:4])
    path = Path(output or f"{''.join(c if c.isalnum() or c in '-_.' else '_' for c in key)}.png")
    path.write_bytes(figure_png(plot_key(table, key, outliers, title=f"{key} per rank, {ref.label}", non_finite=marked,
                                         not_logged=not_logged)))
    notes = [f"outlier ranks: {', '.join(map(str, outliers))}"] if outliers else []
    notes += [f"NaN/inf marked x: {', '.join(f'rank {r} from step {s:,}' for r, s in marked.items())}"] if marked else []
    click.echo(f"Wrote {path}" + (f" ({'; '.join(notes)})" if notes else ""))


@main.command("ui")
@click.argument("db_path", metavar="DB")
@click.option("--port", type=int, default=8765, show_default=True, help="TCP port (0: any free one).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but 127.0.0.1 lets others read the store: no login.")
@click.option("--allow-host", "allowed_hosts", multiple=True, metavar="NAME",
              help="Also answer requests addressed to NAME (a tunnel's or proxy's host name); repeatable.")
@click.option("--request-timeout", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True,
              metavar="SECONDS", help="Stop a request's reads after this many seconds; it answers 503 (503: try again).")
@_friendly_errors
def ui_cmd(db_path: str, port: int, host: str, allowed_hosts: tuple[str, ...], request_timeout: float) -> None:
    """A live page over the store DB: runs, findings, every key's band and rank x step heatmap.

    Read-only; it never blocks a training run writing DB. Ctrl-C stops it, the queries of
    running requests too; a request's reads are bounded by --request-timeout. It answers only
    requests addressed to its own address (and to each --allow-host NAME): a page of another
    site cannot read the store through a name of its own (DNS rebinding).
    """
    from multirank_logger.store.backends import public_name
    from multirank_logger.ui.server import UiServer

    if host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(f"Warning: listening on {host}: anyone who can reach it reads this store (read-only, no login).", err=True)
    if "://" not in db_path and not Path(db_path).exists():
        click.echo(f"No store at {public_name(db_path)} yet: the page says so until a run logs to it.", err=True)
    try:
        server = UiServer(db_path, host, port, allowed_hosts, request_timeout)
    except OSError as exc:
        raise click.ClickException(f"Cannot listen on {host}:{port}: {exc.strerror or exc}. Pick another --port.") from exc
    try:
        server.warm_up()  # a store path that can never be a store, a server not reached: one line, no page
        click.echo(f"multirank-logger ui: {server.url}  (store {public_name(db_path)}; Ctrl-C stops it)")
        sys.stdout.flush()  # the URL, at once, also when stdout is a pipe
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.close()  # the running requests' queries interrupted: none left running in the engine at exit


# -- decisions and logs: the side tables (query/side_tables.py) ------------------------------


@main.command("alerts")
@click.argument("db_path", metavar="DB")
@click.option("--run", default=None, help="Run id or NAME/version_N (default: the latest run).")
@click.option("--all-runs", is_flag=True, help="Every run's alerts, each with its run.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@_friendly_errors
def alerts_cmd(db_path: str, run: str | None, all_runs: bool, fmt: str) -> None:
    """What the watch raised during a run (or every run), in order, with when each was seen."""
    from multirank_logger.report.alert_list import alerts_text, every_run_alerts_text

    if all_runs and run is not None:
        raise click.UsageError("--run and --all-runs: give one.")
    with open_store(db_path) as reader:
        if all_runs:
            df, labels = reader.alerts(every_run=True), {int(r["id"]): str(r["run"]) for r in reader.run_rows()}
        else:
            ref = reader.resolve_run(run)
            df = reader.alerts(ref.id)
    click.echo(every_run_alerts_text(df, labels, fmt) if all_runs else alerts_text(ref.label, ref.id, df, fmt))


@main.command("findings")
@click.argument("db_path", metavar="DB")
@click.option("--run", default=None, help="Run id or NAME/version_N (default: the latest run).")
@click.option("--all-runs", is_flag=True, help="Every run's kept findings (which ranks keep coming back).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@_friendly_errors
def findings_cmd(db_path: str, run: str | None, all_runs: bool, fmt: str) -> None:
    """The verdict each run kept at its end: its findings, origins first (no recompute)."""
    from multirank_logger.report.kept_findings import kept_findings_text

    with open_store(db_path) as reader:
        df = reader.findings(run, every_run=all_runs)
        labels = {int(r["id"]): str(r["run"]) for r in reader.run_rows()}
    click.echo(kept_findings_text(df, labels, fmt))


@main.command("hosts")
@click.argument("db_path", metavar="DB")
@click.option("--chronic", "rule", default="3/5", show_default=True, metavar="K/N",
              help="A host is chronic when named in K or more of its last N runs.")
@click.option("--since", type=click.DateTime(["%Y-%m-%d", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M"]), default=None,
              help="Only runs started on or after this date (UTC).")
@click.option("--kind", "kinds", multiple=True, help="Only findings of this kind (repeatable): non_finite, departure, straggler, memory.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv", "slurm"]), default="table", show_default=True,
              help="slurm: --exclude= of the chronic hosts (Slurm's node names where recorded).")
@click.option("--by", type=click.Choice(["host", "gpu"]), default="host", show_default=True,
              help="gpu: every GPU by its UUID (whatever its host was called); slurm: the chronic GPUs' hosts.")
@_friendly_errors
def hosts_cmd(db_path: str, rule: str, since: datetime.datetime | None, kinds: tuple[str, ...], fmt: str, by: str) -> None:
    """Every host across the runs: the runs it took part in, those whose kept verdict named it, chronic or one-off."""
    from multirank_logger.report.host_list import chronic_rule, hosts_text, option_error, read_hosts

    if said := option_error(rule, kinds):
        raise click.BadParameter(said[1], param_hint=said[0])
    k_n = chronic_rule(rule)
    after = since.replace(tzinfo=datetime.timezone.utc).timestamp() if since is not None else None
    rows = read_hosts(db_path, since=after, kinds=kinds or None, chronic=k_n, by=by)
    text = hosts_text(rows, fmt, k_n, by)
    if text or fmt != "slurm":
        click.echo(text)


@main.command("decisions")
@click.argument("db_path", metavar="DB")
@click.option("--run", default=None, help="Run id or NAME/version_N (default: the latest run).")
@_friendly_errors
def decisions_cmd(db_path: str, run: str | None) -> None:
    """Checkpoint and early-stopping decisions (DecisionAudit) with every rank's value and vote."""
    from multirank_logger.report.decision_list import decisions_text

    with open_store(db_path) as reader:
        ref = reader.resolve_run(run)
        df = reader.decisions(ref.id)
    click.echo(decisions_text(ref.label, ref.id, df))


@main.command("logs")
@click.argument("db_path", metavar="DB")
@click.option("--run", default=None, help="Run id or NAME/version_N (default: the latest run).")
@click.option("--rank", type=int, default=None, help="Only this rank's records.")
@click.option("--level", default=None, help="Only records at or above this level (INFO, WARNING...).")
@_friendly_errors
def logs_cmd(db_path: str, run: str | None, rank: int | None, level: str | None) -> None:
    """Every rank's log records and warnings; one logged alike by several ranks is printed once."""
    from multirank_logger.query.side_tables import format_ranks, group_alike

    with open_store(db_path) as reader:
        ref = reader.resolve_run(run)
        try:
            records = reader.logs(ref.id, rank=rank, level=level)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--level") from exc
    if records.empty:
        click.echo(f"No log records in {ref.label} for this selection (capture_logs=False, or nothing logged).")
        return
    for g in group_alike(records).itertuples():
        when = datetime.datetime.fromtimestamp(g.time, datetime.timezone.utc).strftime("%H:%M:%S.%f")[:-3]
        click.echo(f"{when} {g.level:<8} [{format_ranks(g.ranks)}] {g.logger}: {g.message}")


if __name__ == "__main__":  # python -m multirank_logger.cli
    main()
