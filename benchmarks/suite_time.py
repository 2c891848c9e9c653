"""Where the test suite's time goes, from pytest's JUnit XML: worker-seconds by folder and module,
and with two files the change of each module (a run before and after a change).

    PYTEST_ADDOPTS=--junitxml=/tmp/after.xml make test
    .venv/bin/python benchmarks/suite_time.py /tmp/after.xml [--before /tmp/before.xml] [--top 30]

Compare modules, not totals: two fresh clones of the same commit differ by +-5 % on a shared
2-core host, more than most changes cut. A test's time is its setup, call and teardown; under
`--dist loadgroup` its class name carries ``@group``, dropped here so runs with and without
groups compare.
"""

from __future__ import annotations

import argparse
import collections
import xml.etree.ElementTree as ET


def seconds_by_test(path: str) -> dict[str, float]:
    """{"tests.runs.test_x::test_y[param]": seconds} of one JUnit XML file."""
    out: dict[str, float] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        module = (case.get("classname") or "").split("@")[0]
        if module.split(".")[-1][:1].isupper():  # a test class: its module is one level up
            module = module.rsplit(".", 1)[0]
        test = f"{module}::{(case.get('name') or '').split('@')[0]}"
        out[test] = out.get(test, 0.0) + float(case.get("time") or 0)
    return out


def by_prefix(tests: dict[str, float], depth: int | None) -> collections.Counter[str]:
    """Seconds summed by module (depth None) or by its first `depth` dotted parts (2: the folder)."""
    sums: collections.Counter[str] = collections.Counter()
    for test, secs in tests.items():
        module = test.split("::")[0]
        sums[module if depth is None else ".".join(module.split(".")[:depth])] += secs
    return sums


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("after", help="pytest --junitxml file")
    parser.add_argument("--before", help="an earlier run's file: each module's change")
    parser.add_argument("--top", type=int, default=30, help="modules to list")
    args = parser.parse_args()
    after = seconds_by_test(args.after)
    print(f"{sum(after.values()):,.0f} worker-seconds over {len(after):,} tests ({args.after})")
    for folder, secs in by_prefix(after, 2).most_common():
        print(f"{secs:8.0f}  {folder}")
    modules = by_prefix(after, None)
    if args.before is None:
        print()
        for module, secs in modules.most_common(args.top):
            print(f"{secs:8.0f}  {module}")
        return
    before = seconds_by_test(args.before)
    was = by_prefix(before, None)
    print(f"\nbefore: {sum(before.values()):,.0f} worker-seconds over {len(before):,} tests ({args.before})")
    print(f"{'before':>8} {'after':>8} {'change':>8}  module (largest changes first)")
    for module in sorted(set(was) | set(modules), key=lambda m: -abs(modules[m] - was[m]))[: args.top]:
        print(f"{was[module]:8.0f} {modules[module]:8.0f} {modules[module] - was[module]:+8.0f}  {module}")


if __name__ == "__main__":
    main()
