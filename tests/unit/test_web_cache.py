"""A worker's one-second memory of dashboards."""

from __future__ import annotations

import threading

import pytest

from web.cache import RecentResults


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_value_is_kept_for_its_time_then_computed_again() -> None:
    clock = Clock()
    cache = RecentResults(1.0, clock=clock)
    calls: list[int] = []

    def compute() -> int:
        calls.append(1)
        return len(calls)

    assert cache.get("k", compute) == 1
    clock.now += 0.99
    assert cache.get("k", compute) == 1
    clock.now += 0.02
    assert cache.get("k", compute) == 2
    assert cache.get("other", compute) == 3


def test_no_time_means_no_memory() -> None:
    cache = RecentResults(0)
    values = iter(range(10))
    assert [cache.get("k", lambda: next(values)) for _ in range(3)] == [0, 1, 2]


def test_while_one_thread_refreshes_others_get_the_previous_value() -> None:
    clock = Clock()
    cache = RecentResults(1.0, clock=clock)
    cache.get("k", lambda: "old")
    clock.now += 5
    started, release = threading.Event(), threading.Event()

    def slow() -> str:
        started.set()
        release.wait(5)
        return "new"

    results: list[str] = []
    refresher = threading.Thread(target=lambda: results.append(cache.get("k", slow)))
    refresher.start()
    started.wait(5)
    assert cache.get("k", lambda: "should not be computed twice") == "old"
    release.set()
    refresher.join(5)
    assert results == ["new"] and cache.get("k", lambda: "x") == "new"


def test_a_failed_computation_is_not_kept_and_does_not_block_the_next() -> None:
    cache = RecentResults(1.0, clock=Clock())

    def boom() -> str:
        raise RuntimeError("redis went away")

    with pytest.raises(RuntimeError):
        cache.get("k", boom)
    assert cache.get("k", lambda: "fine") == "fine"


def test_the_number_of_entries_is_bounded() -> None:
    clock = Clock()
    cache = RecentResults(1.0, max_entries=3, clock=clock)
    for key in range(10):
        cache.get(key, lambda: "v")
    assert len(cache._values) <= 3
