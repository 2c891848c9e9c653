"""Whether a host is chronically named across runs, or was named once: the hosts ledger's rule.

A host is *chronic* when a rank on it was named in the kept verdict (the ``findings`` table) of
at least ``k`` of the last ``n`` runs it took part in: a node to drain (Slurm ``--exclude``), not
one bad day. Otherwise it is *one-off* (named in one run in all), *intermittent* (named in more,
never ``k`` of its last ``n``) or *clean* (never named). Pure: the flags of one host's runs, in
the order they started.
"""

from __future__ import annotations

import numpy as np

__all__ = ["CHRONIC", "host_status"]

#: the default rule: named in 3 of its last 5 runs
CHRONIC = (3, 5)


def host_status(named: np.ndarray, k: int = CHRONIC[0], n: int = CHRONIC[1]) -> tuple[str, int, int]:
    """One host's standing, from `named`: per run it took part in (oldest first), whether a rank
    on it was named.

    Returns:
        ``(status, named_last, last)``: ``chronic`` | ``intermittent`` | ``one-off`` | ``clean``,
        and how many of its `last` (up to `n`) runs named it.
    """
    if not 1 <= k <= n:
        raise ValueError(f"chronic needs 1 <= K <= N, got {k}/{n}")
    named = np.asarray(named, dtype=bool)
    recent = named[-n:]
    named_last = int(recent.sum())
    total = int(named.sum())
    if named_last >= k:
        status = "chronic"
    elif total == 0:
        status = "clean"
    else:
        status = "one-off" if total == 1 else "intermittent"
    return status, named_last, int(len(recent))
