"""Whether a rank departs from the others, straggles, logged NaN/inf or stands out in peak memory.

The only place these are decided. Everything here takes NumPy arrays of one run's values laid
out as steps x ranks (a whole run, or a window of steps at a time) and knows nothing of where
they came from: the report feeds it from one pass over a store (``query/run_scan.py``), a watch
during training can feed it the windows it holds.

How a rank *departs* (outliers and stragglers), with no fixed threshold on the values:

1. at each step, the median of the ranks, and each rank's deviation from it;
2. the ranks' typical spread at that step: the median of the ranks' absolute deviations
   (robust to one rank in three going astray), smoothed over neighbouring steps so that a step
   where two ranks happen to agree does not make every other rank look far;
3. a rank departs at a step when its deviation is over ``DEPART_SPREADS`` typical spreads, and
   it *persistently* departs when it does so on most steps of a stretch of at least
   ``MIN_STEPS`` steps (or 5% of the run), so a one-off spike or the noise of normal shards is
   no finding. The finding gives the stretch's first step and the size of the departure.

It takes three ranks (``MIN_RANKS``): with two, each is as far from their median as the other.

Fed a window at a time (`DepartureWindows`), what stays per step is the ranks' count, median,
typical spread, min and max, and the few values that may depart: every value whose deviation is
more than ``DEPART_SPREADS`` times the smallest spread within ``SPREAD_WINDOW`` steps each side.
The smoothed spread is never below that minimum, so every value that departs is among them, and
`judge_departures` decides exactly on them; a window's last steps wait for the next window.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "DEPART_SPREADS", "MEMORY_RATIO", "MIN_RANKS", "MIN_STEPS", "SPREAD_WINDOW", "STRAGGLER_MIN_SHARE", "STRAGGLER_PHASES",
    "WRITER_RSS_ALLOWANCE", "DepartureWindows", "KeySteps", "departures", "judge_departures",
    "memory_measure", "memory_outliers", "non_finite_ranks", "votes_split", "persistent", "rolling_median", "rolling_min", "row_medians",
    "straggler", "stragglers",
]

#: a rank departs at a step when it is this many typical spreads of the ranks from their median
DEPART_SPREADS = 8.0
#: a departure is persistent over at least this many steps (or 5% of the run's steps, if more)
MIN_STEPS = 5
#: steps each side whose typical spreads are pooled (a rolling median)
SPREAD_WINDOW = 5
#: ranks a step needs for a median that one rank cannot move
MIN_RANKS = 3
#: StepTimer's columns judged for stragglers (the page draws each as its series `timing:COLUMN`)
STRAGGLER_PHASES = ("data_s", "forward_s")
#: a straggler's extra time must be at least this share of a step to be worth a finding
STRAGGLER_MIN_SHARE = 0.1
#: a rank's peak memory stands out at this many times the other ranks' median peak
MEMORY_RATIO = 1.25
#: host memory (RSS) rank 0 of a gather run may hold beyond the others' before the ratio counts: it
#: alone writes the store (connection, cache, the batches it receives); above what a clean run and one
#: under 256 senders measured (benchmarks/RESULTS.md, "Figures the source cites")
WRITER_RSS_ALLOWANCE = 384 * 2**20
#: steps in the rolling share of departing steps that makes a stretch (`persistent`)
_STRETCH_WINDOW = 5


@dataclass
class KeySteps:
    """One key, per step with at least ``MIN_RANKS`` finite values, in step order; and the values
    that may depart (a superset of those that do)."""

    steps: np.ndarray
    count: np.ndarray  # ranks with a finite value at the step
    median: np.ndarray
    mad: np.ndarray  # median absolute deviation from `median`
    low: np.ndarray  # the ranks' min
    high: np.ndarray  # the ranks' max
    # candidate values: the position in `steps`, the rank, its value and its deviation from `median`
    cand_pos: np.ndarray
    cand_rank: np.ndarray
    cand_value: np.ndarray
    cand_dev: np.ndarray


# -- departures --------------------------------------------------------------------------------


def departures(steps: np.ndarray, ranks: np.ndarray, values: np.ndarray, *, higher_only: bool = False) -> list[dict[str, Any]]:
    """Ranks departing persistently from the others in a whole steps x ranks table (`values`,
    NaN where a rank has no value; NaN and inf are the non-finite finding's, not a departure).

    Returns:
        One dict per departing rank: rank, first_step, last_step, steps (departing), ratio
        (its median value over the ranks' median, where that is not 0), spreads (its median
        deviation in typical spreads), excess (its median deviation, in the values' unit).
    """
    values = np.array(values, dtype=float)
    values[~np.isfinite(values)] = np.nan
    counted = (~np.isnan(values)).sum(axis=1) >= MIN_RANKS
    values, steps = values[counted], np.asarray(steps)[counted]
    if len(steps) < MIN_STEPS:
        return []
    median = np.nanmedian(values, axis=1)
    dev = values - median[:, None]
    mad = np.nanmedian(np.abs(dev), axis=1)
    pos, col = np.nonzero(~np.isnan(dev))  # every value is a candidate here
    rank = np.asarray(ranks, dtype=np.int64)[col]
    none = np.zeros(0)
    stats = KeySteps(steps, none, median, mad, none, none, pos, rank, values[pos, col], dev[pos, col])
    return judge_departures(stats, higher_only=higher_only)


def judge_departures(stats: KeySteps, *, higher_only: bool = False, spread_window: int = SPREAD_WINDOW,
                     depart_spreads: float = DEPART_SPREADS, counted_steps: int | None = None) -> list[dict[str, Any]]:
    """The ranks departing persistently, from one key's per-step statistics and its candidate
    values (`departures` gives the dicts' fields); every value that departs must be among the
    candidates. ``higher_only``: only a rank above the others departs (a time: a faster rank is
    no straggler). ``counted_steps``: the run's counted steps so far, where `stats` hold only
    its latest (a watch's window, `DepartureWindows.trim`): a stretch must last 5% of those."""
    steps, median, pos, rank, value, dev = (stats.steps, stats.median, stats.cand_pos, stats.cand_rank,
                                            stats.cand_value, stats.cand_dev)
    if len(steps) < MIN_STEPS:
        return []
    spread = rolling_median(stats.mad, spread_window)
    with np.errstate(divide="ignore", invalid="ignore"):
        score = np.where(dev == 0, 0.0, (dev if higher_only else np.abs(dev)) / spread[pos])
    depart = np.nan_to_num(score, nan=0.0) > depart_spreads
    min_steps = max(MIN_STEPS, math.ceil(0.05 * (len(steps) if counted_steps is None else counted_steps)))
    found = []
    for r in np.unique(rank[depart]).tolist():
        mine = rank == r
        flags = np.zeros(len(steps), bool)
        flags[pos[mine & depart]] = True
        where = persistent(flags, min_steps)
        if not where.any():
            continue
        sel = mine & depart & where[pos]
        at = pos[sel]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.nanmedian(np.where(median[at] != 0, value[sel] / median[at], np.nan))
        found.append(
            {
                "rank": int(r),
                "first_step": int(steps[at].min()),
                "last_step": int(steps[at].max()),
                "steps": int(len(at)),
                "ratio": None if np.isnan(ratio) else float(ratio),
                "spreads": float(np.nanmedian(np.minimum(score[sel], 1e300))),
                "excess": float(np.nanmedian(dev[sel])),
            }
        )
    return found


def persistent(depart: np.ndarray, min_steps: int) -> np.ndarray:
    """The departing steps inside stretches where most steps depart and that last ``min_steps``,
    each with the shorter such stretches just before it (fewer than ``MIN_STEPS`` steps apart):
    a few steps where the other ranks were noisy too (a loaded host) do not move where a
    departure began. A short stretch alone is still no finding."""
    half = _STRETCH_WINDOW // 2
    window = np.lib.stride_tricks.sliding_window_view
    # "most": over half of the (up to 5) steps centred on each, counted in integers (exact)
    departing = window(np.pad(depart.astype(np.int64), half), _STRETCH_WINDOW).sum(axis=1)
    present = window(np.pad(np.ones(len(depart), np.int64), half), _STRETCH_WINDOW).sum(axis=1)
    most = 2 * departing > present
    keep = np.zeros(len(depart), bool)
    edges = np.flatnonzero(np.diff(np.r_[0, most.astype(np.int8), 0]))
    stretches = list(zip(edges[::2], edges[1::2]))
    for i, (start, stop) in enumerate(stretches):
        if stop - start < min_steps:
            continue
        first = i
        while first > 0 and stretches[first][0] - stretches[first - 1][1] < MIN_STEPS:
            first -= 1
        keep[stretches[first][0] : stop] = True
    return keep & depart


class DepartureWindows:
    """One key's `KeySteps`, fed a steps x ranks window at a time (steps ascending across windows).

    Memory grows with the steps, not with the ranks: per step its statistics, and the candidate
    values. The last ``spread_window`` steps of a window wait for the next one (their candidate
    rule needs the spreads on their right); `result` judges them as the run's last steps.

    ``hold_whole``: the steps `trim` takes out of the judged window are kept aside (`whole`: the
    run's statistics from its first step, what the report's pass holds), until `forget_whole`.
    """

    def __init__(self, spread_window: int = SPREAD_WINDOW, depart_spreads: float = DEPART_SPREADS,
                 hold_whole: bool = False) -> None:
        self.spread_window = spread_window
        self.factor = depart_spreads * (1 - 1e-9)  # a candidate rule that never misses by rounding
        self.parts: list[tuple[np.ndarray, ...]] = []
        self.candidates: list[tuple[np.ndarray, ...]] = []
        # the last steps of the last window, not yet judged, and the spreads before them
        self.pending: tuple[np.ndarray, ...] | None = None
        self.seen = 0  # counted steps so far
        self.hold_whole = hold_whole
        # the steps `trim` took out (their statistics, their candidates at positions from the first step)
        self._trimmed: list[tuple[np.ndarray, ...]] = []
        self._trimmed_candidates: list[tuple[np.ndarray, ...]] = []
        self._trimmed_steps = 0
        #: bytes of the statistics and candidates kept aside (`hold_whole`)
        self.trimmed_bytes = 0

    def add(self, steps: np.ndarray, ranks: np.ndarray, table: np.ndarray) -> None:
        """One window: its `steps` (ascending), `ranks` and the key's steps x ranks `table` (NaN
        where no finite value). Steps with fewer than ``MIN_RANKS`` values are not counted."""
        count = (~np.isnan(table)).sum(axis=1)
        counted = count >= MIN_RANKS
        if not counted.all():  # (a copy of the window's table: only where some step has too few)
            table, steps, count = table[counted], steps[counted], count[counted]
        if not len(steps):
            return
        median, low, high, mad = medians_and_spreads(table, count)
        dev = table - median[:, None]
        self.parts.append((steps, count, median, mad, low, high))
        self._candidates(ranks, table, dev, mad)

    def _candidates(self, ranks: np.ndarray, table: np.ndarray, dev: np.ndarray, mad: np.ndarray) -> None:
        """Keep the values that may depart among those whose spreads each side are known; hold the
        last `spread_window` steps' for the next window."""
        sw = self.spread_window
        if len(mad) > sw:  # (else the held steps and these, stacked: a short window)
            self._candidates_apart(ranks, table, dev, mad)
            return
        first = self.seen
        self.seen += len(mad)
        pos = np.arange(first, first + len(mad))
        cand_ranks = np.broadcast_to(ranks, dev.shape)
        if self.pending is not None:  # the previous window's last steps, and the spreads before them
            h_pos, h_ranks, h_table, h_dev, h_mad_pos, h_mad = self.pending
            table, dev = _stack(h_table, table), _stack(h_dev, dev)
            cand_ranks = _stack(h_ranks, cand_ranks, fill=-1)
            pos = np.r_[h_pos, pos]
            mad_pos, all_mad = np.r_[h_mad_pos, np.arange(first, first + len(mad))], np.r_[h_mad, mad]
        else:
            mad_pos, all_mad = np.arange(first, first + len(mad)), mad
        lo = rolling_min(all_mad, sw)[np.searchsorted(mad_pos, pos)]
        judged = max(0, len(pos) - sw)
        with np.errstate(invalid="ignore"):
            hit = (dev[:judged] != 0) & (np.abs(dev[:judged]) > self.factor * lo[:judged, None])
        rows, cols = np.nonzero(hit)
        if len(rows):
            self.candidates.append((pos[rows], cand_ranks[rows, cols], table[rows, cols], dev[rows, cols]))
        keep = slice(judged, len(pos))
        self.pending = (pos[keep], cand_ranks[keep], table[keep], dev[keep], mad_pos[-2 * sw :], all_mad[-2 * sw :])

    def _candidates_apart(self, ranks: np.ndarray, table: np.ndarray, dev: np.ndarray, mad: np.ndarray) -> None:
        """`_candidates` where this window's steps outnumber the held ones: the held steps are
        judged on their own rows, this window's on its table's (no stacked copy of either), in
        the stacked order."""
        sw = self.spread_window
        first = self.seen
        self.seen += len(mad)
        pos = np.arange(first, first + len(mad))
        if self.pending is not None:
            h_pos, h_ranks, h_table, h_dev, h_mad_pos, h_mad = self.pending
            mad_pos, all_mad = np.r_[h_mad_pos, pos], np.r_[h_mad, mad]
            rolled = rolling_min(all_mad, sw)
            self._keep(h_pos, rolled[np.searchsorted(mad_pos, h_pos)], h_dev, h_table, h_ranks)
        else:
            mad_pos, all_mad = pos, mad
            rolled = rolling_min(all_mad, sw)
        judged = len(pos) - sw
        self._keep(pos[:judged], rolled[np.searchsorted(mad_pos, pos[:judged])], dev[:judged], table[:judged], ranks)
        self.pending = (pos[judged:], np.broadcast_to(ranks, (sw, len(ranks))).copy(), table[judged:].copy(),
                        dev[judged:].copy(), mad_pos[-2 * sw :], all_mad[-2 * sw :])

    def _keep(self, pos: np.ndarray, lo: np.ndarray, dev: np.ndarray, table: np.ndarray, ranks: np.ndarray) -> None:
        """The candidates among rows `dev` (of steps `pos`, `lo` their spreads' rolling min);
        `ranks` per column, or per cell (held rows: -1 for a padded column)."""
        with np.errstate(invalid="ignore"):
            rows, cols = np.nonzero(np.abs(dev) > self.factor * lo[:, None])
        cand_dev = dev[rows, cols]
        if (zero := cand_dev == 0).any():  # (past a negative factor) a value at the median is no candidate
            rows, cols, cand_dev = rows[~zero], cols[~zero], cand_dev[~zero]
        cand_rank = ranks[cols] if ranks.ndim == 1 else ranks[rows, cols]
        if (padded := cand_rank < 0).any():
            rows, cols, cand_dev, cand_rank = rows[~padded], cols[~padded], cand_dev[~padded], cand_rank[~padded]
        if len(rows):
            self.candidates.append((pos[rows], cand_rank, table[rows, cols], cand_dev))

    def _flush(self) -> None:
        """Take the held steps' candidates: the run ends after them (fewer spreads on their right,
        as at the end of `judge_departures`' rolling window)."""
        assert self.pending is not None
        h_pos, h_ranks, h_table, h_dev, h_mad_pos, h_mad = self.pending
        lo = rolling_min(h_mad, self.spread_window)[np.searchsorted(h_mad_pos, h_pos)]
        with np.errstate(invalid="ignore"):
            hit = (h_dev != 0) & (np.abs(h_dev) > self.factor * lo[:, None]) & (h_ranks >= 0)
        rows, cols = np.nonzero(hit)
        if len(rows):
            self.candidates.append((h_pos[rows], h_ranks[rows, cols], h_table[rows, cols], h_dev[rows, cols]))
        self.pending = None

    def peek(self) -> KeySteps | None:
        """`result` as if the run ended now, leaving the windows to go on (a watch's judgement)."""
        if self.pending is None:
            return self.result()
        parts, candidates, pending = list(self.parts), list(self.candidates), self.pending
        try:
            return self.result()
        finally:
            self.parts, self.candidates, self.pending = parts, candidates, pending

    def trim(self, keep: int) -> None:
        """Forget all but the last `keep` counted steps (and their candidates): a watch's memory,
        whatever the run's length. The steps held for the next window stay."""
        held = sum(len(part[0]) for part in self.parts)
        drop = held - keep
        if drop <= 0 or not self.parts:
            return
        cols = [np.concatenate(c) for c in zip(*self.parts)]
        self.parts = [tuple(c[drop:] for c in cols)]
        first = self.seen - held  # the position of the first step held
        cut = first + drop
        if self.hold_whole:
            self._set_aside(tuple(c[:drop] for c in cols))
        if self.candidates:
            pos, rank, value, dev = (np.concatenate(c) for c in zip(*self.candidates))
            mine = pos >= cut
            if self.hold_whole and not mine.all():
                self._set_aside(candidates=(pos[~mine] - first + self._trimmed_steps, rank[~mine], value[~mine], dev[~mine]))
            self.candidates = [(pos[mine] - cut, rank[mine], value[mine], dev[mine])]
        if self.hold_whole:
            self._trimmed_steps += drop
        self.seen -= cut
        if self.pending is not None:
            h_pos, h_ranks, h_table, h_dev, h_mad_pos, h_mad = self.pending
            self.pending = (h_pos - cut, h_ranks, h_table, h_dev, h_mad_pos - cut, h_mad)

    def _set_aside(self, stats: tuple[np.ndarray, ...] | None = None, candidates: tuple[np.ndarray, ...] | None = None) -> None:
        for kept, part in ((self._trimmed, stats), (self._trimmed_candidates, candidates)):
            if part is None:
                continue
            kept.append(part)
            self.trimmed_bytes += sum(a.nbytes for a in part)
            if len(kept) > 64:  # one part a judgement: joined now and then, not one array each
                kept[:] = [tuple(np.concatenate(c) for c in zip(*kept))]

    def forget_whole(self) -> None:
        """Keep only the judged window from now on (a watch's memory bound was reached)."""
        self.hold_whole = False
        self._trimmed, self._trimmed_candidates, self._trimmed_steps, self.trimmed_bytes = [], [], 0, 0

    def whole(self) -> KeySteps | None:
        """`peek` over every step fed since the first, those `trim` took out too (``hold_whole``):
        the statistics the report's pass holds for the run's rows fed."""
        now = self.peek()
        if not self._trimmed or now is None:
            return now
        cols = [np.concatenate([*old, new]) for old, new in zip(zip(*self._trimmed), (
            now.steps, now.count, now.median, now.mad, now.low, now.high))]
        new_cands = (now.cand_pos + self._trimmed_steps, now.cand_rank, now.cand_value, now.cand_dev)
        cands = [np.concatenate([*old, new]) for old, new in zip(zip(*self._trimmed_candidates), new_cands)] \
            if self._trimmed_candidates else list(new_cands)
        return KeySteps(*cols, *cands)

    def result(self) -> KeySteps | None:
        """The key's statistics and candidates so far, the held steps judged; None without a counted step."""
        if self.pending is not None:
            self._flush()
        if not self.parts:
            return None
        cols = [np.concatenate(c) for c in zip(*self.parts)]
        cands = [np.concatenate(c) for c in zip(*self.candidates)] if self.candidates else [
            np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0), np.zeros(0)]
        return KeySteps(*cols, *cands)


# -- stragglers, memory, non-finite values ---------------------------------------------------------


def stragglers(phases: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], step_time: float) -> list[dict[str, Any]]:
    """The ranks whose time in a phase of the step departs upwards from the others' by at least
    ``STRAGGLER_MIN_SHARE`` of a step.

    Args:
        phases: per phase (``"data_s"``, ``"forward_s"``): its steps, ranks and steps x ranks
            seconds (a step's time is the sum over its accumulated batches).
        step_time: the median step's time (its parts summed), in seconds.
    """
    out = []
    for phase, (steps, ranks, values) in phases.items():
        out += [s for item in departures(steps, ranks, values, higher_only=True) if (s := straggler(phase, item, step_time))]
    return out


def straggler(phase: str, item: dict[str, Any], step_time: float) -> dict[str, Any] | None:
    """A rank departing upwards in `phase` (`item`: `departures`' dict) as a straggler's item, or
    None where its extra time is under ``STRAGGLER_MIN_SHARE`` of `step_time` (the median step's)."""
    share = item["excess"] / step_time if step_time > 0 else math.nan
    if not share >= STRAGGLER_MIN_SHARE:
        return None
    return {"rank": item["rank"], "phase": phase.removesuffix("_s"), "first_step": item["first_step"],
            "last_step": item["last_step"], "steps": item["steps"], "excess_s": item["excess"],
            "share_of_step": share, "spreads": item["spreads"]}


def memory_measure(cuda_peaks: bool) -> str:
    """What peak memory is judged on (the report's and the watch's, and the page's series): CUDA's
    reserved peak where StepTimer measured one, else the process's RSS."""
    return "mem_reserved_peak" if cuda_peaks else "rss"


def memory_outliers(ranks: np.ndarray, peaks: np.ndarray, measure: str, retries: np.ndarray | None = None,
                    writers: set[int] | frozenset[int] = frozenset()) -> list[dict[str, Any]]:
    """Ranks whose peak memory is at least ``MEMORY_RATIO`` times the other ranks' median peak, or
    that retried a CUDA allocation.

    Args:
        ranks: the ranks with a peak, and `peaks` their peak bytes (same order).
        measure: what was measured (``"rss"``, ``"mem_reserved_peak"``); on ``rss``, the ranks that
            write the others' rows (`writers`) are judged on their peak less ``WRITER_RSS_ALLOWANCE``.
        retries: per rank, its CUDA allocation retries (None: not measured).
    """
    peaks = np.asarray(peaks, dtype=float)
    out = []
    for i, rank in enumerate(np.asarray(ranks).tolist()):
        peak = float(peaks[i])
        others = float(np.median(np.delete(peaks, i))) if len(peaks) > 1 else math.nan
        judged = peak - WRITER_RSS_ALLOWANCE if measure == "rss" and rank in writers else peak
        ratio = judged / others if others > 0 else math.nan
        retried = int(retries[i]) if retries is not None else 0
        if ratio >= MEMORY_RATIO or retried:
            out.append({"rank": int(rank), "measure": measure, "peak_bytes": int(peak),
                        "others_median_bytes": None if math.isnan(others) else int(others),
                        "ratio": None if math.isnan(ratio) else ratio, "alloc_retries": retried})
    return out


def votes_split(callback: str, votes: Iterable[bool | None]) -> bool:
    """Whether the ranks' own votes on one decision (a checkpoint's save, an early stop) differ:
    the report's and `multirank-logger decisions`' one rule. A rank with no vote (NA: not
    recorded) takes no side; `StopOnAlert`'s decisions never split (rank 0 alone votes by design:
    its watch's alert)."""
    if callback == "StopOnAlert":
        return False
    return len({bool(v) for v in votes if v is not None}) > 1


def non_finite_ranks(ranks: list[int] | np.ndarray, counts: np.ndarray) -> list[int]:
    """The ranks with a NaN or inf: `counts` per rank (in `ranks` order) of the non-finite values,
    or of the cells holding one (any axes after the first are summed)."""
    per_rank = np.asarray(counts).reshape(len(ranks), -1).sum(axis=1)
    return [int(r) for r, n in zip(np.asarray(ranks).tolist(), per_rank.tolist()) if n > 0]


# -- the statistics -------------------------------------------------------------------------------


def row_medians(table: np.ndarray, count: np.ndarray, extremes: bool = True) -> tuple[np.ndarray, ...]:
    """Per row of `table` (NaN where no value, `count` values per row): the median of its
    values[, their min and max].

    As ``np.nanmedian`` computes them (the mean of the two middle values for an even count),
    without its slow path for rows with NaN: a sort puts NaN last, the count finds the middle.
    """
    if (count == table.shape[1]).all():  # no NaN: the two middle values by partition
        n = table.shape[1]
        # one kth, and the lower middle as the max of the values left of it: NumPy's partition
        # with two kths took 5x as long (1.46 ms against 0.3 for 390 steps x 256 ranks)
        part = np.partition(table, n // 2, axis=1)
        lower = part[:, n // 2] if n % 2 else part[:, : n // 2].max(axis=1)
        middle = (lower + part[:, n // 2]) / 2
        return (middle, table.min(axis=1), table.max(axis=1)) if extremes else (middle,)
    ordered = np.sort(table, axis=1)
    rows = np.arange(len(table))
    middle = (ordered[rows, (count - 1) // 2] + ordered[rows, count // 2]) / 2
    return middle, ordered[:, 0], ordered[rows, count - 1]


def medians_and_spreads(table: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, ...]:
    """`row_medians` (median, min, max per row) and each row's median absolute deviation from its
    median, ``row_medians(np.abs(table - median[:, None]), count)``, the same numbers, from one
    sort of `table` instead of two selections.

    The sorted row is split where the median falls: the values below it give |x - m| = m - x
    (rounded alike: round-to-nearest is symmetric), rising as x falls; those above give x - m,
    rising with x. The deviations' middle values are then those of two sorted runs, found by a
    binary search over how many come from each, for every row at once.
    """
    n = table.shape[1]
    ordered = np.sort(table, axis=1)  # NaN last
    rows = np.arange(len(table))
    k_low, k_high = (count - 1) // 2, count // 2
    median = (ordered[rows, k_low] + ordered[rows, k_high]) / 2
    if (count == n).all():
        low, high = table.min(axis=1), table.max(axis=1)
    else:
        low, high = ordered[:, 0], ordered[rows, count - 1]
    # the runs: below[i] = m - ordered[h - 1 - i] (i < h), above[j] = ordered[h + j] - m (j < count - h)
    h = count // 2
    n_above = count - h

    def below(i: np.ndarray) -> np.ndarray:
        return median - ordered[rows, np.clip(h - 1 - i, 0, n - 1)]

    def above(j: np.ndarray) -> np.ndarray:
        return ordered[rows, np.clip(h + j, 0, n - 1)] - median

    # the fewest `a` from `below` among the first k_low + 1 deviations such that the next from
    # `below` is no smaller than the last from `above` (then those k_low + 1 are the smallest)
    lo, hi = np.maximum(0, k_low + 1 - n_above), np.minimum(k_low + 1, h)
    while (open_ := lo < hi).any():
        mid = (lo + hi) // 2
        b = k_low + 1 - mid
        enough = (mid >= h) | (b <= 0) | (above(b - 1) <= below(mid))
        hi = np.where(open_ & enough, mid, hi)
        lo = np.where(open_ & ~enough, mid + 1, lo)
    a, b = lo, k_low + 1 - lo
    with np.errstate(invalid="ignore"):
        last = np.fmax(np.where(a > 0, below(a - 1), np.nan), np.where(b > 0, above(b - 1), np.nan))
        after = np.fmin(np.where(a < h, below(a), np.nan), np.where(b < n_above, above(b), np.nan))
    mad = (last + np.where(k_high > k_low, after, last)) / 2
    return median, low, high, mad


def rolling_median(values: np.ndarray, half: int) -> np.ndarray:
    """The median of `values` over `half` positions each side (fewer at the ends): pandas'
    ``rolling(2 * half + 1, center=True, min_periods=1).median()``, in NumPy."""
    padded = np.pad(np.asarray(values, dtype=float), half, constant_values=np.nan)
    windows = np.lib.stride_tricks.sliding_window_view(padded, 2 * half + 1)
    return row_medians(windows, (~np.isnan(windows)).sum(axis=1), extremes=False)[0]


def rolling_min(values: np.ndarray, half: int) -> np.ndarray:
    """The min of `values` over `half` positions each side (fewer at the ends)."""
    padded = np.pad(values.astype(float), half, constant_values=np.inf)
    return np.lib.stride_tricks.sliding_window_view(padded, 2 * half + 1).min(axis=1)


def _stack(held: np.ndarray, new: np.ndarray, fill: float = np.nan) -> np.ndarray:
    """Rows of two windows, whose ranks may differ in number: the narrower padded with `fill`."""
    if held.shape[1] == new.shape[1]:
        return np.vstack((held, new))
    width = max(held.shape[1], new.shape[1])
    pad = [np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=fill) for a in (held, new)]
    return np.vstack(pad)
