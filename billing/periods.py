"""Billing periods: fixed, UTC-aligned slices of time (an hour unless configured), named by a path-safe key.

A period key such as `20260101T0000Z` is the period's UTC start; it sorts like time and holds no colon, so it
is safe in Hadoop/Parquet partition paths and Redis keys.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

DEFAULT_PERIOD_MS = 3_600_000
"""One hour."""

DAY_MS = 86_400_000
MINUTE_MS = 60_000

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_KEY_PATTERN = re.compile(r"(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})Z", re.ASCII)


def _datetime_of(ts_ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=ts_ms)


def format_utc(ts_ms: int) -> str:
    """ISO-8601 UTC with milliseconds and a `Z`, such as `2026-01-01T00:00:05.000Z`."""
    return _datetime_of(ts_ms).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def format_elapsed(ms: int) -> str:
    """A span of time for people: `42 s`, `7 min`, `3 h` (rounded down)."""
    seconds = max(0, ms) // 1000
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


@dataclass(frozen=True)
class Periods:
    """Billing periods of `length_ms`, aligned on the UTC epoch, so on midnight UTC every day."""

    length_ms: int = DEFAULT_PERIOD_MS

    def __post_init__(self) -> None:
        length = self.length_ms
        if isinstance(length, bool) or not isinstance(length, int):
            raise TypeError(f"a period length is an integer number of milliseconds, got {length!r}")
        if length <= 0 or length % MINUTE_MS or DAY_MS % length:
            raise ValueError(
                f"a period length must be a positive whole number of minutes that divides a day evenly, got {length} ms"
            )

    def start_of(self, ts_ms: int) -> int:
        """The start (epoch ms) of the period holding `ts_ms`."""
        return ts_ms - ts_ms % self.length_ms

    def end_of(self, ts_ms: int) -> int:
        """The exclusive end (epoch ms) of the period holding `ts_ms`."""
        return self.start_of(ts_ms) + self.length_ms

    def key_of(self, ts_ms: int) -> str:
        """The key of the period holding `ts_ms`."""
        return self.key(self.start_of(ts_ms))

    def key(self, start_ms: int) -> str:
        """The key `YYYYMMDDTHHMMZ` of the period starting at `start_ms`; ValueError if not a period start."""
        if start_ms % self.length_ms:
            raise ValueError(f"{format_utc(start_ms)} is not the start of a {self.length_ms} ms period")
        return _datetime_of(start_ms).strftime("%Y%m%dT%H%MZ")

    def parse_key(self, key: str) -> int:
        """The start (epoch ms) of the period named `key`; ValueError on anything but a period key."""
        match = _KEY_PATTERN.fullmatch(key) if isinstance(key, str) else None
        if match is None:
            raise ValueError(f"{key!r} is not a period key such as 20260101T0000Z")
        try:
            year, month, day, hour, minute = (int(part) for part in match.groups())
            start = datetime(year, month, day, hour, minute, tzinfo=UTC)
        except ValueError as exc:
            raise ValueError(f"{key!r} is not a period key: {exc}") from exc
        start_ms = (start - _EPOCH) // timedelta(milliseconds=1)
        if start_ms % self.length_ms:
            raise ValueError(f"{key!r} is not the start of a {self.length_ms} ms period")
        return start_ms

    def range_keys(self, start_ms: int, end_ms: int) -> list[str]:
        """Keys of the periods that overlap the half-open interval [start_ms, end_ms), oldest first."""
        if end_ms <= start_ms:
            return []
        return [self.key(start) for start in range(self.start_of(start_ms), end_ms, self.length_ms)]


ANY_PERIOD = Periods(MINUTE_MS)
"""Reads and names a period key whatever the periods' length (every length is a whole number of minutes): for code
that only has a key, such as a correction's period or an export's."""
