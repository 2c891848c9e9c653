"""One of N plain processes that form a gloo process group and log (transport="direct" unless told).

No Trainer: each process sets the launch's environment itself (RANK, WORLD_SIZE, MASTER_*;
with `nodes` > 1, NODE_RANK and LOCAL_RANK as Lightning's launcher sets them on each of that
many simulated hosts), joins the process group, builds a MultiRankLogger, logs `calls` calls
of two keys and finalizes, as Lightning would. Used by tests/runs/test_logger_many_ranks.py and
tests/runs/test_server_writers.py.

Each rank writes ``rank{r}.json``: its transport, run, and the route of its rows (the writer
that received them and the TCPStore they went to); rank 0 also writes ``launch_store.json``:
which ranks' rows were acknowledged (``ack/{r}`` above 0), or ended (``done/{r}``), through the
launch's TCPStore.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from tests.helpers.logger_helpers import stderr_to_file


def value(rank: int, call: int) -> float:
    return float(rank * 1_000_000 + call)


def rank_main(
    rank: int, world: int, port: int, db: str, calls: int, out: str, transport: str = "direct", nodes: int = 1,
    options: dict[str, Any] | None = None, go: str | None = None, stderr_to_out: bool = False,
    kill: dict[str, Any] | None = None,
) -> None:
    """With `go`, the rank writes ``{go}.ready{rank}`` once set up (the run created), then waits
    for the file `go` before it logs (the test changes the store meanwhile). With `stderr_to_out`,
    its stderr goes to ``{out}/rank{rank}.err`` (logger_helpers.stderr_to_file: for a forkserver's
    children). With `kill` (``rank``, ``at``, ``gate``), rank ``kill["rank"]`` kills itself
    (SIGKILL) at call ``at``, its rows of the calls before flushed; the other ranks wait there for
    the file ``gate`` (the test touches it once that rank is dead), and at the end no rank waits
    for a dead one."""
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
    from tests.helpers.internals import run_of

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
        if kill is not None and call == kill["at"]:
            _meet_the_kill(rank, logger, kill)
        logger.log_metrics({"value": value(rank, call), "call": call}, step=call)
        logger.save()
    channel = getattr(run_of(logger).sink_holder.sink, "channel", None)  # where this rank's rows went (before finalize drops it)
    route = None if channel is None else {
        "writer": channel.writer, "ns": channel.namespace,
        "rows_at": f"{channel.host or os.environ['MASTER_ADDR']}:{channel.port or os.environ['MASTER_PORT']}",
    }
    logger.finalize("success")
    Path(out, f"rank{rank}.json").write_text(
        json.dumps({"rank": rank, "transport": logger.transport, "run_id": logger.run_id, "route": route})
    )  # after finalize: a rank that raised never writes it
    if kill is None:
        dist.barrier()
        if rank == 0 and route is not None:
            _probe_launch_store(port, world, route["ns"], out)
    elif rank == 0:  # it hosts the launch's store: the live ranks may still need it
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and sum(1 for _ in Path(out).glob("rank*.json")) < world - 1:
            time.sleep(0.05)
    dist.destroy_process_group()


def _meet_the_kill(rank: int, logger: Any, kill: dict[str, Any]) -> None:
    if rank == kill["rank"]:
        # what came so far stored first (a sleep raced the writer on a loaded machine: none stored)
        if not logger.flush(timeout=60):
            raise RuntimeError(f"rank {rank}: the rows before the kill were not stored within 60 s")
        os.kill(os.getpid(), signal.SIGKILL)
    deadline = time.monotonic() + 120
    while not Path(kill["gate"]).exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def _probe_launch_store(port: int, world: int, namespace: str, out: str) -> None:
    """After every rank finalized: the ranks whose row keys are in the launch's store (rank 0's)."""
    import torch.distributed as dist

    client = dist.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=10), wait_for_workers=False)
    store = dist.PrefixStore(f"multirank_logger/{namespace}/", client)  # as the channel names its keys
    # a channel reads its ack counter where it first connects (the launch's store, for the
    # choice): a key at 0 there is no row; a row acknowledged through this store counts
    acked = [r for r in range(world) if store.check([f"ack/{r}"]) and int(store.add(f"ack/{r}", 0))]
    found = {"ack": acked, "done": [r for r in range(world) if store.check([f"done/{r}"])]}
    Path(out, "launch_store.json").write_text(json.dumps({"port": port, **found}))
