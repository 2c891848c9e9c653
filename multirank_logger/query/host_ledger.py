"""The hosts ledger: every host (or GPU, by its UUID), the runs it took part in, those whose kept
verdict named it.

What ``multirank-logger hosts`` reads (``StoreReader.hosts``): two queries, over ``ranks`` (which
host each run's ranks ran on, and the names it went by there: Slurm's, a GPU's host and model)
and the ``findings`` table joined to it (the verdict each run kept
at its end: a finding names a rank, the rank a host). No metric row is read, so a store of
10,000 runs answers in well under a second (benchmarks/bench_hosts.py). A resumed run's verdict
is its last launch's (as ``StoreReader.findings``); its ranks' hosts are those of its last launch
(the ``ranks`` table keeps one row per rank). Whether a host is chronic is the judgement's rule
(judgement/ledger.py).

The rows come as the driver's tuples, not Arrow: pyarrow (26) imports pandas on its first
``pa.array``, which was most of the cold command's time. The queries are SQL text over the
tables' names, so that ``multirank-logger hosts`` (report/host_list.read_hosts) can run them on a SQLite or DuckDB file through the engine's
own driver (store/backends/store_files.py) without importing SQLAlchemy, the rest of that time
(tests/project/test_import_set.py keeps both out; benchmarks/RESULTS.md "Hosts ledger").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from multirank_logger._util.readable import natural_key
from multirank_logger.judgement.ledger import CHRONIC, host_status
from multirank_logger.store.backends.store_files import FetchSql

__all__ = ["LEDGER_BY", "SEQ_ATTEMPT_SHIFT", "read_host_ledger"]

#: what the ledger lists, and the ``ranks`` column that tells it: a host by its name, a GPU by its
#: UUID (whatever its host was called: the UUID is the device's own)
LEDGER_BY = {"host": "host", "gpu": "gpu_uuid"}

#: a row's ``seq`` is ``(launch << 40) + its call``: model/schema.SEQ_ATTEMPT_SHIFT (a test checks they agree)
SEQ_ATTEMPT_SHIFT = 40


def read_host_ledger(fetch_rows: FetchSql, *, since: float | None = None, kinds: Iterable[str] | None = None,
                     chronic: tuple[int, int] = CHRONIC, by: str = "host") -> list[dict[str, Any]]:
    """Every host that ran a rank of a run started at or after `since` (unix seconds; None: every
    run), by name (numbers as numbers: ``node2`` before ``node10``): ``host``, ``runs`` (the runs it took part in), ``named`` (those whose kept
    verdict named a rank on it, of the `kinds` given; None: every kind), ``by_kind`` (kind: runs
    named), ``first_seen`` and ``last_seen`` (the start of its first and last run, unix seconds),
    ``named_last`` of its ``last`` (up to N) runs, and ``status`` (judgement/ledger.py
    ``host_status`` with `chronic` = (K, N): chronic, intermittent, one-off, clean), and
    ``slurm_node``: Slurm's name of the host in its latest run that recorded one (else None).

    `by` ``"gpu"``: every GPU (by UUID) instead, each row with ``gpu`` (its UUID), ``gpu_name``,
    ``host`` and ``slurm_node`` (of its latest run) and ``hosts`` (every host name it was seen under)."""
    k, n = chronic
    host_status(np.zeros(0, bool), k, n)  # the rule's bounds, checked before any read
    col = f"ranks.{LEDGER_BY[by]}"
    when = "" if since is None else f" AND runs.started_at >= {float(since)!r}"  # a float this code made: SQL's literal
    # each (host or GPU, run) once, with the names it went by in that run (a GPU's host and model,
    # Slurm's name of the node; MAX: any rank's that recorded one)
    took_part = (f"SELECT {col}, ranks.run_id, runs.started_at, MAX(ranks.host), MAX(ranks.gpu_name),"
                 f" MAX(ranks.slurm_node) FROM ranks JOIN runs ON runs.id = ranks.run_id WHERE {col} IS NOT NULL{when}"
                 f" GROUP BY {col}, ranks.run_id, runs.started_at")
    named = (f"SELECT findings.run_id, findings.seq, findings.kind, {col} FROM findings"
             " JOIN ranks ON ranks.run_id = findings.run_id AND ranks.rank = findings.rank"
             f" JOIN runs ON runs.id = findings.run_id WHERE {col} IS NOT NULL{when}")
    parts = fetch_rows(took_part)
    if not parts:
        return []
    host, run_id, started, on_host, gpu_name, slurm = _columns(parts, (object, np.int64, float, object, object, object))
    names, code = np.unique(host.astype(str), return_inverse=True)
    order = np.lexsort((run_id, started, code))  # each host's runs together, oldest first
    code, run_id, started = code[order], run_id[order], started[order]
    seen = [on_host[order], gpu_name[order], slurm[order]]
    width = int(run_id.max()) + 1
    pair = code.astype(np.int64) * width + run_id  # (host, run) as one integer

    by_kind = _named_pairs(fetch_rows(named), {str(h): i for i, h in enumerate(names)}, width, kinds)
    named_any = np.unique(np.concatenate(list(by_kind.values()))) if by_kind else np.zeros(0, np.int64)
    flags = np.isin(pair, named_any)
    kind_flags = {kind: np.isin(pair, pairs) for kind, pairs in sorted(by_kind.items())}

    out = []
    bounds = np.flatnonzero(np.diff(np.r_[-1, code, len(names)]))
    for start, stop in zip(bounds[:-1], bounds[1:]):
        status, named_last, last = host_status(flags[start:stop], k, n)
        key = str(names[code[start]])
        out.append({
            by: key, **_names_seen([c[start:stop] for c in seen], by), "runs": int(stop - start), "named": int(flags[start:stop].sum()),
            "by_kind": {kind: int(f[start:stop].sum()) for kind, f in kind_flags.items() if f[start:stop].any()},
            "first_seen": float(started[start:stop].min()), "last_seen": float(started[start:stop].max()),
            "named_last": named_last, "last": last, "status": status,
        })
    return sorted(out, key=lambda row: natural_key(row[by]))  # node2 before node10


def _names_seen(names: list[np.ndarray], by: str) -> dict[str, Any]:
    """One host's (`by` "host") Slurm name, or one GPU's host, model and Slurm name, each as in its
    latest run that recorded one, and every host name it was seen under; from `names` (host,
    gpu_name, slurm_node: one row a run, oldest first)."""
    host, gpu_name, slurm = (c.tolist() for c in names)
    out: dict[str, Any] = {"slurm_node": _latest(slurm)}
    if by != "host":
        out.update(gpu_name=_latest(gpu_name), host=_latest(host),
                   hosts=sorted({h for h in host if h is not None}, key=natural_key))
    return out


def _latest(values: list[Any]) -> Any:
    return next((v for v in reversed(values) if v is not None), None)


def _columns(rows: Sequence[Sequence[Any]], types: Sequence[Any]) -> list[np.ndarray]:
    """The driver's `rows` as one NumPy array per column, of `types`."""
    return [np.fromiter((row[i] for row in rows), kind, len(rows)) for i, kind in enumerate(types)]


def _named_pairs(rows: Sequence[Sequence[Any]], codes: dict[str, int], width: int,
                 kinds: Iterable[str] | None) -> dict[str, np.ndarray]:
    """Per kind, the (host, run) pairs named in a run's kept verdict: its last launch's findings."""
    if not rows:
        return {}
    run_id, seq, kind, hosts = _columns(rows, (np.int64, np.int64, object, object))
    launch = seq >> SEQ_ATTEMPT_SHIFT
    host = hosts.tolist()
    inside = run_id < width  # (a finding of a run with no `runs` row: in no run listed)
    run_id, launch, kind, host = run_id[inside], launch[inside], kind[inside], [h for h, i in zip(host, inside) if i]
    last = np.zeros(width, np.int64)
    np.maximum.at(last, run_id, launch)
    keep = launch == last[run_id]
    if kinds is not None:
        keep &= np.isin(kind.astype(str), list(kinds))
    code = np.fromiter((codes.get(str(h), -1) for h in host), np.int64, len(host))
    keep &= code >= 0  # (a host whose runs all started before `since` took part in none listed)
    pair = code * width + run_id
    return {str(k): np.unique(pair[keep & (kind == k)]) for k in np.unique(kind[keep].astype(str))}
