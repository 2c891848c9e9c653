"""The store on real SQLite and DuckDB files: round trips, refusals, concurrent creation."""

from __future__ import annotations

import contextlib
import itertools
import math
import multiprocessing as mp
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
import sqlalchemy as sa

from multirank_logger.errors import InvalidMetric, NotADatabase, StoreLocked, StoreNotWritable, UnsupportedStore
from multirank_logger.rows.batch import METRICS_SCHEMA, column_lists, concat_batches
from multirank_logger.rows.schema import DTYPE_NAN, METRIC_COLUMNS, decode_value, encode_value, metrics, runs
from multirank_logger.store.sql_store import Store, head_revision
from multirank_logger.write.buffer import RecordBuffer

TRICKY_KEYS = ["a'b", 'x"; DROP TABLE metrics; --', "späce ключ 指标", "with,comma", "tab\tand\nnewline", ""]


def _read_back(store: Store) -> list[tuple[int, int, str, object]]:
    with store.begin() as conn:
        rows = conn.execute(
            sa.select(metrics.c.rank, metrics.c.seq, metrics.c.key, metrics.c.value, metrics.c.dtype).order_by(
                metrics.c.rank, metrics.c.seq, metrics.c.key
            )
        ).fetchall()
    return [(r.rank, r.seq, r.key, decode_value(r.value, r.dtype)) for r in rows]


def _batch(**columns: list[object]) -> pa.RecordBatch:
    """A batch of metric rows given column by column."""
    return pa.RecordBatch.from_pydict(columns, schema=METRICS_SCHEMA)


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return type(a) is type(b) and a == b


def test_values_round_trip_exactly(any_db: str) -> None:
    """NaN, +/-inf, ints, bools and full-precision floats come back as the same Python scalars."""
    logged = {
        "nan": math.nan,
        "pinf": math.inf,
        "ninf": -math.inf,
        "zero_int": 0,
        "big_int": 2**53,
        "neg_int": -7,
        "true": True,
        "false": False,
        "third": 1 / 3,
        "tiny": 5e-324,
        "loss": 0.6931471824645996,
        "neg_zero": -0.0,
    }
    store = Store(any_db)
    run = store.create_run("lightning_logs")
    buffer = RecordBuffer()
    buffer.append(0, logged)
    store.write(buffer.drain(run.id, rank=0))
    back = {key: value for _, _, key, value in _read_back(store)}
    assert back.keys() == logged.keys()
    for key, value in logged.items():
        assert _same(back[key], value), (key, back[key], value)
    assert math.copysign(1, back["neg_zero"]) == -1
    store.close()


# every kind of value, uneven calls, repeated and new keys, a non-str key
_DRAIN_CALLS = [
    (0, {"nan": math.nan, "neg_zero": -0.0, "zero": 0.0, "pinf": math.inf, "big_int": 2**70}),
    (0, {}),
    (5, {"true": True, "false": False, "neg_int": -7, "zero_int": 0, "nan": 0.25, 7: 1.5}),
    (3, {TRICKY_KEYS[1]: 1 / 3, TRICKY_KEYS[2]: 5e-324, "": -1.5}),
]


# drain's short cuts: every call the same keys in the same order, floats only (NaN, -0.0 among
# them); then the same keys in another order, and one call with a key fewer
_SAME_KEYS = [(step, {"b": step / 3, "a": [math.nan, -0.0, 1e300][step % 3]}) for step in range(6)]
_DRAIN_CASES = {
    "mixed": _DRAIN_CALLS,
    "same keys": _SAME_KEYS,
    "other order": [*_SAME_KEYS, (6, {"a": 1.0, "b": 2.0})],
    "a key fewer": [*_SAME_KEYS, (6, {"b": 2.0})],
}


@pytest.mark.parametrize("calls", _DRAIN_CASES.values(), ids=_DRAIN_CASES.keys())
def test_drain_rows_are_each_logged_value_encoded(calls: list[tuple[int, dict[object, object]]]) -> None:
    """drain() gives, in call order, one row per logged value: encode_value's (value, dtype),
    the call's seq (counting calls with values only: an empty one stores nothing, so a seq of its
    own would read as a call never stored), step and time, the key as its str."""
    buffer = RecordBuffer()
    for step, logged in calls:
        buffer.append(step, logged)
    times = [call[2] for call in buffer._calls]
    batch = buffer.drain(run_id=4, rank=2)
    seqs = list(itertools.accumulate((bool(logged) for _, logged in calls), initial=0))
    expected = [
        (4, 2, seqs[i], step, str(key), *encode_value(value), times[i])
        for i, (step, logged) in enumerate(calls)
        for key, value in logged.items()
    ]
    rows = list(zip(*column_lists(batch, METRIC_COLUMNS)))
    assert [repr(row) for row in rows] == [repr(row) for row in expected]
    assert batch.schema == METRICS_SCHEMA
    nans = sum(isinstance(v, float) and math.isnan(v) for _, logged in calls for v in logged.values())
    assert batch.column("value").null_count == nans  # a NaN: NULL, as the schema stores it
    assert buffer.calls_pending == 0 and len(buffer.drain(4, 2)) == 0


def test_batch_schema_is_the_metrics_table() -> None:
    """The Arrow schema of a batch is the metrics table's: its columns in order, its widths
    (int32 Integer, int64 BigInteger, int16 SmallInteger, float64 Float, dictionary keys), its NULLs."""
    assert METRICS_SCHEMA.names == list(METRIC_COLUMNS) == [c.name for c in metrics.columns]
    assert [str(f.type) for f in METRICS_SCHEMA] == [
        "int32", "int32", "int64", "int64", "dictionary<values=string, indices=int32, ordered=0>", "double", "int16",
        "double",
    ]
    assert [f.nullable for f in METRICS_SCHEMA] == [c.nullable for c in metrics.columns]


def test_nan_is_null_with_its_own_dtype(db_path: Path) -> None:
    """NaN is stored as NULL with dtype 3 on every backend, so SQL aggregates skip it."""
    store = Store(db_path)
    run = store.create_run("lightning_logs")
    buffer = RecordBuffer()
    buffer.append(3, {"loss": math.nan})
    store.write(buffer.drain(run.id, rank=1))
    with store.begin() as conn:
        row = conn.execute(sa.select(metrics.c.value, metrics.c.dtype, metrics.c.step, metrics.c.rank)).one()
    assert tuple(row) == (None, DTYPE_NAN, 3, 1)
    store.close()


def test_tricky_key_names_are_stored_verbatim(any_db: str) -> None:
    """Quotes, SQL, unicode, commas and control characters in keys are kept as given."""
    store = Store(any_db)
    run = store.create_run("lightning_logs")
    buffer = RecordBuffer()
    buffer.append(0, {key: float(i) for i, key in enumerate(TRICKY_KEYS)})
    store.write(buffer.drain(run.id, rank=0))
    assert sorted(key for _, _, key, _ in _read_back(store)) == sorted(TRICKY_KEYS)
    with store.begin() as conn:  # the table survived the key that tried to drop it
        assert conn.execute(sa.select(sa.func.count()).select_from(metrics)).scalar_one() == len(TRICKY_KEYS)
    store.close()


def test_call_order_is_kept_per_rank(db_path: Path) -> None:
    """Each rank's rows keep their own call counter, whatever step was passed."""
    store = Store(db_path)
    run = store.create_run("lightning_logs", world_size=2)
    for rank in (0, 1):
        buffer = RecordBuffer()
        for step in (5, 5, 2, 9):
            buffer.append(step, {"x": rank * 100 + step})
        store.write(buffer.drain(run.id, rank))
    with store.begin() as conn:
        rows = conn.execute(
            sa.select(metrics.c.rank, metrics.c.seq, metrics.c.step).order_by(metrics.c.rank, metrics.c.seq)
        ).fetchall()
    assert [tuple(r) for r in rows] == [(r, s, st) for r in (0, 1) for s, st in enumerate((5, 5, 2, 9))]
    store.close()


def test_non_scalar_value_is_refused_and_nothing_is_lost() -> None:
    """A list or a 2-element tensor names its key; calls recorded before stay in the buffer."""
    import torch

    buffer = RecordBuffer()
    buffer.append(0, {"ok": 1.0})
    with pytest.raises(InvalidMetric, match=r"Metric 'bad' \(logged at step 1\) is a Tensor of shape \(2,\)"):
        buffer.append(1, {"fine": 2.0, "bad": torch.tensor([1.0, 2.0])})
    with pytest.raises(InvalidMetric, match=r"Metric 'lst' \(logged at step 1\) is a list"):
        buffer.append(1, {"lst": [1.0]})
    buffer.append(2, {"one": torch.tensor(3.5), "i": torch.tensor(4)})
    batch = buffer.drain(run_id=1, rank=0)
    assert list(zip(batch.column("key").to_pylist(), batch.column("step").to_pylist())) == [
        ("ok", 0), ("one", 2), ("i", 2)
    ]
    assert batch.column("dtype").to_pylist() == [0, 0, 1]


def test_bulk_write_is_one_transaction(any_db: str) -> None:
    """A batch that fails part-way leaves none of its rows behind."""
    store = Store(any_db)
    run = store.create_run("lightning_logs")
    good = RecordBuffer()
    for step in range(1000):
        good.append(step, {"a": 1.0, "b": 2})
    columns = good.drain(run.id, 0).to_pydict()
    columns["key"][-1] = None  # violates NOT NULL on the last row
    batch = pa.RecordBatch.from_pydict(columns, schema=METRICS_SCHEMA)
    with pytest.raises(sa.exc.DBAPIError):
        store.write(batch)
    with store.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(metrics)).scalar_one() == 0
    store.close()


@pytest.mark.parametrize("name", ["runs.csv", "runs", "runs.parquet"])
def test_unknown_suffix_is_refused(tmp_path: Path, name: str) -> None:
    """A path with no known suffix names the choices, and creates nothing."""
    with pytest.raises(UnsupportedStore) as info:
        Store(tmp_path / name)
    assert ".duckdb, .db, .sqlite, .sqlite3" in str(info.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("copy_name", ["runs.bak", "runs.duckdb.bak", "runs.sqlite"])
def test_store_kind_is_told_from_first_bytes(tmp_path: Path, db_path: Path, backend: str, copy_name: str) -> None:
    """A copy of a store keeps its kind whatever its name (``runs.duckdb.bak``, or a DuckDB file
    named ``.sqlite``): the first bytes decide, and `runs` reads it."""
    from click.testing import CliRunner

    from multirank_logger.cli import main

    store = Store(db_path)
    store.create_run("copied", world_size=2)
    store.close()
    copy = tmp_path / "elsewhere" / copy_name
    copy.parent.mkdir()
    copy.write_bytes(db_path.read_bytes())
    reopened = Store(copy)
    assert reopened.url.get_backend_name() == backend
    reopened.close()
    shown = CliRunner().invoke(main, ["runs", str(copy)])
    assert shown.exit_code == 0, shown.output
    assert "copied" in shown.output
    junk = tmp_path / "notes.bak"  # neither kind's bytes and no store suffix: refused, unchanged
    junk.write_bytes(b"SQLite format 2 and then some text")
    with pytest.raises(UnsupportedStore):
        Store(junk)
    assert junk.read_bytes() == b"SQLite format 2 and then some text"


def test_directory_that_cannot_be_written_fails_at_construction(tmp_path: Path, backend: str) -> None:
    """An unwritable directory (a read-only mount: root ignores mode bits) fails at once."""
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"mount namespaces are not permitted here: {probe.stderr.decode().strip()}")
    ro = tmp_path / "ro"
    ro.mkdir()
    suffix = {"sqlite": ".sqlite", "duckdb": ".duckdb"}[backend]
    script = textwrap.dedent(
        f"""
        from multirank_logger.store.sql_store import Store
        from multirank_logger.errors import StoreNotWritable
        try:
            Store({str(ro / ("runs" + suffix))!r})
        except StoreNotWritable as exc:
            print(exc)
        """
    )
    shell = f"mount -t tmpfs -o ro none {ro} && exec {sys.executable} -c \"$0\""
    result = subprocess.run(["unshare", "-m", "sh", "-c", shell, script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"Cannot write the store at {ro}/runs{suffix}: Read-only file system.")
    assert "Pass a db path in a directory you can write to." in result.stdout


def test_path_that_is_a_directory_is_refused(tmp_path: Path, backend: str) -> None:
    """A directory named like a store is refused before anything is opened."""
    target = tmp_path / f"runs.{'duckdb' if backend == 'duckdb' else 'db'}"
    target.mkdir()
    with pytest.raises(StoreNotWritable, match="is a directory, not a store file"):  # NotAStoreFile
        Store(target)


@pytest.mark.parametrize("suffix", [".db", ".sqlite", ".duckdb"])
def test_text_file_is_not_a_database_and_is_left_untouched(tmp_path: Path, suffix: str) -> None:
    """A text file named like a store is refused, byte for byte unchanged, with no side files."""
    path = tmp_path / f"runs{suffix}"
    content = b"these are my notes, not a database\n" * 100
    path.write_bytes(content)
    with pytest.raises(NotADatabase, match="is not a (SQLite|DuckDB) database.*left untouched"):
        Store(path)
    assert path.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


@contextlib.contextmanager
def _duckdb_held(path: Path, read_only: bool = False) -> Iterator[int]:
    """Another process holds the DuckDB file open while the block runs; yields its PID."""
    code = f"import duckdb, sys; c = duckdb.connect({str(path)!r}, read_only={read_only}); print('ready', flush=True); sys.stdin.read()"
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        yield holder.pid
    finally:
        holder.communicate("", timeout=30)


def test_duckdb_file_held_by_another_process_is_refused(tmp_path: Path) -> None:
    """A DuckDB file that another process holds open for writing gives its PID and what to do."""
    path = tmp_path / "runs.duckdb"
    Store(path).close()
    with _duckdb_held(path) as holder_pid:
        with pytest.raises(StoreLocked) as info:
            Store(path)
        assert f"(PID {holder_pid})" in str(info.value)
        assert "wait for that process to finish, or log this run to another file" in str(info.value)
    Store(path).close()  # usable again once the holder is gone


def _open_and_create_run(path: str, barrier: mp.Barrier, out: mp.Queue) -> None:
    barrier.wait()
    store = Store(path)
    run = store.create_run("lightning_logs")
    out.put((run.id, run.version))
    store.close()


def test_concurrent_creation_and_runs_do_not_race(many_writers_db: str) -> None:
    """Eight processes creating one store at once all succeed, with distinct runs (SQLite's
    write lock; PostgreSQL's advisory lock)."""
    path = many_writers_db
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(8), ctx.Queue()
    procs = [ctx.Process(target=_open_and_create_run, args=(path, barrier, out)) for _ in range(8)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    assert [proc.exitcode for proc in procs] == [0] * 8
    results = sorted(out.get(timeout=5) for _ in procs)
    assert results == [(i + 1, i) for i in range(8)]
    store = Store(path)
    assert store.current_revision() == head_revision()
    with store.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(runs)).scalar_one() == 8
    store.close()


def test_explicit_version_that_exists_is_refused(db_path: Path) -> None:
    """Asking for a taken version says so and how to get a free one."""
    store = Store(db_path)
    store.create_run("exp", version=3)
    assert store.create_run("exp").version == 4
    with pytest.raises(Exception, match="exp/version_3 already exists.*Pass version=None"):
        store.create_run("exp", version=3)
    store.close()


def test_batches_concatenate_in_order() -> None:
    """concat_batches keeps rows in order, merges the batches' key dictionaries, keeps the schema."""
    a, b = RecordBuffer(), RecordBuffer()
    a.append(0, {"x": 1.0, "y": 0.5})
    b.append(7, {"y": 2, "z": True})
    both = concat_batches([a.drain(1, 0), b.drain(1, 1)])
    assert both.column("key").to_pylist() == ["x", "y", "y", "z"]
    assert both.column("rank").to_pylist() == [0, 0, 1, 1]
    assert both.schema == METRICS_SCHEMA
    assert concat_batches([]).num_rows == 0


def test_duckdb_file_is_free_between_writes(tmp_path: Path) -> None:
    """Outside a transaction the writer holds no DuckDB lock, so another process can read."""
    path = tmp_path / "runs.duckdb"
    store = Store(path)
    run = store.create_run("lightning_logs")
    buffer = RecordBuffer()
    with store.writing():
        for step in range(3):
            buffer.append(step, {"x": float(step)})
            store.write(buffer.drain(run.id, 0))
    reader = subprocess.run(
        [sys.executable, "-c", f"import duckdb; print(duckdb.connect({str(path)!r}, read_only=True).execute('select count(*) from metrics').fetchone()[0])"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert reader.stdout.strip() == "3", reader.stderr
    store.close()


def test_a_held_connection_belongs_to_its_thread(db_path: Path) -> None:
    """While one thread holds the store (writing()), another thread's write (a SIGTERM flush)
    uses a connection of its own, and both writes land."""
    store = Store(db_path)
    run = store.create_run("lightning_logs")
    buffer = RecordBuffer()
    errors: list[BaseException] = []

    def other_thread() -> None:
        try:
            assert store.held_connection is None
            other = RecordBuffer()
            other.append(0, {"from_thread": 1.0})
            store.write(other.drain(run.id, 1))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    with store.writing():
        held = store.held_connection
        assert held is not None
        buffer.append(0, {"from_main": 1.0})
        store.write(buffer.drain(run.id, 0))
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join(60)
        assert store.held_connection is held
    assert errors == []
    assert store.held_connection is None
    assert [(rank, key) for rank, _, key, _ in _read_back(store)] == [(0, "from_main"), (1, "from_thread")]
    store.close()


def test_writing_on_a_held_duckdb_file_raises_store_locked(tmp_path: Path) -> None:
    """Holding a connection for a burst of writes meets a held file as StoreLocked, not a driver error."""
    path = tmp_path / "runs.duckdb"
    store = Store(path)
    with _duckdb_held(path, read_only=True):
        with pytest.raises(StoreLocked):
            with store.writing():
                pass
    with store.writing():  # free again
        store.create_run("lightning_logs")
    store.close()


def test_duckdb_file_with_a_corrupt_header_is_refused_untouched(tmp_path: Path) -> None:
    """A DuckDB file whose header does not check out is NotADatabase, byte for byte unchanged."""
    path = tmp_path / "runs.duckdb"
    Store(path).close()
    content = bytearray(path.read_bytes())
    assert content[8:12] == b"DUCK"
    content[12:20] = (999).to_bytes(8, "little")  # the storage version, under the header checksum
    path.write_bytes(bytes(content))
    with pytest.raises(NotADatabase, match="is not a DuckDB database.*left untouched"):
        Store(path)
    assert path.read_bytes() == bytes(content)


def test_duckdb_newer_storage_message_names_both_versions(tmp_path: Path) -> None:
    """DuckDB's own words for a file from a newer DuckDB become one clear StoreError."""
    import duckdb

    from multirank_logger.store.backends import backend_for, resolve_url

    # the text duckdb 1.5 gives for a file written by duckdb 2.0 (seen on this machine)
    text = (
        "IO Error: Trying to read a database file with version number 69, but we can only read "
        "versions between 64 and 68.\nThe database file was created with a newer version of DuckDB."
    )
    path = tmp_path / "runs.duckdb"
    ours = backend_for(resolve_url(path)).translate_error(Exception(text))
    assert str(ours) == (
        f"{path} was written by a newer DuckDB (storage version 69) than the duckdb {duckdb.__version__} "
        "installed here, which cannot read it. It was left untouched; open it where that newer DuckDB is "
        "installed, or log to another file."
    )


def test_a_batch_sqlite_refuses_is_a_sqlalchemy_error_and_writes_nothing(tmp_path: Path) -> None:
    """The SQLite insert runs on the driver's own cursor: its errors still come as SQLAlchemy's
    (which the store translates), and the batch's transaction is rolled back whole."""
    store = Store(tmp_path / "runs.sqlite")
    run = store.create_run("lightning_logs")
    n = 3  # "loss" twice in one call (seq 0): the primary key refuses the second
    batch = _batch(run_id=[run.id] * n, rank=[0] * n, seq=[0] * n, step=[0] * n, key=["first", "loss", "loss"],
                   value=[1.0, 2.0, 3.0], dtype=[0] * n, time=[0.0] * n)
    with pytest.raises(sa.exc.IntegrityError):
        store.write(batch)
    assert _read_back(store) == []
    store.close()


@pytest.mark.parametrize("variable_limit", [None, 999], ids=["default-limit", "limit-999"])
def test_sqlite_takes_batches_of_any_size_whole(tmp_path: Path, variable_limit: int | None) -> None:
    """SQLite rows go in many per INSERT statement (full statements, then one per set bit of
    the rest): every batch size lands whole, each row once and in place, also where the SQLite
    library takes at most 999 parameters a statement (as before 3.32)."""
    store = Store(tmp_path / "runs.sqlite")
    run = store.create_run("lightning_logs")
    first = 0
    with store.writing():
        if variable_limit is not None:
            driver = store.held_connection.connection.driver_connection  # type: ignore[union-attr]
            if not hasattr(driver, "setlimit"):
                pytest.skip("sqlite3.Connection.setlimit needs Python 3.11")
            driver.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, variable_limit)
        for n in (1, 5, 63, 64, 127, 1023, 1024, 1025, 3000):
            seqs = list(range(first, first + n))
            store.write(_batch(run_id=[run.id] * n, rank=[0] * n, seq=seqs, step=seqs, key=["k"] * n,
                               value=[float(s) for s in seqs], dtype=[0] * n, time=[0.0] * n))
            first += n
    assert _read_back(store) == [(0, s, "k", float(s)) for s in range(first)]
    store.close()


def _calls(run_id: int, rank: int, seqs: range, keys: tuple[str, ...] = ("a", "b")) -> pa.RecordBatch:
    rows = [(seq, key) for seq in seqs for key in keys]
    n = len(rows)
    return _batch(run_id=[run_id] * n, rank=[rank] * n, seq=[s for s, _ in rows], step=[s for s, _ in rows],
                  key=[k for _, k in rows], value=[float(s) for s, _ in rows], dtype=[0] * n, time=[0.0] * n)


def test_a_batch_written_again_stores_each_row_once(any_db: str) -> None:
    """A batch retried after its commit (whole, overlapping the next calls, or a call cut in two
    between batches) adds only the rows the store lacks, on every backend, with no unique index:
    the ranks' seq spans stay one per rank."""
    store = Store(any_db)
    run = store.create_run("exp", world_size=2)
    assert store.write(_calls(run.id, 0, range(0, 5))) == 10
    assert store.write(_calls(run.id, 0, range(0, 5))) == 0  # retried whole
    assert store.write(_calls(run.id, 0, range(3, 8))) == 6  # calls 3-4 again, 5-7 new
    first_half = _calls(run.id, 1, range(0, 3)).slice(0, 5)  # call 2 cut after its "a"
    assert store.write(first_half) == 5 and store.write(_calls(run.id, 1, range(0, 4))) == 3
    assert store.write(_calls(run.id, 1, range(10, 12))) == 4  # a gap: a second span
    stored = _read_back(store)
    assert len(stored) == len(set((r, s, k) for r, s, k, _ in stored)) == 16 + 8 + 4
    with store.begin() as conn:
        spans = conn.execute(sa.text("SELECT rank, first_seq, last_seq FROM metric_spans ORDER BY rank, first_seq"))
        assert [tuple(row) for row in spans] == [(0, 0, 7), (1, 0, 3), (1, 10, 11)]
    store.close()
