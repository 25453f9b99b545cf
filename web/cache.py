"""What one worker process keeps for about a second: many people watching the same advertiser cost one Redis read
and one rendering per second, however many requests they make.

Only results that any permitted person would see alike are kept (an advertiser's dashboard, keyed by advertiser and
period), and only after the request's access check passed: the cache never decides who sees what. The stream
writes every few seconds and the dashboard polls every three, so a second of age is not visible.

When a value expires, one request computes the new one while the others still get the old one for that moment,
so that a busy second never makes every thread read and render the same page at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import TypeVar

T = TypeVar("T")


class RecentResults:
    """Values by key for `ttl_s` seconds (0: not kept at all), at most `max_entries` of them."""

    def __init__(self, ttl_s: float, max_entries: int = 1024, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.clock = clock
        self._values: dict[Hashable, tuple[float, object]] = {}
        self._refreshing: set[Hashable] = set()
        self._lock = threading.Lock()

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        """The value kept for `key` if it is fresh, else `compute()`'s, kept for next time."""
        if self.ttl_s <= 0:
            return compute()
        now = self.clock()
        found = self._values.get(key)
        if found is not None:
            if found[0] > now:
                return found[1]  # type: ignore[return-value]
            with self._lock:
                if key in self._refreshing:
                    return found[1]  # type: ignore[return-value]  # another thread is computing it right now
                self._refreshing.add(key)
        try:
            value = compute()
            with self._lock:
                if len(self._values) >= self.max_entries:
                    self._values = {k: v for k, v in self._values.items() if v[0] > now}
                    if len(self._values) >= self.max_entries:
                        self._values.clear()
                self._values[key] = (self.clock() + self.ttl_s, value)
            return value
        finally:
            with self._lock:
                self._refreshing.discard(key)
