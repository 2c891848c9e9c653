"""A window of a run's rows laid out as a key x step x rank grid (the report's pass, run_scan.py).

A row's cell is its key's number, step and rank (``rank_spread.step_rank_cells``: as they are,
less the window's first step and rank, where they are dense); a step or rank without a row
in the window is then left out, as a step no key reached its 3 ranks at is in ``run_scan``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from multirank_logger.query.rank_spread import step_rank_cells

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
    steps, ranks, step_rank = step_rank_cells(step, rank, layers=n_keys)
    cells = n_keys * len(steps) * len(ranks)
    cell = key.astype(np.int64)  # in place from here: each temporary of a window is 8 MB
    cell *= len(steps) * len(ranks)
    cell += step_rank
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
    step_in, rank_in = in_cell.any(axis=(0, 2)), in_cell.any(axis=(0, 1))  # a step or rank without a row
    if not step_in.all():
        steps, grid, in_cell = steps[step_in], grid[:, step_in], in_cell[:, step_in]
    if not rank_in.all():
        ranks, grid, in_cell = ranks[rank_in], grid[:, :, rank_in], in_cell[:, :, rank_in]
    return Window(steps, ranks, grid, in_cell, key[bad], rank[bad], step[bad], kind)
