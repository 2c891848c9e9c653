"""Read side of the side tables: checkpoint / early-stopping decisions and every rank's log.

`SideTablesReader` is a mixin of `query.StoreReader` (it uses its `resolve_run` and
`_fetch_arrow`), so ``open_store(db).decisions()`` and ``.logs()`` sit beside ``.metrics()``.
The pure helpers below (`disagreements`, `group_alike`, `format_ranks`) shape those frames
for the CLI and for anyone reading them.

Example::

    store = open_store("runs.duckdb")
    d = store.decisions()                 # one row per (decision, rank)
    d[d.seq.isin(disagreements(d))]       # the decisions where the ranks voted differently
    group_alike(store.logs(level="INFO")) # a message every rank logged: one row, all its ranks
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa

from multirank_logger.ddp.log_capture import level_number
from multirank_logger.model.schema import decisions, logs

__all__ = ["SideTablesReader", "disagreements", "format_ranks", "group_alike"]

DECISION_COLUMNS = ("seq", "step", "epoch", "callback", "monitor", "mode", "rank", "value", "vote", "decision",
                    "path", "best", "time")  # fmt: skip
LOG_COLUMNS = ("rank", "seq", "time", "level", "levelno", "logger", "message")


class SideTablesReader:
    """``decisions()`` and ``logs()`` of a run, as pandas DataFrames (mixed into StoreReader)."""

    def decisions(self, run: int | str | None = None) -> Any:
        """Every ModelCheckpoint / EarlyStopping decision of a run, one row per (decision, rank).

        Columns: ``seq`` (the decision's number, the same on every rank), ``step``, ``epoch``,
        ``callback``, ``monitor``, ``mode``, ``rank``, ``value`` (the rank's own monitored
        value), ``vote`` (this rank alone would save / stop), ``decision`` (what was done),
        ``path`` (the checkpoint saved), ``best`` (the callback's best score after it) and
        ``time`` (unix seconds). Sorted by decision, then rank. Empty when the run had no
        `DecisionAudit`.

        Raises:
            LookupFailed: for an unknown run.
        """
        ref = self.resolve_run(run)  # type: ignore[attr-defined]
        stmt = (
            sa.select(*(decisions.c[name] for name in DECISION_COLUMNS))
            .where(decisions.c.run_id == ref.id)
            .order_by(decisions.c.seq, decisions.c.rank)
        )
        df = self._frame(stmt, DECISION_COLUMNS)
        for name in ("vote", "decision"):  # SQLite hands back 0/1
            df[name] = df[name].astype("boolean")
        return df

    def logs(self, run: int | str | None = None, rank: int | None = None, level: int | str | None = None) -> Any:
        """Every rank's logging records and warnings kept during a run (``capture_logs``).

        Args:
            run: see the class docstring of StoreReader.
            rank: only this rank's records.
            level: only records at or above this level (``"WARNING"``, ``30``).

        Returns:
            Columns ``rank``, ``seq`` (the rank's record number), ``time`` (unix seconds),
            ``level``, ``levelno``, ``logger``, ``message``; in time order.

        Raises:
            LookupFailed: for an unknown run.
            ValueError: for a level name logging does not know.
        """
        ref = self.resolve_run(run)  # type: ignore[attr-defined]
        stmt = sa.select(*(logs.c[name] for name in LOG_COLUMNS)).where(logs.c.run_id == ref.id)
        if rank is not None:
            stmt = stmt.where(logs.c.rank == int(rank))
        if level is not None:
            stmt = stmt.where(logs.c.levelno >= level_number(level))
        return self._frame(stmt.order_by(logs.c.time, logs.c.rank, logs.c.seq), LOG_COLUMNS)

    def _frame(self, stmt: sa.Select, columns: Iterable[str]) -> Any:
        df = self._fetch_arrow(stmt).to_pandas()  # type: ignore[attr-defined]
        return df[list(columns)] if len(df.columns) else df.reindex(columns=list(columns))


def disagreements(decided: Any) -> list[int]:
    """The decisions (``seq``) of a `SideTablesReader.decisions` frame where the ranks' votes differ."""
    if decided.empty:
        return []
    votes = decided.groupby("seq")["vote"].nunique(dropna=False)
    return [int(seq) for seq in votes[votes > 1].index]


def group_alike(records: Any) -> Any:
    """Log records that several ranks logged alike, as one row with the ranks that logged it.

    The n-th time each rank logged one (level, logger, message) are taken as one message: a
    banner every rank prints once is one row with every rank; a line repeated is one row per
    repetition.

    Returns:
        Columns ``time`` (the earliest rank's), ``level``, ``levelno``, ``logger``,
        ``message``, ``ranks`` (a sorted list); in time order.
    """
    import pandas as pd

    if records.empty:
        return pd.DataFrame(columns=["time", "level", "levelno", "logger", "message", "ranks"])
    same = ["level", "levelno", "logger", "message"]
    df = records.assign(nth=records.groupby(["rank", *same]).cumcount())
    grouped = df.groupby([*same, "nth"], sort=False).agg(time=("time", "min"), ranks=("rank", lambda r: sorted(set(r))))
    out = grouped.reset_index().sort_values("time", kind="stable").reset_index(drop=True)
    return out[["time", "level", "levelno", "logger", "message", "ranks"]]


def format_ranks(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 5]`` as ``"ranks 0-3,5"``; one rank as ``"rank 2"``."""
    ordered = sorted({int(r) for r in ranks})
    if len(ordered) == 1:
        return f"rank {ordered[0]}"
    spans: list[str] = []
    start = prev = ordered[0]
    for r in [*ordered[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return "ranks " + ",".join(spans)
