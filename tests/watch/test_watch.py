"""The watch's judgement fed as a run goes (judgement/live.py), and where its alerts go (watch/alerts.py).

The 4-rank DDP training is tests/runs/test_watch_ddp.py's; here the judgement meets seeded noisy runs
(the report's own, tests/report/test_findings.py) fed in windows, in the order rows arrive.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from multirank_logger.judgement.live import LiveJudgement
from multirank_logger.judgement.ranks import departures
from multirank_logger.watch.alerts import AlertOutlets, redact_url
from tests.helpers.planted_rows import noisy_losses


def _feed(values: np.ndarray, chunk: int = 7, seed: int = 0, keep_steps: int = 512) -> tuple[list, LiveJudgement]:
    """Rows of a steps x ranks table, `chunk` steps at a time, each chunk's rows shuffled (ranks
    arrive in any order), judged after each chunk; then the end."""
    rng = np.random.default_rng(seed)
    steps, world = values.shape
    live = LiveJudgement(world, close_after=1e9, keep_steps=keep_steps)
    found = []
    for first in range(0, steps, chunk):
        step = np.repeat(np.arange(first, min(steps, first + chunk)), world)
        rank = np.tile(np.arange(world), len(step) // world)
        order = rng.permutation(len(step))
        step, rank = step[order], rank[order]
        live.add_rows(np.full(len(step), "loss", object), rank, step, values[step, rank], now=0.0)
        found += live.judge(now=0.0)
    return found + live.judge(now=0.0, final=True), live


@pytest.mark.parametrize("ranks", [3, 8])
def test_no_alert_in_normal_shard_noise(ranks: int) -> None:
    """The report's seeded noisy runs, fed as they would arrive: no alert (no false alarm)."""
    assert [(seed, f) for seed in range(20) if (f := _feed(noisy_losses(seed, ranks), seed=seed)[0])] == []


@pytest.mark.parametrize("ranks", [3, 8, 32])
def test_alert_agrees_with_the_report(ranks: int) -> None:
    """A rank at 20x from step 120 and another's NaN at step 90 and inf at 150: each alerted once
    (the non-finite value at its first step), with the rank and first step the report's judgement
    gives over the whole table."""
    values = noisy_losses(1, ranks)
    values[120:, ranks - 1] *= 20
    values[90, 0], values[150, 0] = np.nan, np.inf
    found, _ = _feed(values)
    clean = values.copy()
    clean[~np.isfinite(clean)] = np.nan
    (report,) = departures(np.arange(len(values)), np.arange(ranks), clean)
    assert [(f.kind, f.rank, f.key, f.first_step) for f in found] == [
        ("non_finite", 0, "loss", 90), ("departure", report["rank"], "loss", report["first_step"])]
    assert report["first_step"] == 120 and found[1].step_seen < 140  # during the run, soon after


def test_memory_stays_windowed_on_a_long_run() -> None:
    """5,000 steps: the statistics held stay at the window (not the history), and a departure from
    step 4,000 is still found from its first step."""
    values = np.vstack([noisy_losses(seed, 6, 500) for seed in range(10)])
    values[4000:, 2] *= 20
    found, live = _feed(values, chunk=50)
    (key,) = live.keys.values()
    held = sum(len(part[0]) for part in key.windows.parts)
    assert held <= max(live.keep_steps, 0.1 * 5000 + 64) + 50
    assert [(f.kind, f.rank, f.first_step) for f in found] == [("departure", 2, 4000)]


def test_a_late_row_of_a_closed_step_is_counted_not_judged() -> None:
    live = LiveJudgement(3, close_after=5.0)
    live.add_rows(np.array(["k"] * 2, object), np.array([0, 1]), np.array([0, 0]), np.array([1.0, 1.0]), now=0.0)
    live.judge(now=10.0)  # rank 2 never came: the step closes after close_after
    live.add_rows(np.array(["k"], object), np.array([2]), np.array([0]), np.array([1.0]), now=11.0)
    assert live.late_rows == 1


def test_redacted_url_keeps_no_token() -> None:
    shown = redact_url("https://bot:s3cret@hooks.slack.com:8443/services/T00/B00/XXXXTOKEN?x=1")
    assert shown == "https://hooks.slack.com:8443/…"


def test_on_alert_exception_caught_and_said_once(caplog: pytest.LogCaptureFixture) -> None:
    """A failing on_alert never reaches the watch's caller; each exception type said once."""
    rows: list[tuple[str, dict]] = []

    def broken(alert: object) -> None:
        raise RuntimeError("boom")

    outlets = AlertOutlets(lambda table, row: rows.append((table, row)), broken, echo=False)
    live = LiveJudgement(3)
    with caplog.at_level(logging.WARNING, logger="multirank_logger"):
        for rank in (0, 1):
            live.add_rows(np.array(["k"], object), np.array([rank]), np.array([5]), np.array([np.inf]), 0.0)
        for finding in live.judge(0.0, final=True):
            outlets.raise_alert(finding)
    assert [(t, r["kind"], r["rank"], r["first_step"]) for t, r in rows] == [("alerts", "non_finite", 0, 5),
                                                                           ("alerts", "non_finite", 1, 5)]
    assert sum("on_alert raised RuntimeError" in r.getMessage() for r in caplog.records) == 1


def test_logger_refuses_bad_alert_arguments(tmp_path: object) -> None:
    from multirank_logger import MultiRankLogger

    with pytest.raises(ValueError, match="alert_url"):
        MultiRankLogger(str(tmp_path), alert_url="ftp://example.com/x")
    with pytest.raises(TypeError, match="on_alert"):
        MultiRankLogger(str(tmp_path), on_alert="print")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="watch"):
        MultiRankLogger(str(tmp_path), watch="yes")  # type: ignore[arg-type]


def test_direct_watch_reads_the_ranks_rows_while_they_are_written(many_writers_db: str) -> None:
    """transport='direct': the watch reads each rank's new rows from the store (SQLite in WAL
    mode, PostgreSQL), read-only, as the ranks write them: a rank's NaN and a departing rank
    alerted, each once, and a rank that stopped logging early holds nothing back."""
    import time

    from multirank_logger.store.sql_store import Store
    from multirank_logger.watch.alerts import AlertOutlets
    from multirank_logger.watch.watch import Watch
    from multirank_logger.write.buffer import RecordBuffer

    store = Store(many_writers_db)
    run = store.create_run("direct", world_size=4, transport="direct")
    rows: list[dict] = []
    watch = Watch(run.id, 4, AlertOutlets(lambda table, row: rows.append(row), echo=False), close_after=1.0,
                  read_store=store.url)
    buffers = [RecordBuffer() for _ in range(4)]
    rng = np.random.default_rng(0)
    watch.start()
    try:
        for first in range(0, 120, 20):  # each rank writes 20 steps at a time (a flush)
            for rank, buffer in enumerate(buffers):
                if rank == 3 and first >= 40:
                    continue  # rank 3 stops logging at step 40
                for step in range(first, first + 20):
                    loss = 1.0 + 0.05 * rng.standard_normal()
                    loss = loss * 10 if rank == 1 and step >= 60 else loss
                    buffer.append(step, {"loss": float("nan") if rank == 2 and step == 30 else loss})
                store.write(buffer.encode(buffer.take(), run.id, rank))
            time.sleep(0.3)
        deadline = time.monotonic() + 20
        while len(rows) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        watch.stop(5.0)
        store.close()
    assert [(r["kind"], r["rank"], r["key"], r["first_step"]) for r in rows] == [
        ("non_finite", 2, "loss", 30), ("departure", 1, "loss", 60)]


def test_gather_watch_sees_received_rows_before_the_writer_and_judges_each_once() -> None:
    """transport='gather': the watch looks at the rows rank 0 received (`RowChannel.peek`) before
    its writer takes them: a sender's NaN is alerted with no writer cycle at all; when the writer
    hands the same batches over (`observe`), none is judged again, and the next batch still is."""
    import datetime
    import time

    import torch.distributed as dist

    from multirank_logger.channel.row_channel import RowChannel
    from multirank_logger.watch.watch import Watch
    from multirank_logger.write.buffer import RecordBuffer
    from tests.helpers.launches import free_port

    server = dist.TCPStore("127.0.0.1", free_port(), None, True, datetime.timedelta(seconds=10), wait_for_workers=False)
    rank0 = RowChannel("w", 0, 2, host="127.0.0.1", port=server.port)
    rank1 = RowChannel("w", 1, 2, host="127.0.0.1", port=server.port)
    judged: list[int] = []

    class Counted(Watch):
        def _add_batch(self, batch, now):  # type: ignore[no-untyped-def]
            judged.append(len(batch))
            super()._add_batch(batch, now)

    rows: list[dict] = []
    # rank 0 logs nothing here: a step closes without it a second after its first row
    watch = Counted(1, 2, AlertOutlets(lambda table, row: rows.append(row), echo=False), close_after=1.0,
                    writers=frozenset({0}), peek=rank0.peek)
    buffer = RecordBuffer()

    def send(first: int, nan_at: int | None = None) -> None:
        for step in range(first, first + 10):
            buffer.append(step, {"loss": float("nan") if step == nan_at else 1.0, "acc": 0.5})
        rank1.send(buffer.encode(buffer.take(), 1, 1))

    watch.start()
    try:
        send(0, nan_at=4)
        deadline = time.monotonic() + 20
        while not rows and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [(r["kind"], r["rank"], r["key"], r["first_step"]) for r in rows] == [("non_finite", 1, "loss", 4)]
        assert judged == [20]  # from the peek: the writer has received nothing yet
        watch.observe(rank0.receive(), [])  # the writer's cycle hands the same batch over
        send(10, nan_at=15)  # "acc" stays finite; "loss" already alerted for rank 1: no new alert
        watch.observe(rank0.receive(), [])  # whichever takes it first, a peek or this receive: judged once
        deadline = time.monotonic() + 20
        while sum(judged) < 40 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        watch.stop(5.0)
    assert judged == [20, 20] and len(rows) == 1


def test_a_stop_is_read_from_the_stop_alert_or_else_the_decision_rows(db_path: object) -> None:
    """StoreReader.stopped_by and runs()'s stopped_by: the `stop` alert's kind, key, rank and first
    step; without one, the StopOnAlert decision rows (rank 0's monitor names the alert, its key
    may hold colons); a later stop of the run is not the one said; a run nobody stopped: None."""
    import time

    from multirank_logger import open_store
    from multirank_logger.store.sql_store import Store
    from multirank_logger.ui.views import runs_view

    store = Store(str(db_path))
    runs = [store.create_run(name, world_size=2) for name in ("by_alert", "by_decisions", "ran_out")]

    def decision(run_id: int, rank: int, seq: int, step: int, monitor: str | None, decided: bool = True) -> dict:
        return {"run_id": run_id, "rank": rank, "seq": seq, "step": step, "callback": "StopOnAlert", "monitor": monitor,
                "vote": monitor is not None, "decision": decided, "time": time.time()}

    try:
        store.write_side({
            "decisions": [decision(runs[0].id, 1, 0, 64, None), decision(runs[0].id, 0, 0, 64, "departure:loss:rank 1"),
                          decision(runs[1].id, 1, 0, 30, None), decision(runs[1].id, 0, 0, 30, "straggler:timing:data_s:rank 3"),
                          decision(runs[1].id, 0, 1, 90, "non_finite:loss:rank 0"),
                          decision(runs[2].id, 0, 0, 12, None, decided=False)],
            "alerts": [{"run_id": runs[0].id, "rank": 1, "seq": 1, "kind": "stop", "key": "loss", "first_step": 60,
                        "step_seen": 64, "seen_at": time.time(), "message": "step 64: StopOnAlert ends the fit",
                        "detail": '{"alert_kind": "departure", "stopped_at": 64}'}],
        })
    finally:
        store.close()
    with open_store(str(db_path)) as reader:
        listed = reader.runs()["stopped_by"].tolist()
        on_the_page = [r["stopped_by"] for r in reversed(runs_view(reader))]  # the page's runs list, newest first
        found = reader.stopped_by("by_decisions")
        assert reader.stopped_by("ran_out") is None
    assert listed == ["stopped by StopOnAlert at step 64 (departure alert: rank 1, loss, from step 60)",
                      "stopped by StopOnAlert at step 30 (straggler alert: rank 3, timing:data_s)", None]
    assert on_the_page == listed
    assert found == {"step": 30, "alert_kind": "straggler", "key": "timing:data_s", "rank": 3, "first_step": None,
                     "monitor": "straggler:timing:data_s:rank 3"}


def test_the_last_judgement_closes_every_step_and_says_so() -> None:
    """A NaN in a run's last rows: no step after it closes, so only the end's judgement (stop with
    final=True, once every rank's rows are in) can raise it; its alert says it was found then."""
    import pyarrow as pa

    from multirank_logger.watch.watch import Watch

    rows: list[dict] = []
    watch = Watch(1, 2, AlertOutlets(lambda table, row: rows.append(row), echo=False), close_after=3600.0)
    batch = pa.RecordBatch.from_pydict({"rank": [0, 1, 0, 1], "step": [8, 8, 9, 9], "seq": [0, 0, 1, 1],
                                        "key": ["loss"] * 4, "value": [1.0, 1.0, 1.0, float("nan")]})
    watch.start()
    watch.observe([batch], [])
    watch.stop(5.0, final=True)
    assert [(r["kind"], r["rank"], r["first_step"]) for r in rows] == [("non_finite", 1, 9)]
    assert rows[0]["message"] == "rank 1 loss NaN from step 9 (seen at step 9); found at the run's end"
    assert '"at_end": true' in rows[0]["detail"]


def test_on_alert_that_exits_is_caught_and_the_watch_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    """sys.exit or KeyboardInterrupt from on_alert would end the watch's thread: caught, said once
    per exception type, and the next alert still goes out."""
    rows: list[dict] = []
    calls: list[str] = []

    def leaving(alert: object) -> None:
        calls.append("called")
        raise SystemExit(3) if len(calls) == 1 else KeyboardInterrupt

    outlets = AlertOutlets(lambda table, row: rows.append(row), leaving, echo=False)
    live = LiveJudgement(3)
    for rank in (0, 1, 2):
        live.add_rows(np.array(["k"], object), np.array([rank]), np.array([rank]), np.array([np.nan]), 0.0)
    with caplog.at_level(logging.WARNING, logger="multirank_logger"):
        for finding in live.judge(0.0, final=True):
            outlets.raise_alert(finding)
    assert len(rows) == 3 and len(calls) == 3
    said = [r.getMessage() for r in caplog.records if "on_alert raised" in r.getMessage()]
    assert len(said) == 2 and "SystemExit" in said[0] and "KeyboardInterrupt" in said[1]


def test_stop_on_alert_without_the_watch_is_refused_at_setup(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """StopOnAlert beside MultiRankLogger(watch=False) could never stop: a clear error at setup."""
    import torch
    from lightning.pytorch import LightningModule, Trainer
    from torch.utils.data import DataLoader, TensorDataset

    from multirank_logger import MultiRankLogger, StopOnAlert

    class Tiny(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self):  # type: ignore[no-untyped-def]
            return DataLoader(TensorDataset(torch.ones(4, 2)), batch_size=2)

    trainer = Trainer(accelerator="cpu", devices=1, max_steps=1, logger=MultiRankLogger(db=str(tmp_path / "r.sqlite"),
                      save_dir=str(tmp_path), watch=False), callbacks=[StopOnAlert()], enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=tmp_path)
    with pytest.raises(ValueError, match="StopOnAlert needs the watch's alerts.*has watch=False"):
        trainer.fit(Tiny())


def test_under_fabric_the_watch_sees_from_the_first_logged_step(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Fabric calls no `save()` and reads no `experiment`: the watch starts with the writer's first
    set-up, before its first rows go out, so a NaN from step 10 is alerted from step 10 (it said
    step 67, or nothing, when the watch waited for a save)."""
    import time

    from lightning.fabric import Fabric

    from multirank_logger import MultiRankLogger
    from tests.helpers.logger_helpers import query

    db = tmp_path / "runs.duckdb"
    logger = MultiRankLogger(db=str(db), save_dir=str(tmp_path), name="fabric", flush_interval=0.05)
    fabric = Fabric(accelerator="cpu", devices=1, loggers=[logger])
    for step in range(80):
        fabric.log_dict({"loss": float("nan") if step >= 10 else 1.0 / (step + 1)}, step=step)
        time.sleep(0.005)  # the writer cycles meanwhile, as in a training
    logger.finalize("success")
    assert [(a.kind, a.rank, a.key, a.first_step) for a in logger.alerts] == [("non_finite", 0, "loss", 10)]
    assert query(db, "SELECT kind, rank, key, first_step FROM alerts") == [("non_finite", 0, "loss", 10)]


def test_a_blocking_on_alert_delays_the_end_by_its_bound_and_is_said(caplog: pytest.LogCaptureFixture) -> None:
    """on_alert that never returns holds the watch's thread, not the run: stop() returns after its
    bound and says why."""
    import threading
    import time

    import pyarrow as pa

    from multirank_logger.watch.watch import Watch

    release = threading.Event()
    watch = Watch(1, 1, AlertOutlets(lambda table, row: None, lambda alert: release.wait(60), echo=False),
                  close_after=3600.0)
    batch = pa.RecordBatch.from_pydict({"rank": [0], "step": [3], "seq": [0], "key": ["loss"], "value": [float("nan")]})
    watch.start()
    watch.observe([batch], [])
    with caplog.at_level(logging.WARNING, logger="multirank_logger"):
        start = time.monotonic()
        watch.stop(1.0, final=True)
        took = time.monotonic() - start
    release.set()
    assert took < 5.0
    assert any("had not finished its last judgement" in r.getMessage() for r in caplog.records)
