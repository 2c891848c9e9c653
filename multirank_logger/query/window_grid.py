"""A window of a run's rows laid out as a key x step x rank grid (the report's pass, run_scan.py).

A row's cell is its key's number, step and rank (``rank_spread.step_rank_cells``: as they are,
less the window's first step and rank, where they are dense); a step or rank without a row
in the window is then left out, as a step no key reached its 3 ranks at is in ``run_scan``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from multirank_logger.judgement.non_finite import NON_FINITE_NAN, non_finite_kinds
from multirank_logger.query.rank_spread import step_rank_cells

__all__ = ["GridBuilder", "Window", "lay_out"]


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
    bad_kind: np.ndarray  # judgement.non_finite's kind of each (non_finite_kinds)


def lay_out(n_keys: int, key: np.ndarray, rank: np.ndarray, step: np.ndarray, value: np.ndarray,
            seq: np.ndarray | None = None) -> Window | None:
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
    bad, kind = non_finite_kinds(value)  # counted over every stored row, repeats too
    return _window(steps, ranks, flat, logged, n_keys, (key[bad], rank[bad], step[bad], kind))


def _window(steps: np.ndarray, ranks: np.ndarray, flat: np.ndarray, logged: np.ndarray, n_keys: int,
            bad: tuple[np.ndarray, ...]) -> Window:
    if len(bad[3]) and (bad[3] != NON_FINITE_NAN).any():
        flat[np.isinf(flat)] = np.nan  # NaN/inf are the non-finite finding's
    shape = (n_keys, len(steps), len(ranks))
    grid, in_cell = flat.reshape(shape), logged.reshape(shape)
    step_in, rank_in = in_cell.any(axis=(0, 2)), in_cell.any(axis=(0, 1))  # a step or rank without a row
    if not step_in.all():
        steps, grid, in_cell = steps[step_in], grid[:, step_in], in_cell[:, step_in]
    if not rank_in.all():
        ranks, grid, in_cell = ranks[rank_in], grid[:, :, rank_in], in_cell[:, :, rank_in]
    return Window(steps, ranks, grid, in_cell, *bad)


class GridBuilder:
    """A `Window` of known steps and ranks (every step from the first to the last, every rank
    from the lowest to the highest: dense), its rows placed a chunk at a time as they are read.

    What `lay_out` makes of all of a window's rows at once, in the memory of the grid (9 bytes a
    cell) and of one chunk: the report's pass reads longer windows in it, each a scan of fewer
    of the store's row groups (DuckDB's zone maps by step).
    """

    def __init__(self, n_keys: int, first_step: int, last_step: int, low_rank: int, high_rank: int) -> None:
        self.n_keys = n_keys
        self.steps = np.arange(first_step, last_step + 1)
        self.ranks = np.arange(low_rank, high_rank + 1)
        cells = n_keys * len(self.steps) * len(self.ranks)
        self.flat = np.full(cells, np.nan)
        self.logged = np.zeros(cells, bool)
        self.rows = 0
        self.bad: list[tuple[np.ndarray, ...]] = []

    def add(self, key: np.ndarray, rank: np.ndarray, step: np.ndarray, value: np.ndarray) -> None:
        """A chunk of rows within the grid's steps and ranks (key: its number, below `n_keys`)."""
        n_ranks = len(self.ranks)
        first, last = int(self.steps[0]), int(self.steps[-1])
        narrow = len(self.flat) < 2**31 and -(2**31) <= first and last < 2**31  # int32 cells where they fit
        cell = step.astype(np.int32 if narrow else np.int64)  # in place from here
        cell -= first
        cell *= n_ranks
        cell += rank
        cell -= int(self.ranks[0])
        cell += key.astype(cell.dtype, copy=False) * (len(self.steps) * n_ranks)
        self.logged[cell] = True
        self.flat[cell] = value
        self.rows += len(cell)
        bad, kind = non_finite_kinds(value)
        if len(bad):
            self.bad.append((key[bad], rank[bad], step[bad], kind))

    def window(self) -> Window | None:
        """The window; None when a cell holds two rows (a rank's repeated call: `lay_out` with seq decides)."""
        if np.count_nonzero(self.logged) < self.rows:
            return None
        bad = tuple(np.concatenate(col) for col in zip(*self.bad)) if self.bad else (
            np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
        return _window(self.steps, self.ranks, self.flat, self.logged, self.n_keys, bad)
