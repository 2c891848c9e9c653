"""Spill files on real disks and their import into real SQLite and DuckDB stores: once, and only once."""

from __future__ import annotations

import math
import re
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner

from multirank_logger.cli import main
from multirank_logger.errors import SpillCorrupt
from multirank_logger.rows.batch import empty_batch
from multirank_logger.store.spill_file import SpillWriter, read_spill, read_spill_contents
from multirank_logger.store.spill_import import import_spill
from multirank_logger.store.sql_store import Store
from multirank_logger.write.buffer import RecordBuffer

#: written by the SpillWriter of commit f090cc9 (format version 1, MRB1 payloads): run exp/version_0,
#: rank 1, two frames; see _V1_ROWS
V1_FILE = Path(__file__).parents[1] / "data" / "spill_v1_mrb1.mrspill"
#: written by the SpillWriter of commit f958495 (format version 2: MRB1 metrics, then a side frame
#: of one logs row and an end frame): run exp/version_0, rank 1
V2_FILE = Path(__file__).parents[1] / "data" / "spill_v2_mrb1_side_end.mrspill"
#: written by the SpillWriter of commit 368c8c9 (format version 4: Arrow metrics of 4 then 1 rows,
#: a side frame of one logs row, hparams, an end): run exp/version_0, rank 1, uuid 0123...cdef
V4_FILE = Path(__file__).parents[1] / "data" / "spill_v4_arrow_side_hparams_end.mrspill"
# (seq, step, key, value, dtype, time) of its rows, frame by frame
_V1_ROWS = [
    [
        (0, 3, "nan", None, 3, 1700000001.25),
        (0, 3, "inf", math.inf, 0, 1700000001.25),
        (0, 3, "-inf", -math.inf, 0, 1700000001.25),
        (0, 3, "int", float(2**53), 1, 1700000001.25),
        (0, 3, "bool", 1.0, 2, 1700000001.25),
        (1, 4, "zero", 0.0, 4, 1700000002.5),
        (1, 4, "clé é ü 🙂", 1.5, 0, 1700000002.5),
    ],
    [(2, 5, "loss", 0.6931471824645996, 0, 1700000003.0), (2, 5, "nan", None, 3, 1700000003.0)],
]


def _rows(batch: pa.RecordBatch) -> list[tuple[object, ...]]:
    names = ("seq", "step", "key", "value", "dtype", "time")
    return list(zip(*(batch.column(name).to_pylist() for name in names)))


def _batch(first_seq: int, calls: int, rank: int = 1, run_id: int = 99) -> pa.RecordBatch:
    buf = RecordBuffer()
    buf._next_seq = first_seq
    for i in range(calls):
        buf.append(first_seq + i, {"loss": float(first_seq + i), "nan": float("nan")})
    return buf.drain(run_id=run_id, rank=rank)


def _count(store: Store, run_id: int) -> int:
    with store.begin() as conn:
        return conn.exec_driver_sql(f"SELECT count(*) FROM metrics WHERE run_id = {run_id}").scalar_one()


def test_spill_file_round_trips(tmp_path: Path) -> None:
    """What a SpillWriter appends, read_spill gives back, with the run's identity in the header."""
    spill = SpillWriter(tmp_path / "spill", run_id=3, name="exp", version=2, rank=1)
    first, second = _batch(0, 3), _batch(3, 2)
    assert spill.write([first, empty_batch()]) == 6
    spill.write([second])
    header, batches = read_spill(spill.path)
    assert batches == [first, second]
    assert (header["run_id"], header["name"], header["version"], header["rank"]) == (3, "exp", 2, 1)
    assert header["format_version"] == 5  # frames with a checked head, the run named by its UUID


def test_torn_last_frame_is_reported_and_the_rest_reads(tmp_path: Path) -> None:
    """A crash mid-write tears at most the last frame: the complete ones still read, and the torn
    one is said (its values, from its intact head)."""
    spill = SpillWriter(tmp_path, run_id=3, name="exp", version=0, rank=1)
    kept = _batch(0, 3)
    spill.write([kept])
    spill.write([_batch(3, 3)])
    data = spill.path.read_bytes()
    spill.path.write_bytes(data[:-7])
    contents = read_spill_contents(spill.path)
    assert contents.batches == [kept]
    [torn] = contents.damage
    assert (torn.torn, torn.first_frame, torn.end_frame, torn.values) == (True, 1, 2, 6)
    assert "ends inside frame 1" in str(torn) and "6 value(s) not imported" in str(torn)


@pytest.mark.parametrize("where", ["length", "payload", "crc"])
def test_a_torn_frame_loses_only_that_frame(db_path: Path, tmp_path: Path, where: str) -> None:
    """A frame torn anywhere (its head, its Arrow payload, its checksum) is dropped alone: the
    frames before it read and import whole, and the import says the torn one."""
    store = Store(db_path)
    run = store.create_run("exp", world_size=2)
    spill = SpillWriter(tmp_path, run_id=run.id, name="exp", version=run.version, rank=1)
    kept = [_batch(0, 3), _batch(3, 2)]
    spill.write(kept)
    before = spill.path.stat().st_size
    spill.write([_batch(5, 40)])
    size = spill.path.stat().st_size
    cut = {"length": before + 3, "payload": (before + size) // 2, "crc": size - 2}[where]
    spill.path.write_bytes(spill.path.read_bytes()[:cut])
    assert read_spill(spill.path)[1] == kept
    report = import_spill(store, spill.path)
    assert report.rows_added == 10
    [torn] = report.damage
    assert torn.torn and torn.first_frame == 2
    assert _count(store, run.id) == 10
    store.close()


def test_a_frame_damaged_in_the_middle_costs_that_frame_alone(tmp_path: Path) -> None:
    """A frame whose bytes changed fails its checksum: the frames before and after it read, and
    the damage says which frame and how many values."""
    spill = SpillWriter(tmp_path, run_id=3, name="exp", version=0, rank=1)
    first, second, third = _batch(0, 3), _batch(3, 4), _batch(7, 2)
    spill.write([first])
    start = spill.path.stat().st_size
    spill.write([second])
    end = spill.path.stat().st_size
    spill.write([third])
    data = bytearray(spill.path.read_bytes())
    data[(start + end) // 2] ^= 0xFF
    spill.path.write_bytes(bytes(data))
    contents = read_spill_contents(spill.path)
    assert contents.batches == [first, third]
    [damage] = contents.damage
    assert (damage.first_frame, damage.end_frame, damage.values, damage.torn) == (1, 2, 8, False)
    assert (damage.start, damage.end) == (start, end)


def test_a_spill_file_of_version_4_still_reads_and_imports(db_path: Path, tmp_path: Path) -> None:
    """A file the code before checked heads wrote (format 4: Arrow metrics, side rows, hparams, an
    end) reads every frame and imports into its run, once."""
    contents = read_spill_contents(V4_FILE)
    assert contents.header["format_version"] == 4
    assert [kind for kind, _ in contents.frames] == ["metrics", "side", "hparams", "metrics", "end"]
    assert [len(b) for b in contents.batches] == [4, 1] and contents.damage == []
    store = Store(db_path)
    path = tmp_path / V4_FILE.name
    shutil.copy(V4_FILE, path)
    report = import_spill(store, path)  # the store lacks the run: recreated from the header
    assert (report.rows_added, report.side_rows_added, report.frames_read, report.damage) == (5, 1, 5, ())
    assert import_spill(store, path).already_imported
    store.close()


def test_a_damaged_frame_of_version_4_is_said_and_what_comes_before_imports(tmp_path: Path) -> None:
    """Version 4 frames carry no head to find the next one by: the frames before the damage read,
    the rest is said unreadable (how many values unknown), never misread."""
    data = bytearray(V4_FILE.read_bytes())
    header_end = data.index(b"\n") + 1
    data[len(data) - 20] ^= 0x01  # inside the last frames
    path = tmp_path / V4_FILE.name
    path.write_bytes(bytes(data))
    contents = read_spill_contents(path)
    [damage] = contents.damage
    assert damage.end_frame is None and damage.values is None and damage.start > header_end
    assert [kind for kind, _ in contents.frames] == ["metrics", "side", "hparams", "metrics"][: damage.first_frame]


def test_a_spill_file_of_the_first_format_still_reads() -> None:
    """A file the code before Arrow wrote (MRB1 payloads, format version 1) reads as the same rows."""
    header, batches = read_spill(V1_FILE)
    assert (header["format_version"], header["name"], header["version"], header["rank"]) == (1, "exp", 0, 1)
    assert [_rows(b) for b in batches] == _V1_ROWS
    assert all(b.column("run_id").to_pylist() == [5] * len(b) for b in batches)


def test_a_spill_file_of_the_first_format_imports(db_path: Path, tmp_path: Path) -> None:
    """The first-format file imports into a store holding its run, NaN a NULL, once."""
    store = Store(db_path)
    run = store.create_run("exp", world_size=2)
    path = tmp_path / V1_FILE.name
    shutil.copy(V1_FILE, path)
    report = import_spill(store, path)
    assert (report.rows_added, report.frames_read, report.rank) == (9, 2, 1)
    with store.begin() as conn:
        stored = conn.exec_driver_sql(
            f"SELECT seq, step, key, value, dtype, time FROM metrics WHERE run_id = {run.id} AND rank = 1 ORDER BY seq"
        ).fetchall()
    assert sorted(map(tuple, stored), key=repr) == sorted((r for frame in _V1_ROWS for r in frame), key=repr)
    assert import_spill(store, path).already_imported
    store.close()


def test_a_spill_file_of_a_newer_format_is_refused(tmp_path: Path) -> None:
    """A format version this code does not know is refused with what to do, not misread."""
    path = tmp_path / "new.mrspill"
    path.write_bytes(b'{"format": "multirank-spill", "format_version": 6}\n')
    with pytest.raises(SpillCorrupt, match="format version 6: written by a newer multirank-logger; upgrade it"):
        read_spill(path)


def test_damaged_file_is_refused(tmp_path: Path) -> None:
    """A file that is not a spill file is refused with a clear error."""
    path = tmp_path / "x.mrspill"
    path.write_bytes(b"hello\n")
    with pytest.raises(SpillCorrupt, match="no multirank-spill header line"):
        read_spill(path)


def test_import_twice_adds_nothing_twice(db_path: Path, tmp_path: Path) -> None:
    """Importing the same spill file again adds no row; frames appended later are added once."""
    store = Store(db_path)
    run = store.create_run("exp", world_size=2)
    spill = SpillWriter(tmp_path / "spill", run_id=run.id + 50, name="exp", version=run.version, rank=1)
    spill.write([_batch(0, 5)])
    first = import_spill(store, spill.path)
    assert (first.rows_added, first.run_id, first.already_imported) == (10, run.id, False)
    assert import_spill(store, spill.path).already_imported
    spill.write([_batch(5, 1)])
    assert import_spill(store, spill.path).rows_added == 2
    assert _count(store, run.id) == 12
    store.close()


def test_import_skips_rows_rank0_already_stored(db_path: Path, tmp_path: Path) -> None:
    """Rows rank 0 stored before the sender saw them acknowledged are not duplicated by the import."""
    store = Store(db_path)
    run = store.create_run("exp", world_size=2)
    store.write(_batch(0, 2, run_id=run.id))
    spill = SpillWriter(tmp_path, run_id=run.id, name="exp", version=run.version, rank=1)
    spill.write([_batch(0, 4)])
    report = import_spill(store, spill.path)
    assert (report.rows_added, report.rows_skipped) == (4, 4)
    assert _count(store, run.id) == 8
    store.close()


def test_cli_import(tmp_path: Path) -> None:
    """`multirank-logger import DB FILE...` says what it added, and that a second import adds nothing."""
    db = tmp_path / "runs.sqlite"
    store = Store(db)
    run = store.create_run("exp", world_size=2)
    store.close()
    spill = SpillWriter(tmp_path, run_id=run.id, name="exp", version=run.version, rank=1)
    spill.write([_batch(0, 3)])
    runner = CliRunner()
    result = runner.invoke(main, ["import", str(db), str(spill.path)])
    assert result.exit_code == 0, result.output
    assert result.output == f"{spill.path}: added 6 rows to run exp/version_0, rank 1.\n"
    again = runner.invoke(main, ["import", str(db), str(spill.path)])
    assert again.output == f"{spill.path}: already imported (run exp/version_0, rank 1); nothing added.\n"


def test_cli_import_into_a_store_without_the_run(tmp_path: Path) -> None:
    """A spill file whose run the store lacks is refused with one Error line listing the runs."""
    db = tmp_path / "runs.sqlite"
    Store(db).close()
    spill = SpillWriter(tmp_path, run_id=1, name="exp", version=4, rank=1)
    spill.write([_batch(0, 1)])
    result = CliRunner().invoke(main, ["import", str(db), str(spill.path)])
    assert result.exit_code == 1
    assert result.output == "Error: No run 'exp/version_4' in this store. Available: (none)\n"


def test_cli_import_into_a_mistyped_path_creates_nothing(tmp_path: Path) -> None:
    """`import typo.sqlite FILE`: a clear error, and no empty store left at the mistyped path."""
    spill = SpillWriter(tmp_path, run_id=1, name="exp", version=0, rank=1)
    spill.write([_batch(0, 1)])
    typo = tmp_path / "rnus.sqlite"
    result = CliRunner().invoke(main, ["import", str(typo), str(spill.path)])
    assert result.exit_code == 1
    assert result.output == f"Error: No store at {typo}. Check the path; a store is created by the first run logged to it.\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [spill.path.name]


def _side_rows(rank: int = 1, run_id: int = 99) -> dict:
    """Side-table rows as a rank's writer drains them (side_records.SideRecords)."""
    from multirank_logger.rows.side_records import SideRecords

    side = SideRecords()
    for i in range(3):
        side.add("logs", {"time": float(i), "level": "WARNING", "levelno": 30, "logger": "x", "message": f"m{i}"})
    side.add("step_timing", {"step": 0, "time": 1.0})
    return side.drain(run_id, rank)


def test_side_rows_and_a_ranks_end_round_trip(tmp_path: Path) -> None:
    """Version 2 frames: side-table rows and the rank's end come back in file order with the metrics."""
    from multirank_logger.store.spill_file import read_spill_contents

    spill = SpillWriter(tmp_path, run_id=3, name="exp", version=0, rank=1)
    spill.write_end("success", 0, 0)  # no file yet: a rank with nothing spilled writes none
    assert not spill.path.exists()
    batch, side = _batch(0, 2), _side_rows()
    spill.write([batch])
    assert spill.write_side(side) == 4
    spill.write_end("success", 4, 1)
    contents = read_spill_contents(spill.path)
    assert [kind for kind, _ in contents.frames] == ["metrics", "side", "end"]
    assert contents.frames[1][1] == side
    end = contents.frames[2][1]
    assert end.pop("ended_at") <= time.time()  # when the rank ended: the import's ended_at
    assert end == {"status": "success", "values_spilled": 4, "values_lost": 1, "counted": False}
    assert read_spill(spill.path)[1] == [batch]  # the metrics-only view of it


def test_a_version_2_file_still_reads_and_imports(db_path: Path, tmp_path: Path) -> None:
    """A file the code before Arrow wrote with side and end frames (format version 2: MRB1 metric
    payloads) reads every frame and imports its metric and side rows."""
    contents = read_spill_contents(V2_FILE)
    assert contents.header["format_version"] == 2
    assert [kind for kind, _ in contents.frames] == ["metrics", "side", "end"]
    assert _rows(contents.frames[0][1]) == [
        (0, 3, "nan", None, 3, 1700000001.25),
        (0, 3, "clé é ü 🙂", 1.5, 0, 1700000001.25),
        (1, 4, "loss", 0.6931471824645996, 0, 1700000002.5),
    ]
    assert contents.frames[2][1] == {"status": "success", "values_spilled": 3, "values_lost": 0}
    store = Store(db_path)
    store.create_run("exp", world_size=2)
    path = tmp_path / V2_FILE.name
    shutil.copy(V2_FILE, path)
    report = import_spill(store, path)
    assert (report.rows_added, report.side_rows_added) == (3, 1)
    store.close()


def test_import_of_a_missing_ranks_file_records_its_end_and_completes_the_run(db_path: Path, tmp_path: Path) -> None:
    """Rank 0 never heard rank 1's end (gather, channel down): the run is incomplete, rank 1 missing.
    Importing rank 1's file stores its metrics and side rows, records its end, counts what it lost,
    and the run is a success only when nothing is lost."""
    import sqlalchemy as sa

    from multirank_logger.store.status import record_rank_end

    for lost, expected in ((0, "success"), (2, "incomplete")):
        store = Store(db_path)
        run = store.create_run(f"exp{lost}", world_size=2)
        for rank in (0, 1):
            store.register_rank(run.id, rank, status="running")
        record_rank_end(store, run.id, rank=0, gather_world=2, status="success", others={}, facts={})
        with store.begin() as conn:
            assert conn.execute(sa.text(f"SELECT status FROM runs WHERE id = {run.id}")).scalar_one() == "incomplete"
        spill = SpillWriter(tmp_path / str(lost), run_id=run.id, name=f"exp{lost}", version=run.version, rank=1)
        spill.write([_batch(0, 3, run_id=run.id)])
        spill.write_side(_side_rows(run_id=run.id))
        spill.write_end("success", 6, lost)
        report = import_spill(store, spill.path)
        assert (report.rows_added, report.side_rows_added, report.rank_status) == (6, 4, "success")
        with store.begin() as conn:
            row = conn.execute(sa.text(f"SELECT status, values_spilled, values_lost FROM runs WHERE id = {run.id}")).one()
            assert tuple(row) == (expected, 0, lost)
            rank1 = conn.execute(sa.text(f"SELECT status FROM ranks WHERE run_id = {run.id} AND rank = 1")).scalar_one()
            assert rank1 == "success"
            logs = conn.execute(sa.text(f"SELECT count(*) FROM logs WHERE run_id = {run.id} AND rank = 1")).scalar_one()
            assert logs == 3
        again = import_spill(store, spill.path)
        assert again.already_imported
        store.close()


def test_an_end_the_run_counted_already_settles_the_rank_without_counting_it_twice(db_path: Path, tmp_path: Path) -> None:
    """Gather rank 0 took rank 1's report (6 values spilled) and acknowledged it, then could not
    record the run's end: both ranks stay "running", and rank 0's own spill file carries rank 1's
    counts with its own. Rank 1's file says its end was counted: importing both files counts
    those 6 values once, and the run is whole."""
    import sqlalchemy as sa

    store = Store(db_path)
    run = store.create_run("exp", world_size=2)
    for rank in (0, 1):
        store.register_rank(run.id, rank, status="running")
    files = []
    for rank, values, end in ((0, 2, {"values_spilled": 2 + 6}), (1, 6, {"values_spilled": 6, "counted": True})):
        spill = SpillWriter(tmp_path / str(rank), run_id=run.id, name="exp", version=run.version, rank=rank)
        spill.write([_batch(0, values // 2, run_id=run.id, rank=rank)])
        spill.write_end("success", values_lost=0, **end)  # type: ignore[arg-type]
        files.append(spill.path)

    def state() -> tuple:
        with store.begin() as conn:
            return tuple(conn.execute(sa.text(f"SELECT status, values_spilled FROM runs WHERE id = {run.id}")).one())

    assert state() == ("running", None)
    assert import_spill(store, files[0]).rank_status == "success"
    assert state() == ("incomplete", 6)  # over, but rank 1's 6 values are still only in its file
    assert import_spill(store, files[1]).rank_status == "success"
    assert state() == ("success", 0)
    store.close()


def _unheard(store: Store) -> list[tuple]:
    import sqlalchemy as sa

    with store.begin() as conn:
        return [tuple(r) for r in conn.execute(sa.text("SELECT rank, attempt FROM unheard_ends ORDER BY rank, attempt"))]


def _run_state(store: Store, run_id: int) -> tuple:
    import sqlalchemy as sa

    with store.begin() as conn:
        return tuple(conn.execute(sa.text(f"SELECT status, values_spilled, values_lost FROM runs WHERE id = {run_id}")).one())


def _gather_launch(store: Store, run_id: int, heard: dict[int, str], status: str = "success") -> int:
    """One launch of 2 gather ranks, as rank 0 records it: its attempt, both ranks registered, its end."""
    from multirank_logger.store.run_lifecycle import begin_attempt
    from multirank_logger.store.status import record_rank_end

    attempt = begin_attempt(store, run_id, 2)
    for rank in (0, 1):
        store.register_rank(run_id, rank)
    record_rank_end(store, run_id, rank=0, gather_world=2, status=status, others=heard, facts={}, attempt=attempt)
    return attempt


def test_a_rank_unheard_in_one_launch_keeps_the_run_incomplete_after_the_next_launch(db_path: Path, tmp_path: Path) -> None:
    """Launch 0: rank 0 never heard rank 1's end, whose undelivered rows went to its spill file.
    Launch 1 (a requeue, or ddp_spawn's test after fit) registers rank 1 again and hears it. The
    run stays "incomplete": rank 1's launch-0 rows are only in that file. Importing it completes
    the run."""
    store = Store(db_path)
    run = store.create_run("exp", world_size=2)
    first = _gather_launch(store, run.id, heard={})
    assert _run_state(store, run.id) == ("incomplete", None, None) and _unheard(store) == [(1, first)]
    spill = SpillWriter(tmp_path, run_id=run.id, name="exp", version=run.version, rank=1, attempt=first)
    spill.write([_batch(0, 3, run_id=run.id)])
    spill.write_end("success", 6, 0)

    _gather_launch(store, run.id, heard={1: "success"})
    assert _run_state(store, run.id)[0] == "incomplete"
    assert _unheard(store) == [(1, first)]
    shown = CliRunner().invoke(main, ["runs", str(db_path)])  # why it is not a success
    assert shown.exit_code == 0 and "incomplete (1 rank end(s) never heard)" in shown.output, shown.output

    report = import_spill(store, spill.path)
    assert (report.rows_added, report.rank_status) == (6, "success")
    assert _run_state(store, run.id) == ("success", 0, 0)
    assert _unheard(store) == []
    shown = CliRunner().invoke(main, ["runs", str(db_path)])
    assert re.search(r"\bsuccess\s", shown.output) and "never heard" not in shown.output, shown.output
    store.close()


def test_a_later_phase_that_hears_the_rank_settles_its_earlier_unheard_end(db_path: Path) -> None:
    """Within one launch (fit, then test in the same processes), the sender's report at its next
    end covers what its unheard end did not get counted (sinks.GatherSender): hearing it settles
    the rank, and with nothing spilled the run is a success."""
    from multirank_logger.store.status import record_rank_end

    store = Store(db_path)
    run = store.create_run("exp", world_size=2)
    attempt = _gather_launch(store, run.id, heard={})
    assert _unheard(store) == [(1, attempt)]
    store.register_rank(run.id, 1)  # the test phase's set-up
    record_rank_end(store, run.id, rank=0, gather_world=2, status="success", others={1: "success"}, facts={},
                    attempt=attempt)
    assert _unheard(store) == []
    assert _run_state(store, run.id)[0] == "success"
    store.close()


def test_a_direct_rank_that_could_not_record_its_end_keeps_the_run_incomplete_after_the_next_launch(
    db_path: Path, tmp_path: Path
) -> None:
    """Direct mode, launch 0: rank 1's store turned unwritable, so it never recorded its end (it
    stays "running"; its last rows and its end are in its spill file); rank 0 recorded the run
    "incomplete" and ended the launch. Launch 1 registers rank 1 again and both ranks end well:
    the run stays "incomplete" until rank 1's launch-0 file is imported. A launch that vanished
    (still "running": SIGKILL) keeps nothing: the resumed run is a success (test_run_lifecycle)."""
    from multirank_logger.store.run_lifecycle import begin_attempt
    from multirank_logger.store.status import end_attempt, record_rank_end

    def launch() -> int:
        attempt = begin_attempt(store, run.id, 2)
        for rank in (0, 1):
            store.register_rank(run.id, rank)
        return attempt

    store = Store(db_path)
    run = store.create_run("exp", world_size=2)
    first = launch()
    record_rank_end(store, run.id, rank=0, gather_world=0, status="success", others={}, facts={}, attempt=first)
    end_attempt(store, run.id, first, "success")
    assert _run_state(store, run.id)[0] == "incomplete"
    spill = SpillWriter(tmp_path, run_id=run.id, name="exp", version=run.version, rank=1, attempt=first)
    spill.write([_batch(0, 2, run_id=run.id)])
    spill.write_end("success", 4, 0)

    second = launch()
    assert _unheard(store) == [(1, first)]
    for rank in (0, 1):
        record_rank_end(store, run.id, rank=rank, gather_world=0, status="success", others={}, facts={},
                        attempt=second)
    assert _run_state(store, run.id)[0] == "incomplete"
    assert (import_spill(store, spill.path).rows_added, _run_state(store, run.id)) == (4, ("success", 0, 0))
    store.close()


def test_a_rank_ending_well_leaves_a_run_that_still_lacks_values_and_its_launch_incomplete(db_path: Path) -> None:
    """Direct mode: rank 0 ends first, with values spilled: the run and its launch are "incomplete".
    Rank 1 ends well later: the run still lacks those values, so neither the run nor its launch
    becomes a success (on DuckDB, whose UPDATE reports no rowcount, the launch did)."""
    from multirank_logger.store.run_lifecycle import begin_attempt
    from multirank_logger.store.status import end_attempt, record_rank_end

    store = Store(db_path)
    run = store.create_run("exp", world_size=2)
    attempt = begin_attempt(store, run.id, 2)
    for rank in (0, 1):
        store.register_rank(run.id, rank)
    record_rank_end(store, run.id, rank=0, gather_world=0, status="success", others={}, facts={},
                    values_spilled=3, attempt=attempt)
    end_attempt(store, run.id, attempt, "success")
    record_rank_end(store, run.id, rank=1, gather_world=0, status="success", others={}, facts={}, attempt=attempt)
    with store.begin() as conn:
        launches = conn.exec_driver_sql("SELECT status FROM attempts").scalars().all()
    assert (_run_state(store, run.id)[0], launches) == ("incomplete", ["incomplete"])
    store.close()


def test_an_interrupted_launch_keeps_no_unheard_end_and_its_resume_is_a_success(db_path: Path) -> None:
    """A preemption (SIGTERM: "interrupted") in which rank 0 never heard rank 1: the resume logs
    again from the checkpoint what that launch logged last, as after a vanished launch, so the
    run that resumes and ends well is a success."""
    store = Store(db_path)
    run = store.create_run("exp", world_size=2)
    _gather_launch(store, run.id, heard={}, status="interrupted")
    assert _unheard(store) == [] and _run_state(store, run.id)[0] == "interrupted"
    _gather_launch(store, run.id, heard={1: "success"})
    assert _run_state(store, run.id)[0] == "success"
    store.close()


def test_side_rows_past_the_bound_are_counted_lost(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """250,000 side rows logged before the run is known: the oldest 50,000 past the 200,000 kept
    in memory are dropped, and the drop is counted and said (before: gone with no count)."""
    from multirank_logger.rows.side_records import MAX_PENDING, SideRecords
    from multirank_logger.write.sinks import DirectSink
    from multirank_logger.write.spiller import Spiller
    from multirank_logger.write.writer_thread import BackgroundWriter, Destination

    store = Store(tmp_path / "runs.sqlite")
    run = store.create_run("side", world_size=1)
    spiller = Spiller(SpillWriter(tmp_path, run_id=run.id, name="side", version=0, rank=0), "runs.sqlite", 0)
    sink = DirectSink(store, run.id, spiller)
    known: list[Destination] = []

    class Owner:
        def destination(self, explicit: bool) -> Destination | None:
            return known[0] if known else None

    side = SideRecords()
    writer = BackgroundWriter(RecordBuffer(), Owner(), flush_interval=3600, flush_every=10**9, side=side)
    rows = MAX_PENDING + 50_000
    for i in range(rows):
        side.add("step_timing", {"step": i, "time": 1.0})
    assert writer.flush(60.0)  # the run unknown yet: rows wait
    known.append(Destination(sink, run.id, 0))
    assert writer.flush(60.0)
    with store.begin() as conn:
        stored = conn.exec_driver_sql("SELECT count(*), min(step) FROM step_timing").one()
    store.close()
    assert tuple(stored) == (MAX_PENDING, 50_000)  # the newest kept, the oldest dropped
    assert spiller.side_rows_lost == 50_000
    assert "50000 side-table row(s) are LOST" in (spiller.summary() or "")
    assert "50000 side-table row(s)" in capfd.readouterr().err


def test_import_refuses_a_spill_of_another_run_of_the_same_name_and_version(db_path: Path, tmp_path: Path) -> None:
    """Run B of the store has A's name and version but not its UUID: nothing imported, an error naming both."""
    from multirank_logger.errors import SpillOfAnotherRun

    store = Store(db_path)
    b = store.create_run("exp", world_size=1)
    spill = SpillWriter(tmp_path, run_id=b.id, name="exp", version=b.version, rank=0, run_uuid="a" * 8 + "-uuid-of-run-a")
    spill.write([_batch(0, 5, rank=0)])
    with pytest.raises(SpillOfAnotherRun) as caught:
        import_spill(store, spill.path)
    assert str(caught.value) == (
        f"{spill.path} holds rows of run exp/version_0 (uuid aaaaaaaa-uuid-of-run-a), but {db_path} holds another "
        f"run of that name and version: exp/version_0 (uuid {b.uuid}, id {b.id}). Nothing was imported. Import the "
        "file into the store its run was logged to, or into a new store file, where the run is recreated: create "
        "it first with `multirank-logger db upgrade NEW_DB`, then `multirank-logger import NEW_DB FILE...`."
    )
    assert _count(store, b.id) == 0
    store.close()
    # the advice works as written: a new store, then the import recreates run A there with its rows
    new_db = tmp_path / f"new{db_path.suffix}"
    for args in (["db", "upgrade", str(new_db)], ["import", str(new_db), str(spill.path)]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
    fresh = Store(new_db)
    with fresh.begin() as conn:
        (run_id,) = conn.exec_driver_sql("SELECT id FROM runs WHERE run_uuid = 'aaaaaaaa-uuid-of-run-a'").one()
    assert _count(fresh, run_id) == 10  # 5 calls of 2 keys
    fresh.close()


def test_import_recreates_a_run_the_store_lacks_from_the_spill_header(db_path: Path, tmp_path: Path) -> None:
    """A store without the file's run: the run comes back (name, version, UUID, hparams, ranks) with every row once."""
    import json

    store = Store(db_path)
    run_uuid = "5f0c7a52-52c4-4d39-9a0e-6f8f4a5c2b11"
    spill = SpillWriter(tmp_path, run_id=7, name="exp", version=3, rank=1, run_uuid=run_uuid, world_size=2,
                        hparams={"lr": 0.1})
    spill.write([_batch(0, 4)])
    spill.note_hparams({"lr": 0.1, "layers": 4})  # logged after the file was created: a frame
    spill.write_end("success", values_spilled=8, values_lost=0)
    report = import_spill(store, spill.path)
    assert report.rows_added == 8 and (report.name, report.version, report.rank) == ("exp", 3, 1)
    with store.begin() as conn:
        (name, version, uuid_, hparams, world, status), = conn.exec_driver_sql(
            "SELECT name, version, run_uuid, hparams, world_size, status FROM runs").fetchall()
        ranks = conn.exec_driver_sql("SELECT rank, status FROM ranks ORDER BY rank").fetchall()
    assert (name, version, uuid_, json.loads(hparams), world) == ("exp", 3, run_uuid, {"layers": 4, "lr": 0.1}, 2)
    assert status == "incomplete" and ranks == [(0, "missing"), (1, "success")]  # rank 0's file not imported yet
    assert import_spill(store, spill.path).already_imported and _count(store, report.run_id) == 8
    store.close()


@pytest.mark.parametrize("spilling_rank", [0, 1])
def test_side_rows_in_a_spill_file_keep_the_run_incomplete_whichever_rank_ends_last(
        db_path: Path, tmp_path: Path, spilling_rank: int) -> None:
    """Direct transport, 2 ranks each recording its own end: the rank whose side rows went to its
    spill file (`side_rows_spilled`) makes the run "incomplete", whether it ends first or after the
    other (which must not settle the run back); importing its file makes the run a success."""
    import sqlalchemy as sa

    from multirank_logger.store.status import record_rank_end

    store = Store(db_path)
    run = store.create_run("side", world_size=2)
    for rank in (0, 1):
        store.register_rank(run.id, rank, status="running")
    for rank in (0, 1):  # rank 0 first: the other rank's end is the last word
        record_rank_end(store, run.id, rank=rank, gather_world=0, status="success", others={}, facts={},
                        side_rows_spilled=4 if rank == spilling_rank else 0)
    assert _run_state(store, run.id)[0] == "incomplete"
    with store.begin() as conn:
        counts = conn.execute(sa.text(f"SELECT rank, side_rows_spilled FROM ranks WHERE run_id = {run.id} ORDER BY rank"))
        assert [(r, n or 0) for r, n in counts] == [(r, 4 if r == spilling_rank else 0) for r in (0, 1)]
    spill = SpillWriter(tmp_path / "spill", run_id=run.id, name="side", version=run.version, rank=spilling_rank)
    spill.write_side(_side_rows(run_id=run.id))
    spill.write_end("success", 0, 0)
    report = import_spill(store, spill.path)
    assert report.side_rows_added == 4  # the file holds what the rank counted
    assert _run_state(store, run.id)[0] == "success"
    with store.begin() as conn:
        assert conn.execute(sa.text(f"SELECT max(side_rows_spilled) FROM ranks WHERE run_id = {run.id}")).scalar() in (0, None)
    store.close()


def test_side_rows_spilled_by_one_launch_keep_the_run_incomplete_through_the_next(db_path: Path, tmp_path: Path) -> None:
    """Launch 0 ends with 2 side rows in rank 0's spill file; launch 1 (a resume) registers rank 0
    again and ends cleanly: the run stays "incomplete" (register_rank carries the count over)
    until the file is imported."""
    from multirank_logger.store.status import record_rank_end

    store = Store(db_path)
    run = store.create_run("resumed", world_size=1)
    store.register_rank(run.id, 0, status="running")
    record_rank_end(store, run.id, rank=0, gather_world=0, status="success", others={}, facts={}, side_rows_spilled=2)
    store.register_rank(run.id, 0, status="running")  # the next launch
    record_rank_end(store, run.id, rank=0, gather_world=0, status="success", others={}, facts={})
    assert _run_state(store, run.id)[0] == "incomplete"
    spill = SpillWriter(tmp_path / "spill", run_id=run.id, name="resumed", version=run.version, rank=0)
    spill.write_side({"logs": _side_rows(rank=0, run_id=run.id)["logs"][:2]})
    spill.write_end("success", 0, 0)
    import_spill(store, spill.path)
    assert _run_state(store, run.id)[0] == "success"
    store.close()
