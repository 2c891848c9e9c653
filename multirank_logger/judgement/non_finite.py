"""A rank's NaN or inf on a key: the non-finite finding, decided in one place.

A value is non-finite when it is NaN, +inf or -inf (a NULL a backend gives back for a stored
NaN is read as NaN by the query side). Per (key, rank) the finding is its first step with such a
value, the kind of value there (NaN before inf before -inf, where one step holds several), and
how many of each over the run. The report feeds `FirstNonFinite` every non-finite row of its one
pass (``query/run_scan.py``, through `non_finite_kinds`); the watch feeds it the rows as they
arrive (``live.py``): the same rows give the same first step and the same word.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

__all__ = ["NEG_INF", "NON_FINITE_NAN", "POS_INF", "WORDS", "FirstNonFinite", "non_finite_kinds"]

#: which non-finite value a row holds (ordered: at one step, the lowest code is the one said)
NON_FINITE_NAN, POS_INF, NEG_INF = 0, 1, 2
#: each kind as a sentence says it
WORDS = {NON_FINITE_NAN: "NaN", POS_INF: "inf", NEG_INF: "-inf"}


def non_finite_kinds(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The positions of `values` that are not finite, and the kind of each (``NON_FINITE_NAN``,
    ``POS_INF``, ``NEG_INF``)."""
    values = np.asarray(values, dtype=float)
    bad = np.flatnonzero(~np.isfinite(values))
    picked = values[bad]
    kind = np.where(np.isnan(picked), NON_FINITE_NAN, np.where(picked > 0, POS_INF, NEG_INF))
    return bad, kind.astype(np.int8)


class FirstNonFinite:
    """Per (key, rank): the first step with a non-finite value, its kind, and the counts so far.

    Rows may come in any order (a rank's rows late, a window at a time): the first step is the
    least seen, whatever came first. Memory: one entry per (key, rank) that ever logged one.
    """

    def __init__(self) -> None:
        # key -> rank -> [first step, kind at the first step, count, NaN count]
        self._by: dict[Hashable, dict[int, list[int]]] = {}

    def add(self, keys: Any, ranks: Any, steps: Any, kinds: Any) -> list[tuple[Hashable, int]]:
        """Non-finite rows (`kinds` from `non_finite_kinds`; `keys` hashable, all of one type).
        Returns the (key, rank) pairs whose first step is new or earlier than before."""
        ranks, steps, kinds = (np.asarray(a, np.int64) for a in (ranks, steps, kinds))
        if not len(ranks):
            return []
        # one entry per (key, rank) of the rows, vectorised: a NaN that spread is millions of rows
        names, key_code = np.unique(np.asarray(keys, dtype=object if isinstance(keys, list) else None),
                                    return_inverse=True)
        order = np.lexsort((kinds, steps, ranks, key_code.ravel()))
        k, r, st, kd = key_code.ravel()[order], ranks[order], steps[order], kinds[order]
        starts = np.flatnonzero(np.r_[True, (k[1:] != k[:-1]) | (r[1:] != r[:-1])])
        counts = np.diff(np.r_[starts, len(k)])
        nans = np.add.reduceat((kd == NON_FINITE_NAN).astype(np.int64), starts)
        moved = []
        for i, n, nan in zip(starts.tolist(), counts.tolist(), nans.tolist()):
            key, rank, step, kind = names[k[i]], int(r[i]), int(st[i]), int(kd[i])
            per_rank = self._by.setdefault(key, {})
            entry = per_rank.get(rank)
            if entry is None:
                per_rank[rank] = [step, kind, n, nan]
                moved.append((key, rank))
                continue
            entry[2] += n
            entry[3] += nan
            if (step, kind) < (entry[0], entry[1]):
                if step < entry[0]:
                    moved.append((key, rank))
                entry[0], entry[1] = step, kind
        return moved

    def first(self, key: Hashable, rank: int) -> tuple[int, str] | None:
        """The first step of (key, rank) with a non-finite value and its word, or None."""
        entry = self._by.get(key, {}).get(rank)
        return None if entry is None else (entry[0], WORDS[entry[1]])

    def firsts(self, key: Hashable) -> dict[int, int]:
        """Each rank's first non-finite step of `key` (where the problem started: origin.py)."""
        return {rank: entry[0] for rank, entry in self._by.get(key, {}).items()}

    def items(self, name: Callable[[Any], str] = str) -> list[dict[str, Any]]:
        """The findings as the report's items: rank, key (`name` of the key fed), first step,
        ``value`` (the word of the first value), count, NaN and inf counts; by key, then rank."""
        out = [{"rank": rank, "key": name(key), "first_step": first, "value": WORDS[kind], "count": n, "nan": nan,
                "inf": n - nan} for key, per_rank in self._by.items()
               for rank, (first, kind, n, nan) in per_rank.items()]
        return sorted(out, key=lambda item: (item["key"], item["rank"]))
