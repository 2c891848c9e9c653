"""One of N plain processes that form a gloo process group and log (transport="direct" unless told).

No Trainer: each process sets the launch's environment itself (RANK, WORLD_SIZE, MASTER_*;
with `nodes` > 1, NODE_RANK and LOCAL_RANK as Lightning's launcher sets them on each of that
many simulated hosts), joins the process group, builds a MultiRankLogger, logs `calls` calls
of two keys and finalizes, as Lightning would. Used by tests/test_logger_many_ranks.py and
tests/test_server_writers.py.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path
from typing import Any

from tests.logger_helpers import stderr_to_file


def value(rank: int, call: int) -> float:
    return float(rank * 1_000_000 + call)


def rank_main(
    rank: int, world: int, port: int, db: str, calls: int, out: str, transport: str = "direct", nodes: int = 1,
    options: dict[str, Any] | None = None, go: str | None = None, stderr_to_out: bool = False,
) -> None:
    """With `go`, the rank writes ``{go}.ready{rank}`` once set up (the run created), then waits
    for the file `go` before it logs (the test changes the store meanwhile). With `stderr_to_out`,
    its stderr goes to ``{out}/rank{rank}.err`` (logger_helpers.stderr_to_file: for a forkserver's children)."""
    import torch.distributed as dist

    if stderr_to_out:
        stderr_to_file(Path(out, f"rank{rank}.err"))

    per_node = world // nodes
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank % per_node),
        NODE_RANK=str(rank // per_node), WORLD_SIZE=str(world),
    )
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    from multirank_logger import MultiRankLogger

    logger = MultiRankLogger(
        db=db, name="many", transport=transport, flush_interval=0.05, flush_logs_every_n_steps=20, export_csv=False,
        **(options or {}),
    )
    _ = logger.experiment  # as Lightning's setup does on every rank
    if go is not None:
        Path(f"{go}.ready{rank}").touch()
        while not Path(go).exists():
            time.sleep(0.02)
    for call in range(calls):
        logger.log_metrics({"value": value(rank, call), "call": call}, step=call)
        logger.save()
    logger.finalize("success")
    Path(out, f"rank{rank}.json").write_text(
        json.dumps({"rank": rank, "transport": logger.transport, "run_id": logger.run_id})
    )  # after finalize: a rank that raised never writes it
    dist.barrier()
    dist.destroy_process_group()
