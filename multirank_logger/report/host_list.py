"""``multirank-logger hosts DB``: the hosts ledger as a table, JSON, CSV or Slurm's exclude list.

The rows are `StoreReader.hosts`' (query/host_ledger.py: the ``ranks`` and ``findings`` tables);
this module only lays them out. ``slurm`` prints ``--exclude=HOST,...`` of the chronic hosts
(nothing when none is), for ``sbatch $(multirank-logger hosts runs.db --format slurm) job.sh``.

The hosts are listed as recorded (``socket.gethostname()``), never cut to a short name: ``--exclude``
takes node names as Slurm knows them (slurm.conf's ``NodeName``), which is typically the short
name (``hostname -s``) but may be the fully qualified one; cutting ``node17.cluster.local`` to
``node17`` would name a node Slurm does not know on a cluster configured with FQDNs. Slurm's own
name of the node (``SLURMD_NODENAME`` in a job) is not recorded yet.
"""

from __future__ import annotations

import csv
import datetime
import io
import json
import os
from collections.abc import Iterable
from typing import Any

from multirank_logger._util.readable import natural_key, text_table
from multirank_logger.judgement.ledger import CHRONIC
from multirank_logger.judgement.sentences import KINDS
from multirank_logger.query.host_ledger import read_host_ledger
from multirank_logger.store.backends.store_files import driver_rows

__all__ = ["FORMATS", "KINDS", "chronic_rule", "hosts_text", "option_error", "read_hosts"]

FORMATS = ("table", "json", "csv", "slurm")


def read_hosts(db: str | os.PathLike[str], *, since: float | None = None, kinds: Iterable[str] | None = None,
               chronic: tuple[int, int] = CHRONIC) -> list[dict[str, Any]]:  # fmt: skip
    """`read_host_ledger` of the store `db`: a SQLite or DuckDB file at this code's schema through
    its own driver, anything else (PostgreSQL, a file to upgrade, a held one) through ``open_store``."""
    with driver_rows(db) as fetch:
        if fetch is not None:
            return read_host_ledger(fetch, since=since, kinds=kinds, chronic=chronic)
    from multirank_logger.query.reader import open_store

    with open_store(db) as reader:
        return reader.hosts(since=since, kinds=kinds, chronic=chronic)


def chronic_rule(text: str) -> tuple[int, int]:
    """``--chronic K/N`` as (K, N).

    Raises:
        ValueError: unless two integers with 1 <= K <= N.
    """
    k, n = (int(part) for part in text.split("/"))
    if not 1 <= k <= n:
        raise ValueError(text)
    return k, n


def option_error(rule: str, kinds: tuple[str, ...]) -> tuple[str, str] | None:
    """What is wrong with the ``hosts`` command's ``--chronic`` `rule` or ``--kind`` `kinds`: (option, why); None when nothing."""
    try:
        chronic_rule(rule)
    except ValueError:
        return "--chronic", f"{rule!r}: give K/N with 1 <= K <= N, e.g. 3/5"
    if unknown := sorted(set(kinds) - set(KINDS)):
        return "--kind", f"{', '.join(unknown)}: a kind is one of {', '.join(KINDS)}"
    return None


def hosts_text(rows: list[dict[str, Any]], fmt: str = "table", chronic: tuple[int, int] = (3, 5)) -> str:
    """`rows` (``StoreReader.hosts``) in `fmt`, one of `FORMATS`; `chronic`: the rule they were judged by."""
    if fmt == "slurm":
        bad = sorted((r["host"] for r in rows if r["status"] == "chronic"), key=natural_key)
        return f"--exclude={','.join(bad)}" if bad else ""
    if fmt == "json":
        return json.dumps({"chronic": {"k": chronic[0], "n": chronic[1]},
                           "hosts": [{**r, "first_seen": _date(r["first_seen"]), "last_seen": _date(r["last_seen"])}
                                     for r in rows]}, indent=1)  # fmt: skip
    kinds = sorted({kind for r in rows for kind in r["by_kind"]})
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["host", "runs", "named", *(f"named_{k}" for k in kinds), "first_seen", "last_seen",
                         "named_last", "last", "status"])  # fmt: skip
        for r in rows:
            writer.writerow([r["host"], r["runs"], r["named"], *(r["by_kind"].get(k, 0) for k in kinds),
                             _date(r["first_seen"]), _date(r["last_seen"]), r["named_last"], r["last"], r["status"]])  # fmt: skip
        return out.getvalue().rstrip("\n")
    if not rows:
        return "No hosts: no run in this selection registered a rank with its host."
    k, n = chronic
    columns: dict[str, list[Any]] = {
        "host": [r["host"] for r in rows], "runs": [r["runs"] for r in rows], "named": [r["named"] for r in rows],
        **{k_: [r["by_kind"].get(k_, 0) for r in rows] for k_ in kinds},
        "first seen": [_date(r["first_seen"]) for r in rows], "last seen": [_date(r["last_seen"]) for r in rows],
        f"last {n}": [f"{r['named_last']}/{r['last']}" for r in rows], "status": [r["status"] for r in rows],
    }  # fmt: skip
    chronic_hosts = sum(r["status"] == "chronic" for r in rows)
    note = (f"named: runs whose kept verdict (the findings table) named a rank on the host, by kind; "
            f"chronic: named in {k} or more of its last {n} runs ({chronic_hosts} host(s)).")  # fmt: skip
    return text_table(columns) + "\n" + note


def _date(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
