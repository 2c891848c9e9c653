"""Rank 0's CSVLogger files: ``metrics.csv`` (written as the run goes) and ``hparams.yaml``.

Rank 0's log calls are also queued in `Rank0Files.calls` as they are recorded (the buffer's
``csv_calls``); `write_live` puts them into the live file (live_csv.py) at every ``save()``, on
the training thread, as CSVLogger's ``save()`` does: when it returns, the file holds every row.
The writer thread's cycles (`catch_up`) write the calls of a caller that stopped saving (Fabric's
log calls between two of its saves), and leave the file to ``save()`` while saves come: the two
threads then never wait for each other's write. At a successful end the file is kept when it
holds every row rank 0 logged; otherwise it is rebuilt from the store, and only when the
store holds every value: never a short file passed off as CSVLogger's.

The files belong to a run (rank_run.RankRun builds them with itself); what they read of it is
the `RunForFiles` protocol, so this module does not import the run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import deque
from itertools import count
from typing import Any, Protocol

from multirank_logger._util.best_effort import safely
from multirank_logger.logger.live_csv import Call, LiveCsv
from multirank_logger.logger.run_settings import RunSettings
from multirank_logger.logger.save_dir import SaveDir
from multirank_logger.query.reader import StoreReader
from multirank_logger.rows.run_ref import RunRef
from multirank_logger.store.sql_store import Store, retry_while_locked
from multirank_logger.store.status import run_lacks_values

__all__ = ["NAME_HPARAMS_FILE", "NAME_METRICS_FILE", "Rank0Files", "RunForFiles"]

log = logging.getLogger(__name__)
NAME_METRICS_FILE = "metrics.csv"
NAME_HPARAMS_FILE = "hparams.yaml"
#: what the live metrics.csv held, when the whole file could not be written at the end
NAME_PARTIAL_METRICS_FILE = "metrics.partial.csv"


class RunForFiles(Protocol):
    """What `Rank0Files` reads of its run (rank_run.RankRun); it changes none of it."""

    settings: RunSettings
    #: ``save_dir``'s filesystem (local or fsspec)
    save_dir: SaveDir
    hparams: dict[str, Any]
    hparams_logged: bool
    #: this launch's attempt (0: the run's first), once set up
    attempt: int | None

    @property
    def log_dir(self) -> str:
        """CSVLogger's ``save_dir/name/version_N``."""

    def open_store(self) -> Store:
        """The run's store, opened."""

    def resolve(self) -> RunRef:
        """The run (its id in the store)."""


class Rank0Files:
    """The files CSVLogger would have written for this run, in its ``log_dir`` (one process's).

    Args:
        run: this process's part in the run (its log_dir, store, attempt, hyperparameters).
    """

    def __init__(self, run: RunForFiles) -> None:
        self.run = run
        self.live_csv: LiveCsv | None = None  # rank 0's metrics.csv, once rank 0 has rows
        self.csv_gaps = 0  # batches the live file missed
        self.continued = False  # the live file began with earlier launches' rows, read from the store
        #: this process's log calls (step, values) not in the file yet: the buffer's csv_calls
        self.calls: deque[Call] = deque()
        # the training thread (save) and the writer thread (catch_up) both write the file; the
        # writer only while no save() comes (catch_up), so save() finds the lock free
        self._lock = threading.Lock()
        self.saves = 0  # write_live calls (save()) so far
        self._saves_seen = 0  # `saves` at the writer's last cycle

    @property
    def metrics_path(self) -> str:
        return os.path.join(self.run.log_dir, NAME_METRICS_FILE)

    def keep_earlier(self, log_dir: str) -> list[str]:
        """A new run in a directory holding an earlier run's files (an explicit ``version`` the
        store does not hold): move its metrics.csv and hparams.yaml aside, which this run's would
        replace at their first write (CSVLogger deletes metrics.csv). Returns the names now kept."""
        fs = self.run.save_dir.fs
        earlier = [name for name in (NAME_METRICS_FILE, NAME_HPARAMS_FILE) if fs.isfile(os.path.join(log_dir, name))]
        for n in count(1):  # the first free suffix for both: a pair stays a pair
            suffix = ".earlier" if n == 1 else f".earlier-{n}"
            kept = [f"{stem}{suffix}{ext}" for stem, ext in map(os.path.splitext, earlier)]
            if not any(fs.exists(os.path.join(log_dir, name)) for name in kept):
                break
        for name, new_name in zip(earlier, kept, strict=True):
            fs.mv(os.path.join(log_dir, name), os.path.join(log_dir, new_name))
        return kept

    def write_live(self, rank: int) -> None:
        """``save()``: rank 0's metrics.csv takes the calls logged since the last time; on any other
        rank they are dropped. Never raises.

        On the training thread at every log call (the Trainer saves after each): the new lines
        formatted and handed to the OS in one write (live_csv.LiveCsv.add_calls)."""
        self.saves += 1
        calls = self.calls
        if not calls:
            return
        with self._lock:
            # popped one by one: a call appended meanwhile (log_metrics on another thread) waits for the next
            taken = [calls.popleft()] if len(calls) == 1 else [calls.popleft() for _ in range(len(calls))]
            live = self.live_csv
            if live is not None and rank == 0:
                live.add_calls(taken)  # never raises; the file's set-up is done (`_write`)
            else:
                self._write_taken(rank, taken)

    def catch_up(self, rank: int, now: bool) -> None:
        """The writer thread's cycle: the calls no ``save()`` wrote, when none came since its last
        cycle (a caller that does not save after each call, as Fabric's) or when the cycle is an
        explicit flush (`now`: ``experiment.save()``, the end). Never raises."""
        saves, self._saves_seen = self._saves_seen, self.saves
        calls, live = self.calls, self.live_csv
        if now and rank == 0 and live is not None:
            with self._lock:  # save() looks for a file removed under the run only now and then
                safely(live.look_for_file, "looking for metrics.csv")
        if not calls or (saves != self.saves and not now):
            return  # save() keeps the file current: it writes these calls in a moment
        with self._lock:
            self._write_taken(rank, [calls.popleft() for _ in range(len(calls))])  # the training thread only appends

    def _write_taken(self, rank: int, taken: list[Call]) -> None:
        if rank == 0 and self.run.settings.export_csv and safely(lambda: self._write(taken),
                                                                 "writing metrics.csv") is None:
            self.csv_gaps += 1  # these calls missed the file: the end exports it from the store

    def _write(self, calls: list[Call]) -> bool:
        """True once the calls are in the file or kept for it (a gap is counted where they are not)."""
        run = self.run
        if self.live_csv is None:
            path = safely(lambda: self.metrics_path, "opening metrics.csv")
            if path is None:
                self.csv_gaps += 1  # the file would miss these rows: the end exports from the store
                return True
            self.live_csv = LiveCsv(path)
            if run.attempt:  # a later launch of the run: the file continues the earlier launches'
                self.continued = True
                live = self.live_csv

                def earlier_launches() -> None:
                    reader, run_id = StoreReader(run.open_store(), lock_timeout=run.settings.timeout), run.resolve().id
                    live.continue_from(lambda fp: reader.write_csv(fp, run=run_id, rank=0))

                if safely(earlier_launches, "continuing metrics.csv from the earlier launches") is None:
                    self.csv_gaps += 1  # the end exports the whole history from the store instead
        self.live_csv.add_calls(calls)
        return True

    def live_csv_whole(self) -> bool:
        """The live metrics.csv holds every row rank 0 logged (none missed, none left to write)."""
        self.catch_up(0, now=True)
        live = self.live_csv
        if live is None:
            return False
        with self._lock:
            whole = live.complete and not self.csv_gaps and live.write_pending()
            live.close()  # the end: the file is not kept open past it
        return whole

    def write_hparams(self) -> None:
        """hparams.yaml, through Lightning's writer (fsspec, OmegaConf), written aside and moved
        over the file: a full disk leaves the former file or none, never a torn one.

        Lightning is imported here, not with the module: a plain-API script that logs no
        hyperparameters never imports it (a few seconds of every rank's start)."""
        from lightning.pytorch.core.saving import save_hparams_to_yaml

        self.run.resolve()  # the run first: a new one moves an earlier run's files aside (keep_earlier)
        log_dir, fs = self.run.log_dir, self.run.save_dir.fs
        self.run.save_dir.makedirs(log_dir)
        path = os.path.join(log_dir, NAME_HPARAMS_FILE)
        tmp = os.path.join(log_dir, f".{NAME_HPARAMS_FILE}.{os.getpid()}.tmp")
        try:
            save_hparams_to_yaml(tmp, self.run.hparams)
            fs.mv(tmp, path)
        except BaseException:
            with contextlib.suppress(Exception):
                fs.rm(tmp)
            raise

    def export_if_complete(self, store: Store, run_id: int, wait: float = 5.0) -> None:
        """metrics.csv only when it holds every value: never a short file passed off as CSVLogger's.

        The file written as the run went (live_csv.py) was fed every row rank 0 logged, before
        the store saw them: it is whole whatever the store refused. A file rebuilt from the
        store at the end, or one that began with earlier launches' rows read from the store (a
        resume), depends on the store holding every value."""
        if self.live_csv_whole() and not self.continued:
            safely(self.export_files, "writing metrics.csv")
            return
        lacks = safely(lambda: retry_while_locked(lambda: run_lacks_values(store, run_id), wait), "reading the run")
        if lacks is None or any(lacks):
            why = "the store could not be read" if lacks is None else (
                f"the store lacks {lacks[0]} value(s) kept in spill files and {lacks[1]} lost"
                + (f", and what {lacks[2]} rank end(s) it never heard hold" if lacks[2] else "")
            )
            self._not_written(why, run_id, "Import the spill files named above, then write")
            return
        if safely(self._export_files_done, "writing metrics.csv") is None:
            self._not_written("it could not be written from the store (above)", run_id, "The store holds it: write")

    def _not_written(self, why: str, run_id: int, how: str) -> None:
        """Say that metrics.csv is not whole, and set aside what the live file holds: a file
        named metrics.csv is CSVLogger's whole file or nothing, and a short one kept under
        another name still shows how far the run got."""
        path, aside = self.metrics_path, os.path.join(self.run.log_dir, NAME_PARTIAL_METRICS_FILE)
        fs = self.run.save_dir.fs
        live = self.live_csv
        moved = safely(lambda: fs.exists(path) and (fs.mv(path, aside) or True), f"moving {path} aside")
        kept = (
            f" Its first {live.rows if live is not None else 'few'} row(s) of rank 0 are in {aside}." if moved else ""
        )
        log.error(
            "multirank_logger: metrics.csv was not written: %s.%s %s it with: multirank-logger export %s --run %s -o %s",
            why, kept, how, self.run.settings.db, run_id, path,
        )

    def _export_files_done(self) -> bool:
        self.export_files()
        return True

    def export_files(self) -> None:
        """Rank 0: the metrics.csv and hparams.yaml CSVLogger would have written for this run."""
        run = self.run
        run.save_dir.makedirs(run.log_dir)
        if run.hparams_logged:
            safely(self.write_hparams, "writing hparams.yaml")  # metrics.csv is written whatever this does
        if self.live_csv_whole():
            return  # the file written as the run went holds every row of rank 0 (live_csv.py)
        # one implementation of CSVLogger's format: the query side's, reading back what was stored
        # (through this run's store: no second engine, no second schema check)
        reader = StoreReader(run.open_store(), lock_timeout=run.settings.timeout)
        run.save_dir.export_csv(reader, self.metrics_path, run=run.resolve().id, rank=0)
