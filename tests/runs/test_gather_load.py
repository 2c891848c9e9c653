"""A small version of benchmarks/bench_gather_load.py: senders pushing rows as fast as they can
through the real gather channel into one rank 0 with a real DuckDB store; every row stored
exactly once (the benchmark's own check, which raises on a missing, duplicated or undelivered row)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.bench_gather_load import KEYS, _check_exactly_once, run_load


def test_every_row_of_every_sender_is_stored_exactly_once(tmp_path: Path) -> None:
    """6 senders for 2 s (tens of thousands of calls each): run_load checks per rank the row count,
    distinct (seq, key), seq 0..n-1, and that no sender kept or spilled a row."""
    result = run_load(6, 2.0, str(tmp_path / "load.duckdb"))
    assert result["senders"] == 6 and result["calls_per_sender_min"] > 0
    assert result["rows"] % len(KEYS) == 0


@pytest.mark.parametrize(
    "stats",
    [
        {1: (30, 30, 3, 0, 2), 2: (31, 30, 3, 0, 2)},  # a row stored twice
        {1: (30, 30, 3, 0, 2), 2: (20, 20, 2, 0, 1)},  # a call missing
        {1: (30, 30, 3, 0, 2)},  # a rank missing
    ],
)
def test_the_exactly_once_check_catches_duplicates_and_gaps(stats: dict) -> None:
    sent = [{"rank": r, "flushed": True, "undelivered": 0} for r in (1, 2)]
    with pytest.raises(AssertionError):
        _check_exactly_once({1: 3, 2: 3}, stats, sent)
