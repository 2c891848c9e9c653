"""Merging a spill file (spill_file.py) into a store: its rows, its side rows, and the rank's end.

Importing is idempotent: the `imports` table remembers, per spill id, which frames were read
(ranges of their ordinals), and rows the store already holds (same run, rank, seq and key: rank 0 may have
stored a batch that its sender never saw acknowledged) are skipped (store/seq_spans.py). The rank's end, when the
store never heard it, is recorded, and the run settles: ``incomplete`` becomes ``success``
once nothing is spilled, lost or unheard (status.py decides both: `settle_rank`, `settle_imported`).

A damaged file imports every intact frame; its damage (`SpillDamage`: which frames, how many values)
comes back in the report, not as an error, and what those frames held stays counted as spilled, so
the run stays ``incomplete``. Importing an intact copy of the file later adds just those frames.

A file names its run by the run's UUID (format 4): it imports into that run only. A store holding
another run of the same name and version is refused (`SpillOfAnotherRun`); a store without the run
(its file was deleted mid-run, and the import targets a new one) gets it recreated from the header:
name, version, hparams, its ranks (``missing`` until their files are imported), status ``incomplete``.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from multirank_logger.errors import LookupFailed, SpillOfAnotherRun, StoreLocked
from multirank_logger.rows.batch import concat_batches, with_run_id
from multirank_logger.rows.run_ref import RunRef
from multirank_logger.rows.schema import SIDE_TABLES, imports, ranks, runs, unheard_ends
from multirank_logger.store.seq_spans import insert_metrics_once
from multirank_logger.store.spill_file import SPILL_SUFFIX, SpillDamage, SpillFrame, open_spill, read_spill_header
from multirank_logger.store.sql_store import unseen_side_rows
from multirank_logger.store.status import (
    INCOMPLETE,
    MISSING,
    count_off_side_rows,
    keep_unheard,
    rank_end_unknown,
    settle_imported,
    settle_rank,
)

__all__ = ["ImportReport", "import_earlier_launches", "import_spill"]

log = logging.getLogger(__name__)
#: metric rows stored at a time: an import holds about this many rows in memory, whatever the file's size
IMPORT_ROWS = 100_000


@dataclass(frozen=True)
class ImportReport:
    """What `import_spill` did with one file."""

    path: str
    spill_id: str
    run_id: int
    name: str
    version: int
    rank: int
    rows_added: int
    rows_skipped: int
    frames_read: int
    side_rows_added: int = 0
    #: how the rank ended, when the file says so and the store had it as "missing"
    rank_status: str | None = None
    #: the file's damaged or torn parts whose frames the store lacks (never imported from any copy)
    damage: tuple[SpillDamage, ...] = ()

    @property
    def already_imported(self) -> bool:
        return self.frames_read == 0


def import_spill(store: Any, path: str | os.PathLike[str]) -> ImportReport:
    """Merge a spill file into `store` (a writable Store), in one transaction. Idempotent.

    The run is found by its UUID (files of format 4; older ones by name and version), so the file
    imports into any store that holds that run, whatever its id there; a store without it gets
    it recreated (module docstring). Metric rows and side-table rows the store holds already
    are skipped. A rank the store has as "missing" (rank 0 never heard its end) takes the end
    the file records, and the values it spilled or lost count in the run's totals.

    Raises:
        SpillCorrupt: when the file is no regular file, or its header line is not a spill file's
            (or fails its checksum). Damaged frames are not raised: the report's `damage` says them.
        LookupFailed: when the store holds no run with the file's name and version (a file of
            format 3 or older, which cannot recreate its run).
        SpillOfAnotherRun: when the store holds another run (another UUID) of that name and version.
    """
    with open_spill(path) as (header, frames):
        return _import_frames(store, str(path), header, frames)


def _import_frames(store: Any, path: str, header: dict[str, Any], frames: Iterator[SpillFrame]) -> ImportReport:
    """`import_spill` on an open file: its frames are read, and their rows stored, a part at a
    time (`IMPORT_ROWS`), in one transaction: a failure part-way leaves the store as it was."""
    spill_id = str(header["spill_id"])
    name, version, rank = str(header["name"]), int(header["version"]), int(header["rank"])
    with store.begin() as conn:
        done = [tuple(r) for r in conn.execute(
            sa.select(imports.c.first_frame, imports.c.end_frame).where(imports.c.spill_id == spill_id))]
        run_id, recreated = _run_of(store, conn, path, header)
        # the run counts this rank's spilled values once it has its end: take the file's off then
        end_known = not rank_end_unknown(conn, run_id, rank, header.get("attempt"))
        report: dict[str, Any] = {"path": path, "spill_id": spill_id, "run_id": run_id, "name": name, "version": version, "rank": rank}
        pending: list[Any] = []
        read = added = side_added = side_read = earlier = 0
        seen_end = False
        end = None
        new: list[int] = []  # the ordinals of the frames this import reads
        damage: list[SpillDamage] = []

        def store_pending() -> None:
            nonlocal read, added
            # the store's id for the run, not the one the rank knew
            batch = with_run_id(concat_batches(pending), run_id)
            pending.clear()
            read += len(batch)
            added += insert_metrics_once(conn, store.backend, batch)  # rows the store holds already are skipped

        for ordinal, kind, obj in frames:
            if kind == "damage":
                if not _imported_before(obj, done):
                    damage.append(obj)
                continue
            seen_end = seen_end or kind == "end"
            if any(first <= ordinal < stop for first, stop in done):
                earlier += len(obj) if kind == "metrics" else 0
                continue  # imported before
            new.append(ordinal)
            if kind == "metrics":
                pending.append(obj)
                if sum(map(len, pending)) >= IMPORT_ROWS:
                    store_pending()
            elif kind == "side":
                side_read += sum(map(len, obj.values()))
                side_added += _insert_side(store, conn, obj, run_id)
            elif kind == "hparams":
                if recreated:  # logged after the header was written: the latest is the run's
                    conn.execute(runs.update().where(runs.c.id == run_id).values(hparams=_to_json(obj)))
            else:
                end = obj
        if not new:
            return ImportReport(**report, rows_added=0, rows_skipped=0, frames_read=0, damage=tuple(damage))
        if pending:
            store_pending()
        rank_status = settle_rank(conn, run_id, rank, end, header.get("attempt")) if end is not None else None
        for i, (first, stop) in enumerate(_ranges(new)):
            conn.execute(
                imports.insert().values(
                    spill_id=spill_id,
                    first_frame=first,
                    end_frame=stop,
                    run_id=run_id,
                    rank=rank,
                    rows=added if i == 0 else 0,
                    source=str(Path(path).resolve()),
                    imported_at=time.time(),
                )
            )
        if seen_end and not damage and header.get("attempt") is not None:
            # whole at last (an intact copy of a file whose damage kept its launch's end unheard)
            conn.execute(unheard_ends.delete().where(unheard_ends.c.run_id == run_id, unheard_ends.c.rank == rank,
                                                     unheard_ends.c.attempt == int(header["attempt"])))
        # side rows are counted (on the rank) only by an end the rank recorded itself, never by the file's
        count_off_side_rows(conn, run_id, rank, side_read if end_known else 0)
        # an end recorded only now (this file's) counted every value of the file: those imported
        # before it too, which were not taken off then (the run did not count them yet)
        settle_imported(conn, run_id, read if end_known else read + earlier if rank_status is not None else 0)
    return ImportReport(
        **report, rows_added=added, rows_skipped=read - added, frames_read=len(new),
        side_rows_added=side_added, rank_status=rank_status, damage=tuple(damage),
    )


def _imported_before(damage: SpillDamage, done: list[tuple[int, int]]) -> bool:
    """Whether every frame `damage` cost was imported already (from an intact copy of the file,
    or from the file before it was made again); true too when it cost no frame."""
    if damage.end_frame is None:
        return False
    return all(any(first <= o < stop for first, stop in done) for o in range(damage.first_frame, damage.end_frame))


def _ranges(ordinals: list[int]) -> list[tuple[int, int]]:
    """Sorted ordinals as [first, stop) ranges of consecutive ones."""
    out: list[tuple[int, int]] = []
    for o in sorted(ordinals):
        if out and out[-1][1] == o:
            out[-1] = (out[-1][0], o + 1)
        else:
            out.append((o, o + 1))
    return out


def _run_of(store: Any, conn: sa.Connection, path: str, header: dict[str, Any]) -> tuple[int, bool]:
    """The store's id of the file's run, and whether it was recreated here (the store lacked it).

    Raises:
        SpillOfAnotherRun, LookupFailed: as `import_spill` says.
    """
    name, version, run_uuid = str(header["name"]), int(header["version"]), header.get("run_uuid")
    if run_uuid is not None:
        found = conn.execute(sa.select(runs.c.id).where(runs.c.run_uuid == run_uuid)).scalar()
        if found is not None:
            return int(found), False
    row = conn.execute(sa.select(runs.c.id, runs.c.run_uuid).where(runs.c.name == name, runs.c.version == version)).first()
    if row is not None:
        if run_uuid is None or row.run_uuid is None:
            return int(row.id), False  # a file (or a run) from before runs had a UUID: name and version are all there is
        db = store.backend.path or store.url.render_as_string(hide_password=True)
        raise SpillOfAnotherRun(
            path, f"{name}/version_{version} (uuid {run_uuid})", f"{name}/version_{version} (uuid {row.run_uuid}, id {row.id})", str(db)
        )
    if run_uuid is None:
        labels = conn.execute(sa.select(runs.c.name, runs.c.version)).all()
        raise LookupFailed("run", f"{name}/version_{version}", [f"{n}/version_{v}" for n, v in labels])
    return _recreate_run(conn, header), True


def _recreate_run(conn: sa.Connection, header: dict[str, Any]) -> int:
    """The file's run, as its header knows it, in a store that lacks it: ``incomplete`` (what its
    other ranks logged is unknown until their files come), its ranks ``missing`` until then."""
    run_id = conn.execute(sa.select(sa.func.coalesce(sa.func.max(runs.c.id), 0) + 1)).scalar_one()
    world_size = max(int(header.get("world_size") or 0), int(header["rank"]) + 1)
    conn.execute(
        runs.insert().values(
            id=run_id, name=str(header["name"]), version=int(header["version"]), status=INCOMPLETE,
            world_size=world_size, started_at=float(header.get("run_started_at") or header.get("created_at") or time.time()),
            hparams=_to_json(header.get("hparams")), version_name=header.get("version_name"), run_uuid=header["run_uuid"],
        )
    )
    now = time.time()
    conn.execute(ranks.insert(), [{"run_id": run_id, "rank": r, "status": MISSING, "started_at": now} for r in range(world_size)])
    log.warning(
        "multirank_logger: the store had no run %s/version_%s (uuid %s); recreated it from %s's header",
        header["name"], header["version"], header["run_uuid"], header.get("spill_id"),
    )
    return int(run_id)


def _to_json(hparams: Any) -> str | None:
    return None if hparams is None else json.dumps(hparams, default=str, sort_keys=True)


def import_earlier_launches(store: Any, spill_dir: str, run: RunRef, attempt: int) -> int:
    """A resumed launch's rank 0: import the spill files earlier launches of the run left in
    `spill_dir` (this host's), before this launch adds to the run. Returns the rows added.

    Only this run's files: the header's run id and allocation time are this run's. The name
    alone would take another store's run of the same name and version, whose files share a
    spill_dir (by default the stores' directory) and whose id may be the same too.

    An earlier launch that could not write the store at its end (a reader held it past
    `timeout`, the disk was full) could not record that end either: the next launch finds it
    still "running" and takes it for one that vanished (killed), which keeps nothing, so
    without this the resumed run would end in success with those rows only in a file. Here
    they join the run first (and its metrics.csv, which begins with the earlier launches'
    rows). A file that cannot be imported keeps the run from success: its launch's rank goes
    into ``unheard_ends``, which importing the file by hand clears. So does a damaged file (its
    intact frames imported): importing an intact copy of it clears that.
    """
    name = f"{glob.escape(run.name)}-version_{run.version}-rank*{SPILL_SUFFIX}"
    run_id = run.id
    added = 0
    for path in sorted(glob.glob(os.path.join(glob.escape(spill_dir), name))):
        header = read_spill_header(path)
        if header is None or header.get("run_id") != run_id or header.get("run_started_at") != run.started_at:
            continue  # not a spill file, or another run's (or written before files said when their run began)
        if header.get("attempt") is None or int(header["attempt"]) >= attempt:
            continue  # written before files named their launch, or this launch's
        try:
            report = import_spill(store, path)
        except StoreLocked:
            raise  # the caller waits for the store, and tries again
        except Exception as exc:  # noqa: BLE001 - the launch goes on; the run stays short of success
            with store.begin() as conn:
                keep_unheard(conn, run_id, int(header["attempt"]), [int(header["rank"])], time.time())
            log.error(
                "multirank_logger: an earlier launch's spill file could not be imported (%s: %s); the run is not "
                "recorded as success until it is: multirank-logger import %s %s",
                type(exc).__name__, exc, store.backend.path or store.url.render_as_string(hide_password=True), path,
            )
            continue
        if report.damage:  # the rest of the file is in; the run stays short of success, as for a file not imported
            with store.begin() as conn:
                keep_unheard(conn, run_id, int(header["attempt"]), [int(header["rank"])], time.time())
        for damage in report.damage:
            log.error(
                "multirank_logger: an earlier launch's spill file is damaged: %s. Its intact frames were imported; "
                "with an intact copy of it: multirank-logger import %s COPY", damage,
                store.backend.path or store.url.render_as_string(hide_password=True),
            )
        if report.rows_added or report.side_rows_added or report.rank_status:
            added += report.rows_added
            log.warning(
                "multirank_logger: imported %d row(s) that launch %s of this run (rank %d) had spilled to %s",
                report.rows_added, header["attempt"], report.rank, path,
            )
    return added


def _insert_side(store: Any, conn: sa.Connection, tables: dict[str, list[dict[str, Any]]], run_id: int) -> int:
    added = 0
    for table, rows in tables.items():
        for row in rows:
            row["run_id"] = run_id
        if rows:
            added += store.backend.insert_rows(conn, SIDE_TABLES[table],
                unseen_side_rows(conn, SIDE_TABLES[table], rows))
    return added
