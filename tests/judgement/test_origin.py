"""Where a problem started (judgement/origin.py), said once (judgement/sentences.py), and the same
answer from the watch fed as rows arrive and from the report over the stored run.

The real 4-rank training whose NaN spreads through the all-reduce is tests/runs/test_origin_ddp.py's;
here planted runs: a random origin rank and step (the last step too), spread to every other rank
within a few steps or not at all, on one key or two, the rows arriving in random interleavings.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multirank_logger import open_store
from multirank_logger.judgement.finding import Finding
from multirank_logger.judgement.live import LiveJudgement
from multirank_logger.judgement.origin import spread_of, with_origin
from multirank_logger.judgement.sentences import finding_sentence
from multirank_logger.report import find
from multirank_logger.store.sql_store import Store
from multirank_logger.write.buffer import RecordBuffer


def test_the_origin_is_the_earliest_rank_and_the_others_followed() -> None:
    spread = spread_of([(0, 151), (1, 151), (2, 150), (3, 151)], world_size=4)
    assert spread == {"origin_ranks": [2], "origin_step": 150, "followers": [[0, 151], [1, 151], [3, 151]],
                      "lag": 1, "all_reduce": True}
    assert spread_of([(0, 10), (3, 40)], world_size=4)["all_reduce"] is False  # two of four, 30 steps apart
    assert spread_of([(1, 5), (2, 5)], world_size=4)["origin_ranks"] == [1, 2]  # two at once: both the origin


def test_the_report_order_leads_with_each_problems_origin() -> None:
    """Problems by their origin's step; within one, the origin, then the followers by first step."""
    items = [{"rank": r, "key": k, "first_step": s} for r, k, s in
             [(0, "b", 151), (1, "b", 151), (2, "b", 150), (3, "a", 300), (0, "a", 290)]]
    ordered = with_origin(items, lambda i: i["key"], world_size=4)
    assert [(i["key"], i["rank"], i["origin"]) for i in ordered] == [
        ("b", 2, True), ("b", 0, False), ("b", 1, False), ("a", 0, True), ("a", 3, False)]
    assert ordered[0]["spread"]["followers"] == [[0, 151], [1, 151]]
    # a follower names the origin only: 1,024 followers each listing the others would be a million pairs
    assert ordered[1]["spread"] == {"origin_ranks": [2], "origin_step": 150, "lag": 1, "all_reduce": False}


def test_a_thousand_followers_stay_one_line() -> None:
    """1,024 ranks following one step later: ranges, not 1,023 numbers."""
    items = [{"rank": r, "key": "loss", "first_step": 150 if r == 37 else 151, "nan": 1, "inf": 0} for r in range(1024)]
    origin = with_origin(items, lambda i: i["key"], world_size=1024)[0]
    assert finding_sentence("non_finite", origin) == (
        "rank 37 loss NaN from step 150; followed by ranks 0-36,38-1023 at step 151 "
        "(every other rank within 1 step: spread through the gradient all-reduce)")


def test_the_reports_text_says_a_thousand_followers_in_one_line() -> None:
    """The report's text: the origin's sentence, then one line for the ranks that followed at
    one step (1,023 ranks at 1,024), one for a later step's; a problem on another key apart."""
    from multirank_logger.report.findings import Findings
    from multirank_logger.report.render import findings_text

    firsts = {37: 150, 5: 153, 900: 153} | {r: 151 for r in range(1024) if r not in (37, 5, 900)}
    items = [{"rank": r, "key": "loss", "first_step": s, "value": "NaN", "count": 10, "nan": 10, "inf": 0}
             for r, s in firsts.items()] + [{"rank": 3, "key": "acc", "first_step": 7, "value": "inf", "count": 1,
                                             "nan": 0, "inf": 1}]
    found = Findings(run="r/version_0", run_id=1, world_size=1024,
                     non_finite=with_origin(items, lambda i: i["key"], world_size=1024))
    text = findings_text(found)
    section = text.split("Non-finite values:\n")[1].split("\n\n")[0].splitlines()
    assert section == [
        "  rank 3 acc inf from step 7: 1 values (0 NaN, 1 inf)",
        "  rank 37 loss NaN from step 150; followed by ranks 0-4,6-36,38-899,901-1023 at step 151, ranks 5,900 at "
        "step 153: 10 values (10 NaN, 0 inf)",
        "  ranks 0-4,6-36,38-899,901-1023 loss NaN from step 151, after rank 37 at step 150: 10,210 values on 1,021 ranks "
        "(10,210 NaN, 0 inf)",
        "  ranks 5,900 loss NaN from step 153, after rank 37 at step 150: 20 values on 2 ranks (20 NaN, 0 inf)",
    ]


def test_a_live_finding_and_a_report_item_say_the_same() -> None:
    """The alert's sentence is the report's, plus the step the watch had reached."""
    live = LiveJudgement(3, close_after=1e9)
    live.add_rows(np.array(["loss"] * 6, object), np.array([0, 1, 2] * 2), np.array([4, 4, 4, 5, 5, 5]),
                  np.array([1.0, 1.0, np.nan, np.nan, np.nan, np.nan]), now=0.0)
    found = live.judge(0.0, final=True)
    assert [(f.rank, f.first_step, f.origin) for f in found] == [(2, 4, True), (0, 5, False), (1, 5, False)]
    report = with_origin([{"rank": r, "key": "loss", "first_step": s, "nan": 1, "inf": 0} for r, s in
                          [(0, 5), (1, 5), (2, 4)]], lambda i: i["key"], 3)
    assert found[0].sentence == finding_sentence("non_finite", report[0]) + " (seen at step 5)"
    # the report's items as typed records: the same findings, fields and number as the watch's
    records = [Finding.from_item("non_finite", item) for item in report]
    assert all(r.matches(f) for r, f in zip(records, found, strict=True))
    assert [(r.origin, r.origin_step, r.series) for r in records] == [(True, 4, "loss"), (False, 4, "loss"), (False, 4, "loss")]
    assert records[0].sentence == finding_sentence("non_finite", report[0])


# -- the property: the watch's alerts are the report's findings at a run's end ---------------------

_plants = st.fixed_dictionaries({
    "origin": st.integers(0, 7),
    "step": st.integers(0, 39),
    "lag": st.sampled_from([None, 0, 1, 3]),  # None: the others never follow
    "persists": st.booleans(),  # NaN from there on, or that one value
})


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(world=st.integers(3, 8), plants=st.dictionaries(st.sampled_from(["loss", "acc"]), _plants, max_size=2),
       stride=st.sampled_from([1, 2, 5]), seed=st.integers(0, 2**16))
def test_at_a_runs_end_the_alerts_are_the_reports_findings(tmp_path_factory, world, plants, stride, seed) -> None:  # type: ignore[no-untyped-def]
    """Planted NaN (random origin and step, spread or not, early or in the last step; "acc" logged
    every `stride` steps): fed to the watch's judgement in random interleavings and judged at the
    end, its findings are the report's over the stored rows, (rank, key, first step, origin) for
    each, each key's in the same order."""
    steps = 40
    rng = np.random.default_rng(seed)
    values = {key: 1.0 + 0.01 * rng.standard_normal((steps, world)) for key in ("loss", "acc")}
    for key, plant in plants.items():
        origin = plant["origin"] % world
        until = steps if plant["persists"] else plant["step"] + 1
        values[key][plant["step"]:until, origin] = np.nan
        if plant["lag"] is not None and plant["step"] + plant["lag"] < steps:
            values[key][plant["step"] + plant["lag"]:, [r for r in range(world) if r != origin]] = np.nan
    db = tmp_path_factory.mktemp("origin") / "runs.sqlite"
    store = Store(db)
    run = store.create_run("planted", world_size=world)
    live = LiveJudgement(world, close_after=1e9)
    at = [0] * world  # each rank's rows arrive in its order, the ranks interleaved at random
    found = []
    buffers = [RecordBuffer() for _ in range(world)]
    while min(at) < steps:
        rank = int(rng.choice([r for r in range(world) if at[r] < steps]))
        upto = min(steps, at[rank] + int(rng.integers(1, 8)))
        chunk = range(at[rank], upto)
        logged = [(s, k) for s in chunk for k in ("loss", "acc") if k == "loss" or s % stride == 0]
        for step in chunk:
            buffers[rank].append(step, {k: float(values[k][step, rank]) for s, k in logged if s == step})
        store.write(buffers[rank].encode(buffers[rank].take(), run.id, rank))
        live.add_rows(np.array([k for _, k in logged], object), np.full(len(logged), rank),
                      np.array([s for s, _ in logged]), np.array([values[k][s, rank] for s, k in logged]), now=0.0)
        at[rank] = upto
        if rng.random() < 0.3:
            found += live.judge(0.0)
    found += live.judge(0.0, final=True)
    store.update_run(run.id, status="success")
    store.close()
    with open_store(db) as reader:
        report = find(reader).non_finite
    for key in ("loss", "acc"):
        alerted = [(f.rank, f.first_step, f.origin) for f in found if f.kind == "non_finite" and f.key == key]
        listed = [(n["rank"], n["first_step"], n["origin"]) for n in report if n["key"] == key]
        assert alerted == listed, (key, plants.get(key))
    assert {f.kind for f in found} <= {"non_finite"}  # noise of 1%: no departure anywhere
    # (across keys alerts come as each key's steps close: a key logged every 5 steps waits longer)



def test_a_resumed_runs_kept_verdict_is_its_last_launchs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Each launch keeps the verdict of the rows it watched (the launch in seq's high bits): a
    run's findings are its last launch's; a run that kept none reads empty, not an error."""
    import json

    import sqlalchemy as sa

    from multirank_logger.rows.schema import SEQ_ATTEMPT_SHIFT, findings, runs

    db = tmp_path / "runs.sqlite"
    store = Store(db)
    try:
        with store.begin() as conn:
            for run_id in (1, 2):
                conn.execute(sa.insert(runs).values(id=run_id, name="r", version=run_id - 1, status="success",
                                                    world_size=4, started_at=0.0))
            rows = [(1, 0, 0, 3, 10), (1, 1, 1 << SEQ_ATTEMPT_SHIFT, 2, 40), (1, 1, (1 << SEQ_ATTEMPT_SHIFT) + 1, 0, 41)]
            for run_id, _, seq, rank, step in rows:
                conn.execute(sa.insert(findings).values(
                    run_id=run_id, rank=rank, seq=seq, kind="non_finite", series="loss", first_step=step,
                    origin=step in (10, 40), origin_step=10 if step == 10 else 40, value=None,
                    detail=json.dumps({"value": "NaN"}), sentence=f"rank {rank} loss NaN from step {step}", found_at=1.0))
    finally:
        store.close()
    with open_store(db) as reader:
        last = reader.findings(1)
        assert [(r.launch, r.rank, r.first_step, r.origin) for r in last.itertuples()] == [(1, 2, 40, True), (1, 0, 41, False)]
        assert reader.findings(2).empty and list(reader.findings(2).columns) == list(last.columns)
        assert len(reader.findings(every_run=True)) == 2


def _rows(ranks: list[int], steps: range, nan_from: dict[int, int]) -> tuple[np.ndarray, ...]:
    pairs = [(r, s) for r in ranks for s in steps]
    values = [np.nan if s >= nan_from.get(r, 10**9) else 1.0 + 0.01 * r for r, s in pairs]
    return (np.array(["loss"] * len(pairs), object), np.array([r for r, _ in pairs]), np.array([s for _, s in pairs]),
            np.array(values))


def test_a_late_ranks_nan_is_still_said_first() -> None:
    """Rank 2's rows reach the watch 15 s late (past close_after): its NaN at step 5 spread to the
    others at step 6. The steps close without it, but the followers' NaN waits until rank 2 has
    caught up: the origin is said first, in the same judgement."""
    live = LiveJudgement(4, close_after=10.0)
    live.add_rows(*_rows([0, 1, 2, 3], range(0, 4), {}), now=0.0)
    live.add_rows(*_rows([0, 1, 3], range(4, 21), {0: 6, 1: 6, 3: 6}), now=0.5)
    assert live.judge(11.0) == []  # steps 4.. closed without rank 2: its rows are late, not missing
    live.add_rows(*_rows([2], range(4, 21), {2: 5}), now=15.0)
    found = live.judge(16.0)
    assert [(f.rank, f.first_step, f.origin) for f in found] == [(2, 5, True), (0, 6, False), (1, 6, False), (3, 6, False)]
    assert found[0].spread["followers"] == [[0, 6], [1, 6], [3, 6]]


def test_a_nan_waits_for_a_silent_rank_no_longer_than_hold_after() -> None:
    """A rank that stopped logging (dead, hung) holds the others' NaN at most hold_after
    (3 x close_after): then it is said, from the ranks that showed it."""
    live = LiveJudgement(4, close_after=10.0)
    live.add_rows(*_rows([0, 1, 2, 3], range(0, 4), {}), now=0.0)
    live.add_rows(*_rows([0, 1, 3], range(4, 21), {0: 6, 1: 6, 3: 6}), now=0.5)
    assert live.judge(11.0) == [] and live.judge(30.0) == []
    found = live.judge(31.0)
    assert [(f.rank, f.first_step, f.origin) for f in found] == [(0, 6, True), (1, 6, True), (3, 6, True)]
