"""Plain processes over gloo (no Trainer) that log through MultiRankLogger while a test breaks
something under one rank (tests/runs/test_faults_ranks.py).

Each rank logs `calls` calls of two keys ("value" = rank * 1e6 + call, "call"), in two halves:
after the first it flushes, touches ``ready{rank}`` in `sync_dir` and waits for ``go`` there
(the test has started its fault by then), then logs the second half and finalizes. Every wait
is bounded.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from pathlib import Path

from tests.helpers.internals import run_of, writer_cycle_held
from tests.helpers.logger_helpers import stderr_to_file


def value(rank: int, call: int) -> float:
    return float(rank * 1_000_000 + call)


CLONE_NEWNS = 0x00020000


def _own_mounts(store_dir: str, spill_dir: str | None) -> None:
    """This process alone (a mount namespace of its own) sees `store_dir` through a bind mount that
    `_store_read_only` later remounts read-only, and, with `spill_dir`, a full 256 KiB tmpfs there.
    Called first thing: unshare(CLONE_NEWNS) needs a process with one thread."""
    import ctypes
    import subprocess

    if ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS) failed")
    subprocess.run(["mount", "--make-rprivate", "/"], check=True)
    subprocess.run(["mount", "--bind", store_dir, store_dir], check=True)
    if spill_dir is not None:
        os.makedirs(spill_dir, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "none", spill_dir], check=True)
        try:
            with open(os.path.join(spill_dir, "filler"), "wb") as fh:
                while True:
                    fh.write(b"\0" * 65536)
                    fh.flush()
        except OSError:
            pass  # full: what the test wants


def _store_read_only(store_dir: str) -> None:
    import subprocess

    subprocess.run(["mount", "-o", "remount,bind,ro", store_dir], check=True)


def rank_main(rank: int, world: int, port: int, db: str, spill_dir: str, calls: int, sync_dir: str,
              transport: str, timeout: float, fault_rank: int = -1, spill_full: bool = False,
              second_phase: int = 0) -> None:
    """`fault_rank` sees the store's directory turn read-only after its first half (spilling the
    rest, onto a full disk with `spill_full`); the other ranks see nothing wrong. With
    `second_phase`, each rank then waits for ``go2`` and logs that many more calls (steps from
    `calls` on) in a second phase of the same run, as ``trainer.test`` after ``fit``, and
    finalizes again (``done2{rank}.json``)."""
    stderr_to_file(Path(sync_dir, f"rank{rank}.err"))  # logger_helpers.ranks_stderr reads them
    faulty = rank == fault_rank
    if faulty:
        _own_mounts(os.path.dirname(db), spill_dir.format(rank) if spill_full else None)
    import torch.distributed as dist

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world)
    )
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    from multirank_logger import MultiRankLogger

    # a per-rank spill_dir: "{}" takes the rank (one rank's on a full disk, the others' elsewhere)
    logger = MultiRankLogger(
        db=db, name="faults", transport=transport, spill_dir=spill_dir.format(rank), timeout=timeout,
        flush_interval=0.05, flush_logs_every_n_steps=20, export_csv=False,
    )
    _ = logger.experiment  # as Lightning's setup does on every rank
    sync = Path(sync_dir)
    half = calls // 2
    for call in range(calls):
        logger.log_metrics({"value": value(rank, call), "call": call}, step=call)
        logger.save()
        if call == half - 1:
            logger.flush(30)
            if faulty:
                # Linux refuses to make a mount read-only while a file on it is open for writing
                # (EBUSY): the store's pooled connection is closed first, with the writer held off
                with writer_cycle_held(logger):
                    run_of(logger).store.engine.dispose()
                    _store_read_only(os.path.dirname(db))
            (sync / f"ready{rank}").touch()
            _wait_file(sync / "go")
        if call % 100 == 0:
            time.sleep(0.02)  # let the writer meet the fault during the run, not only at its end
    logger.finalize("success")
    (sync / f"done{rank}.json").write_text(json.dumps({"rank": rank, "run_id": logger.run_id}))
    if second_phase:
        _wait_file(sync / "go2")
        for call in range(calls, calls + second_phase):
            logger.log_metrics({"value": value(rank, call), "call": call}, step=call)
        logger.finalize("success")
        (sync / f"done2{rank}.json").write_text(json.dumps({"rank": rank, "run_id": logger.run_id}))
    # no barrier (a rank whose peer was stopped must not wait on it), and no interpreter teardown:
    # torch's C++ teardown with a peer that was stopped mid-call sometimes aborts ("terminate
    # called without an active exception"), after everything this test checks is done
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _wait_file(path: Path, bound: float = 60) -> None:
    deadline = time.monotonic() + bound
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
