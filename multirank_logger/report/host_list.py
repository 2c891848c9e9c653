"""``multirank-logger hosts DB``: the hosts ledger as a table, JSON, CSV or Slurm's exclude list.

The rows are `StoreReader.hosts`' (query/host_ledger.py: the ``ranks`` and ``findings`` tables);
this module only lays them out. ``slurm`` prints ``--exclude=HOST,...`` of the chronic hosts
(nothing when none is), for ``sbatch $(multirank-logger hosts runs.db --format slurm) job.sh``;
``--by gpu`` lists every GPU by its UUID instead, and its ``slurm`` the hosts of the chronic GPUs.

``--exclude`` takes node names as Slurm knows them (slurm.conf's ``NodeName``): the name a rank
recorded from ``SLURMD_NODENAME`` (schema 0013) where it ran in a Slurm job, else the host as
recorded (``socket.gethostname()``), never cut to a short name: that is typically the short name
(``hostname -s``) but may be the fully qualified one, and cutting ``node17.cluster.local`` to
``node17`` would name a node Slurm does not know on a cluster configured with FQDNs.
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
from multirank_logger.query.host_ledger import LEDGER_BY, read_host_ledger
from multirank_logger.store.backends.store_files import driver_rows

__all__ = ["BY", "FORMATS", "KINDS", "chronic_rule", "hosts_text", "option_error", "read_hosts"]

FORMATS = ("table", "json", "csv", "slurm")
BY = tuple(LEDGER_BY)


def read_hosts(db: str | os.PathLike[str], *, since: float | None = None, kinds: Iterable[str] | None = None,
               chronic: tuple[int, int] = CHRONIC, by: str = "host") -> list[dict[str, Any]]:
    """`read_host_ledger` of the store `db`: a SQLite or DuckDB file at this code's schema through
    its own driver, anything else (PostgreSQL, a file to upgrade, a held one) through ``open_store``."""
    with driver_rows(db) as fetch:
        if fetch is not None:
            return read_host_ledger(fetch, since=since, kinds=kinds, chronic=chronic, by=by)
    from multirank_logger.query.reader import open_store

    with open_store(db) as reader:
        return reader.hosts(since=since, kinds=kinds, chronic=chronic, by=by)


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


def hosts_text(rows: list[dict[str, Any]], fmt: str = "table", chronic: tuple[int, int] = (3, 5), by: str = "host") -> str:
    """`rows` (``StoreReader.hosts``, of `by`) in `fmt`, one of `FORMATS`; `chronic`: the rule they were judged by."""
    if fmt == "slurm":  # Slurm's name of the node where recorded; a GPU's: its host's
        bad = sorted({r.get("slurm_node") or r["host"] for r in rows if r["status"] == "chronic"}, key=natural_key)
        return f"--exclude={','.join(bad)}" if bad else ""
    what = "hosts" if by == "host" else "gpus"
    if fmt == "json":
        return json.dumps({"chronic": {"k": chronic[0], "n": chronic[1]},
                           what: [{**r, "first_seen": _date(r["first_seen"]), "last_seen": _date(r["last_seen"])}
                                  for r in rows]}, indent=1)
    kinds = sorted({kind for r in rows for kind in r["by_kind"]})
    about = ["host", "slurm_node"] if by == "host" else ["gpu", "gpu_name", "host", "slurm_node"]
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([*about, "runs", "named", *(f"named_{k}" for k in kinds), "first_seen", "last_seen",
                         "named_last", "last", "status"])
        for r in rows:
            writer.writerow([*(r.get(a) or "" for a in about), r["runs"], r["named"], *(r["by_kind"].get(k, 0) for k in kinds),
                             _date(r["first_seen"]), _date(r["last_seen"]), r["named_last"], r["last"], r["status"]])
        return out.getvalue().rstrip("\n")
    if not rows:
        return ("No hosts: no run in this selection registered a rank with its host." if by == "host" else
                "No GPUs: no run in this selection registered a rank with its GPU's UUID (CUDA in use).")
    k, n = chronic
    shown = ["host"] if by == "host" else ["gpu", "gpu_name", "host"]
    if any(r.get("slurm_node") and r["slurm_node"] != r["host"] for r in rows):
        shown.append("slurm_node")  # only where it says something the host does not
    columns: dict[str, list[Any]] = {
        **{a.replace("_", " "): [r.get(a) or "-" for r in rows] for a in shown},
        "runs": [r["runs"] for r in rows], "named": [r["named"] for r in rows],
        **{k_: [r["by_kind"].get(k_, 0) for r in rows] for k_ in kinds},
        "first seen": [_date(r["first_seen"]) for r in rows], "last seen": [_date(r["last_seen"]) for r in rows],
        f"last {n}": [f"{r['named_last']}/{r['last']}" for r in rows], "status": [r["status"] for r in rows],
    }
    chronic_count = sum(r["status"] == "chronic" for r in rows)
    one = "host" if by == "host" else "GPU"
    note = (f"named: runs whose kept verdict (the findings table) named a rank on the {one}, by kind; "
            f"chronic: named in {k} or more of its last {n} runs ({chronic_count} {one}(s)).")
    return text_table(columns) + "\n" + note


def _date(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
