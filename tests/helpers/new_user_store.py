"""A store as a new user's first run leaves it (issue 40): 3 ranks, rank 2 a bad shard whose loss
spikes to 25,000, rank 1 slow to load data; ``val_loss`` at 3 epoch ends, ``epoch`` alike on every
rank, StepTimer's phases and RSS in bytes, Lightning's multi-line model summary, a checkpoint
decision. Two runs (the second a rerun), for the runs list and the overlay. Written through the
Store's own write paths, no training: the page tests read it in a real Chromium.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from multirank_logger.store.sql_store import Store
from multirank_logger.write.buffer import RecordBuffer

RANKS, STEPS, EPOCH_STEPS = 3, 60, 20
BAD_RANK, SLOW_RANK, SPIKE_STEP, SPIKE = 2, 1, 30, 25_000.0
VAL_STEPS = (19, 39, 59)
RSS = 600 * 2**20
MODEL_SUMMARY = (
    "\n  | Name  | Type   | Params | Mode \n-----------------------------------------\n"
    "0 | layer | Linear | 9      | train\n-----------------------------------------\n"
    "9         Trainable params\n0         Non-trainable params\n9         Total params"
)


def build(db: Path, runs: int = 2, ranks: int = RANKS) -> Path:
    """``runs`` runs of ``ranks`` ranks into a new store at ``db`` (rank 2 bad where there is one)."""
    store = Store(db)
    for n in range(runs):
        run = store.create_run("new_user", world_size=ranks, transport="direct")
        t0 = time.time()
        for rank in range(ranks):
            store.register_rank(run.id, rank, local_rank=rank, node_rank=0, host="node0", pid=0, status="success")
            store.update_rank(run.id, rank, started_at=t0, ended_at=t0 + 90)
            buffer = RecordBuffer()
            for step in range(STEPS):
                loss = 2.0 * math.exp(-step / 25) + 0.05 * rank + 0.1 * n
                if rank == BAD_RANK and step >= SPIKE_STEP:
                    loss = SPIKE if step == SPIKE_STEP else loss * 40
                values: dict[str, float | int] = {"train_loss": loss, "epoch": step // EPOCH_STEPS}
                if step in VAL_STEPS:
                    values["val_loss"] = loss * 1.1
                buffer.append(step, values)
            store.write(buffer.drain(run.id, rank))
            timing = [
                {"run_id": run.id, "rank": rank, "seq": step, "step": step, "epoch": step // EPOCH_STEPS, "batch_idx": step,
                 "data_s": 0.2 if rank == SLOW_RANK else 0.004, "forward_s": 0.012, "rest_s": 0.03, "batch_size": 16,
                 "rss": RSS + rank * 40 * 2**20 + step * 2**20, "time": t0 + step}
                for step in range(STEPS)
            ]
            logs = [{"run_id": run.id, "rank": rank, "seq": 0, "time": t0, "level": "INFO", "levelno": 20,
                     "logger": "lightning.pytorch.callbacks.model_summary", "message": MODEL_SUMMARY}]
            decisions = [{"run_id": run.id, "rank": rank, "seq": 0, "step": 59, "epoch": 2, "callback": "ModelCheckpoint",
                          "monitor": "val_loss", "mode": "min", "value": 0.5 + rank, "vote": rank != BAD_RANK,
                          "decision": True, "path": "ckpt/epoch=2.ckpt", "best": 0.5, "time": t0 + 60}]
            store.write_side({"step_timing": timing, "logs": logs, "decisions": decisions})
        store.update_run(run.id, status="success", ended_at=t0 + 90)
    store.close()
    return db
