"""The `multirank-logger` command: a thin layer over the store and the query module.

Each command parses its arguments, calls the library, and prints. Library errors
become one `Error: ...` line (click.ClickException), never a traceback.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from multirank_logger import __version__
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
