"""The read side at scale (issue 30): each command in a fresh process on the scale store, its wall
time and its own peak RSS, at two sizes (memory must not grow with the store); and bytes per row.

The store: ``bench_query.build_scale_store`` (full mode: 256 ranks x 20,000 steps x 10 keys =
51.2M rows, one outlier rank, one NaN), and the same with 64 ranks (12.8M rows) as the second size;
in full mode also 1,024 ranks x 25,000 steps x 10 keys (256M rows, 3.2 GB; issue 42's targets)
with ``MULTIRANK_BENCH_256M=1``, and 1,024 x 100,000 x 10 (1B rows, ~12 GB) with ``MULTIRANK_BENCH_1B=1``
(their builds: ~4.5 and ~20 minutes on 2 cores, chunk by chunk; cached under benchmarks/.cache/).
Each case starts the command as a child of the benchmark's worker and reads the child's own peak
RSS (``os.wait4``): what a user's shell would see.

- ``report``: ``multirank-logger report DB`` (every finding, the text report);
- ``report -o``: the same, and the HTML file (its size in MB as an extra);
- ``per_rank``: ``open_store(DB).per_rank("metric_0")``, a step x rank DataFrame;
- ``rank_spread``: ``open_store(DB).rank_spread("metric_0")``;
- ``export rank 0``: ``multirank-logger export DB -o FILE`` (rank 0's metrics.csv);
- ``runs``: ``multirank-logger runs DB`` (from ``step_summaries``, not the rows);
- ``page (served)`` (the big stores): ``multirank-logger ui DB`` started fresh, the run's header
  asked, then the seconds of the first ``/api/run/1/series?name=metric_0``: what a user waits for;
- ``page``: the live page's first answer, ``/api/run/ID/series?name=metric_0``'s view built in a
  fresh process (``ui.views.summary`` + ``series_view`` + JSON), from the summaries past 8,000 steps;
- peer, raw DuckDB: every key's per-step median (``GROUP BY key, step``) on the same file, in a
  fresh process (the floor under the report's per-step statistics);
- ``bytes/row``: the DuckDB file's size over its rows (no unique index since migration 0006);
  SQLite and PostgreSQL: the same rows (a slice of the scale store, see ``BYTES_SLICE``) copied
  into a store of each, its file / ``pg_total_relation_size`` of every table over the rows.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._harness import Case, Goal, Sizes

SECTION = "read_scale"
ROOT = Path(__file__).resolve().parent.parent
#: (ranks, steps, keys) per mode: the store of the targets, and a smaller one (memory vs size)
SIZES_BY_MODE = {
    "full": ((256, 20_000, 10), (64, 20_000, 10)),
    "quick": ((64, 2_000, 10), (16, 2_000, 10)),
    "tiny": ((16, 200, 3), (8, 200, 3)),
}
#: the rows copied into SQLite and PostgreSQL for their bytes/row: (ranks, steps) of the scale store
BYTES_SLICE = (64, 2_000)

_PER_RANK = "from multirank_logger.query.reader import open_store; r = open_store({db!r}); t = r.per_rank('metric_0')"
_SPREAD = "from multirank_logger.query.reader import open_store; r = open_store({db!r}); s = r.rank_spread('metric_0')"
_PAGE = ("import json; from multirank_logger.query.reader import open_store; from multirank_logger.ui import views; "
         "r = open_store({db!r}); s = views.summary(r, 1, 'metric_0'); n = len(json.dumps(views.clean(views.series_view(s, views._nodes(r, 1)))))")
_RAW = ("import duckdb; c = duckdb.connect({db!r}, read_only=True); c.execute(\"SET memory_limit = '256MB'\"); c.execute('SET enable_progress_bar = false'); "
        "n = len(c.execute('SELECT key, step, median(value) FROM metrics GROUP BY key, step').fetchall())")


def _timed(argv: list[str]) -> tuple[float, float]:
    """Run `argv` as a child; (seconds, the child's peak RSS in MiB)."""
    with tempfile.TemporaryFile() as stderr:  # a file, not a pipe: nothing blocks the child
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
        stderr.seek(0)
        err = stderr.read().decode(errors="replace")
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):  # report exits 1 when it finds something
        raise RuntimeError(f"{argv[2:4]} exited {proc.returncode}: {err[-2000:]}")
    return seconds, usage.ru_maxrss / 1024


def command(what: str, ranks: int, steps: int, keys: int) -> dict[str, Any]:
    """One read command on the scale store of this size, in a fresh process: seconds, and its RSS."""
    from benchmarks.bench_query import build_scale_store

    db = str(build_scale_store(ranks, steps, keys))
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="bench-read-") as root:
        out = Path(root) / "out"
        argv = {
            "report": [py, "-m", "multirank_logger.cli", "report", db],
            "report -o": [py, "-m", "multirank_logger.cli", "report", db, "-o", f"{out}.html"],
            "per_rank": [py, "-c", _PER_RANK.format(db=db)],
            "rank_spread": [py, "-c", _SPREAD.format(db=db)],
            "export": [py, "-m", "multirank_logger.cli", "export", db, "--rank", "0", "-o", f"{out}.csv"],
            "runs": [py, "-m", "multirank_logger.cli", "runs", db],
            "page": [py, "-c", _PAGE.format(db=db)],
            "raw": [py, "-c", _RAW.format(db=db)],
        }[what]
        seconds, rss = _timed(argv)
        extra: dict[str, Any] = {"rows_M": ranks * steps * keys / 1e6, "peak_MiB": rss}
        if what == "report -o":
            extra["html_MB"] = Path(f"{out}.html").stat().st_size / 1e6
    return {"value": seconds, "rss_mib": rss, **extra}


def served(ranks: int, steps: int, keys: int, store: Path | None = None) -> dict[str, Any]:
    """The live page's first answer for a key, as a user waits for it: ``multirank-logger ui DB``
    started fresh, the run's header asked first (as the page does), then the seconds of
    ``/api/run/1/series?name=metric_0``; RSS: the server's peak (VmHWM) after it. `store`: another
    store of that shape (bench_first_key.py's), else the scale store."""
    import re
    import urllib.request

    from benchmarks.bench_query import build_scale_store

    db = str(store or build_scale_store(ranks, steps, keys))
    proc = subprocess.Popen([sys.executable, "-m", "multirank_logger.cli", "ui", db, "--port", "0"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        found = re.search(r"http://[^ ]+", proc.stdout.readline())
        if found is None:
            raise RuntimeError("multirank-logger ui said no address")
        url = found.group(0).rstrip("/")
        with urllib.request.urlopen(f"{url}/api/run/1", timeout=600) as answer:
            answer.read()
        t0 = time.perf_counter()
        with urllib.request.urlopen(f"{url}/api/run/1/series?name=metric_0", timeout=600) as answer:
            size = len(answer.read())
        seconds = time.perf_counter() - t0
        status = Path(f"/proc/{proc.pid}/status").read_text()
        peak = int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024  # type: ignore[union-attr]
    finally:
        proc.terminate()
        proc.wait(30)
    return {"value": seconds, "rss_mib": peak, "rows_M": ranks * steps * keys / 1e6, "peak_MiB": peak,
            "answer_MB": size / 1e6}


def duckdb_bytes(ranks: int, steps: int, keys: int) -> dict[str, Any]:
    """The DuckDB scale store's bytes per row (file size over rows)."""
    from benchmarks.bench_query import build_scale_store

    db = build_scale_store(ranks, steps, keys)
    rows = ranks * steps * keys
    return {"value": db.stat().st_size / rows, "MB": db.stat().st_size / 1e6, "rows_M": rows / 1e6}


def server_bytes(backend: str, ranks: int, steps: int, keys: int) -> dict[str, Any]:
    """SQLite's or PostgreSQL's bytes per row: BYTES_SLICE of the scale store's rows, written
    through the store (Store.write, as a logger would), then the file's size / every table's size."""
    import duckdb
    import pyarrow as pa

    from benchmarks.bench_query import build_scale_store
    from multirank_logger.rows.schema import METRIC_COLUMNS
    from multirank_logger.store.sql_store import Store

    slice_ranks, slice_steps = min(BYTES_SLICE[0], ranks), min(BYTES_SLICE[1], steps)
    src = duckdb.connect(str(build_scale_store(ranks, steps, keys)), read_only=True)
    cols = ", ".join(f'"{c}"' for c in METRIC_COLUMNS if c != "run_id")
    with tempfile.TemporaryDirectory(prefix="bench-bytes-") as root:
        server = None
        if backend == "sqlite":
            url: str = str(Path(root) / "bytes.sqlite")
        else:
            import pgserver  # type: ignore[import-untyped]

            server = pgserver.get_server(Path(root) / "pg", cleanup_mode="stop")
            url = server.get_uri()
        store = Store(url)
        run = store.create_run("bytes", world_size=slice_ranks, transport="gather")
        rows = 0
        for rank in range(slice_ranks):  # one rank's rows at a time, in batches of 1,000 steps as flushed
            for first in range(0, slice_steps, 1_000):
                table = src.execute(f"SELECT {cols} FROM metrics WHERE rank = {rank} AND step >= {first} "
                                    f"AND step < {min(first + 1_000, slice_steps)} ORDER BY seq, key").to_arrow_table()
                batch = pa.table({"run_id": pa.array([run.id] * table.num_rows, pa.int32()),
                                  **{c: table.column(c) for c in table.column_names}})
                store.write(batch.select(list(METRIC_COLUMNS)).to_batches()[0])
                rows += table.num_rows
        if backend == "sqlite":
            store.close()
            size = Path(url).stat().st_size
        else:
            with store.begin() as conn:
                size = conn.exec_driver_sql(
                    "SELECT SUM(pg_total_relation_size(c.oid)) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE c.relkind = 'r' AND n.nspname = 'public'"
                ).scalar()
            store.close()
        if server is not None:
            server.cleanup()
    src.close()
    return {"value": float(size) / rows, "rows_M": rows / 1e6, "MB": float(size) / 1e6}


def cases(sizes: Sizes) -> list[Case]:
    big, small = SIZES_BY_MODE[sizes.mode]
    peak = Goal("extra:peak_MiB", "<=", 600, "<= 600 MiB")
    goals = {
        "report": (Goal("value", "<=", 6.0, "<= 6 s"), peak),
        "report -o": (Goal("value", "<=", 8.0, "<= 8 s"), peak, Goal("extra:html_MB", "<=", 10, "HTML <= 10 MB")),
        "per_rank": (Goal("value", "<=", 2.5, "<= 2.5 s"), peak),
        "rank_spread": (peak,),
        "export": (peak,),
    }
    out = []
    # issue 42's stores and targets, each opted into (their builds: ~5 and ~20 minutes on 2 cores):
    # 1,024 ranks x 25,000 steps x 10 keys (256M rows), and x 100,000 steps (1B rows, ~12 GB)
    big_stores = {"MULTIRANK_BENCH_256M": (25_000, "256M", 15.0), "MULTIRANK_BENCH_1B": (100_000, "1B", 60.0)}
    for flag, (steps, rows, report_s) in big_stores.items():
        if sizes.mode != "full" or not os.environ.get(flag):
            continue
        kw = {"ranks": 1024, "steps": steps, "keys": 10}
        label = f"1024x{steps:,}x10 ({rows} rows)"
        targets = {
            "report": (Goal("value", "<=", report_s, f"<= {report_s:g} s"), Goal("extra:peak_MiB", "<=", 1024, "<= 1 GiB")),
            "per_rank": (Goal("extra:peak_MiB", "<=", 600, "<= 600 MiB"),) if rows == "256M" else (),
            "runs": (Goal("value", "<=", 1.0, "<= 1 s"),) if rows == "256M" else (),
            "page": (),
            "page (served)": (Goal("value", "<=", 1.0, "<= 1 s"),) if rows == "256M" else (),
        }
        for what, goals_big in targets.items():
            served_page = what == "page (served)"
            out.append(Case(SECTION, f"{what} {label}", f"benchmarks.bench_read_scale:{'served' if served_page else 'command'}",
                            "s", kw if served_page else {"what": what, **kw}, goals=goals_big, rounds=2, inner=1,
                            timeout_s=1800, note="the first series answer of a fresh `multirank-logger ui`" if served_page
                            else "a fresh process; RSS is the command's own"))
    # the targets' store: 5 rounds in full mode, as one command's time moves by a quarter within
    # minutes on this shared host (a median of 2 is the mean of two draws); the other store: 2
    target_rounds = 5 if sizes.mode == "full" else min(2, sizes.query_rounds)
    for shape in (big, small):
        kw = dict(zip(("ranks", "steps", "keys"), shape))
        label = f"{shape[0]}x{shape[1]:,}x{shape[2]} ({shape[0] * shape[1] * shape[2] / 1e6:g}M rows)"
        for what in ("raw", "report", "report -o", "per_rank", "rank_spread", "export", "runs", "page")[: 8 if shape == big else 6]:
            name = f"{'raw DuckDB median per (key, step)' if what == 'raw' else what} {label}"
            out.append(Case(SECTION, name, "benchmarks.bench_read_scale:command", "s", {"what": what, **kw},
                            peer=None if what == "raw" else f"raw DuckDB median per (key, step) {label}",
                            goals=goals.get(what, ()) if shape == big else (),
                            rounds=target_rounds if shape == big else min(2, sizes.query_rounds),
                            inner=1, timeout_s=600, note="a fresh process; RSS is the command's own"))
    kw = dict(zip(("ranks", "steps", "keys"), big))
    out.append(Case(SECTION, "bytes/row DuckDB", "benchmarks.bench_read_scale:duckdb_bytes", "B", kw, rounds=1,
                    inner=1, goals=(Goal("value", "<=", 14, "<= 14 B/row"),), note="the scale store's file"))
    for backend in ("sqlite", "postgresql"):
        out.append(Case(SECTION, f"bytes/row {backend}", "benchmarks.bench_read_scale:server_bytes", "B",
                        {"backend": backend, **kw}, rounds=1, inner=1, timeout_s=900,
                        note=f"{BYTES_SLICE[0]} ranks x {BYTES_SLICE[1]:,} steps of it, written through Store.write"))
    return out


NOTES = [
    "read_scale: each command is a child of the worker; its time is wall seconds from start to exit "
    "(imports and opening included) and its RSS is its own peak (os.wait4). 2 cores shared.",
]
