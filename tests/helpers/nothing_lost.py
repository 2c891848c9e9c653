"""The promise "nothing lost" as a checkable model (issue 38): Hypothesis strategies for log calls
with adversarial keys, values and steps, each generated with what the store must hold for it (or
that the call must be refused), faults to inject between calls, and the check after a run.

Every generated piece carries its own expectation, worked out here from the rules (an int64 step,
a UTF-8 key without NUL of at most 1024 bytes, one number within float64), not by asking the
code under test. Used by tests/runs/test_nothing_lost_properties.py and benchmarks/soak_nothing_lost.py.
"""

from __future__ import annotations

import functools
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hypothesis import strategies as st

#: a generated part the store cannot hold: the call holding it must raise InvalidMetric
REFUSED = object()
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
FLOAT_MAX_INT = int(sys.float_info.max)
#: faults a sequence may meet between two calls (in-process); "lock" starts a process holding the store;
#: "full" (the store's disk fills up) only where the store is on a disk of its own (fill_disk)
FAULTS = ("none", "delete", "replace", "lock")
#: CSVLogger's count of unsaved calls restarts where step + 1 is a multiple of this (the step of a None step)
FLUSH_EVERY = 7


def canonical(value: float | None) -> Any:
    """A stored value as compared: NULL and NaN alike, -0.0 as 0.0 (the dtype column keeps the sign)."""
    if value is None or value != value:
        return "nan"
    return float(value) + 0.0


# -- keys ------------------------------------------------------------------------------------------

_ODD_KEYS = [
    "", " ", "loss", "val/loss", "'; DROP TABLE metrics; --", 'a"b,c', "step", "λόσς", "🔥", "a\nb", "k" * 1024,
    "é" * 512,  # 1024 bytes of UTF-8: the longest taken
]
_BAD_KEYS = ["\udcff", "file\udce9.txt", "a\x00b", "\x00", "k" * 1025, "é" * 513]


def _key_ok(key: str) -> bool:
    try:
        size = len(key.encode())
    except UnicodeEncodeError:
        return False
    return "\x00" not in key and size <= 1024


keys = st.one_of(
    st.sampled_from(_ODD_KEYS),
    st.sampled_from(_BAD_KEYS),
    st.text(max_size=8),
    st.text(alphabet=st.characters(codec=None, min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=2),
).map(lambda k: (k, _key_ok(k)))


# -- values: (object logged, canonical stored value or REFUSED) ------------------------------------

def _int_value(v: int) -> tuple[Any, Any]:
    return v, float(v) if -FLOAT_MAX_INT <= v <= FLOAT_MAX_INT else REFUSED


values = st.one_of(
    st.floats().map(lambda v: (v, canonical(v))),
    st.sampled_from([-0.0, math.nan, math.inf, -math.inf, 5e-324]).map(lambda v: (v, canonical(v))),
    st.integers(min_value=-(2**70), max_value=2**70).map(_int_value),
    st.sampled_from([2**1023, 10**400, -(10**400), FLOAT_MAX_INT, FLOAT_MAX_INT + 1]).map(_int_value),
    st.booleans().map(lambda v: (v, float(v))),
    st.floats(width=32).map(lambda v: (np.float32(v), canonical(float(np.float32(v))))),
    st.integers(min_value=INT64_MIN, max_value=INT64_MAX).map(lambda v: (np.int64(v), float(v))),
    st.floats(allow_nan=True).map(lambda v: (torch.tensor(v, dtype=torch.float64), canonical(v))),
    st.integers(-1000, 1000).map(lambda v: (torch.tensor(v), float(v))),
    st.sampled_from([[1.0, 2.0], "0.5", None]).map(lambda v: (v, REFUSED)),
    st.just(0).map(lambda _: (torch.tensor([1.0, 2.0]), REFUSED)),
)


# -- steps: (object passed, the int stored, None for "CSVLogger's count", or REFUSED) -----------------

def _int_step(v: int) -> tuple[Any, Any]:
    return v, v if INT64_MIN <= v <= INT64_MAX else REFUSED


def _float_step(v: float) -> tuple[Any, Any]:
    return v, int(v) if math.isfinite(v) and v.is_integer() and INT64_MIN <= int(v) <= INT64_MAX else REFUSED


steps = st.one_of(
    st.none().map(lambda _: (None, None)),
    st.integers(min_value=-5, max_value=60).map(_int_step),  # small and repeated or decreasing
    st.integers(min_value=-(2**64), max_value=2**64).map(_int_step),
    st.sampled_from([2**45 + 1, 1_764_000_000_000_000, INT64_MAX, INT64_MIN, 2**63, -(2**63) - 1]).map(_int_step),
    st.floats().map(_float_step),
    st.integers(0, 100).map(lambda v: (np.int64(v), v)),
    st.integers(0, 100).map(lambda v: (torch.tensor(v), v)),
    st.sampled_from(["3", b"3"]).map(lambda v: (v, REFUSED)),
)


@dataclass
class Call:
    """One log call and what the store must hold for it."""

    metrics: dict[Any, Any]
    step: Any
    stored_step: Any  # int, None (CSVLogger's count), or REFUSED
    expected: dict[str, Any]  # key as stored -> canonical value
    refused: bool

    def __repr__(self) -> str:  # Hypothesis prints the failing example
        return f"Call({self.metrics!r}, step={self.step!r}, refused={self.refused})"


@st.composite
def calls(draw: st.DrawFn) -> Call:
    """A log call of 1-4 keys."""
    pairs = draw(st.lists(st.tuples(keys, values), min_size=1, max_size=4, unique_by=lambda p: p[0][0]))
    step, stored_step = draw(steps)
    metrics = {k: v for (k, _), (v, _) in pairs}
    refused = stored_step is REFUSED or any(not ok or e is REFUSED for (_, ok), (_, e) in pairs)
    return Call(metrics, step, stored_step, {k: e for (k, _), (_, e) in pairs}, refused)


@dataclass
class Scenario:
    """A sequence of calls and one fault injected before call number `fault_at`."""

    calls: list[Call]
    fault: str = "none"
    fault_at: int = 0
    finalize: bool = True
    #: a gather rank ending without finalize: seconds before its exit hooks run, and that it lives on after them
    exit_delay: float = 0.0
    linger: float = 0.0


@st.composite
def scenarios(draw: st.DrawFn, faults: Iterable[str] = FAULTS, max_calls: int = 30) -> Scenario:
    sequence = draw(st.lists(calls(), min_size=1, max_size=max_calls))
    fault = draw(st.sampled_from(list(faults)))
    return Scenario(sequence, fault, draw(st.integers(0, len(sequence))))


def expected_rows(sequence: list[Call], outcomes: list[bool], kept_from: int = 0) -> Counter[tuple[int, str, Any]]:
    """The rows the run must hold: those of the calls that were accepted (`outcomes`: True where
    the call raised) from call `kept_from` on, a None step being CSVLogger's count of unsaved calls."""
    rows: Counter[tuple[int, str, Any]] = Counter()
    unsaved = 0
    for i, (call, raised) in enumerate(zip(sequence, outcomes)):
        if raised:
            continue
        step = unsaved if call.stored_step is None else call.stored_step
        unsaved += 1
        if (step + 1) % FLUSH_EVERY == 0:
            unsaved = 0
        if i < kept_from:
            continue
        for key, value in call.expected.items():
            rows[(step, str(key), value)] += 1
    return rows


# -- faults ----------------------------------------------------------------------------------------

def store_files(db: Path) -> list[Path]:
    return [db, *(db.with_name(db.name + s) for s in ("-wal", "-shm", ".wal", "-journal"))]


def delete_store(db: Path) -> None:
    for path in store_files(db):
        path.unlink(missing_ok=True)


def replace_store(db: Path, scratch: Path) -> None:
    """The store replaced by another store holding a run of the same name and version."""
    from multirank_logger import MultiRankLogger

    other = scratch / f"other{db.suffix}"
    logger = MultiRankLogger(db=str(other), flush_interval=3600, export_csv=False, save_dir=str(scratch / "other_logs"))
    logger.log_metrics({"other": 1.0}, step=0)
    logger.finalize("success")
    delete_store(db)
    shutil.move(str(other), str(db))


_HOLD = """
import sys, time, pathlib
db, ready, seconds = sys.argv[1], pathlib.Path(sys.argv[2]), float(sys.argv[3])
if db.endswith(".duckdb"):
    import duckdb
    conn = duckdb.connect(db)  # read-write: the one process DuckDB lets in
else:
    import sqlite3
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
ready.touch()
time.sleep(seconds)
conn.close()
"""


def hold_store(db: Path, seconds: float, scratch: Path) -> subprocess.Popen[bytes] | None:
    """Another process holding the store (DuckDB open read-write, SQLite under BEGIN EXCLUSIVE) for
    `seconds`; None when the store cannot be held now (e.g. the writer holds the DuckDB file)."""
    ready = scratch / f"held-{time.monotonic_ns()}"
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(db), str(ready), str(seconds)], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            return None
        time.sleep(0.01)
    return proc


class _Filler:
    """A file filling its disk; `wait` frees the disk (the name matches hold_store's process)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def wait(self, timeout: float | None = None) -> None:
        self.path.unlink(missing_ok=True)


def fill_disk(directory: Path) -> _Filler:
    """Fill the disk of `directory` (a small tmpfs of the test's own) to the last byte."""
    path = directory / f"filler-{time.monotonic_ns()}"
    with open(path, "wb", buffering=0) as out:
        for chunk in (1 << 20, 4096, 1):
            try:
                while True:
                    out.write(b"\0" * chunk)
            except OSError:  # ENOSPC: the next, smaller chunk fills what is left
                continue
    return _Filler(path)


@functools.cache
def no_unshare() -> str | None:
    """Why this process may not mount a tmpfs in a mount namespace of its own (root on Linux), or None."""
    if sys.platform != "linux" or shutil.which("unshare") is None:
        return "needs Linux and the unshare command"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs none /mnt"], capture_output=True, text=True, check=False)
    return None if probe.returncode == 0 else f"mount namespaces are not permitted here ({probe.stderr.strip()})"


# -- the check -------------------------------------------------------------------------------------

def spill_commands(output: str) -> list[tuple[str, str]]:
    """(store, spill file) of every import command the output names."""
    return sorted(set(re.findall(r"multirank-logger import (\S+) (\S+\.mrspill)", output)))


def run_rows(db: str, run_uuid: str) -> tuple[Counter[tuple[int, str, Any]], tuple[Any, ...] | None]:
    """The rows of the run `run_uuid` in `db` as (step, key, canonical value), and its
    (status, values_spilled, values_lost); empty and None where the store or the run is missing."""
    import sqlalchemy as sa

    from multirank_logger.store.sql_store import Store

    if "://" not in db and not os.path.exists(db):
        return Counter(), None
    store = Store(db)
    try:
        with store.begin() as conn:
            run = conn.execute(
                sa.text("SELECT id, status, values_spilled, values_lost FROM runs WHERE run_uuid = :u"), {"u": run_uuid}
            ).first()
            if run is None:
                return Counter(), None
            rows = conn.execute(sa.text("SELECT step, key, value FROM metrics WHERE run_id = :r"), {"r": run[0]})
            return Counter((s, k, canonical(v)) for s, k, v in rows), tuple(run[1:])
    finally:
        store.close()


def lost_in_output(output: str) -> int:
    """The values the output counts LOST: each rank's last end-of-run line (Spiller.summary)."""
    last = {}
    for line in re.finditer(r"rank (\d+): the run is incomplete in the store: .*?(\d+) value\(s\) are LOST \(neither", output):
        last[line[1]] = int(line[2])
    return sum(last.values())


def import_spills(commands: list[tuple[str, str]], recovery: str | None = None) -> list[str]:
    """Run every import command; a spill the named store refuses as another run's (the file was
    replaced by another store) goes into `recovery`, a new store where its run is recreated.
    The stores that took spills."""
    from click.testing import CliRunner

    from multirank_logger.cli import main as cli

    into = []
    for db, path in commands:
        result = CliRunner().invoke(cli, ["import", db, path])
        if result.exit_code != 0 and recovery is not None and "holds another run of that name" in result.output:
            # the refusal says to import into a new store file, yet `import` creates none but the
            # spill's own store: make it first (reported in issue 38's note)
            from multirank_logger.store.sql_store import Store

            db = recovery
            Store(db, create=True).close()
            result = CliRunner().invoke(cli, ["import", db, path])
        assert result.exit_code == 0, f"import {db} {path} failed:\n{result.output}"
        into.append(db)
    return into


def check_promise(
    db: str, run_uuid: str, expected: Counter[tuple[int, str, Any]], output: str, recovery: str | None = None
) -> None:
    """Every accepted value is in the store, in a spill file the output named, or counted lost (in
    the run's row; in the output's end-of-run line where the store never took the run's end);
    `success` only with every value stored; importing every spill restores each value once into its
    run (in `db`, or in `recovery` where `db` now holds another run of that name)."""
    stored, run = run_rows(db, run_uuid)
    assert not stored - expected, f"rows the run never logged: {list((stored - expected).elements())[:5]}"
    commands = spill_commands(output)
    if run is not None and run[0] == "success":
        assert stored == expected, f"'success' with {sum((expected - stored).values())} value(s) not stored"
        assert not commands, f"'success' and spill files named: {commands}"
    lost = 0 if run is None else int(run[2] or 0)
    if run is None or run[0] == "running":  # the store never took the run's end (a full disk): the output counts
        lost = max(lost, lost_in_output(output))
    for _ in range(2):  # a second import adds nothing: each value lands once
        import_spills(commands, recovery)
        stored, run = run_rows(db, run_uuid)
        if recovery is not None:
            recovered, recovered_run = run_rows(recovery, run_uuid)
            stored += recovered
            run = run or recovered_run
        assert not stored - expected, f"rows twice or foreign after import: {list((stored - expected).elements())[:5]}"
        missing = sum((expected - stored).values())
        assert missing == lost, (
            f"{missing} value(s) neither stored nor in a named spill file, {lost} counted lost "
            f"(run {run}, spills {commands}); output:\n{output[-3000:]}"
        )
