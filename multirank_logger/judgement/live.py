"""The one judgement (ranks.py), fed as a run goes: rows in, each new finding out once.

What a watch on rank 0 holds (watch/watch.py feeds it and says what it finds); pure NumPy,
no I/O, no clock (the caller passes ``now``):

- a rank's first non-finite value of a key (non_finite.py, the report's one rule), from the rows as they arrive, once the steps through
  the one after it are closed (see below): then every rank that went non-finite there or before
  is known, and the finding names where it started (origin.py: a NaN one rank's batch spreads
  through the gradient all-reduce is said from that rank, first, not from whichever rank's rows
  came in first);
- a rank departing persistently from the others on a key (`ranks.judge_departures`, on the
  statistics a `ranks.DepartureWindows` keeps per key), once its steps are *closed*: every rank
  that logs the key has its value there, or the step's first row is ``close_after`` seconds old
  (a rank that stopped logging does not hold the others back). A row of a closed step that
  comes later is not judged (counted in `late_rows`);
- a straggler (StepTimer's ``data_s``/``forward_s``: a rank's time departs upwards by at least
  ``STRAGGLER_MIN_SHARE`` of a step, the median step time of the steps held) and a rank whose
  peak memory stands out (`ranks.memory_outliers` on the peaks so far).

Memory, whatever the run's length: per key the open steps' rows, and the last ``keep_steps``
closed steps' statistics (or 10% of the key's counted steps, if more: a stretch must last 5% of
them to persist, `ranks.judge_departures`' ``counted_steps``) are what is judged as it goes.

The run's end is judged whole. The statistics of the steps taken out of the judged window are
kept aside (`ranks.DepartureWindows`' ``hold_whole``: per key and step its count, median, typical
spread, min and max, and the few values that may depart), with every StepTimer step time, up to
``WHOLE_BYTES`` in all. The last judgement (``final``) then judges each key over all of it, with
the report's rule for a stretch (5% of the key's counted steps), and `verdict` is the report's
findings of the same rows, to the last number: `complete` says so, and `judged_rows` how many
rows of each rank it judged, which a reader matches against the store's before it serves the
kept verdict instead of a pass over the rows (query/kept_verdict.py). Past ``WHOLE_BYTES``, or
once a row came after its step was judged, the watch keeps only its window and `whole_reason`
says why; its verdict is then what it found as it went, and `complete` is False.

Agreement with the report: the same functions, on the same values. The report's stretch must
last 5% of the run's counted steps, which the watch cannot know before the end: it counts the
steps seen so far, or ``EXPECTED_STEPS`` (200) while fewer, so a stretch must last 10 steps at
least (as in a 200-step run's report). Counting only the steps seen, 9 in 200 seeded noisy
3-rank runs raised a departure the report did not find (benchmarks/bench_watch.py). A stretch
that ends before lasting 5% of a longer run's steps is an alert the report will not list; the
report says so beside each alert (``[not a finding of the whole run]``).
"""

from __future__ import annotations

import functools
import math
from array import array
from collections import deque
from typing import Any

import numpy as np

from multirank_logger.judgement.cost import stretch_cost
from multirank_logger.judgement.finding import Finding
from multirank_logger.judgement.non_finite import FirstNonFinite, non_finite_kinds
from multirank_logger.judgement.origin import ALL_REDUCE_LAG, spread_for, spread_of, with_origin
from multirank_logger.judgement.ranks import (
    MIN_RANKS,
    MIN_STEPS,
    STRAGGLER_MIN_SHARE,
    STRAGGLER_PHASES,
    DepartureWindows,
    KeySteps,
    judge_departures,
    memory_measure,
    memory_outliers,
    straggler,
)
from multirank_logger.judgement.sentences import KINDS, series_of

__all__ = ["Finding", "LiveJudgement"]
#: counted steps a run is taken to last at least, for the 5% a stretch must last (see the module docstring)
EXPECTED_STEPS = 200
#: a first NaN/inf waits for a late rank's rows up to this many close_after (`LiveJudgement.hold_after`)
HOLD_FACTOR = 3.0
#: closed steps' statistics held per key at least (see the module docstring)
KEEP_STEPS = 512
#: StepTimer rows whose step time the straggler's share is taken against (the latest)
STEP_TIMES_KEPT = 65_536
#: bytes of statistics kept aside for the run's end to be judged whole (see the module docstring):
#: 8 B x 6 a step and key (1M steps x keys), and 8 B a StepTimer row
WHOLE_BYTES = 64 * 2**20


class _Key:
    """One key's open rows and its closed steps' statistics."""

    def __init__(self, world: int, summed: bool, hold_whole: bool) -> None:
        self.summed = summed  # a time per step: the step's batches summed (gradient accumulation)
        self.chunks: list[tuple[np.ndarray, ...]] = []  # steps, ranks, values, each row's arrival
        self.ranks_seen = np.zeros(world, bool)
        self.closed_through: int | None = None  # the last step closed
        self.windows = DepartureWindows(hold_whole=hold_whole)
        self.counted = 0  # closed steps with MIN_RANKS values
        self.new_steps = False
        self.newest: int | None = None
        self.first_arrival = math.inf  # when its first row arrived: the ranks that log it are known close_after later
        self.newest_by_rank = np.full(world, np.iinfo(np.int64).min)  # each rank's newest step of the key so far


class LiveJudgement:
    """Rows of a run in, new findings out (see the module docstring).

    Args:
        world_size: the run's ranks.
        close_after: seconds after which a step's missing ranks are no longer waited for.
        hold_after: seconds a rank's first NaN/inf waits at most for a late rank's rows before it is
            said (``HOLD_FACTOR`` times `close_after` by default): the origin's alert first.
        writers: ranks that write the others' rows (gather's rank 0): memory judged as the report does.
        keep_steps: closed steps' statistics held per key at least.
        expected_steps: counted steps the run is taken to last at least (`EXPECTED_STEPS`).
        whole_bytes: bytes kept aside for the run's end to be judged whole (0: judge the window only).
    """

    def __init__(self, world_size: int, *, close_after: float = 10.0, writers: frozenset[int] = frozenset(),
                 keep_steps: int = KEEP_STEPS, expected_steps: int = EXPECTED_STEPS,
                 hold_after: float | None = None, whole_bytes: int = WHOLE_BYTES) -> None:
        self.world = max(1, int(world_size))
        self.close_after = close_after
        self.hold_after = HOLD_FACTOR * close_after if hold_after is None else hold_after
        self.writers = writers
        self.keep_steps = keep_steps
        self.expected_steps = expected_steps
        self.keys: dict[str, _Key] = {}
        self.raised: set[tuple[str, str, int]] = set()  # (kind, key, rank): each finding once
        #: every finding said so far, in order (`verdict`): one per (kind, key, rank), never more
        self.found: list[Finding] = []
        #: per (key, rank), the first non-finite step (the report's one rule: judgement/non_finite.py)
        self.non_finite = FirstNonFinite()
        #: the (key, rank) pairs with a non-finite value not said yet: held until the steps around it are closed
        self._unsaid: dict[tuple[str, int], float] = {}  # -> when it was first held
        #: per (kind, key), each rank's first step: where a problem started (origin.spread_of)
        self._firsts: dict[tuple[str, str], dict[int, int]] = {}
        self.late_rows = 0
        self.newest_step: int | None = None
        self._peaks: dict[str, dict[int, float]] = {"rss": {}, "mem_reserved_peak": {}}
        self._retries: dict[int, int] = {}
        self._memory_changed = False
        #: the latest rows' step times (each row's parts summed: the report's step time is their median)
        self._step_times: deque[float] = deque(maxlen=STEP_TIMES_KEPT)
        #: each straggler said, by (key, rank): its stretch and cost go on growing while it straggles
        #: (`_grow_cost`), so the kept verdict says what it cost through the run's end
        self._stragglers: dict[tuple[str, int], Finding] = {}
        #: why the run's end cannot be judged whole (None while it can: see the module docstring)
        self.whole_reason: str | None = None if whole_bytes > 0 else "it was asked to judge its window only"
        self.whole_bytes = whole_bytes
        self._all_step_times = array("d")  # every step time, while the run is held whole
        #: per key, the whole run's statistics and its departures, from the last judgement (`verdict`)
        self._judged_whole: dict[str, tuple[KeySteps, list[dict[str, Any]]]] | None = None
        #: metric rows taken in, per rank, and each rank's distinct steps and last step (`judged_rows`)
        self.rows_by_rank = np.zeros(self.world, np.int64)
        self._steps_by_rank: np.ndarray | None = np.zeros(self.world, np.int64)  # None: a rank's steps went back
        self._last_by_rank = np.full(self.world, np.iinfo(np.int64).min)

    # -- rows in --------------------------------------------------------------------------

    def add_rows(self, keys: np.ndarray, ranks: np.ndarray, steps: np.ndarray, values: np.ndarray,
                 now: float) -> None:
        """Metric rows (`keys` as str objects, in arrival order; a rank's in its call order). A
        rank's first NaN/inf of a key is a finding of a later `judge` (see the module docstring)."""
        if not len(keys):
            return
        ranks = np.asarray(ranks, np.int64)
        steps = np.asarray(steps, np.int64)
        values = np.asarray(values, float)
        ours = (ranks >= 0) & (ranks < self.world)  # (a row of another rank is counted late: _add_key)
        self.rows_by_rank += np.bincount(ranks[ours], minlength=self.world)
        self._count_steps(ranks[ours], steps[ours])
        top = int(steps.max())
        self.newest_step = top if self.newest_step is None else max(self.newest_step, top)
        bad, kinds = non_finite_kinds(values)
        if len(bad):
            bad_keys = [str(k) for k in np.asarray(keys, dtype=object)[bad].tolist()]
            for at in self.non_finite.add(bad_keys, ranks[bad], steps[bad], kinds):
                if ("non_finite", *at) not in self.raised:
                    self._unsaid.setdefault((str(at[0]), at[1]), now)
        clean = values.copy()
        clean[bad] = np.nan  # NaN/inf are the non-finite finding's, not a departure
        names, inverse = np.unique(np.asarray(keys, dtype=object).astype(str), return_inverse=True)
        order = np.argsort(inverse, kind="stable")
        bounds = np.searchsorted(inverse[order], np.arange(len(names) + 1))
        for j, name in enumerate(names.tolist()):
            rows = order[bounds[j] : bounds[j + 1]]
            self._add_key(name, steps[rows], ranks[rows], clean[rows], now, summed=False)

    def add_timing(self, rows: list[dict[str, Any]], now: float) -> None:
        """StepTimer's ``step_timing`` rows (each with rank, step and its columns)."""
        if not rows:
            return
        rank = np.array([r["rank"] for r in rows], np.int64)
        step = np.array([r["step"] for r in rows], np.int64)
        for phase in STRAGGLER_PHASES:
            value = np.array([_num(r.get(phase)) for r in rows])
            keep = ~np.isnan(value)
            if keep.any():
                self._add_key(f"timing:{phase}", step[keep], rank[keep], value[keep], now, summed=True)
        for r in rows:
            parts = [r.get(c) for c in ("data_s", "forward_s", "rest_s")]
            if any(p is not None for p in parts):  # pandas' sum(min_count=1): a row with no part has no time
                self._step_times.append(sum(_num(p, 0.0) for p in parts))
                if self.whole_reason is None:
                    self._all_step_times.append(self._step_times[-1])
        self._bound_whole()
        for r in rows:
            for measure in ("rss", "mem_reserved_peak"):
                v = r.get(measure)
                if v is not None and v == v and v > self._peaks[measure].get(int(r["rank"]), -1.0):
                    self._peaks[measure][int(r["rank"])] = float(v)
                    self._memory_changed = True
            if r.get("alloc_retries"):
                self._retries[int(r["rank"])] = max(self._retries.get(int(r["rank"]), 0), int(r["alloc_retries"]))
                self._memory_changed = True

    def _add_key(self, name: str, steps: np.ndarray, ranks: np.ndarray, values: np.ndarray, now: float,
                 summed: bool) -> None:
        key = self.keys.get(name)
        if key is None:
            key = self.keys[name] = _Key(self.world, summed, self.whole_reason is None)
        inside = (ranks >= 0) & (ranks < self.world)
        # how far each rank got, late rows too (a NaN held for a late rank waits for this: _caught_up)
        np.maximum.at(key.newest_by_rank, ranks[inside], steps[inside])
        if key.closed_through is not None:
            inside &= steps > key.closed_through
        if not inside.all():
            self.late_rows += int((~inside).sum())
            self._stop_holding_whole(f"{self.late_rows:,} row(s) came after their step was judged")
            steps, ranks, values = steps[inside], ranks[inside], values[inside]
        if len(steps):
            key.ranks_seen[ranks] = True
            key.first_arrival = min(key.first_arrival, now)
            key.chunks.append((steps, ranks, values, np.full(len(steps), now)))

    # -- judging ----------------------------------------------------------------------------

    def judge(self, now: float, final: bool = False) -> list[Finding]:
        """Close what steps can be closed and judge the keys that got new ones; `final`: the run
        ended, every step is closed, and each key is judged over the whole run where it was held
        (see the module docstring). Returns the new findings (each once)."""
        found: list[Finding] = []
        whole = final and self.whole_reason is None
        if whole:
            self._judged_whole = {}
        for name, key in self.keys.items():
            self._close(key, now, final)
            if key.new_steps or whole:
                key.new_steps = False
                found += self._departures(name, key, whole)
        found = self._non_finite(now, final) + found
        if self._memory_changed:
            self._memory_changed = False
            found += self._memory()
        self.found += found
        return found

    @property
    def complete(self) -> bool:
        """Whether the last judgement judged the whole run as the report does (`verdict` is its findings)."""
        return self._judged_whole is not None and self.whole_reason is None

    def judged_rows(self) -> list[int] | None:
        """The metric rows judged, per rank, where the verdict is `complete`; else None."""
        return self.rows_by_rank.tolist() if self.complete else None

    def rank_steps(self) -> list[tuple[int, int] | None] | None:
        """Per rank, its distinct steps (any key) and its last step (None: no row), as the report's
        ranks table counts them; None where a rank's rows did not come in step order (then only
        the rows tell which steps are distinct)."""
        if self._steps_by_rank is None:
            return None
        return [(int(n), int(last)) if n else None for n, last in zip(self._steps_by_rank, self._last_by_rank)]

    def _count_steps(self, ranks: np.ndarray, steps: np.ndarray) -> None:
        """Each rank's new distinct steps, from its rows in its call order (a step repeats only in a
        row: a key each), while no rank's step goes back."""
        if self._steps_by_rank is None or not len(ranks):
            return
        order = np.argsort(ranks, kind="stable")  # each rank's rows, in their order
        rank, step = ranks[order], steps[order]
        before = np.r_[0, step[:-1]]
        starts = np.r_[True, rank[1:] != rank[:-1]]
        before[starts] = self._last_by_rank[rank[starts]]
        if (step < before).any():
            self._steps_by_rank = None
            return
        np.add.at(self._steps_by_rank, rank[step > before], 1)
        np.maximum.at(self._last_by_rank, rank, step)

    def verdict(self) -> list[tuple[str, dict[str, Any]]]:
        """Every finding as (kind, the report's item), each with where its problem started among
        all of them (`origin.with_origin`: a follower found before its origin's rows came names
        the origin here), origins first: what a run's end keeps. Where the run was judged whole
        (`complete`), the findings of that judgement with the report's numbers; else what was said
        as the run went."""
        items = self._whole_verdict() if self.complete else {
            kind: [f.item() for f in self.found if f.kind == kind] for kind in KINDS}
        out: list[tuple[str, dict[str, Any]]] = []
        for kind in KINDS:
            out += [(kind, item) for item in with_origin(items[kind], functools.partial(series_of, kind), self.world)]
        return out

    def _whole_verdict(self) -> dict[str, list[dict[str, Any]]]:
        """The last judgement's findings of the whole run, as the report's items and in its order."""
        assert self._judged_whole is not None
        departures: list[dict[str, Any]] = []
        stragglers: list[dict[str, Any]] = []
        on_gpu = bool(self._peaks["mem_reserved_peak"])
        for name in sorted(self._judged_whole, key=_report_order):
            stats, items = self._judged_whole[name]
            if not name.startswith("timing:"):
                departures += [{"rank": item["rank"], "key": name, **{k: v for k, v in item.items() if k != "rank"}}
                               for item in items]
                continue
            for item in items:
                if (said := straggler(name.split(":", 1)[1], item, self._step_time())) is not None:
                    said.update(stretch_cost(stats.steps, stats.high, stats.median, said["first_step"], said["last_step"],
                                             self.world, on_gpu=on_gpu))
                    stragglers.append(said)
        return {"non_finite": self.non_finite.items(), "departure": departures, "straggler": stragglers,
                "memory": self._memory_items()[1]}

    def _step_time(self) -> float:
        """The median step time (its parts summed) of the rows held: every row's, while the run is held whole."""
        times = np.frombuffer(self._all_step_times, float) if self.whole_reason is None else np.fromiter(self._step_times, float)
        return float(np.median(times)) if len(times) else math.nan

    def _bound_whole(self) -> None:
        """Stop holding the run whole once what is kept aside passes ``whole_bytes``."""
        if self.whole_reason is None:
            held = sum(key.windows.trimmed_bytes for key in self.keys.values()) + self._all_step_times.itemsize * len(
                self._all_step_times)
            if held > self.whole_bytes:
                self._stop_holding_whole(f"the run's statistics passed {self.whole_bytes / 2**20:g} MiB")

    def _stop_holding_whole(self, reason: str) -> None:
        if self.whole_reason is None:
            self.whole_reason = reason
            for key in self.keys.values():
                key.windows.forget_whole()
            self._all_step_times = array("d")

    def _close(self, key: _Key, now: float, final: bool) -> None:
        if not key.chunks:
            return
        steps = np.concatenate([c[0] for c in key.chunks])
        ranks = np.concatenate([c[1] for c in key.chunks])
        values = np.concatenate([c[2] for c in key.chunks])
        arrived = np.concatenate([c[3] for c in key.chunks])
        uniq, inv = np.unique(steps, return_inverse=True)
        have = np.zeros((len(uniq), self.world), bool)
        have[inv, ranks] = True
        first_seen = np.full(len(uniq), np.inf)
        np.minimum.at(first_seen, inv, arrived)
        # the ranks that log the key: every rank, or those seen once close_after has passed since its
        # first row (a slow rank's first rows come late: its early steps must not close without it)
        expected = int(key.ranks_seen.sum())
        known = expected == self.world or now - key.first_arrival >= self.close_after
        done = ((have.sum(axis=1) >= expected) & known) | (now - first_seen >= self.close_after) | final
        # a later step closed with an earlier one open would come before it: close a prefix only
        n = len(done) if done.all() else int(np.argmin(done))
        if n == 0:
            return
        table = np.full((n, self.world), np.nan)
        closed = inv < n
        if key.summed:
            table[:] = 0.0
            np.add.at(table, (inv[closed], ranks[closed]), values[closed])
            table[~have[:n]] = np.nan
        else:
            table[inv[closed], ranks[closed]] = values[closed]  # a rank's later call at a step wins
        rest = ~closed
        key.chunks = [(steps[rest], ranks[rest], values[rest], arrived[rest])] if rest.any() else []
        key.closed_through = int(uniq[n - 1])
        key.newest = key.closed_through
        counted = (~np.isnan(table)).sum(axis=1) >= MIN_RANKS
        key.counted += int(counted.sum())
        if counted.any():
            key.windows.add(uniq[:n], np.arange(self.world), table)
            key.new_steps = True

    def _non_finite(self, now: float, final: bool) -> list[Finding]:
        """The first NaN/inf of each (key, rank) whose steps through `ALL_REDUCE_LAG` later are
        closed and that every rank logging the key has reached (its rows there are in): where it
        started is known, and the ranks it reached at once. Earliest first, so the origin's alert
        comes before its followers'. A rank whose rows come late (a loaded host, a long flush) is
        waited for up to ``hold_after`` seconds: a step closes without it after ``close_after``,
        and a follower's alert would then go before the origin's."""
        out = []
        spreads: dict[str, dict[str, Any] | None] = {}  # per key, once per judgement (1,024 ranks release at once)
        firsts = {at: first for at in self._unsaid if (first := self.non_finite.first(*at)) is not None}
        caught: dict[tuple[str, int], bool] = {}
        for (key, rank), (step, word) in sorted(firsts.items(), key=lambda item: (item[1][0], item[0][1])):
            held = self.keys.get(key)
            closed = held is not None and held.closed_through is not None and held.closed_through >= step + ALL_REDUCE_LAG
            waited = now - self._unsaid[(key, rank)] >= self.hold_after
            if not (final or waited) and closed and (key, step) not in caught:  # once per (key, step): 1,024 ranks
                caught[(key, step)] = self._caught_up(held, step + ALL_REDUCE_LAG, now)
            if not (final or (closed and (waited or caught[(key, step)]))):
                continue
            del self._unsaid[(key, rank)]
            self.raised.add(("non_finite", key, rank))
            if key not in spreads:
                spreads[key] = self._spread("non_finite", key)
            out.append(Finding("non_finite", rank, key, step, self.newest_step, float(word), {"value": word},
                               spread_for(spreads[key], rank)))
        return out

    def _caught_up(self, key: _Key | None, step: int, now: float) -> bool:
        """Whether every rank that logs `key` has logged it at `step` or later: every rank of the
        run until ``close_after`` has passed since its first row, then those seen."""
        if key is None:
            return False
        expected = key.ranks_seen if now - key.first_arrival >= self.close_after else np.ones(self.world, bool)
        return bool((key.newest_by_rank[expected] >= step).all())

    def _spread(self, kind: str, key: str, rank: int | None = None, first_step: int | None = None) -> dict[str, Any] | None:
        """Where the problem of `kind` on `key` started, among the ranks known to show it (and
        `rank` from `first_step`); None while one rank alone does."""
        firsts = self.non_finite.firsts(key) if kind == "non_finite" else self._firsts.setdefault((kind, key), {})
        if rank is not None and first_step is not None:
            firsts[rank] = min(first_step, firsts.get(rank, first_step))
        if len(firsts) < 2:
            return None
        return spread_of(firsts.items(), self.world)

    def _departures(self, name: str, key: _Key, whole: bool = False) -> list[Finding]:
        """`name`'s new findings: over its window, or (`whole`, the run's end) over the whole run,
        with the report's rule for a stretch."""
        if key.counted < MIN_STEPS:
            return []
        stats = key.windows.whole() if whole else key.windows.peek()
        if stats is None:
            return []
        timing = name.startswith("timing:")
        items = judge_departures(stats, higher_only=timing, counted_steps=None if whole else max(key.counted, self.expected_steps))
        if whole and self._judged_whole is not None:
            self._judged_whole[name] = (stats, items)
        else:
            key.windows.trim(max(self.keep_steps, math.ceil(0.1 * key.counted) + 64))
            self._bound_whole()
        out = []
        for item in items:
            kind = "straggler" if timing else "departure"
            if (kind, name, item["rank"]) in self.raised:
                if timing and (name, item["rank"]) in self._stragglers:
                    self._grow_cost(self._stragglers[(name, item["rank"])], item, stats)
                continue
            detail = {k: v for k, v in item.items() if k != "rank"}
            value = item["ratio"]
            if timing:
                step_time = self._step_time()
                share = item["excess"] / step_time if step_time > 0 else math.nan
                if not share >= STRAGGLER_MIN_SHARE:
                    continue
                detail = {"phase": name.split(":", 1)[1].removesuffix("_s"), "excess_s": item["excess"],
                          "share_of_step": share, **detail}
                # what it cost so far (judgement/cost.py): its stretch's steps held, as the report counts them
                detail.update(stretch_cost(stats.steps, stats.high, stats.median, item["first_step"], item["last_step"],
                                           self.world, on_gpu=bool(self._peaks["mem_reserved_peak"])))
                value = item["excess"]
            self.raised.add((kind, name, item["rank"]))
            spread = spread_for(self._spread(kind, name, item["rank"], item["first_step"]), item["rank"])
            out.append(Finding(kind, item["rank"], name, item["first_step"], key.newest, value, detail, spread))
            if timing:
                self._stragglers[(name, item["rank"])] = out[-1]
        return out

    def _grow_cost(self, said: Finding, item: dict[str, Any], stats: Any) -> None:
        """A straggler said before that still straggles (`item`: the judgement's latest): its
        stretch's new steps added to its cost, in its detail (its alert went out with the cost
        then; `verdict` keeps this one). Where the held statistics no longer reach back to its
        first step, its count of steps off is no longer known and is left out."""
        last = said.detail.get("last_step")
        if last is None or item["last_step"] <= last:
            return
        more = stretch_cost(stats.steps, stats.high, stats.median, last + 1, item["last_step"], self.world,
                            on_gpu=bool(self._peaks["mem_reserved_peak"]))
        detail = said.detail
        detail["waited_s"] = detail.get("waited_s", 0.0) + more["waited_s"]
        detail["cost_steps"] = detail.get("cost_steps", 0) + more["cost_steps"]
        detail["rank_hours"] = detail.get("rank_hours", 0.0) + more["rank_hours"]
        detail["hours_unit"] = more["hours_unit"]
        detail["last_step"] = item["last_step"]
        whole = len(stats.steps) and said.first_step is not None and stats.steps[0] <= said.first_step
        if whole and item["first_step"] == said.first_step:
            detail["steps"] = item["steps"]
        else:
            detail.pop("steps", None)

    def _memory_items(self) -> tuple[str, list[dict[str, Any]]]:
        """The measure judged, and the ranks whose peak so far stands out on it (`ranks.memory_outliers`)."""
        measure = memory_measure(bool(self._peaks["mem_reserved_peak"]))
        peaks = self._peaks[measure]
        if len(peaks) < 2:
            return measure, []
        ranks = np.array(sorted(peaks), np.int64)
        retries = np.array([self._retries.get(int(r), 0) for r in ranks]) if measure != "rss" else None
        return measure, memory_outliers(ranks, np.array([peaks[int(r)] for r in ranks]), measure, retries, self.writers)

    def _memory(self) -> list[Finding]:
        measure, items = self._memory_items()
        out = []
        for item in items:
            if ("memory", measure, item["rank"]) in self.raised:
                continue
            self.raised.add(("memory", measure, item["rank"]))
            detail = {k: v for k, v in item.items() if k != "rank"}
            out.append(Finding("memory", item["rank"], measure, None, self.newest_step, item["ratio"], detail))
        return out


def _report_order(name: str) -> tuple[int, int | str]:
    """The report's order of the series: the metric keys by name, then StepTimer's phases."""
    phase = name.removeprefix("timing:")
    return (1, STRAGGLER_PHASES.index(phase)) if phase != name and phase in STRAGGLER_PHASES else (0, name)


def _num(value: Any, missing: float = math.nan) -> float:
    return missing if value is None else float(value)
