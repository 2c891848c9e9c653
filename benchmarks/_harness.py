"""Shared benchmark machinery: cases, fresh-process runs, medians, peak RSS, the markdown table.

A section module (``bench_*.py``) describes its measurements as `Case` objects. Each
case names a function ``module:function`` that does one measurement and returns a
dict with at least ``value``. The harness runs every case in a fresh Python process
(so one peer's memory never pollutes another's peak RSS), ``rounds`` times, with the
cases of a section interleaved round by round, in an order rotated each round
(A B C, B C A, C A B, ...), so that the machine's drift hits every peer alike.
Inside one process the function may be called ``inner`` times; every call is one sample.

Ratios are computed per pair of samples taken at the same (round, inner) position
(or, when the two cases take different numbers of samples per process, per round
from each round's medians) and summarised by their median, min and max: on a noisy shared machine a ratio of
peers measured side by side means more than either absolute time.
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import resource
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = [
    "BENCH_DIR",
    "CACHE_DIR",
    "REPO_ROOT",
    "Case",
    "Goal",
    "Result",
    "Sizes",
    "Unavailable",
    "machine_info",
    "markdown_report",
    "peak_rss_mib",
    "run_cases",
    "summarize",
    "targets_summary",
]

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
CACHE_DIR = BENCH_DIR / ".cache"
_RESULT_MARK = "BENCH-RESULT "


class Unavailable(Exception):
    """Raised by a measurement whose subject does not exist yet (a module not landed)."""


@dataclass(frozen=True)
class Sizes:
    """How big and how often: one object per mode (full, quick, tiny)."""

    mode: str
    rounds: int  # fresh processes per case
    inner: int  # samples per process
    hot_calls: int
    hot_keys: int
    ingest_rows: int  # rows per batch
    ingest_batches: int
    ingest_small_batches: int  # of 1,000 rows: the size of one logger flush (100 calls x 10 keys)
    e2e_steps: int
    e2e_metrics: int
    e2e_rounds: int
    query_ranks: int
    query_steps: int
    query_keys: int
    query_rounds: int
    memory_calls: int  # log calls of one long run (bench_memory)
    memory_chunks: int  # RSS readings along it


@dataclass(frozen=True)
class Goal:
    """A target from the issues: ``metric op threshold``, metric being the value or the ratio."""

    metric: str  # "value", "ratio" (to the row's peer), "vs:<case>" (ratio to another case),
    # or "extra:<key>" (the median of one of the case's extras, in the row's unit)
    op: str  # "<=" or ">="
    threshold: float
    text: str

    def check(self, value: float | None, ratio: float | None) -> str:
        x = value if self.metric == "value" or self.metric.startswith("extra:") else ratio
        if x is None or not math.isfinite(x):
            return "n/a"
        ok = x <= self.threshold if self.op == "<=" else x >= self.threshold
        return "met" if ok else "**not met**"


@dataclass
class Case:
    """One row of the table: a measurement, its unit, the peer it is compared with."""

    section: str
    name: str
    target: str  # "module:function", imported in the child process
    unit: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    peer: str | None = None  # name of the case in the same section to divide by
    goals: Sequence[Goal] = ()
    note: str = ""
    rounds: int | None = None  # overrides Sizes.rounds
    inner: int | None = None  # overrides Sizes.inner
    timeout_s: float = 900.0
    extra_ratios: Sequence[str] = ()  # extras also divided by the peer's, sample by sample


@dataclass
class Result:
    case: Case
    samples: list[float | None] = field(default_factory=list)
    positions: list[tuple[int, int]] = field(default_factory=list)  # (round, inner) of each sample
    rss_mib: list[float] = field(default_factory=list)  # one per process
    extras: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    @property
    def values(self) -> list[float]:
        return [v for v in self.samples if v is not None]


# -- measuring ----------------------------------------------------------------------------


def peak_rss_mib() -> float:
    """This process's peak resident set size, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def kill_leftovers(procs: Sequence[Any]) -> None:
    """Kill and reap those of `procs` (multiprocessing processes) still running: after an error, so
    that none waits out its own timeouts (multiprocessing joins live children at exit)."""
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(10)


def raise_if_any_failed(procs: Sequence[Any]) -> None:
    """After joining `procs` (multiprocessing processes): when one exited non-zero or is still
    running, kill those still running and raise, naming the exit codes."""
    failed = [p.exitcode for p in procs if p.exitcode != 0]
    if failed:
        kill_leftovers(procs)
        raise RuntimeError(f"{len(failed)} process(es) failed (exit codes {failed})")


def free_port() -> int:
    """A TCP port free on loopback now: a launch's MASTER_PORT, a TCPStore's.

    Drawn below the kernel's ephemeral range (32768-60999 by default), not bound to port 0:
    an ephemeral port is free again once this socket closes, and until the launch's rank 0
    binds it (seconds later: its ranks import torch first) any client connection on the
    machine (a TCPStore's, PostgreSQL's, another launch's) may take it as its own end
    ("address already in use", every other rank then waiting for a rank 0 that is gone)."""
    draw = random.SystemRandom()
    for _ in range(100):
        port = draw.randrange(20_000, 32_768)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_env(**extra: str) -> dict[str, str]:
    """This environment for a DDP launch on loopback: a free MASTER_PORT, one thread per rank, and
    none of the rank variables of a launch this process may itself be part of."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1", **extra)
    for var in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "GLOBAL_RANK", "RANK"):
        env.pop(var, None)
    return env


def run_launch(cmd: Sequence[str], env: dict[str, str], timeout_s: float, what: str) -> tuple[int, str]:
    """Run a DDP launch (`cmd`, whose ranks its launcher starts) to its end; its exit code and its
    output (stdout and stderr). In a session of its own, so that a hung launch is killed with
    every rank; past `timeout_s` it raises, naming `what` and the output's end."""
    proc = subprocess.Popen(list(cmd), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise RuntimeError(f"{what} did not finish in {timeout_s:.0f} s: {output[-2000:]}") from None
    return proc.returncode, output


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    root = str(REPO_ROOT)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONHASHSEED", "0")
    # two cores and several processes: one thread per process, no oversubscription
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    return env


def run_in_child(case: Case, inner: int) -> dict[str, Any]:
    """Run `inner` samples of `case` in a fresh interpreter; return samples, extras and peak RSS."""
    spec = json.dumps({"target": case.target, "kwargs": case.kwargs, "inner": inner})
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks._worker", spec],
        cwd=REPO_ROOT,
        env=_child_env(),
        capture_output=True,
        text=True,
        timeout=case.timeout_s,
    )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(_RESULT_MARK):
            return json.loads(line[len(_RESULT_MARK) :])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-15:]
    return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}


def run_in_process(case: Case, inner: int) -> dict[str, Any]:
    """The same as run_in_child, in this process (for smoke tests: RSS is this process's peak)."""
    from benchmarks._worker import measure

    return measure(case.target, case.kwargs, inner)


def run_cases(
    cases: Sequence[Case],
    sizes: Sizes,
    *,
    in_process: bool = False,
    log: Callable[[str], None] = print,
) -> list[Result]:
    """Run the cases of one section interleaved, round after round."""
    results = {c.name: Result(c) for c in cases}
    max_rounds = max((c.rounds or sizes.rounds) for c in cases) if cases else 0
    runner = run_in_process if in_process else run_in_child
    for r in range(max_rounds):
        # rotate the order each round, so no case always runs first (or right after the same one)
        shift = r % len(cases)
        for case in [*cases[shift:], *cases[:shift]]:
            res = results[case.name]
            rounds = case.rounds or sizes.rounds
            if r >= rounds or res.error is not None:
                continue
            inner = case.inner or sizes.inner
            t0 = time.perf_counter()
            try:
                out = runner(case, inner)
            except subprocess.TimeoutExpired:
                out = {"error": f"timed out after {case.timeout_s:.0f} s"}
            if "error" in out:
                res.error = out["error"]
                log(f"  {case.section}/{case.name}: {res.error}")
                continue
            res.samples.extend(out["samples"])
            res.positions.extend((r, i) for i in range(len(out["samples"])))
            res.extras.extend(out.get("extras", []))
            res.rss_mib.append(out["rss_mib"])
            shown = ", ".join(_fmt(v) for v in out["samples"])
            log(f"  [{r + 1}/{rounds}] {case.section}/{case.name}: {shown} {case.unit}"
                f"  (rss {out['rss_mib']:.0f} MiB, {time.perf_counter() - t0:.1f} s)")
    return list(results.values())


# -- summarizing ----------------------------------------------------------------------------


def _stats(xs: Sequence[float]) -> tuple[float, float, float] | None:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return None
    return statistics.median(xs), min(xs), max(xs)


def _extra_samples(res: Result, key: str) -> list[float | None]:
    out: list[float | None] = []
    for extra in res.extras:
        v = extra.get(key)
        out.append(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None)
    return out


def _ratios(res: Result, peer: Result, key: str | None = None) -> list[float]:
    """Ratios of samples taken side by side: same (round, inner) position, else same round's medians.

    With `key`, of that extra instead of the figure.
    """
    mine_s = res.samples if key is None else _extra_samples(res, key)
    theirs_s = peer.samples if key is None else _extra_samples(peer, key)
    mine = dict(zip(res.positions, mine_s))
    theirs = dict(zip(peer.positions, theirs_s))
    if mine and set(mine) <= set(theirs):
        pairs = [(a, theirs[pos]) for pos, a in mine.items()]
    else:
        pairs = []
        for rnd in sorted({r for r, _ in mine}):
            a = [v for (r, _), v in mine.items() if r == rnd and v is not None]
            b = [v for (r, _), v in theirs.items() if r == rnd and v is not None]
            if a and b:
                pairs.append((statistics.median(a), statistics.median(b)))
    return [a / b for a, b in pairs if a is not None and b is not None and b > 0]


def summarize(results: Sequence[Result]) -> list[dict[str, Any]]:
    """One dict per row: stats of the value, of the ratio to the peer, of the RSS, goal status."""
    by_name = {r.case.name: r for r in results}
    peers = {r.case.peer for r in results}
    rows = []
    for res in results:
        case = res.case
        row: dict[str, Any] = {
            "section": case.section,
            "case": case.name,
            "unit": case.unit,
            "peer": case.peer,
            "is_peer": case.name in peers,
            "note": case.note,
            "error": res.error,
            "n": len(res.values),
            "value": _stats(res.values),
            "rss_mib": _stats(res.rss_mib),
            "ratio": None,
            "goals": [],
        }
        peer = by_name.get(case.peer) if case.peer else None
        if peer is not None and peer is not res:
            row["ratio"] = _stats(_ratios(res, peer))
        median = row["value"][0] if row["value"] else None
        ratio = row["ratio"][0] if row["ratio"] else None
        row["goals"] = []
        for g in case.goals:
            versus, against = ratio, case.peer
            if g.metric.startswith("vs:"):
                against = g.metric[3:]
                other = by_name.get(against)
                stats = _stats(_ratios(res, other)) if other is not None else None
                versus = stats[0] if stats else None
                g = Goal("ratio", g.op, g.threshold, g.text)
            if g.metric.startswith("extra:"):
                key = g.metric[len("extra:"):]
                samples = [e[key] for e in res.extras if isinstance(e.get(key), (int, float))]
                extra = statistics.median(samples) if samples else None
                row["goals"].append((g.text, g.check(extra, None), f"{key}={_fmt(extra)}"))
                continue
            if g.metric == "value":
                shown = f"{_fmt(median)} {case.unit}"
            else:
                shown = f"{versus:.3g}x of {against}" if versus is not None else "-"
            row["goals"].append((g.text, g.check(median, versus), shown))
        if res.extras:
            row["extras"] = _merge_extras(res.extras)
            for key in case.extra_ratios:
                stats = _stats(_ratios(res, peer, key)) if peer is not None and peer is not res else None
                if stats:
                    row["extras"][f"{key} vs peer"] = f"{stats[0]:.3g}x [{stats[1]:.3g}, {stats[2]:.3g}]"
        rows.append(row)
    return rows


def _merge_extras(extras: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Median of each numeric extra; the first value of anything else."""
    merged: dict[str, Any] = {}
    for key in extras[0]:
        vals = [e.get(key) for e in extras]
        nums = [v for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool)]
        merged[key] = statistics.median(nums) if nums and len(nums) == len(vals) else vals[0]
    return merged


# -- reporting ----------------------------------------------------------------------------


def _fmt(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    ax = abs(x)
    if ax >= 1e6:
        return f"{x / 1e6:.2f}M"
    if ax >= 1000:
        return f"{x:,.0f}"
    if ax >= 100:
        return f"{x:.0f}"
    if ax >= 10:
        return f"{x:.1f}"
    if ax >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def _fmt_ratio(stats: tuple[float, float, float] | None, peer: str | None, is_peer: bool) -> str:
    if not stats:
        return "(the peer)" if is_peer and peer is None else "-"
    med, lo, hi = stats
    return f"{med:.3g}x [{lo:.3g}, {hi:.3g}] of {peer}"


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    head = (
        "| section | case | median | min | max | unit | vs peer: median [min, max] "
        "| peak RSS MiB: median [min, max] | target | status | notes |"
    )
    lines = [head, "|" + "---|" * 11]
    for row in rows:
        if row["error"]:
            lines.append(
                f"| {row['section']} | {row['case']} | - | - | - | {row['unit']} | - | - | "
                + " ".join(g[0] for g in row["goals"])
                + f" | n/a | {row['error'][:300]} |"
            )
            continue
        v = row["value"] or (None, None, None)
        rss = row["rss_mib"]
        rss_text = f"{rss[0]:.0f} [{rss[1]:.0f}, {rss[2]:.0f}]" if rss else "-"
        goals = "; ".join(g[0] for g in row["goals"]) or "-"
        status = "; ".join(g[1] for g in row["goals"]) or "-"
        notes = row["note"]
        extras = row.get("extras") or {}
        if extras:
            shown = ", ".join(f"{k}={_fmt(v) if isinstance(v, (int, float)) else v}" for k, v in extras.items())
            notes = f"{notes}; {shown}" if notes else shown
        lines.append(
            f"| {row['section']} | {row['case']} | {_fmt(v[0])} | {_fmt(v[1])} | {_fmt(v[2])} | {row['unit']} "
            f"| {_fmt_ratio(row['ratio'], row['peer'], row['is_peer'])} | {rss_text} | {goals} | {status} | {notes} |"
        )
    return "\n".join(lines)


def targets_summary(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One line per target from the issues: the row, the target, what was measured, met or not."""
    lines = []
    for row in rows:
        for text, status, shown in row["goals"]:
            lines.append(f"- {row['section']} / {row['case']}: {text}: {status} ({shown})")
    return lines or ["- (no row of this run carries a target)"]


def _mem_gib() -> float:
    try:
        import psutil

        return psutil.virtual_memory().total / 2**30
    except ImportError:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


_PACKAGES = ("multirank-logger", "torch", "lightning", "duckdb", "duckdb-engine", "sqlalchemy",
             "pyarrow", "pandas", "tensorboard", "psutil")


def _loadavg() -> tuple[float, ...]:
    try:
        return tuple(round(x, 2) for x in os.getloadavg())
    except OSError:
        return (float("nan"),) * 3


def machine_info() -> dict[str, Any]:
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return {
        "cores": os.cpu_count(),
        "cpu": _cpu_model(),
        "memory_gib": round(_mem_gib(), 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": versions,
        "load_at_start": _loadavg(),
    }


def markdown_report(
    rows: Sequence[dict[str, Any]],
    *,
    command: str,
    machine: dict[str, Any],
    sizes: Sizes,
    elapsed_s: float,
    notes: Sequence[str] = (),
    in_process: bool = False,
) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in machine["versions"].items())
    out = [
        "# multirank-logger benchmarks",
        "",
        f"- command: `{command}` (mode: {sizes.mode}; took {elapsed_s / 60:.1f} min)",
        f"- date: {time.strftime('%Y-%m-%d %H:%M %Z')}",
        f"- machine: {machine['cores']} cores ({machine['cpu']}), {machine['memory_gib']} GiB memory, "
        f"{machine['platform']}, Python {machine['python']}",
        f"- versions: {versions}",
        f"- sizes: {sizes}",
        "",
        "Every figure is the median of the samples with their min and max. "
        + ("This run measured every case in ONE process (--in-process): its RSS figures are cumulative."
           if in_process else
           "Every case ran in its own fresh process (peak RSS is that process's, or the largest rank's "
           "for DDP runs)."),
        "The cases of a section ran interleaved round by round, in an order rotated each round. Ratios are",
        "taken sample by sample",
        "against the peer measured beside it in the same round, then summarised. This machine is",
        f"shared and noisy (load average {', '.join(str(x) for x in machine['load_at_start'])} at the start, "
        f"{', '.join(str(x) for x in _loadavg())} at the end): read the ratios before the absolute numbers.",
        "",
        markdown_table(rows),
        "",
        "## Targets",
        "",
        *targets_summary(rows),
        "",
    ]
    if notes:
        out += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(out)
