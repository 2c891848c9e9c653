"""Property-based tests of "nothing lost" (issue 38): random sequences of log calls with adversarial
keys, values and steps, interleaved with faults (the store deleted, replaced by another store, held
by another process, its disk filling up), on SQLite, DuckDB and PostgreSQL, direct transport in this
process and gather in a real 2-process run (ending with finalize, or through both ranks' exit hooks).
After each: every accepted value is stored, in a spill file the output named, or counted lost; a
refused call raised at the call; `success` only with every value stored; importing every spill
restores each value once into its own run (tests/helpers/nothing_lost.py).

Bounded for `make test` (derandomized where $CI is set); benchmarks/soak_nothing_lost.py runs many more.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multirank_logger.errors import InvalidMetric
from tests.helpers import nothing_lost as model
from tests.helpers.internals import run_of
from tests.helpers.launches import forkserver, spawn_ranks
from tests.helpers.stores import BACKEND_SUFFIXES, new_postgres_database

# CI runs the same examples every time (a failure there is one a person can rerun); locally they vary
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "default"))

def _examples(bounded: int) -> int:
    """`bounded` examples in `make test` (~40 s of the suite in all); the soak's count when it sets one."""
    return int(os.environ.get("NOTHING_LOST_EXAMPLES", bounded))


_BOUNDED = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}


class _Captured(io.StringIO):
    """This process's stderr during a run: the messages naming spill files, for the check."""


def run_in_process(db: str, scenario: model.Scenario, scratch: Path, spill_dir: Path | None = None) -> None:
    """Log `scenario` through one MultiRankLogger (direct transport) with its fault, then check the promise."""
    from multirank_logger import MultiRankLogger

    captured = _Captured()
    holder = None
    with contextlib.redirect_stderr(captured):
        logger = MultiRankLogger(
            db=db, save_dir=str(scratch / "logs"), spill_dir=str(spill_dir or scratch / "spill"), flush_interval=0.02,
            flush_logs_every_n_steps=model.FLUSH_EVERY, timeout=1.0, finalize_timeout=5.0,
        )
        _ = logger.experiment  # as Lightning's set-up does: the run exists from here on
        run_uuid = run_of(logger).resolve().uuid
        outcomes = []
        kept_from = 0  # the first call whose rows the store must hold (a deleted file takes the earlier ones)
        for i, call in enumerate(scenario.calls):
            if i == scenario.fault_at and scenario.fault != "none" and "://" not in db:
                if scenario.fault in ("delete", "replace"):
                    # what was stored goes with the file (the user's doing): the check starts at this call
                    assert logger.flush(30)
                    kept_from = i
                holder = _inject(scenario.fault, Path(db), scratch)
            try:
                logger.log_metrics(call.metrics, step=call.step)
                outcomes.append(False)
            except InvalidMetric:
                outcomes.append(True)
        logger.finalize("success")
    if holder is not None:
        holder.wait(30)
    assert outcomes == [c.refused for c in scenario.calls], "a call refused that the store holds, or accepted one it cannot"
    expected = model.expected_rows(scenario.calls, outcomes, kept_from)
    model.check_promise(db, run_uuid, expected, captured.getvalue(), recovery=str(scratch / f"recovered{Path(db).suffix}"))


def _inject(fault: str, db: Path, scratch: Path) -> Any:
    if fault == "delete":
        model.delete_store(db)
    elif fault == "replace":
        model.replace_store(db, scratch)
    elif fault == "lock":
        return model.hold_store(db, 1.5, scratch)  # past the logger's timeout of 1 s: rows wait or spill
    elif fault == "full":
        return model.fill_disk(db.parent)  # freed after the run, before the spills are imported
    return None


@pytest.mark.parametrize("backend", sorted(BACKEND_SUFFIXES))
@settings(max_examples=_examples(12), **_BOUNDED)
@given(scenario=model.scenarios())
def test_direct_embedded_keeps_every_accepted_value(backend: str, scenario: model.Scenario) -> None:
    """Direct transport on SQLite and DuckDB, in this process, with store faults."""
    scratch = Path(tempfile.mkdtemp(prefix="nothing-lost-"))
    try:
        run_in_process(str(scratch / f"runs{BACKEND_SUFFIXES[backend]}"), scenario, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@settings(max_examples=_examples(5), **_BOUNDED)
@given(scenario=model.scenarios(faults=("none",)))
def test_direct_postgresql_keeps_every_accepted_value(postgres_server, scenario: model.Scenario) -> None:
    """Direct transport on a PostgreSQL server (no file faults: the server is shared by the session)."""
    scratch = Path(tempfile.mkdtemp(prefix="nothing-lost-"))
    try:
        run_in_process(new_postgres_database(postgres_server), scenario, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# -- a full disk: the store on a small tmpfs of its own, in a mount namespace (root) -----------------

#: where the store's tmpfs is mounted, in the subprocess that runs the test below
_FULL_DISK = os.environ.get("NOTHING_LOST_FULL_DISK")


@pytest.mark.skipif(_FULL_DISK is None, reason="runs inside test_direct_full_disk_keeps_every_accepted_value")
@pytest.mark.parametrize("backend", sorted(BACKEND_SUFFIXES))
@settings(max_examples=_examples(2), **_BOUNDED)
@given(scenario=model.scenarios(faults=("full",), max_calls=15), spill_on_full_disk=st.booleans())
def test_direct_on_a_disk_filling_up(backend: str, scenario: model.Scenario, spill_on_full_disk: bool) -> None:
    """The store's disk fills up before call `fault_at`; the spill dir on it too (its values counted
    lost) or on another disk (importing them, once the disk has room again, restores them)."""
    assert _FULL_DISK is not None
    disk = Path(tempfile.mkdtemp(dir=_FULL_DISK))
    scratch = Path(tempfile.mkdtemp(prefix="nothing-lost-"))
    try:
        run_in_process(str(disk / f"runs{BACKEND_SUFFIXES[backend]}"), scenario, scratch,
                       spill_dir=disk / "spill" if spill_on_full_disk else None)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(disk, ignore_errors=True)


def test_direct_full_disk_keeps_every_accepted_value() -> None:
    """test_direct_on_a_disk_filling_up, in a subprocess with a 16 MiB tmpfs of its own (`unshare -m`)."""
    if model.no_unshare() is not None:
        pytest.skip(str(model.no_unshare()))
    disk = tempfile.mkdtemp(prefix="nothing-lost-disk-")
    try:
        pytest_cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                      f"{__file__}::test_direct_on_a_disk_filling_up"]
        script = f"mount -t tmpfs -o size=16m none {disk} && exec {' '.join(pytest_cmd)}"
        env = {**os.environ, "NOTHING_LOST_FULL_DISK": disk}
        done = subprocess.run(["unshare", "-m", "sh", "-c", script], env=env, capture_output=True, text=True,
                              timeout=300, check=False)
        assert done.returncode == 0 and " passed" in done.stdout, (done.stdout + done.stderr)[-5000:]
    finally:
        shutil.rmtree(disk, ignore_errors=True)


# -- gather: a real 2-process run ------------------------------------------------------------------

def _gather_rank(rank: int, world: int, port: int, db: str, scratch: str) -> None:
    """One rank of a gather run: logs its calls, notes which raised and its stderr, finalizes or not."""
    import datetime

    import torch.distributed as dist

    work = Path(scratch)
    err = open(work / f"rank{rank}.err", "w")  # noqa: SIM115 - for the life of the process
    os.dup2(err.fileno(), 2)
    sys.stderr = err
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    from multirank_logger import MultiRankLogger

    scenario: model.Scenario = pickle.loads((work / f"scenario{rank}.pkl").read_bytes())
    logger = MultiRankLogger(
        db=db, transport="gather", save_dir=str(work / "logs"), spill_dir=str(work / "spill"), flush_interval=0.02,
        flush_logs_every_n_steps=model.FLUSH_EVERY, timeout=10.0,
    )
    _ = logger.experiment
    (work / f"uuid{rank}").write_text(run_of(logger).resolve().uuid)
    outcomes = []
    for call in scenario.calls:
        try:
            logger.log_metrics(call.metrics, step=call.step)
            outcomes.append(False)
        except InvalidMetric:
            outcomes.append(True)
    (work / f"outcomes{rank}.pkl").write_bytes(pickle.dumps(outcomes))
    if scenario.finalize:
        logger.finalize("success")
        dist.barrier()
    else:
        # no finalize: the process ends as a script does, through its exit hooks (a multiprocessing
        # child skips them: os._exit), while its peer ends the same way
        import atexit

        dist.barrier()
        time.sleep(scenario.exit_delay)
        atexit._run_exitfuncs()
        time.sleep(scenario.linger)  # the rest of a script's teardown
    sys.stderr.flush()


#: each rank's calls; when it ends without finalize, how long it waits before its exit hooks and lives
#: on after them (the ranks' ends in either order, rank 0's TCPStore gone with its process)
_gather_scenarios = st.lists(
    st.builds(
        lambda s, delay, linger: dataclasses.replace(s, exit_delay=delay, linger=linger),
        model.scenarios(faults=("none",), max_calls=10), st.sampled_from([0.0, 0.3]), st.sampled_from([0.0, 0.3]),
    ),
    min_size=2, max_size=2,
)


@pytest.mark.parametrize("finalize", [True, False], ids=["finalize", "exit-hooks"])
@settings(max_examples=max(2, _examples(2) // 10), **_BOUNDED)
@given(backend=st.sampled_from(sorted(BACKEND_SUFFIXES)), scenarios=_gather_scenarios)
def test_gather_two_ranks_keep_every_accepted_value(backend: str, scenarios: list[model.Scenario], finalize: bool) -> None:
    """Gather transport, 2 real ranks over gloo, each with its own calls; some runs end without
    finalize, both ranks through their exit hooks."""
    for scenario in scenarios:
        scenario.finalize = finalize
    scratch = Path(tempfile.mkdtemp(prefix="nothing-lost-gather-"))
    try:
        _gather_run(str(scratch / f"runs{BACKEND_SUFFIXES[backend]}"), scenarios, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.mark.parametrize("finalize", [True, False], ids=["finalize", "exit-hooks"])
@settings(max_examples=max(1, _examples(1) // 10), **_BOUNDED)
@given(scenarios=_gather_scenarios)
def test_gather_postgresql_keeps_every_accepted_value(
    postgres_server: Any, scenarios: list[model.Scenario], finalize: bool
) -> None:
    """Gather transport on a PostgreSQL server, 2 real ranks (rank 0 alone connects to the server)."""
    for scenario in scenarios:
        scenario.finalize = finalize
    scratch = Path(tempfile.mkdtemp(prefix="nothing-lost-gather-"))
    try:
        _gather_run(new_postgres_database(postgres_server), scenarios, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


_ONE_VALUE = model.Call({"b": 2.0}, step=0, stored_step=0, expected={"b": 2.0}, refused=False)
_REFUSED = model.Call({"a": 1.0}, step="3", stored_step=model.REFUSED, expected={"a": 1.0}, refused=True)


@pytest.mark.parametrize("idle", [[], [_REFUSED]], ids=["no-call", "refused-call"])
@pytest.mark.parametrize("idle_rank", [0, 1])
def test_gather_rank_that_logged_nothing_ends_its_part_at_exit(idle_rank: int, idle: list[model.Call]) -> None:
    """Both ranks exit through their exit hooks without finalize, one of them having logged nothing
    accepted. Rank 0 that logged nothing still took rank 1's rows and ended the run (it ended
    nothing: the run stayed 'running' and rank 1's value was in its spill file, or, as rank 0's
    exit took the TCPStore with it, in neither); rank 1 that logged nothing still said it was done
    (rank 0 waited its timeout for it and recorded the run 'incomplete')."""
    scenarios = [model.Scenario(list(idle), finalize=False), model.Scenario([_ONE_VALUE], finalize=False)]
    if idle_rank == 1:
        scenarios.reverse()
    scratch = Path(tempfile.mkdtemp(prefix="nothing-lost-gather-"))
    try:
        db = str(scratch / "runs.sqlite")
        started = time.monotonic()
        run_uuid = _gather_run(db, scenarios, scratch)
        stored, run = model.run_rows(db, run_uuid)
        assert run is not None and run[0] == "success", run
        assert stored == model.Counter({(0, "b", 2.0): 1})
        assert time.monotonic() - started < 9.0, "a rank waited its timeout (10 s) for the other's end"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _gather_run(db: str, scenarios: list[model.Scenario], scratch: Path) -> str:
    """Run `scenarios` (one per rank, no fault) as a gather launch on `db`, check the promise and
    that the run is a success; the run's uuid."""
    for rank, scenario in enumerate(scenarios):
        (scratch / f"scenario{rank}.pkl").write_bytes(pickle.dumps(scenario))
    codes = spawn_ranks(_gather_rank, 2, db, str(scratch), join_s=120, ctx=forkserver("tests.helpers.nothing_lost"))
    output = "".join((scratch / f"rank{r}.err").read_text() for r in range(2) if (scratch / f"rank{r}.err").exists())
    assert codes == [0, 0], output[-3000:]
    run_uuid = (scratch / "uuid0").read_text()
    assert (scratch / "uuid1").read_text() == run_uuid
    expected = model.Counter()  # type: ignore[var-annotated]
    for rank, scenario in enumerate(scenarios):
        outcomes = pickle.loads((scratch / f"outcomes{rank}.pkl").read_bytes())
        assert outcomes == [c.refused for c in scenario.calls]
        expected += model.expected_rows(scenario.calls, outcomes)
    model.check_promise(db, run_uuid, expected, output)
    # no fault: every rank ended (finalize, or its exit hooks) and the store took every value
    stored, run = model.run_rows(db, run_uuid)
    assert run is not None and run[0] == "success" and stored == expected, f"run {run}; output:\n{output[-3000:]}"
    return run_uuid
