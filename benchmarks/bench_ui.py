"""The ui (`multirank-logger ui`): first render of a run in a real browser, drawing costs, and a
training's wall time with the page open.

- ``first render``: a fresh ``multirank-logger ui`` server (no cache) on the scale store (full
  mode: 256 ranks x 20,000 steps x 10 keys = 51.2M rows, ``bench_query.build_scale_store``);
  Debian's headless Chromium (Selenium) opens the run's page; the figure is the page's own
  ``performance.now()`` when its first key's band chart and heatmap are drawn (navigation start
  to pixels: server, SQL, transfer and drawing). Extras: the two answers it waited for (the
  run's header, its first key: s, from the browser's resource timing), the CPU seconds the
  server and the browser spent until then (what a shared machine's load does not inflate), the
  1-minute load average, every key drawn (s), KiB loaded by the first render and in all, the
  largest answer (KiB). Peer: the raw DuckDB ``GROUP BY rank, bucket`` of that key alone (the
  SQL floor under the page).
- ``heatmap 1,024 x 2,000`` and ``uPlot 1,000 series``: the page's own drawing code, timed in
  the browser on made-up data (to the next animation frame).
- ``2-rank DDP, ui page open``: the e2e training (``_e2e_train.py``, MultiRankLogger gather into
  DuckDB) while the run's page is open and polling, against the same training with no page;
  and nothing lost (every step of every key of both ranks in the store).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks._harness import Case, Goal, Sizes, Unavailable, launch_env

SECTION = "ui"
ROOT = Path(__file__).resolve().parent.parent
SCALE_BY_MODE = {"full": (256, 20_000, 10), "quick": (64, 2_000, 10), "tiny": (16, 200, 3)}


def _browser(width: int = 1300, height: int = 1000) -> Any:
    sys.path.insert(0, str(ROOT))
    try:
        from tests.helpers.ui_browser import chromium
    except ImportError as exc:  # selenium: the test extra
        raise Unavailable(f"selenium is not installed ({exc})") from exc
    try:
        return chromium(width, height)
    except RuntimeError as exc:
        raise Unavailable(str(exc)) from exc


def _wait(driver: Any, script: str, timeout: float = 300) -> Any:
    """The first truthy value of ``script`` (a function body), polled inside the page every 25 ms:
    a poll from here costs the browser and the driver a round trip each time, on the cores the
    server measured needs."""
    driver.set_script_timeout(timeout)
    return driver.execute_async_script(
        "const done = arguments[arguments.length - 1], check = new Function(arguments[0]);"
        "const tick = () => { const v = check(); if (v) done(v); else setTimeout(tick, 25); }; tick();",
        script,
    )


def _loaded_kib(driver: Any) -> tuple[float, float]:
    """(KiB of every response, KiB of the largest one), from Chromium's network log."""
    sizes = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.loadingFinished":
            sizes.append(message["params"]["encodedDataLength"])
    return sum(sizes) / 1024, max(sizes, default=0) / 1024


def _cpu_s(pid: int) -> float:
    """CPU seconds of a process and its children (Chromium's renderer and GPU processes)."""
    import psutil

    total = 0.0
    proc = psutil.Process(pid)
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


_TIMINGS = """
return performance.getEntriesByType('resource').filter((e) => e.name.includes('/api/'))
  .map((e) => [new URL(e.name).pathname + new URL(e.name).search, e.startTime, e.responseEnd]);
"""


def first_render(ranks: int, steps: int, keys: int) -> dict[str, Any]:
    from benchmarks.bench_query import build_scale_store

    db = build_scale_store(ranks, steps, keys)
    server = subprocess.Popen([sys.executable, "-m", "multirank_logger.cli", "ui", str(db), "--port", "0"],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        url = (server.stdout.readline() if server.stdout else "").split()[2]
        with _browser() as driver:
            browser_pid = driver.service.process.pid
            cpu0 = _cpu_s(server.pid), _cpu_s(browser_pid)
            t0 = time.perf_counter()
            driver.get(url + "run/1")
            first_ms = _wait(driver, "return +document.body.dataset.firstRender")
            cpu1 = _cpu_s(server.pid), _cpu_s(browser_pid)
            first_kib, _ = _loaded_kib(driver)
            # the answers the first render waited for: the run's header, then its first key
            api = driver.execute_script(_TIMINGS)
            _wait(driver, "return document.body.dataset.drawn")
            drawn_s = time.perf_counter() - t0
            rest_kib, largest_kib = _loaded_kib(driver)
            canvas = driver.execute_script("const c = document.querySelector('canvas.heatmap'); return [+c.dataset.ranks, +c.dataset.columns]")
    finally:
        server.terminate()
        server.wait(timeout=30)
    run_api = next(e for e in api if e[0].endswith("/api/run/1"))
    series_api = next(e for e in api if "/series?" in e[0])
    return {"value": first_ms / 1000, "run_answer_s": round((run_api[2] - run_api[1]) / 1000, 2),
            "first_key_answer_s": round((series_api[2] - series_api[1]) / 1000, 2),
            "server_cpu_s": round(cpu1[0] - cpu0[0], 2), "browser_cpu_s": round(cpu1[1] - cpu0[1], 2),
            "load_avg_1min": round(os.getloadavg()[0], 1), "all_keys_drawn_s": round(drawn_s, 2),
            "kib_at_first_render": round(first_kib), "page_kib": round(first_kib + rest_kib),
            "largest_answer_kib": round(largest_kib),
            "heatmap": f"{canvas[0]}x{canvas[1]}"}


def raw_groupby(ranks: int, steps: int, keys: int) -> dict[str, Any]:
    """The SQL under one key's charts, straight from DuckDB into Arrow: the floor."""
    import duckdb

    from benchmarks.bench_query import KEY, build_scale_store

    db = build_scale_store(ranks, steps, keys)
    width = max(1, -(-steps // 2000))
    t0 = time.perf_counter()
    con = duckdb.connect(str(db), read_only=True)
    table = con.execute(f"SELECT rank, step - step % {width} AS b, avg(value), min(value), max(value), max(dtype) "
                        f"FROM metrics WHERE run_id = 1 AND key = '{KEY}' GROUP BY ALL").to_arrow_table()
    con.close()
    return {"value": time.perf_counter() - t0, "cells": table.num_rows}


_DRAW = """
const [what, ranks, cols, series, done] = arguments;
const box = document.createElement('div'); box.style.width = '1200px'; document.body.append(box);
let seed = 1; const rnd = () => ((seed = (seed * 16807) % 2147483647) / 2147483647);
const t0 = performance.now();
if (what === 'heatmap') {
  const codes = new Int8Array(ranks * cols);
  for (let i = 0; i < codes.length; i++) codes[i] = Math.round((rnd() - 0.5) * 40);
  let bin = ''; const u8 = new Uint8Array(codes.buffer);
  for (let i = 0; i < u8.length; i += 8192) bin += String.fromCharCode.apply(null, u8.subarray(i, i + 8192));
  const d = {ranks: [...Array(ranks).keys()], steps: [...Array(cols).keys()].map((j) => j * 10), width: 10,
             nodes: [['node', ranks]], heatmap: btoa(bin)};
  const chart = window.MRL_DRAW.chartFor(box, d);  // the heatmap is drawn under its chart, in its x scale
  const t1 = performance.now();
  window.MRL_DRAW.heatmap(box, d, chart, () => {});
  requestAnimationFrame(() => done(performance.now() - t1));
} else {
  const steps = [...Array(cols).keys()], lines = {};
  const band = {lo: [], q1: [], median: [], q3: [], hi: []};
  for (const k of Object.keys(band)) for (let j = 0; j < cols; j++) band[k].push(rnd());
  for (let r = 0; r < series; r++) lines[r] = steps.map(() => rnd());
  const t1 = performance.now();
  window.MRL_DRAW.bandChart(box, steps, band, lines);
  requestAnimationFrame(() => done(performance.now() - t1));
}
"""


def draw(what: str, ranks: int, cols: int, series: int) -> dict[str, Any]:
    """The page's own drawing code on made-up data, in the browser: milliseconds to the next frame."""
    from multirank_logger.ui.page import write_static_page

    with tempfile.TemporaryDirectory(prefix="bench-ui-") as root:
        page = Path(root) / "empty.html"
        write_static_page(page, "bench", {"runs": []}, "/")
        with _browser() as driver:
            driver.set_script_timeout(300)
            driver.get(page.as_uri())
            _wait(driver, "return window.MRL_DRAW")
            ms = driver.execute_async_script(_DRAW, what, ranks, cols, series)
    return {"value": ms / 1000}


def training(page: bool, steps: int, metrics: int) -> dict[str, Any]:
    """One 2-rank launch of the e2e training, with the run's page open (or not); wall s of the fit."""
    import duckdb

    from benchmarks.bench_e2e import SCRIPT
    from multirank_logger.ui.server import UiServer

    variant = "MultiRankLogger gather"
    with tempfile.TemporaryDirectory(prefix="bench-ui-train-") as root:
        db = Path(root) / variant.replace(" ", "_") / "gather.duckdb"
        env = launch_env()
        cmd = [sys.executable, str(SCRIPT), "--variants", variant, "--steps", str(steps), "--metrics", str(metrics), "--out", root]
        server = UiServer(str(db)) if page else None
        browser = _browser() if page else None
        driver = browser.__enter__() if browser is not None else None
        try:
            if server is not None and driver is not None:
                threading.Thread(target=server.serve_forever, daemon=True).start()
                driver.get(server.url + "run/1")  # the warm-up fit logs nothing: the measured fit is run 1
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
            polled = driver.execute_script("return document.getElementById('head').innerText") if driver else ""
        finally:
            if browser is not None:
                browser.__exit__(None, None, None)
            if server is not None:
                server.shutdown()
                server.server_close()
        reports = [json.loads((Path(root) / f"rank{r}.json").read_text()) for r in (0, 1)] if proc.returncode == 0 else None
        if reports is None:
            raise RuntimeError(f"training failed: {proc.stdout[-1500:]} {proc.stderr[-1500:]}")
        con = duckdb.connect(str(db), read_only=True)
        stored = con.execute("SELECT count(*) FROM metrics WHERE run_id = 1").fetchone()[0]
        con.close()
    fit = next(r for r in reports[0] if r["variant"] == variant)
    expected = 2 * steps * metrics
    return {"value": fit["fit_s"], "cpu_s": fit["cpu_s"], "values_stored": stored, "values_logged_at_least": expected,
            "lost": max(0, expected - stored), "page_saw": polled.splitlines()[-1][:80] if polled else ""}


def cases(sizes: Sizes) -> list[Case]:
    ranks, steps, keys = SCALE_BY_MODE[sizes.mode]
    from benchmarks.bench_query import build_scale_store

    build_scale_store(ranks, steps, keys)  # once, here in the parent, before any case is timed
    kw = {"ranks": ranks, "steps": steps, "keys": keys}
    shape = f"{ranks} ranks x {steps:,} steps x {keys} keys = {ranks * steps * keys / 1e6:.1f}M rows"
    rounds = 1 if sizes.mode == "tiny" else 3
    heat = (1024, 2000) if sizes.mode != "tiny" else (64, 200)
    lines = 1000 if sizes.mode != "tiny" else 20
    train_steps = {"full": 600, "quick": 200, "tiny": 10}[sizes.mode]
    return [
        Case(SECTION, "raw DuckDB GROUP BY one key", "benchmarks.bench_ui:raw_groupby", "s", kw, rounds=rounds, inner=1,
             note=f"the SQL floor under one key's charts (rank x 2,000 buckets); {shape}"),
        Case(SECTION, "ui first render of a run", "benchmarks.bench_ui:first_render", "s", kw, rounds=rounds, inner=1,
             peer="raw DuckDB GROUP BY one key", goals=(Goal("value", "<=", 2.0, "<= 2 s"),),
             note=f"fresh server, headless Chromium: navigation to the first key's band chart and heatmap drawn; {shape}"),
        Case(SECTION, f"heatmap {heat[0]:,} x {heat[1]:,} draw", "benchmarks.bench_ui:draw", "s",
             {"what": "heatmap", "ranks": heat[0], "cols": heat[1], "series": 0}, rounds=rounds, inner=1,
             note="the page's heatmap code on made-up cells, to the next frame"),
        Case(SECTION, f"uPlot {lines:,} series draw", "benchmarks.bench_ui:draw", "s",
             {"what": "band", "ranks": 0, "cols": 2000 if sizes.mode != "tiny" else 200, "series": lines}, rounds=rounds, inner=1,
             note="the page's band chart with that many rank lines on top, to the next frame"),
        Case(SECTION, "2-rank DDP, no page", "benchmarks.bench_ui:training", "s",
             {"page": False, "steps": train_steps, "metrics": 5}, rounds=rounds, inner=1,
             note=f"_e2e_train.py, MultiRankLogger gather into DuckDB, {train_steps} steps x 5 keys"),
        Case(SECTION, "2-rank DDP, ui page open", "benchmarks.bench_ui:training", "s",
             {"page": True, "steps": train_steps, "metrics": 5}, rounds=rounds, inner=1, peer="2-rank DDP, no page",
             goals=(Goal("ratio", "<=", 1.05, "within noise of no page"),),
             note="the same, with the run's page open in Chromium, polling every 2 s"),
    ]


NOTES = [
    "ui: first render is the page's own performance.now() (from navigation start) when the first key's band chart "
    "and heatmap are drawn, from a fresh `multirank-logger ui` server (no cache), in Debian's headless Chromium.",
]
