"""The verdict the watch keeps at a run's end is the report's, and is served for exactly its rows.

Rows of planted problems (a rank departing for a stretch, a NaN one rank logs first and the
others follow, a key logged every N steps, a data straggler) are written to real SQLite and
DuckDB stores and fed to rank 0's watch (judgement/live.py, watch/watch.py) as it takes them: a
chunk of steps at a time, every rank's rows in any order, judged after each chunk, with a small
window so that most of the run's statistics are kept aside. Its verdict (``keep_verdict``) is
stored through the side rows, and `report.find` must then serve it (query/kept_verdict.py) and
say exactly what the report's pass over the rows says (``from_rows=True``), every finding and
number. Where the verdict is not the whole run's, or the store holds other rows than it judged,
the pass runs and says why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multirank_logger.query.reader import open_store
from multirank_logger.report.findings import Findings, find
from multirank_logger.rows.batch import metrics_batch
from multirank_logger.rows.schema import findings, verdicts
from multirank_logger.rows.side_records import SideRecords
from multirank_logger.store.sql_store import Store
from multirank_logger.watch.alerts import AlertOutlets
from multirank_logger.watch.watch import Watch


def _plan(draw: st.DrawFn) -> dict[str, Any]:
    world = draw(st.integers(3, 6))
    steps = draw(st.integers(30, 360))
    keys = []
    for name in ("loss", "acc", "lr")[: draw(st.integers(1, 3))]:
        key: dict[str, Any] = {"name": name, "every": draw(st.sampled_from([1, 1, 2, 3])), "start": draw(st.integers(-20, 0))}
        if draw(st.booleans()):  # a rank departing for a stretch
            first = draw(st.integers(0, steps - 1))
            key["depart"] = (draw(st.integers(0, world - 1)), first, draw(st.integers(first, steps)), draw(st.sampled_from([3.0, 40.0])))
        if draw(st.booleans()):  # a NaN/inf on one rank, followed by the others a step later (or never)
            key["nan"] = (draw(st.integers(0, world - 1)), draw(st.integers(0, steps - 1)), draw(st.booleans()),
                          draw(st.sampled_from([np.nan, np.inf, -np.inf])))
        keys.append(key)
    straggler = (draw(st.integers(0, world - 1)), draw(st.integers(0, steps - 1))) if draw(st.booleans()) else None
    return {"world": world, "steps": steps, "keys": keys, "straggler": straggler, "seed": draw(st.integers(0, 2**16)),
            "chunk": draw(st.integers(1, 40)), "keep_steps": draw(st.sampled_from([8, 64, 512]))}


plans = st.composite(_plan)()


def _rows(plan: dict[str, Any]) -> tuple[list[tuple[int, int, str, float]], list[dict[str, Any]]]:
    """The run's metric rows (rank, step, key, value) in call order, and its StepTimer rows."""
    rng = np.random.default_rng(plan["seed"])
    world, steps = plan["world"], plan["steps"]
    rows = []
    for key in plan["keys"]:
        for step in range(key["start"], steps, key["every"]):
            values = rng.normal(1.0, 0.05, world)
            if "depart" in key:
                rank, first, last, size = key["depart"]
                if first <= step < last:
                    values[rank] += size
            if "nan" in key:
                rank, first, spreads, bad = key["nan"]
                if step >= first:
                    values[rank] = bad
                if spreads and step > first:
                    values[:] = bad
            rows += [(rank, step, key["name"], float(values[rank])) for rank in range(world)]
    rows.sort(key=lambda r: (r[1], r[0]))  # each rank's calls in step order
    timing = []
    for step in range(steps):
        for rank in range(world):
            data = 0.01 + rng.uniform(0, 0.002)
            if plan["straggler"] and rank == plan["straggler"][0] and step >= plan["straggler"][1]:
                data += 0.2
            timing.append({"rank": rank, "step": step, "data_s": data, "forward_s": 0.02 + rng.uniform(0, 0.002),
                           "rest_s": 0.05, "time": 1.7e9 + step})
    return rows, timing


def _write(store: Store, run_id: int, rows: list[tuple[int, int, str, float]], first_seq: dict[int, int]) -> None:
    names = sorted({r[2] for r in rows})
    for rank in sorted({r[0] for r in rows}):
        mine = [r for r in rows if r[0] == rank]
        value = np.array([r[3] for r in mine])
        nan = np.isnan(value)
        seq = first_seq.get(rank, 0) + np.arange(len(mine))
        first_seq[rank] = int(seq[-1]) + 1
        store.write(metrics_batch(
            run_id=np.full(len(mine), run_id), rank=np.full(len(mine), rank), seq=seq,
            step=np.array([r[1] for r in mine]), codes=np.array([names.index(r[2]) for r in mine]), keys=names,
            value=np.where(nan, 0.0, value), valid=~nan, dtype=np.where(nan, 3, 0), time=1.7e9 + seq * 0.01))


def _judged_run(db: Path | str, plan: dict[str, Any], whole_bytes: int | None = None, late: bool = False) -> tuple[int, Watch]:
    """A run of `plan` stored in `db`, judged by a watch as rank 0's takes its rows, its verdict kept."""
    rows, timing = _rows(plan)
    store = Store(db)
    run = store.create_run("kept", world_size=plan["world"], transport="gather")
    for rank in range(plan["world"]):
        store.register_rank(run.id, rank, local_rank=rank, node_rank=0, host="h", pid=0, status="success")
    seqs: dict[int, int] = {}
    _write(store, run.id, rows, seqs)
    side = SideRecords()
    for row in timing:
        side.add("step_timing", row)
    watch = Watch(run.id, plan["world"], AlertOutlets(side.add, echo=False), close_after=1e9)
    live = watch.judgement
    live.keep_steps = plan["keep_steps"]
    if whole_bytes is not None:
        live.whole_bytes = whole_bytes
    rng = np.random.default_rng(plan["seed"] + 1)
    by_step: dict[int, list[Any]] = {}
    for r in rows:
        by_step.setdefault(r[1], []).append(r)
    steps = sorted(by_step)
    for i in range(0, len(steps), plan["chunk"]):
        chunk = [r for s in steps[i : i + plan["chunk"]] for r in by_step[s]]
        chunk = _interleaved(chunk, rng)
        live.add_rows(np.array([r[2] for r in chunk], object), np.array([r[0] for r in chunk]), np.array([r[1] for r in chunk]),
                      np.array([r[3] for r in chunk]), now=0.0)
        live.add_timing([t for t in timing if steps[i] <= t["step"] <= steps[min(i + plan["chunk"], len(steps)) - 1]], now=0.0)
        live.judge(now=0.0)
    if late:  # a row of a step judged already (a rank's rows that came after the others')
        late_row = [(0, steps[0], plan["keys"][0]["name"], 1.0)]
        _write(store, run.id, late_row, seqs)
        live.add_rows(np.array([late_row[0][2]], object), np.array([0]), np.array([steps[0]]), np.array([1.0]), now=0.0)
    for finding in live.judge(now=0.0, final=True):
        watch.outlets.raise_alert(finding, at_end=True)
    watch.keep_verdict()
    store.write_side(side.drain(run.id, 0))
    store.update_run(run.id, status="success")
    store.close()
    return run.id, watch


def _interleaved(rows: list[Any], rng: np.random.Generator) -> list[Any]:
    """`rows` with the ranks' interleaved at random, each rank's own in its call order (as they arrive)."""
    ranks = np.array([r[0] for r in rows])
    at = np.empty(len(rows))
    for rank in np.unique(ranks):
        mine = np.flatnonzero(ranks == rank)
        at[mine] = np.sort(rng.random(len(mine)))
    return [rows[j] for j in np.argsort(at, kind="stable")]


def _same(served: Findings, judged: Findings) -> None:
    """`served` (the kept verdict) says what the pass over the rows says, to the last number."""
    a, b = served.to_dict(), judged.to_dict()
    assert (a.pop("judged_from"), b.pop("judged_from")) == ("kept verdict", "rows")
    assert a == b


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(plan=plans)
def test_the_kept_verdict_is_the_reports_on_sqlite(tmp_path_factory: pytest.TempPathFactory, plan: dict[str, Any]) -> None:
    db = tmp_path_factory.mktemp("kept") / "runs.sqlite"
    run_id, watch = _judged_run(db, plan)
    assert watch.judgement.complete and watch.whole_reason() is None
    with open_store(db) as reader:
        _same(find(reader, run_id), find(reader, run_id, from_rows=True))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(plan=plans)
def test_the_kept_verdict_is_the_reports_on_duckdb(tmp_path_factory: pytest.TempPathFactory, plan: dict[str, Any]) -> None:
    db = tmp_path_factory.mktemp("kept") / "runs.duckdb"
    run_id, _ = _judged_run(db, plan)
    with open_store(db) as reader:
        _same(find(reader, run_id), find(reader, run_id, from_rows=True))


#: a run with a bit of everything: a departure, a NaN that spreads, a key every other step, a straggler
PLAN = {"world": 4, "steps": 300, "seed": 7, "chunk": 9, "keep_steps": 8, "straggler": (3, 40),
        "keys": [{"name": "loss", "every": 1, "start": 0, "depart": (1, 100, 260, 3.0), "nan": (2, 280, True, np.nan)},
                 {"name": "acc", "every": 2, "start": -10}]}


def test_the_verdict_kept_names_the_whole_runs_numbers(any_db: str) -> None:
    """The planted problems, with the numbers of the whole run (not those of the moment they were
    raised), served on every backend (PostgreSQL's sums come back as Decimals)."""
    run_id, watch = _judged_run(any_db, PLAN)
    with open_store(any_db) as reader:
        found = find(reader, run_id)
        _same(found, find(reader, run_id, from_rows=True))
    assert [(o["rank"], o["key"], o["first_step"], o["last_step"]) for o in found.outliers] == [(1, "loss", 100, 259)]
    assert [(n["rank"], n["key"], n["first_step"], n["count"], n["origin"]) for n in found.non_finite][0] == (2, "loss", 280, 20, True)
    assert [(s["rank"], s["phase"], s["first_step"], s["last_step"]) for s in found.stragglers] == [(3, "data", 40, 299)]
    # the departure was said while it lasted (with the stretch seen then); the verdict has its whole stretch
    said = [f for f in watch.judgement.found if f.kind == "departure"]
    assert [(f.rank, f.first_step) for f in said] == [(1, 100)] and said[0].detail["last_step"] < 259


@pytest.mark.parametrize("suffix", [".sqlite", ".duckdb"])
def test_where_the_store_holds_other_rows_the_pass_runs_and_says_why(tmp_path: Path, suffix: str) -> None:
    db = tmp_path / f"runs{suffix}"
    run_id, _ = _judged_run(db, PLAN)
    store = Store(db)
    _write(store, run_id, [(0, 300, "loss", 1.0)], {0: 10_000})  # rows imported after the end (a spill file)
    store.close()
    with open_store(db) as reader:
        found = find(reader, run_id)
        assert found.judged_from == "rows" and "other metric rows" in (found.verdict_not_served or "")
        assert [(o["rank"], o["key"]) for o in found.outliers] == [(1, "loss")]


def test_a_findings_row_missing_is_never_served(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite"
    run_id, _ = _judged_run(db, PLAN)
    store = Store(db)
    with store.begin() as conn:
        conn.execute(sa.delete(findings).where(findings.c.kind == "departure"))
    store.close()
    with open_store(db) as reader:
        found = find(reader, run_id)
    assert found.judged_from == "rows" and "are stored" in (found.verdict_not_served or "")
    assert [(o["rank"], o["key"]) for o in found.outliers] == [(1, "loss")]  # the pass still finds it


@pytest.mark.parametrize("fault", ["bytes", "late"])
def test_a_watch_that_could_not_hold_the_whole_run_says_why_and_the_pass_runs(tmp_path: Path, fault: str) -> None:
    db = tmp_path / "runs.sqlite"
    run_id, watch = _judged_run(db, PLAN, whole_bytes=4096 if fault == "bytes" else None, late=fault == "late")
    assert not watch.judgement.complete
    reason = watch.whole_reason() or ""
    assert ("passed" in reason) if fault == "bytes" else ("came after their step was judged" in reason)
    store = Store(db)
    with store.begin() as conn:
        kept = conn.execute(sa.select(verdicts.c.complete, verdicts.c.rows_by_rank, verdicts.c.reason)).all()
    store.close()
    assert [(bool(c), rows) for c, rows, _ in kept] == [(False, None)] and kept[0][2] == reason
    with open_store(db) as reader:
        found = find(reader, run_id)
    assert found.judged_from == "rows" and found.verdict_not_served == reason
    assert [(o["rank"], o["key"]) for o in found.outliers] == [(1, "loss")]


def test_without_a_kept_verdict_the_pass_runs_silently(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite"
    store = Store(db)
    run = store.create_run("plain", world_size=3, transport="gather")
    _write(store, run.id, [(r, s, "loss", 1.0 + r * 0.01) for s in range(20) for r in range(3)], {})
    store.close()
    with open_store(db) as reader:
        found = find(reader, run.id)
    assert (found.judged_from, found.verdict_not_served) == ("rows", None)
    assert [r["steps"] for r in found.ranks] == [20, 20, 20]


@pytest.mark.parametrize("suffix", [".sqlite", ".duckdb"])
def test_a_rank_whose_steps_go_back_has_its_steps_counted_from_the_summaries(tmp_path: Path, suffix: str) -> None:
    """A key logged at an earlier step than the rank's last (an epoch's metric at its first step):
    the watch cannot tell its distinct steps, the verdict is still the whole run's, and the ranks
    table is counted from the step summaries, as the pass counts it from the rows."""
    db = tmp_path / f"runs{suffix}"
    rng = np.random.default_rng(3)
    calls = [(rank, step, "loss", 1.0 + rng.normal(0, 0.01) + (2.0 if rank == 1 and step >= 20 else 0.0))
             for step in range(60) for rank in range(3)]
    calls += [(rank, 10 * epoch, "val", 0.5) for epoch in range(3) for rank in range(3)]  # (steps back)
    store = Store(db)
    run = store.create_run("back", world_size=3, transport="gather")
    _write(store, run.id, calls, {})
    side = SideRecords()
    watch = Watch(run.id, 3, AlertOutlets(side.add, echo=False), close_after=1e9)
    watch.judgement.add_rows(np.array([c[2] for c in calls], object), np.array([c[0] for c in calls]),
                             np.array([c[1] for c in calls]), np.array([c[3] for c in calls]), now=0.0)
    watch.judgement.judge(now=0.0, final=True)
    assert watch.judgement.complete and watch.judgement.rank_steps() is None
    watch.keep_verdict()
    store.write_side(side.drain(run.id, 0))
    store.close()
    with open_store(db) as reader:
        served, judged = find(reader, run.id), find(reader, run.id, from_rows=True)
    _same(served, judged)
    assert [(r["steps"], r["last_step"]) for r in served.ranks] == [(60, 59)] * 3
    assert [(o["rank"], o["key"], o["first_step"]) for o in served.outliers] == [(1, "loss", 20)]


def test_a_watch_that_sees_rank_0s_rows_only_keeps_no_whole_verdict() -> None:
    """DuckDB with transport='direct': the ranks write the file themselves, and a reader would lock
    them out; the watch sees rank 0's rows only and says so (the count would tell too)."""
    from multirank_logger.watch.watch import watch_for

    side = SideRecords()
    for transport, opens_per_transaction, alone in (("direct", True, True), ("direct", False, False), ("gather", True, False)):
        watch, _ = watch_for(1, 3, transport, "sqlite:///unused", opens_per_transaction,
                             AlertOutlets(side.add, echo=False), close_after=1.0)
        watch.judgement.judge(now=0.0, final=True)
        reason = watch.whole_reason()
        assert (reason is not None and "rank 0's rows only" in reason) == alone, (transport, reason)


@pytest.mark.parametrize("column, damage", [("rows_by_rank", "[1, 2"), ("steps_by_rank", '{"0": 5}'), ("rows_by_rank", '"ab"')])
def test_a_damaged_verdict_row_is_never_served(tmp_path: Path, column: str, damage: str) -> None:
    """A verdict row whose JSON is cut or foreign (a damaged file, another tool's row): the pass runs and says so."""
    db = tmp_path / "runs.sqlite"
    run_id, _ = _judged_run(db, PLAN)
    store = Store(db)
    with store.begin() as conn:
        conn.execute(sa.update(verdicts).values({column: damage}))
    store.close()
    with open_store(db) as reader:
        found = find(reader, run_id)
    assert found.judged_from == "rows" and found.verdict_not_served, found.verdict_not_served
    assert [(o["rank"], o["key"]) for o in found.outliers] == [(1, "loss")]
