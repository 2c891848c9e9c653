"""The benchmark suite: ``make bench`` (full), ``make bench-quick`` (sanity check, < 2 min).

    .venv/bin/python benchmarks/run.py [--quick | --tiny] [--only hotpath,memory,ingest,e2e,query,gather,gather_load,scale,read_scale,ui,export]
                                       [--out FILE] [--json FILE] [--in-process]

Sections: hotpath (log_metrics + save per call), memory (RSS over a long run),
ingest (rows/s into the store),
e2e (2-rank DDP wall time), query (rank-0 export and per-rank table on a large store),
gather (the transport's own benchmark, when benchmarks/bench_gather.py exists),
gather_load (32 senders into one rank 0: its sustained rows/s and lag),
scale (256 senders paced at a training's rate into one rank 0: intake, lag, rank 0's CPU
and memory, the senders' memory, the launch's TCPStore latency with and without them), read_scale (report, report -o, per_rank,
rank_spread and export on the 51.2M-row store, each in a fresh process: time and peak RSS at two
sizes; bytes per row on each backend), export (the Parquet export against DuckDB's COPY ... TO of
the same rows: time, peak RSS, bytes per row, at two sizes). Each
figure is a median with min and max; each row names the peer it is divided by. The
table is printed at the end and written to benchmarks/RESULTS.md (full mode, every
section) or benchmarks/.cache/RESULTS-<mode>[-<sections>].md.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._harness import (  # noqa: E402
    BENCH_DIR,
    CACHE_DIR,
    Sizes,
    machine_info,
    markdown_report,
    markdown_table,
    run_cases,
    summarize,
    targets_summary,
)

SECTIONS = ("hotpath", "memory", "ingest", "e2e", "query", "gather", "gather_load", "scale", "read_scale", "ui", "export")

SIZES = {
    "full": Sizes(
        mode="full", rounds=3, inner=2,
        hot_calls=50_000, hot_keys=10,
        ingest_rows=100_000, ingest_batches=5, ingest_small_batches=50,
        e2e_steps=2_000, e2e_metrics=5, e2e_rounds=3,
        query_ranks=8, query_steps=200_000, query_keys=10, query_rounds=3,
        memory_calls=1_000_000, memory_chunks=20,
    ),
    "quick": Sizes(
        mode="quick", rounds=1, inner=2,
        hot_calls=5_000, hot_keys=10,
        ingest_rows=100_000, ingest_batches=2, ingest_small_batches=10,
        e2e_steps=300, e2e_metrics=5, e2e_rounds=1,
        query_ranks=8, query_steps=10_000, query_keys=10, query_rounds=1,
        memory_calls=50_000, memory_chunks=5,
    ),
    # for the smoke test: seconds, in process, numbers meaningless
    "tiny": Sizes(
        mode="tiny", rounds=1, inner=1,
        hot_calls=200, hot_keys=10,
        ingest_rows=2_000, ingest_batches=2, ingest_small_batches=2,
        e2e_steps=10, e2e_metrics=5, e2e_rounds=1,
        query_ranks=2, query_steps=200, query_keys=10, query_rounds=1,
        memory_calls=400, memory_chunks=2,
    ),
}


def section_module(name: str) -> Any:
    """The module that lists a section's cases, or None while its file is not there."""
    if not (BENCH_DIR / f"bench_{name}.py").is_file():
        return None
    # bench_gather.py is another team's `run(quick) -> dict`: an adapter turns it into rows
    return importlib.import_module("benchmarks._gather_adapter" if name == "gather" else f"benchmarks.bench_{name}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="small sizes, one round: a sanity check under 2 min")
    mode.add_argument("--tiny", action="store_true", help="minimal sizes for the smoke test (numbers meaningless)")
    p.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {SECTIONS}")
    p.add_argument("--out", type=Path, help="markdown report (default: RESULTS.md for a full run of every section)")
    p.add_argument("--json", type=Path, help="also write the summarized rows as JSON")
    p.add_argument("--in-process", action="store_true", help="no fresh process per case (RSS then meaningless)")
    p.add_argument("--size", action="append", default=[], metavar="FIELD=N",
                   help="override one size, e.g. --size e2e_steps=6000 (a longer e2e resolves a 3%% overhead)")
    args = p.parse_args(argv)
    args.size_overrides = {}
    for item in args.size:
        field, _, value = item.partition("=")
        if field not in Sizes.__dataclass_fields__ or field == "mode" or not value.isdigit():
            p.error(f"--size {item!r}: expected FIELD=N, FIELD one of {sorted(set(Sizes.__dataclass_fields__) - {'mode'})}")
        args.size_overrides[field] = int(value)
    args.sections = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        p.error(f"unknown section(s) {sorted(unknown)}; choose from {SECTIONS}")
    return args


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    sizes = SIZES["quick" if args.quick else "tiny" if args.tiny else "full"]
    sizes = dataclasses.replace(sizes, **args.size_overrides)
    given = sys.argv[1:] if argv is None else argv
    command = " ".join(["python benchmarks/run.py", *(shlex.quote(a) for a in given)])
    if sizes.mode == "full" and not given:
        command = f"make bench ({command})"
    machine = machine_info()
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for name in args.sections:
        mod = section_module(name)
        cases = mod.cases(sizes) if mod is not None else []
        if not cases:
            notes.append(f"section {name}: benchmarks/bench_{name}.py is not there yet; skipped")
            print(f"== {name}: skipped (no module)", flush=True)
            continue
        t0 = time.perf_counter()
        print(f"== {name} ({len(cases)} cases)", flush=True)
        results = run_cases(cases, sizes, in_process=args.in_process, log=lambda s: print(s, flush=True))
        section_rows = summarize(results)
        rows += section_rows
        print(f"== {name} done in {time.perf_counter() - t0:.0f} s", flush=True)
        notes += getattr(mod, "NOTES", [])
    elapsed = time.perf_counter() - started
    report = markdown_report(rows, command=command, machine=machine, sizes=sizes,
                             elapsed_s=elapsed, notes=notes, in_process=args.in_process)
    # only a full run of every section replaces the committed RESULTS.md
    whole = sizes.mode == "full" and set(args.sections) == set(SECTIONS) and not args.size_overrides
    partial = "" if set(args.sections) == set(SECTIONS) else "-" + "-".join(args.sections)
    out = args.out or (BENCH_DIR / "RESULTS.md" if whole else CACHE_DIR / f"RESULTS-{sizes.mode}{partial}.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)
    # the rows as data too, for comparing runs (a copy always lands in the cache folder)
    for path in filter(None, (args.json, CACHE_DIR / f"rows-{sizes.mode}.json")):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(rows, indent=1, default=str))
    print()
    print(markdown_table(rows))
    print("\n" + "\n".join(targets_summary(rows)))
    print(f"\n{len(rows)} rows in {elapsed / 60:.1f} min; written to {out}")
    return rows


if __name__ == "__main__":
    main()
