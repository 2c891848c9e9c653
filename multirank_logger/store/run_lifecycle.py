"""A run's life across launches: which run a launch opens (new or resumed), and its attempts.

A long job is preempted, requeued and restarted from its checkpoint, maybe with another
number of ranks; `ddp_spawn` starts fresh workers for fit and again for test. Each of
these launches continues the same run (same id, same log_dir) as a new *attempt*: a row
of the ``attempts`` table, and the high bits of its rows' ``seq``
(``schema.SEQ_ATTEMPT_SHIFT``), so a rank's ``seq`` never repeats within a run and the
query side can tell a superseded step (logged by a preempted launch after its last
checkpoint, then again by the resumed one) from the latest.

Which run a launch opens (`open_run`):

- ``run_key`` given: the run of this name with that key (a scheduler's job id survives a
  requeue), else a new run that carries the key;
- ``version`` given (an int, or a str for a named version): that run, else a new one;
- neither: a new run, the next version free in the store *and* on disk (a CSVLogger or
  TensorBoard ``version_N`` already there is never reused); with ``resume="must"`` the
  latest run of the name; under ``torchrun --max-restarts``, a restarted worker group
  continues the run of its job (`elastic_run_key`).

``resume`` says whether an existing run may be continued: ``"allow"`` (the default, as
CSVLogger accepts an existing ``version``), ``"must"`` (a requeue that must not start over)
or ``"never"`` (a fresh run, or an error).
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import time

import sqlalchemy as sa

from multirank_logger.errors import ResumeRefused, RunIdentityMismatch
from multirank_logger.rows.run_ref import RunRef
from multirank_logger.rows.schema import SEQ_ATTEMPT_SHIFT, attempts, metadata, metrics, runs, step_summaries
from multirank_logger.store.sql_store import Store
from multirank_logger.store.status import RUNNING, close_earlier_launches

__all__ = [
    "RESUME_MODES",
    "begin_attempt",
    "check_run_choice",
    "check_same_run",
    "elastic_run_key",
    "next_free_on_disk",
    "open_run",
    "orphan_runs",
    "seq_base",
]

RESUME_MODES = ("allow", "must", "never")
_VERSION_DIR = re.compile(r"^version_(\d+)$")
#: scheduler variables naming the job: recorded with each attempt
_JOB_ID_VARS = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "JOB_ID", "TORCHELASTIC_RUN_ID")


def check_run_choice(version: object, resume: str, run_key: object) -> None:
    """The logger's `version`, `resume` and `run_key` arguments, checked at construction.

    Raises:
        ValueError: saying what is accepted.
    """
    named = isinstance(version, str)
    if isinstance(version, str) and (not version or os.sep in version or version in (".", "..")):
        raise ValueError(f"version={version!r}; a named version is a directory name: non-empty, without {os.sep!r}")
    if not named and version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 0):
        raise ValueError(
            f"version={version!r}; expected a non-negative int, a str (a named version), or None for the next free one"
        )
    if resume not in RESUME_MODES:
        raise ValueError(f"resume={resume!r} is not one of {', '.join(map(repr, RESUME_MODES))}")
    if run_key is not None and (not isinstance(run_key, str) or not run_key):
        raise ValueError(f"run_key={run_key!r}; expected a non-empty str (e.g. the scheduler's job id) or None")


def seq_base(attempt: int) -> int:
    """The first `seq` of an attempt's rows: its number in the high bits."""
    return attempt << SEQ_ATTEMPT_SHIFT


def next_free_on_disk(root_dir: str) -> int:
    """One past the highest ``version_N`` directory in `root_dir` (0 when there is none), as
    CSVLogger's ``_get_next_version`` counts: a run of another logger there is never overwritten."""
    try:
        names = os.listdir(root_dir)
    except OSError:
        return 0
    taken = [int(m.group(1)) for n in names if (m := _VERSION_DIR.match(n)) and os.path.isdir(os.path.join(root_dir, n))]
    return max(taken) + 1 if taken else 0


def elastic_run_key() -> tuple[str, bool] | None:
    """For a torchelastic worker: (a key naming this torchrun job, whether this is a restart).

    ``torchrun --max-restarts`` restarts the whole worker group after a failure, in new
    processes with ``TORCHELASTIC_RESTART_COUNT`` one higher and the same
    ``TORCHELASTIC_RUN_ID``: the restarted group continues the run the first group opened.
    The run id names the job when it was chosen (``--rdzv-id``, or ``--standalone``'s random
    one); without rendezvous settings it is ``"none"`` for every torchrun, so the agent process
    (the workers' parent, alive across restarts) on this host names the job instead.
    """
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "").strip()
    if not run_id:
        return None
    try:
        restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    except ValueError:
        restart = 0
    if run_id == "none":
        return f"torchelastic:none:{socket.gethostname()}:{os.getppid()}", restart > 0
    return f"torchelastic:{run_id}", restart > 0


def open_run(
    store: Store,
    name: str,
    *,
    version: int | str | None,
    resume: str,
    run_key: str | None,
    world_size: int,
    root_dir: str,
) -> tuple[RunRef, bool]:
    """The run this launch writes under, and whether it is an existing one continued (resumed)
    rather than a new one (module docstring).

    Under torchelastic with neither `version` nor `run_key` (and ``resume="allow"``), the
    first worker group creates a run carrying the job's key (`elastic_run_key`) and a
    restarted group continues it.

    Raises:
        ResumeRefused: ``resume="must"`` and no such run, or ``resume="never"`` and the run exists.
    """
    # one connection for every step: a DuckDB file a reader grabs between two of them would make
    # the caller's retry allocate a second run after the first was committed
    find_key = new_key = run_key
    elastic = elastic_run_key() if run_key is None and version is None and resume == "allow" else None
    if elastic is not None:
        new_key = elastic[0]
        find_key = new_key if elastic[1] else None  # a first group never continues an older job's run
    with store.writing():
        return _open_run(store, name, version=version, resume=resume, run_key=find_key, new_key=new_key,
                         world_size=world_size, root_dir=root_dir)


def _open_run(
    store: Store, name: str, *, version: int | str | None, resume: str, run_key: str | None, new_key: str | None,
    world_size: int, root_dir: str,
) -> tuple[RunRef, bool]:
    found = _find(store, name, version, run_key, latest=resume == "must" and version is None and run_key is None)
    what = _describe(name, version, run_key)
    if found is not None:
        if resume == "never":
            raise ResumeRefused(
                f"Run {what} already exists in {store.url.database}. Pass resume='allow' to continue it, "
                "version=None for the next free version, or another name."
            )
        store.update_run(found.id, status=RUNNING, ended_at=None, world_size=world_size)
        return dataclasses.replace(found, world_size=world_size), True
    if resume == "must":
        raise ResumeRefused(
            f"resume='must', but the store {store.url.database} holds no run {what} to continue. "
            "Pass resume='allow' to start it when it is not there."
        )
    number = version if isinstance(version, int) else None
    record = store.create_run(
        name,
        version=number,
        world_size=world_size,
        at_least=next_free_on_disk(root_dir) if number is None else 0,
        version_name=version if isinstance(version, str) else None,
        run_key=new_key,
    )
    found = _find(store, name, record.version, None, latest=False)  # as stored (started_at)
    assert found is not None
    return found, False


def _find(store: Store, name: str, version: int | str | None, run_key: str | None, *, latest: bool) -> RunRef | None:
    cols = (runs.c.id, runs.c.version, runs.c.version_name, runs.c.started_at, runs.c.world_size, runs.c.run_uuid)
    stmt = sa.select(*cols).where(runs.c.name == name)
    if run_key is not None:
        stmt = stmt.where(runs.c.run_key == run_key)
    elif isinstance(version, str):
        stmt = stmt.where(runs.c.version_name == version)
    elif version is not None:
        stmt = stmt.where(runs.c.version == version)
    elif not latest:
        return None
    with store.begin() as conn:
        row = conn.execute(stmt.order_by(runs.c.id.desc()).limit(1)).first()
    if row is None:
        return None
    return RunRef(
        int(row.id), name, int(row.version), row.version_name, float(row.started_at), int(row.world_size), row.run_uuid
    )


def _describe(name: str, version: int | str | None, run_key: str | None) -> str:
    if run_key is not None:
        return f"{name!r} with run_key={run_key!r}"
    if isinstance(version, str):
        return f"{name}/{version}"
    return f"{name}/version_{version}" if version is not None else f"{name!r} (latest)"


def begin_attempt(store: Store, run_id: int, world_size: int) -> int:
    """Record a new launch of `run_id` and return its number (0 for the first).

    The earlier launch is gone: what was still running of it is closed first
    (status.close_earlier_launches: vanished launches, missing ranks, unheard ends).
    """
    with store.begin() as conn:
        close_earlier_launches(conn, run_id)
        last = conn.execute(sa.select(sa.func.max(attempts.c.attempt)).where(attempts.c.run_id == run_id)).scalar()
        if last is not None:
            attempt = int(last) + 1
        else:
            # a run logged before attempts were recorded (a store from before schema 0004) holds
            # attempt 0's rows already: start above them (EXISTS: one seek, not a scan)
            logged = conn.execute(sa.select(sa.exists().where(metrics.c.run_id == run_id))).scalar()
            attempt = 1 if logged else 0
        conn.execute(
            attempts.insert().values(
                run_id=run_id,
                attempt=attempt,
                world_size=world_size,
                status=RUNNING,
                started_at=time.time(),
                host=socket.gethostname(),
                job_id=next((os.environ[v] for v in _JOB_ID_VARS if os.environ.get(v)), None),
            )
        )
        conn.execute(runs.update().where(runs.c.id == run_id).values(status=RUNNING, ended_at=None))
    return attempt


def check_same_run(store: Store, rank: int, run_id: int, name: str, version: int, started_at: float) -> None:
    """A rank about to write the store itself: is rank 0's run the run this store holds?

    Raises:
        RunIdentityMismatch: when the store has no such run, or another run under its id.
    """
    with store.begin() as conn:
        row = conn.execute(
            sa.select(runs.c.name, runs.c.version, runs.c.started_at).where(runs.c.id == run_id)
        ).first()
    expected = f"{name}/version_{version} (id {run_id})"
    if row is None:
        raise RunIdentityMismatch(rank, expected, f"no run with id {run_id}", str(store.url.database))
    if (row.name, int(row.version)) != (name, version) or (started_at and abs(float(row.started_at) - started_at) > 1e-3):
        found = f"{row.name}/version_{row.version} (id {run_id}, started at {row.started_at})"
        raise RunIdentityMismatch(rank, expected, found, str(store.url.database))


def drop_if_never_launched(store: Store, run_id: int) -> bool:
    """Remove a run no launch ever began: no row of any table names it. True when removed.

    For a run allocated ahead of a fork that was not a launch (logger/process_registry.py): a logger
    built and never used leaves no run, with or without a fork in between."""
    with store.begin() as conn:
        for table in metadata.sorted_tables:
            if table is not runs and "run_id" in table.c:
                if conn.execute(sa.select(table.c.run_id).where(table.c.run_id == run_id).limit(1)).first():
                    return False
        conn.execute(sa.delete(runs).where(runs.c.id == run_id, runs.c.status == RUNNING))
    return True


def orphan_runs(conn: sa.Connection) -> list[tuple[int, int]]:
    """(run id, rows) of metric rows whose run has no ``runs`` row: written under an identity
    rank 0's store never allocated. Never expected; reported by ``multirank-logger runs``.

    Counted from ``step_summaries``, which every insert of metric rows keeps beside them
    (store/step_summaries.py): a scan of every metric row was 1.9 s of `runs` at 256M rows. The
    run ids first (DuckDB answers from its statistics, SQLite and PostgreSQL from their index),
    the rows only of an orphan run: a NOT IN over every summary was another 0.1 s per 25M rows."""
    s = step_summaries.c
    stored = set(conn.execute(sa.select(s.run_id).distinct()).scalars())
    orphans = sorted(stored - set(conn.execute(sa.select(runs.c.id)).scalars()))
    if not orphans:
        return []
    stmt = (
        sa.select(s.run_id, sa.func.sum(s.n_finite + s.n_nan + s.n_pos_inf + s.n_neg_inf))
        .where(s.run_id.in_(orphans))
        .group_by(s.run_id)
        .order_by(s.run_id)
    )
    return [(int(r[0]), int(r[1])) for r in conn.execute(stmt)]
