"""`_util/prefetch.prefetched`: a generator run one item ahead on its own thread (the report's pass
reads the next window while this one is computed). Every item in order, the producer's error
raised where it happened, and a caller that stops early leaves no producer running."""

from __future__ import annotations

import threading

import pytest

from multirank_logger._util.prefetch import prefetched


def test_items_in_order_made_on_another_thread() -> None:
    made_on = set()

    def produce():
        for i in range(50):
            made_on.add(threading.get_ident())
            yield i

    assert list(prefetched(produce)) == list(range(50))
    assert made_on and threading.get_ident() not in made_on


def test_the_producers_error_is_raised_after_the_items_before_it() -> None:
    def produce():
        yield 1
        yield 2
        raise ValueError("window 3 could not be read")

    got = []
    with pytest.raises(ValueError, match="window 3"):
        for item in prefetched(produce):
            got.append(item)
    assert got == [1, 2]


def test_a_caller_that_stops_early_closes_the_producer() -> None:
    closed = threading.Event()

    def produce():
        try:
            yield from range(10**9)
        finally:
            closed.set()  # what a `with connect()` in the producer would close

    items = prefetched(produce)
    for item in items:
        if item == 3:
            break
    items.close()  # what leaving a for loop over a generator expression does at collection
    assert closed.wait(5)
    assert not [t for t in threading.enumerate() if t.name == "multirank-logger-prefetch"]
