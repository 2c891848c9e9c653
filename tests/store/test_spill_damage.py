"""Spill files that prove their bytes (issue 48): any single-bit flip or truncation of a real spill
file is either refused as a whole (its header) or imported with every intact frame, the damaged
ones said exactly (which frames, how many values), no row that was not written, nothing twice;
only regular files are read, and every read is bounded whatever a damaged length says."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multirank_logger.cli import main
from multirank_logger.errors import SpillCorrupt
from multirank_logger.rows.side_records import SideRecords
from multirank_logger.store.spill_file import SpillWriter, read_spill_contents
from multirank_logger.store.spill_import import import_spill
from multirank_logger.store.sql_store import Store
from multirank_logger.store.status import record_rank_end
from multirank_logger.write.buffer import RecordBuffer

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "default"))

RUN = "exp"


def _batch(first_seq: int, calls: int) -> pa.RecordBatch:
    buf = RecordBuffer()
    buf._next_seq = first_seq
    for i in range(calls):
        buf.append(first_seq + i, {"loss": float(first_seq + i), "lr": 0.1 * i, "nan": float("nan")})
    return buf.drain(run_id=1, rank=1)


@dataclass(frozen=True, repr=False)
class Written:
    """A spill file as its writer wrote it: the bytes, where each frame lies, the rows of each."""

    data: bytes
    header_end: int
    extents: list[tuple[int, int]]  # [start, end) of each frame, in order
    rows: list[set[tuple[int, str]]]  # (seq, key) of each frame's metric rows (empty for other kinds)
    side: list[int]  # side rows of each frame

    def __repr__(self) -> str:  # what a failing example prints: not 15 kB of bytes
        return f"Written({len(self.data)} bytes, frames at {self.extents})"


def _write_real_spill(directory: Path) -> tuple[Written, Path]:
    """Rank 1's spill file of a gather run whose rank 0 never heard its end: metric frames of
    several sizes, side rows, hyperparameters, the rank's end; as SpillWriter writes it."""
    spill = SpillWriter(directory, run_id=1, name=RUN, version=0, rank=1, hparams={"lr": 0.1})
    extents, rows, side = [], [], []
    seq = 0

    def frame(write: object, metric: pa.RecordBatch | None = None, side_rows: int = 0) -> None:
        start = spill.path.stat().st_size if spill.path.exists() else None
        write()  # type: ignore[operator]
        if start is None:
            start = len(spill.path.read_bytes().split(b"\n", 1)[0]) + 1
        extents.append((start, spill.path.stat().st_size))
        rows.append(set() if metric is None else set(zip(metric.column("seq").to_pylist(), metric.column("key").to_pylist())))
        side.append(side_rows)

    for calls in (3, 1, 40, 7):
        batch = _batch(seq, calls)
        seq += calls
        frame(lambda b=batch: spill.write([b]), batch)
    records = SideRecords()
    for i in range(3):
        records.add("logs", {"time": float(i), "level": "WARNING", "levelno": 30, "logger": "x", "message": f"m{i}"})
    tables = records.drain(1, 1)
    frame(lambda: spill.write_side(tables), side_rows=3)
    frame(lambda: spill.note_hparams({"lr": 0.2}))
    batch = _batch(seq, 5)
    frame(lambda: spill.write([batch]), batch)
    values = sum(map(len, rows))
    frame(lambda: spill.write_end("success", values, 0))
    data = spill.path.read_bytes()
    return Written(data, extents[0][0], extents, rows, side), spill.path


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Written, Path]:
    return _write_real_spill(tmp_path_factory.mktemp("spill"))


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store holding the run, rank 0's end recorded without rank 1's (the run incomplete)."""
    db = tmp_path_factory.mktemp("store") / "runs.sqlite"
    store = Store(db)
    run = store.create_run(RUN, world_size=2)
    for rank in (0, 1):
        store.register_rank(run.id, rank, status="running")
    record_rank_end(store, run.id, rank=0, gather_world=2, status="success", others={}, facts={})
    store.close()
    return db


def _stored(store: Store) -> list[tuple[int, str]]:
    with store.begin() as conn:
        return [tuple(r) for r in conn.execute(sa.text("SELECT seq, key FROM metrics WHERE rank = 1"))]


def _run_state(store: Store) -> tuple:
    with store.begin() as conn:
        return tuple(conn.execute(sa.text("SELECT status, values_spilled, values_lost FROM runs")).one())


def _damaged(written: Written, flip: int | None, cut: int | None) -> bytes:
    data = bytearray(written.data)
    if flip is not None:
        data[flip // 8] ^= 1 << (flip % 8)
    return bytes(data[:cut] if cut is not None else data)


def _touched(written: Written, flip: int | None, cut: int | None) -> list[int]:
    """The frames whose bytes the damage touched (a cut touches the frame it falls inside)."""
    if flip is not None:
        return [i for i, (a, b) in enumerate(written.extents) if a <= flip // 8 < b]
    return [i for i, (a, b) in enumerate(written.extents) if a < cut < b]  # type: ignore[operator]


def _damage_cases() -> st.SearchStrategy[tuple[str, int]]:
    return st.one_of(st.tuples(st.just("flip"), st.integers(0, 8 * 40_000)), st.tuples(st.just("cut"), st.integers(0, 40_000)))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_damage_cases())
def test_any_bit_flip_or_cut_costs_exactly_the_frames_it_touches(written: tuple[Written, Path], case: tuple[str, int]) -> None:
    """Reading a file with one bit flipped (or cut short anywhere): a damaged header is refused
    (SpillCorrupt, nothing read); otherwise every frame the damage did not touch reads as written,
    and the damage names the touched frame and its values (unknown only where nothing intact follows)."""
    w, _ = written
    kind, where = case
    flip, cut = (where % (8 * len(w.data)), None) if kind == "flip" else (None, where % (len(w.data) + 1))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "x.mrspill")
        path.write_bytes(_damaged(w, flip, cut))
        if (flip is not None and flip // 8 < w.header_end) or (cut is not None and cut < w.header_end):
            with pytest.raises(SpillCorrupt):
                read_spill_contents(path)
            return
        contents = read_spill_contents(path)
    touched = _touched(w, flip, cut)
    present = range(len(w.extents)) if cut is None else [i for i, (_, b) in enumerate(w.extents) if b <= cut]
    intact = [i for i in present if i not in touched]
    kinds = ["metrics"] * 4 + ["side", "hparams", "metrics", "end"]
    assert [k for k, _ in contents.frames] == [kinds[i] for i in intact]
    got = [set(zip(b.column("seq").to_pylist(), b.column("key").to_pylist())) for b in contents.batches]
    assert got == [w.rows[i] for i in intact if kinds[i] == "metrics"]
    if not touched:
        assert contents.damage == []
        return
    [damage] = contents.damage
    [frame] = touched
    assert damage.first_frame == frame
    assert damage.end_frame in (frame + 1, None)
    if damage.end_frame is not None:
        assert damage.values == len(w.rows[frame])
    else:  # nothing intact after it to count by: the last frame's head changed, or a cut inside a head
        assert damage.values is None and (frame == len(w.extents) - 1 or cut is not None)
    assert damage.torn == (cut is not None)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_damage_cases())
def test_importing_a_damaged_file_then_an_intact_copy_stores_each_row_once(
    written: tuple[Written, Path], template: Path, case: tuple[str, int]
) -> None:
    """Import of a damaged file: only rows that were written, every untouched frame's, none twice on a
    re-run; the run stays incomplete while values are missing; the intact copy then adds exactly
    the rest and the run is a success."""
    w, original = written
    kind, where = case
    flip, cut = (where % (8 * len(w.data)), None) if kind == "flip" else (None, where % (len(w.data) + 1))
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp, "runs.sqlite")
        shutil.copy(template, db)
        path = Path(tmp, "x.mrspill")
        path.write_bytes(_damaged(w, flip, cut))
        store = Store(db)
        try:
            try:
                report = import_spill(store, path)
            except SpillCorrupt:
                assert (flip or 0) // 8 < w.header_end if flip is not None else cut < w.header_end  # type: ignore[operator]
                assert _stored(store) == []
            else:
                written_rows = set().union(*w.rows)
                stored = _stored(store)
                assert len(stored) == len(set(stored)) and set(stored) <= written_rows
                touched = _touched(w, flip, cut)
                present = range(len(w.extents)) if cut is None else [i for i, (_, b) in enumerate(w.extents) if b <= cut]
                assert set(stored) == set().union(*(w.rows[i] for i in present if i not in touched))
                assert bool(report.damage) == bool(touched)
                again = import_spill(store, path)
                assert again.rows_added == 0 and len(again.damage) == len(report.damage)
                if set(stored) != written_rows:
                    assert _run_state(store)[0] == "incomplete"
            shutil.copy(original, path)
            whole = import_spill(store, path)
            assert whole.damage == ()
            assert sorted(_stored(store)) == sorted(set().union(*w.rows))
            assert _run_state(store) == ("success", 0, 0)
        finally:
            store.close()


def test_cli_says_each_damaged_frame_and_exits_1(written: tuple[Written, Path], template: Path, tmp_path: Path) -> None:
    """`import` of a file whose third frame changed: the rest is added, the damage said (file, frames,
    values, what to do), exit 1; a re-run adds nothing; the intact copy adds that frame and settles."""
    w, original = written
    db = tmp_path / "runs.sqlite"
    shutil.copy(template, db)
    start, end = w.extents[2]
    path = tmp_path / original.name
    data = bytearray(w.data)
    data[(start + end) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    runner = CliRunner()
    result = runner.invoke(main, ["import", str(db), str(path)])
    assert result.exit_code == 1
    lost = len(w.rows[2])
    total = len(set().union(*w.rows))
    assert result.stdout == f"{path}: added {total - lost} rows to run {RUN}/version_0, rank 1.\n"
    assert f"{path}: bytes {start}-{end - 1} are damaged (frame 2): {lost} value(s) not imported" in result.stderr
    assert f"Error: 1 part(s) of the spill files did not read (above): {lost} value(s) were not imported" in result.stderr
    assert "import it again: only the frames the store lacks are added" in result.stderr
    again = runner.invoke(main, ["import", str(db), str(path)])
    assert again.exit_code == 1 and "already imported" in again.stdout
    shutil.copy(original, path)
    whole = runner.invoke(main, ["import", str(db), str(path)])
    assert whole.exit_code == 0, whole.output
    assert whole.stdout == f"{path}: added {lost} rows to run {RUN}/version_0, rank 1.\n"
    store = Store(db)
    assert _run_state(store) == ("success", 0, 0)
    store.close()


def test_a_length_past_any_bound_is_damage_not_an_allocation(tmp_path: Path) -> None:
    """A version 4 frame whose length says 2**60 bytes (one damaged byte): said unreadable at once,
    no read of that size tried (the process stays under 1 GiB)."""
    data = bytearray((Path(__file__).parents[1] / "data" / "spill_v4_arrow_side_hparams_end.mrspill").read_bytes())
    first = data.index(b"\n") + 1
    data[first + 7] = 0x10  # the u64 length's high byte
    path = tmp_path / "x.mrspill"
    path.write_bytes(bytes(data))
    code = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30));"
        "from multirank_logger.store.spill_file import read_spill_contents;"
        "c = read_spill_contents(sys.argv[1]); print(len(c.frames), c.damage[0].first_frame, c.damage[0].values)"
    )
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "0", "None"]


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "rows.mrspill"
    os.mkfifo(path)
    yield path


@pytest.mark.parametrize("target", ["fifo", "/dev/zero"])
def test_import_reads_only_regular_files(fifo: Path, tmp_path: Path, target: str) -> None:
    """A FIFO (no writer: it would hang), /dev/zero (it never ends): one clear line, exit 1, nothing
    read. In a subprocess with a timeout, so a hang fails the test instead of holding it."""
    db = tmp_path / "runs.sqlite"
    Store(db).close()
    path = {"fifo": str(fifo), "/dev/zero": "/dev/zero"}[target]
    code = "import sys; from multirank_logger.cli import main; main(sys.argv[1:])"
    out = subprocess.run([sys.executable, "-c", code, "import", str(db), path], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert lines == [
        f"Error: {path} is not a readable spill file (not a regular file: only spill files are imported). "
        "It was left untouched; nothing was imported."
    ], out.stderr
    with pytest.raises(SpillCorrupt, match="not a regular file"):  # a directory, which the command's argument refuses first
        read_spill_contents(tmp_path)


def test_a_header_changed_in_one_bit_is_refused(written: tuple[Written, Path], tmp_path: Path) -> None:
    """The rank in the header changed from 1 to 3 (one bit): the header's checksum refuses the file,
    rather than import its rows as another rank's."""
    w, _ = written
    data = w.data.replace(b'"rank": 1', b'"rank": 3', 1)
    assert data != w.data
    path = tmp_path / "x.mrspill"
    path.write_bytes(data)
    with pytest.raises(SpillCorrupt, match="its header line fails its checksum"):
        read_spill_contents(path)


def test_a_write_cut_short_mid_file_costs_only_its_frame(tmp_path: Path) -> None:
    """A write that failed part-way (a full disk) and later writes that succeeded: the cut frame is
    said lost with its values, the frames after it read."""
    spill = SpillWriter(tmp_path, run_id=1, name=RUN, version=0, rank=1)
    first, cut, after = _batch(0, 2), _batch(2, 5), _batch(7, 3)
    spill.write([first])
    size = spill.path.stat().st_size
    spill.write([cut])
    with open(spill.path, "r+b") as fh:  # the disk took only part of the frame
        fh.truncate(size + 40)
    spill.write([after])
    contents = read_spill_contents(spill.path)
    assert contents.batches == [first, after]
    [damage] = contents.damage
    assert (damage.first_frame, damage.end_frame, damage.values, damage.torn) == (1, 2, 15, False)


def test_calls_a_rank_never_stored_are_said_by_report_and_import(tmp_path: Path) -> None:
    """Rank 1 stored calls 0-9 and 14-19 of launch 0; 10-13 are in its spill file, cut short after
    call 11. `report` says calls 10-13 are not in the store; importing the cut file leaves 12-13,
    said; the whole file closes the gap, and nothing is said. An empty log call is no gap."""
    db = tmp_path / "runs.sqlite"
    store = Store(db)
    run = store.create_run(RUN, world_size=2)
    for rank in (0, 1):
        store.register_rank(run.id, rank, status="running")
    buf = RecordBuffer()
    for call in range(20):
        buf.append(call, {"loss": float(call)} if call != 5 else {})  # call 5 logs nothing: no row, no seq
    rows = buf.drain(run_id=run.id, rank=1)
    seq = rows.column("seq").to_numpy()
    assert sorted(set(seq.tolist())) == list(range(19))  # 19 calls with values
    store.write(rows.filter(pa.array(seq < 10)))  # a batch is a run of consecutive calls: the one between never came
    store.write(rows.filter(pa.array(seq >= 14)))
    spill = SpillWriter(tmp_path / "spill", run_id=run.id, name=RUN, version=run.version, rank=1)
    spill.write([rows.filter(pa.array((seq >= 10) & (seq < 12)))])
    cut = spill.path.stat().st_size
    spill.write([rows.filter(pa.array((seq >= 12) & (seq < 14)))])
    store.close()
    said = "rank 1, launch 0: calls {} not in the store, later ones are (never stored: the process was killed, or they were lost; or in a spill file not imported yet)."
    report = CliRunner().invoke(main, ["report", str(db)])
    assert report.exit_code == 0, report.output
    assert said.format("10-13") in report.output
    whole = spill.path.read_bytes()
    spill.path.write_bytes(whole[:cut])
    first = CliRunner().invoke(main, ["import", str(db), str(spill.path)])
    assert first.exit_code == 0, first.output
    assert first.stdout.splitlines()[1:] == [f"run {RUN}/version_0: " + said.format("12-13")]
    spill.path.write_bytes(whole)
    second = CliRunner().invoke(main, ["import", str(db), str(spill.path)])
    assert second.exit_code == 0 and len(second.stdout.splitlines()) == 1, second.output
    assert "not in the store" not in CliRunner().invoke(main, ["report", str(db)]).output
