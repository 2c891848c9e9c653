"""Plain processes over gloo (no Trainer) that log through MultiRankLogger while a test breaks
something under one rank (tests/test_faults_ranks.py).

Each rank logs `calls` calls of two keys ("value" = rank * 1e6 + call, "call"), in two halves:
after the first it flushes, touches ``ready{rank}`` in `sync_dir` and waits for ``go`` there
(the test has started its fault by then), then logs the second half and finalizes. Every wait
is bounded.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path


def value(rank: int, call: int) -> float:
    return float(rank * 1_000_000 + call)


def rank_main(rank: int, world: int, port: int, db: str, spill_dir: str, calls: int, sync_dir: str,
              transport: str, timeout: float) -> None:
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
            logger._writer.flush_until(time.monotonic() + 30)
            (sync / f"ready{rank}").touch()
            deadline = time.monotonic() + 60
            while not (sync / "go").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        if call % 100 == 0:
            time.sleep(0.02)  # let the writer meet the fault during the run, not only at its end
    logger.finalize("success")
    (sync / f"done{rank}.json").write_text(json.dumps({"rank": rank, "run_id": logger.run_id}))
    # no barrier: a rank whose peer was stopped must not wait on it
