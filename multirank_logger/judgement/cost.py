"""What a finding cost: the time every rank waited on a straggler, the steps trained after a NaN.

The only place these figures are decided; pure NumPy over the same steps x ranks tables the
stragglers are judged on (`ranks.stragglers`), no SQL.

A straggler's cost. In DDP every rank waits for the slowest in the gradients' all-reduce, so
each rank's *whole* step takes the same wall time (StepTimer's ``rest_s`` holds the others'
wait): the difference between ranks shows in the phase before the all-reduce where the
straggler spent longer, its data wait or its forward. Per step of the straggler's stretch
(its first to its last departing step), in that phase:

    waited = the slowest rank's seconds - the median rank's seconds

is what every rank waited on it that step (the median rank is where the step would have been
without it). Summed over the stretch's steps, ``waited_s`` is the wall time the run lost;
times the world size, ``rank_hours`` is the device time lost (GPU-hours on CUDA, where
StepTimer timed the forward on the GPU; on CPU, CPU ranks' hours: the words say which).
Two findings of one phase over the same steps (a whole host straggling) each count the same
steps: their costs overlap and are not to be added.

A NaN's cost: the steps the run trained after its origin's first step (the run's last step
minus it): the steps a stop at the first NaN would have saved.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from multirank_logger.judgement.ranks import MIN_RANKS

__all__ = ["COST_FIELDS", "hours_unit", "stretch_cost", "steps_after", "straggler_cost"]

#: the fields a straggler's cost adds to its item (and to the kept verdict's detail)
COST_FIELDS = ("waited_s", "cost_steps", "rank_hours", "hours_unit")


def hours_unit(on_gpu: bool) -> str:
    """How the device time lost is named: ``GPU-hours`` where the ranks ran on CUDA, else
    ``rank-hours`` (CPU ranks: an hour of one rank's process, not of a GPU)."""
    return "GPU-hours" if on_gpu else "rank-hours"


def straggler_cost(steps: np.ndarray, values: np.ndarray, first_step: int, last_step: int, world_size: int,
                   on_gpu: bool = False) -> dict[str, Any]:
    """The cost of a straggler in one phase (see the module docstring).

    Args:
        steps: the phase table's steps (ascending), and `values` its steps x ranks seconds (NaN
            where a rank has no time at a step).
        first_step: the straggler's first departing step, and `last_step` its last: the stretch summed.
        world_size: the run's ranks (every one of them waited).
        on_gpu: the ranks ran on CUDA (names the hours GPU-hours).

    Returns:
        ``waited_s`` (per step the slowest rank's seconds minus the median rank's, summed over
        the stretch's steps timed by ``MIN_RANKS`` ranks or more: the steps the straggler was
        judged on, and the watch counts), ``cost_steps`` (those steps), ``rank_hours``
        (``waited_s`` x `world_size` / 3600) and ``hours_unit`` (`hours_unit`).
    """
    steps = np.asarray(steps)
    values = np.asarray(values, dtype=float)
    inside = (steps >= first_step) & (steps <= last_step)
    table = values[inside]
    timed = (~np.isnan(table)).sum(axis=1) >= MIN_RANKS  # the counted steps (ranks.KeySteps), as the watch's
    table = table[timed]
    if not len(table):
        return stretch_cost(np.zeros(0), np.zeros(0), np.zeros(0), first_step, last_step, world_size, on_gpu)
    return stretch_cost(steps[inside][timed], np.nanmax(table, axis=1), np.nanmedian(table, axis=1), first_step,
                        last_step, world_size, on_gpu)


def stretch_cost(steps: np.ndarray, slowest: np.ndarray, median: np.ndarray, first_step: int, last_step: int,
                 world_size: int, on_gpu: bool = False) -> dict[str, Any]:
    """`straggler_cost` from each step's slowest and median rank's seconds (the watch keeps these
    per step, not the ranks' table: ``ranks.KeySteps``' ``high`` and ``median``): the same figures,
    over the `steps` from `first_step` to `last_step`."""
    steps = np.asarray(steps)
    inside = (steps >= first_step) & (steps <= last_step)
    waited = float(np.sum(np.asarray(slowest, float)[inside] - np.asarray(median, float)[inside]))
    return {"waited_s": waited, "cost_steps": int(inside.sum()), "rank_hours": waited * world_size / 3600.0,
            "hours_unit": hours_unit(on_gpu)}


def steps_after(origin_step: int, last_step: int | None) -> int | None:
    """The steps trained after a problem's origin (`origin_step`): the run's `last_step` minus
    it (0 where the run stopped there); None where the run's last step is not known."""
    if last_step is None:
        return None
    return max(0, int(last_step) - int(origin_step))
