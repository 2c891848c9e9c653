"""Rows and tables with planted problems, judged by the report's pass, the watch and the page alike:
`planted_rows`, a 7-rank run's metric rows (query/run_scan.py's tests); `noisy_losses`, a loss
table whose only departures are the shards' own noise (the judgement's false-alarm tests)."""

from __future__ import annotations

import numpy as np

from multirank_logger.rows.schema import encode_value

RANKS, STEPS, KEYS = 7, 240, ("a_loss", "b_acc", "c_flat")


def planted_rows(seed: int) -> list[dict]:
    """A 7-rank run: noisy keys, rank 5 departing on a_loss from step 100 and rank 2 on b_acc
    for a stretch; NaN and inf; rank 6 missing some steps; some steps logged twice by a rank
    (the later call, which wins, departs); a key every rank logs alike."""
    rng = np.random.default_rng(seed)
    out = []
    seq = dict.fromkeys(range(RANKS), 0)
    for step in range(STEPS):
        for rank in range(RANKS):
            if rank == 6 and step % 7 == 3:
                continue
            calls = 2 if (rank + step) % 23 == 0 else 1
            for call in range(calls):
                for key in KEYS:
                    x = 1.0 + 0.1 * rng.standard_normal()
                    if key == "a_loss" and rank == 5 and step >= 100:
                        x += 3.0
                    if key == "b_acc" and rank == 2 and 60 <= step < 140:
                        x *= 5
                    if key == "b_acc" and call == 1:
                        x = 40.0  # the later call wins: a one-step spike, no finding
                    if key == "c_flat":
                        x = float(step)
                    if (rank, step, key) == (3, 77, "a_loss"):
                        x = float("nan")
                    if (rank, step, key) in ((1, 5, "b_acc"), (1, 9, "b_acc")):
                        x = float("inf") if step == 5 else float("-inf")
                    value, dtype = encode_value(x)
                    out.append({"run_id": 1, "rank": rank, "seq": seq[rank], "step": step, "key": key, "value": value,
                                "dtype": dtype, "time": 0.0})
                seq[rank] += 1
    return out


def noisy_losses(seed: int, ranks: int, steps: int = 200) -> np.ndarray:
    """A decaying loss per rank with each shard's own noise and a per-shard offset."""
    rng = np.random.default_rng(seed)
    trend = 2.0 * np.exp(-np.arange(steps) / 60)[:, None] + 0.3
    return trend * (1 + 0.05 * rng.standard_normal(ranks)) + 0.2 * trend * rng.standard_normal((steps, ranks))
