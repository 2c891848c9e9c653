"""A window of a run's rows laid out as a key x step x rank grid (the report's pass, run_scan.py).

A window's steps and ranks are nearly always every one between its first and last: a row's
cell is then its key, step and rank as they are, less the window's first step and rank,
without a counting pass over each column; where steps lie far apart (a run logging every
50th step), only the steps and ranks present get a place (``rank_spread.positions``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from multirank_logger.query.rank_spread import positions

__all__ = ["NON_FINITE_NAN", "NON_FINITE_NEG_INF", "NON_FINITE_POS_INF", "Window", "lay_out"]


@dataclass
class Window:
    """A window of steps laid out: ``grid[key, step, rank]`` holds the value (NaN where none, or
    not finite); ``logged`` where a row was; the non-finite rows as (key, rank, step, kind)."""

    steps: np.ndarray
    ranks: np.ndarray
    grid: np.ndarray
    logged: np.ndarray
    bad_key: np.ndarray
    bad_rank: np.ndarray
    bad_step: np.ndarray
    bad_kind: np.ndarray  # NON_FINITE_NAN, _POS_INF or _NEG_INF


NON_FINITE_NAN, NON_FINITE_POS_INF, NON_FINITE_NEG_INF = 0, 1, 2


def lay_out(n_keys: int, key: np.ndarray, rank: np.ndarray, step: np.ndarray, value: np.ndarray,
            seq: np.ndarray | None = None) -> Window | None:  # fmt: skip
    """A window's rows as a `Window`; None when a cell repeats and `seq` is missing."""
    low_step, low_rank = int(step.min()), int(rank.min())
    steps, ranks = np.arange(low_step, int(step.max()) + 1), np.arange(low_rank, int(rank.max()) + 1)
    dense = n_keys * len(steps) * len(ranks) <= 4 * len(step) + 1024
    if not dense:  # steps far apart (a key logged every k steps): only the steps and ranks present
        (steps, step_pos), (ranks, rank_pos) = positions(step), positions(rank)
    cells = n_keys * len(steps) * len(ranks)
    cell = key.astype(np.int64)  # in place from here: each temporary of a window is 8 MB
    cell *= len(steps)
    cell += step if dense else step_pos
    cell *= len(ranks)
    cell += rank if dense else rank_pos
    if dense:  # a step and a rank as they are, less the window's first (no counting pass over each)
        cell -= low_step * len(ranks) + low_rank
    logged = np.zeros(cells, bool)
    logged[cell] = True
    if seq is None and np.count_nonzero(logged) < len(cell):  # cheaper than counting each cell
        return None
    flat = np.full(cells, np.nan)
    if seq is not None:  # a rank's later call wins: of each cell's rows, the one with the largest seq
        order = np.lexsort((seq, cell))
        last_row = order[np.r_[cell[order][1:] != cell[order][:-1], True]]
        flat[cell[last_row]] = value[last_row]
    else:
        flat[cell] = value
    bad = np.flatnonzero(~np.isfinite(value))  # counted over every stored row, repeats too
    kind = np.where(np.isnan(value[bad]), NON_FINITE_NAN, np.where(value[bad] > 0, NON_FINITE_POS_INF, NON_FINITE_NEG_INF))
    if len(bad) and (kind != NON_FINITE_NAN).any():
        flat[np.isinf(flat)] = np.nan  # NaN/inf are the non-finite finding's
    shape = (n_keys, len(steps), len(ranks))
    grid, in_cell = flat.reshape(shape), logged.reshape(shape)
    if dense:  # a step no rank logged, a rank that logged nothing here: not in the window
        step_in, rank_in = in_cell.any(axis=(0, 2)), in_cell.any(axis=(0, 1))
        if not step_in.all():
            steps, grid, in_cell = steps[step_in], grid[:, step_in], in_cell[:, step_in]
        if not rank_in.all():
            ranks, grid, in_cell = ranks[rank_in], grid[:, :, rank_in], in_cell[:, :, rank_in]
    return Window(steps, ranks, grid, in_cell, key[bad], rank[bad], step[bad], kind)
