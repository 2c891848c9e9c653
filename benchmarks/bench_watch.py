"""What rank 0's watch costs, how soon it alerts, and how often it alerts on a clean run.

    .venv/bin/python benchmarks/bench_watch.py [--seconds 30] [--ranks 2 16 256] [--clean-runs 100]
    .venv/bin/python benchmarks/bench_watch.py --peek-cost 16 256 --seconds 20 --ddp-latency 16

Cost and latency: a synthetic feed of R ranks x 10 keys x 10 steps/s, handed to the watch as
gather's rank 0 writer hands it (``Watch.observe``: one Arrow batch of every rank's new rows
every 0.5 s, the writer's flush interval), for ``--seconds``. Each R runs twice, each in a
process of its own: the same feed into a watch (watch/watch.py, its thread judging) and into
nothing (the feed alone). The watch's cost is the difference: CPU seconds per wall second
(a share of one core) and peak RSS. At the middle of the run rank R-1 logs a NaN (key 0) and
rank 1's key 1 goes x10 (from R >= 3): the latency is from the moment the batch with the
NaN (the departure's first step) is handed over to the moment the alert is raised.

End to end (``--ddp-latency``): a real 4-rank gather DDP training on CPU (benchmarks/_watch_latency_train.py,
the default ``flush_interval`` of 5 s) whose ranks each log a NaN now and then, on a key of its own;
the latency is from the rank's ``self.log`` call to rank 0's alert (its console line), once as the
watch runs now (it looks at the rows rank 0 receives every ``PEEK_S``) and once fed by rank 0's
writer cycles alone (``--no-peek``: the behaviour before), each in a fresh store.

False alarms: the report's seeded clean noisy runs (tests/helpers/planted_rows.py's ``noisy_losses``: a
decaying loss, each shard its own noise and offset) fed to the watch's judgement 10 steps at a
time, rows in random order; a run with any alert is a false alarm. Beside it, the report's own
judgement over the whole table (``judgement.ranks.departures``).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._harness import free_port  # noqa: E402

KEYS = 10
STEPS_PER_S = 10
FLUSH_S = 0.5


def _batches(ranks: int, seconds: float) -> list[pa.RecordBatch]:
    """Every flush's batch, built before the clock starts (both modes build the same)."""
    names = pa.array([f"key_{k}" for k in range(KEYS)])
    per = int(STEPS_PER_S * FLUSH_S)
    total = int(seconds * STEPS_PER_S)
    nan_step = depart_step = total // 2
    rng = np.random.default_rng(0)
    out = []
    for first in range(0, total, per):
        step = np.repeat(np.arange(first, first + per), ranks * KEYS)
        rank = np.tile(np.repeat(np.arange(ranks), KEYS), per)
        key = np.tile(np.arange(KEYS, dtype=np.int32), per * ranks)
        value = 1.0 + 0.05 * rng.standard_normal(len(step))
        value[(rank == ranks - 1) & (key == 0) & (step == nan_step)] = np.nan
        if ranks >= 3:
            value[(rank == 1) & (key == 1) & (step >= depart_step)] *= 10
        out.append(pa.RecordBatch.from_arrays(
            [pa.DictionaryArray.from_arrays(pa.array(key), names), pa.array(rank), pa.array(step), pa.array(value)],
            names=["key", "rank", "step", "value"]))
    return out


def measure(ranks: int, seconds: float, watch_on: bool) -> dict[str, Any]:
    """One process's run: the feed, into a watch or into nothing."""
    from multirank_logger.judgement.finding import Finding
    from multirank_logger.watch.alerts import AlertOutlets
    from multirank_logger.watch.watch import Watch

    batches = _batches(ranks, seconds)
    nan_step = int(seconds * STEPS_PER_S) // 2
    raised: list[tuple[float, Finding]] = []
    handed: dict[int, float] = {}  # the first step of each batch -> when it was handed over

    class Timed(AlertOutlets):
        def raise_alert(self, finding: Finding) -> Any:
            raised.append((time.monotonic(), finding))
            return super().raise_alert(finding)

    watch = Watch(1, ranks, Timed(lambda table, row: None, echo=False), close_after=10.0) if watch_on else None
    if watch is not None:
        watch.start()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cpu0, wall0 = time.process_time(), time.monotonic()
    for i, batch in enumerate(batches):
        due = wall0 + i * FLUSH_S
        time.sleep(max(0.0, due - time.monotonic()))
        handed[i * int(STEPS_PER_S * FLUSH_S)] = time.monotonic()
        if watch is not None:
            watch.observe([batch], [])
    time.sleep(FLUSH_S)
    if watch is not None:
        watch.stop(5.0)
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    latency = {}
    for when, f in raised:
        first = (f.first_step // int(STEPS_PER_S * FLUSH_S)) * int(STEPS_PER_S * FLUSH_S)
        latency[f.kind] = round(when - handed[first], 3)
    return {"ranks": ranks, "watch": watch_on, "cpu_s": cpu, "wall_s": wall, "cpu_share": cpu / wall,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "rss_before_mib": rss_before / 1024, "rows_per_s": ranks * KEYS * STEPS_PER_S,
            "alerts": [(f.kind, f.rank, f.key, f.first_step) for _, f in raised], "latency_s": latency,
            "nan_step": nan_step, "skipped": watch.skipped if watch is not None else 0}


def long_run(ranks: int, steps: int) -> dict[str, Any]:
    """The watch's judgement fed `steps` steps of R ranks x 10 keys as fast as it takes them (no
    pacing, no thread): the most rows a second it judges, and whether its memory stays windowed.
    Run in a process of its own; the batches are made as it goes (5 steps at a time)."""
    from multirank_logger.judgement.live import LiveJudgement

    live = LiveJudgement(ranks, close_after=1e9)
    rng = np.random.default_rng(0)
    keys = np.array([f"key_{k}" for k in range(KEYS)], dtype=object)
    per = int(STEPS_PER_S * FLUSH_S)
    rss = []
    judge_cpu = 0.0
    for first in range(0, steps, per):
        step = np.repeat(np.arange(first, first + per), ranks * KEYS)
        rank = np.tile(np.repeat(np.arange(ranks), KEYS), per)
        key = keys[np.tile(np.arange(KEYS), per * ranks)]
        value = 1.0 + 0.05 * rng.standard_normal(len(step))
        t = time.process_time()
        live.add_rows(key, rank, step, value, 0.0)
        if first % STEPS_PER_S == 0:  # a judgement a second, as the watch's thread does
            live.judge(0.0)
        judge_cpu += time.process_time() - t
        if first % (steps // 10) == 0:
            rss.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    held = max(sum(len(p[0]) for p in k.windows.parts) for k in live.keys.values())
    rows = steps * ranks * KEYS
    return {"ranks": ranks, "steps": steps, "rows": rows, "cpu_s": judge_cpu, "rows_per_cpu_s": rows / judge_cpu,
            "peak_rss_mib_by_tenth": [round(r) for r in rss], "held_steps_per_key": held}


def false_alarms(runs: int, ranks_list: tuple[int, ...] = (3, 4, 8, 32), steps: int = 200) -> list[dict[str, Any]]:
    from multirank_logger.judgement.live import LiveJudgement
    from multirank_logger.judgement.ranks import departures

    def noisy(seed: int, ranks: int) -> np.ndarray:  # tests/helpers/planted_rows.py's noisy_losses
        rng = np.random.default_rng(seed)
        trend = 2.0 * np.exp(-np.arange(steps) / 60)[:, None] + 0.3
        return trend * (1 + 0.05 * rng.standard_normal(ranks)) + 0.2 * trend * rng.standard_normal((steps, ranks))

    out = []
    for ranks in ranks_list:
        live_alarms = report_alarms = 0
        for seed in range(runs):
            values = noisy(seed, ranks)
            rng = np.random.default_rng(seed)
            live = LiveJudgement(ranks, close_after=1e9)
            found = []
            for first in range(0, steps, 10):
                step = np.repeat(np.arange(first, first + 10), ranks)
                rank = np.tile(np.arange(ranks), 10)
                order = rng.permutation(len(step))
                step, rank = step[order], rank[order]
                live.add_rows(np.full(len(step), "loss", object), rank, step, values[step, rank], 0.0)
                found += live.judge(0.0)
            found += live.judge(0.0, final=True)
            live_alarms += bool(found)
            report_alarms += bool(departures(np.arange(steps), np.arange(ranks), values))
        out.append({"ranks": ranks, "runs": runs, "steps": steps, "watch_false_alarms": live_alarms,
                    "report_false_alarms": report_alarms})
    return out


def paced(ranks_list: list[int], seconds: float) -> None:
    """Each R's feed into a watch and into nothing, each in a process of its own."""
    print(f"feed: R ranks x {KEYS} keys x {STEPS_PER_S} steps/s, a batch every {FLUSH_S} s, {seconds:.0f} s per run")
    print(f"{'ranks':>6} {'rows/s':>8} {'CPU feed':>9} {'CPU watch':>10} {'watch: share of a core':>23} "
          f"{'RSS feed':>9} {'RSS watch':>10} {'+MiB':>6}  latency (s), alerts")
    for ranks in ranks_list:
        runs = {}
        for on in (False, True):
            proc = subprocess.run([sys.executable, __file__, "--one", str(ranks), str(seconds), str(int(on))],
                                  capture_output=True, text=True, check=True)
            runs[on] = json.loads(proc.stdout.strip().splitlines()[-1])
        off, on_ = runs[False], runs[True]
        share = on_["cpu_share"] - off["cpu_share"]
        print(f"{ranks:>6} {on_['rows_per_s']:>8,} {off['cpu_share']:>8.1%} {on_['cpu_share']:>9.1%} {share:>22.2%} "
              f"{off['peak_rss_mib']:>8.0f}M {on_['peak_rss_mib']:>9.0f}M {on_['peak_rss_mib'] - off['peak_rss_mib']:>6.1f}"
              f"  {on_['latency_s']} {on_['alerts']} skipped={on_['skipped']}", flush=True)


def peek_cost(ranks_list: list[int], seconds: float) -> None:
    """What the watch's look at the received rows costs rank 0's process (gather): `RowChannel.peek`
    every `PEEK_S` over R-1 senders' queues, on a TCPStore server in the same process (as rank 0
    hosts the launch's), for `seconds`; CPU seconds per wall second, the server's thread included.
    The queues are empty: the rows a peek pops the writer's receive would pop anyway."""
    import datetime

    import torch.distributed as dist

    from multirank_logger.channel.row_channel import RowChannel
    from multirank_logger.watch.watch import PEEK_S

    period = PEEK_S or 0.5
    print(f"peek: RowChannel.peek every {period:g} s over R-1 senders' queues, {seconds:.0f} s each")
    for ranks in ranks_list:
        port = free_port()
        server = dist.TCPStore("127.0.0.1", port, None, True, datetime.timedelta(seconds=10), wait_for_workers=False)
        channel = RowChannel(f"peek-{ranks}", 0, ranks, host="127.0.0.1", port=port)
        channel.peek()  # connected
        cpu0, wall0, n = time.process_time(), time.monotonic(), 0
        while time.monotonic() - wall0 < seconds:
            channel.peek()
            n += 1
            time.sleep(period)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        print(f"  {ranks:>4} ranks: {cpu / n * 1e3:.2f} ms CPU per peek, {cpu / wall:.2%} of a core", flush=True)
        channel.close()
        del server


def ddp_latency(flush_interval: float, probes: int) -> None:
    """`_watch_latency_train.py` twice, the watch as it is and without its peek: each NaN's latency."""
    import statistics
    import tempfile

    script = Path(__file__).resolve().parent / "_watch_latency_train.py"
    print(f"end to end: 4 ranks (gather, DDP on CPU), flush_interval {flush_interval:g} s, {probes} NaNs "
          f"(rank i % 4), from the rank's self.log to rank 0's alert; target: flush_interval + 2 s")
    for mode in ("peek", "no-peek"):
        with tempfile.TemporaryDirectory() as tmp:
            args = [sys.executable, str(script), "--db", f"{tmp}/runs.duckdb", "--out", tmp,
                    "--flush-interval", str(flush_interval), "--probes", str(probes)]
            proc = subprocess.run(args + (["--no-peek"] if mode == "no-peek" else []), capture_output=True, text=True)
            if proc.returncode:
                raise SystemExit(f"{mode}: the training failed:\n{proc.stderr[-3000:]}")
            logged = {}
            for path in Path(tmp).glob("logged-*.jsonl"):
                for line in path.read_text().splitlines():
                    row = json.loads(line)
                    logged[row["key"]] = row
            alerts = {}
            alerts_file = Path(tmp) / "alerts.jsonl"
            for line in alerts_file.read_text().splitlines() if alerts_file.exists() else []:
                row = json.loads(line)
                alerts.setdefault(row["key"], row)
        late = {key: alerts[key]["t"] - row["t"] for key, row in logged.items() if key in alerts}
        for who, ranks in (("ranks 1-3 (sent to rank 0)", {1, 2, 3}), ("rank 0 (its own rows)", {0})):
            got = sorted(v for k, v in late.items() if logged[k]["rank"] in ranks)
            n = sum(1 for row in logged.values() if row["rank"] in ranks)
            if got:
                print(f"  {mode:>7} {who:<27} {len(got)}/{n} alerted: median {statistics.median(got):.2f} s, "
                      f"max {got[-1]:.2f} s  {[round(v, 2) for v in got]}", flush=True)
            else:
                print(f"  {mode:>7} {who:<27} 0/{n} alerted", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--ranks", type=int, nargs="*", default=[2, 16, 256], help="the paced feeds' ranks (none: skip)")
    parser.add_argument("--clean-runs", type=int, default=100)
    parser.add_argument("--long-steps", type=int, default=20_000, help="steps of the unpaced 256-rank run (0: none)")
    parser.add_argument("--ddp-latency", type=int, default=0, metavar="NANS",
                        help="the end-to-end latency on a real 4-rank training with NANS NaNs, then exit (0: none)")
    parser.add_argument("--flush-interval", type=float, default=5.0, help="--ddp-latency's flush_interval")
    parser.add_argument("--peek-cost", type=int, nargs="*", default=[], metavar="RANKS",
                        help="what the watch's look at the received rows costs at RANKS ranks (--seconds each), then exit")
    parser.add_argument("--one", nargs=3, metavar=("RANKS", "SECONDS", "WATCH"), help=argparse.SUPPRESS)
    parser.add_argument("--long", nargs=2, type=int, metavar=("RANKS", "STEPS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(int(args.one[0]), float(args.one[1]), args.one[2] == "1")))
        return
    if args.long:
        print(json.dumps(long_run(*args.long)))
        return
    if args.peek_cost:
        peek_cost(args.peek_cost, args.seconds)
    if args.ddp_latency:
        ddp_latency(args.flush_interval, args.ddp_latency)
    if args.peek_cost or args.ddp_latency:
        return
    if args.ranks:
        paced(args.ranks, args.seconds)
    if args.long_steps:
        proc = subprocess.run([sys.executable, __file__, "--long", "256", str(args.long_steps)], capture_output=True,
                              text=True, check=True)
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"\nunpaced: 256 ranks x {KEYS} keys x {row['steps']:,} steps ({row['rows']:,} rows) judged in "
              f"{row['cpu_s']:.1f} CPU s: {row['rows_per_cpu_s']:,.0f} rows per CPU second "
              f"({row['rows_per_cpu_s'] / (256 * KEYS * STEPS_PER_S):.0f}x the paced feed); peak RSS at each tenth "
              f"(MiB): {row['peak_rss_mib_by_tenth']}; steps held per key at the end: {row['held_steps_per_key']}",
              flush=True)
    if args.clean_runs:
        print("\nfalse alarms on seeded clean noisy runs (tests/helpers/planted_rows.py), fed 10 steps at a time:")
        rows = false_alarms(args.clean_runs) + false_alarms(max(1, args.clean_runs // 4), (3, 8), steps=1000)
        for row in rows:
            print(f"  {row['ranks']:>3} ranks x {row['steps']} steps: watch {row['watch_false_alarms']}/{row['runs']} "
                  f"runs, report {row['report_false_alarms']}/{row['runs']}", flush=True)


if __name__ == "__main__":
    main()
