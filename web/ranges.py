"""Date ranges and months: what people bill by (days, month to date, last month), over the hourly periods.

Pure. A range is whole UTC days, first and last included; presets are relative to "today" (UTC) of an injected
clock. `from`/`to` query arguments are ISO dates (`2026-01-31`); anything else, a range that ends before it starts or
one longer than `MAX_DAYS`, is refused (the views answer 400). The figures of a range's periods are summed per day
and per month by `web.model.group`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

DAY_MS = 86_400_000
MAX_DAYS = 400
"""The longest range one request may ask for: a little more than a year."""

PRESETS = {
    "today": "Today",
    "last-7-days": "Last 7 days",
    "last-30-days": "Last 30 days",
    "month-to-date": "Month to date",
    "last-month": "Last month",
}
DEFAULT_PRESET = "month-to-date"

_DATE = re.compile(r"\d{4}-\d{2}-\d{2}", re.ASCII)
_MONTH = re.compile(r"\d{4}-\d{2}", re.ASCII)


class RangeError(ValueError):
    """A date range or month that cannot be read; the message says what is expected."""


@dataclass(frozen=True, slots=True)
class RangeProblem:
    """A range a page could not read: why, and what was typed (kept in the form, beside the message)."""

    message: str
    typed_from: str = ""
    typed_to: str = ""
    typed_range: str = ""


@dataclass(frozen=True, slots=True)
class DateRange:
    """Whole UTC days from `first` to `last`, both included; `preset` names it when it is one."""

    first: date
    last: date
    preset: str | None = None

    @property
    def start_ms(self) -> int:
        return _ms(self.first)

    @property
    def end_ms(self) -> int:
        """Exclusive: midnight after `last`."""
        return _ms(self.last) + DAY_MS

    @property
    def label(self) -> str:
        span = (
            self.first.isoformat()
            if self.first == self.last
            else f"{self.first.isoformat()} to {self.last.isoformat()}"
        )
        return f"{PRESETS[self.preset]} ({span})" if self.preset else span

    def days(self) -> list[date]:
        return [self.first + timedelta(days=n) for n in range((self.last - self.first).days + 1)]

    def as_json(self) -> dict[str, object]:
        return {
            "from": self.first.isoformat(),
            "to": self.last.isoformat(),
            "preset": self.preset,
            "start_ms": self.start_ms,
            "end_ms": self.end_ms,
        }


def today_of(now_ms: int) -> date:
    return datetime.fromtimestamp(now_ms / 1000, tz=UTC).date()


def preset_range(name: str, today: date) -> DateRange:
    if name == "today":
        return DateRange(today, today, name)
    if name == "last-7-days":
        return DateRange(today - timedelta(days=6), today, name)
    if name == "last-30-days":
        return DateRange(today - timedelta(days=29), today, name)
    if name == "month-to-date":
        return DateRange(today.replace(day=1), today, name)
    if name == "last-month":
        last = today.replace(day=1) - timedelta(days=1)
        return DateRange(last.replace(day=1), last, name)
    raise RangeError(f"range is one of {', '.join(PRESETS)}")


def parse_range(
    range_name: str | None, from_text: str | None, to_text: str | None, today: date, default: str | None = None
) -> DateRange | None:
    """The range a request asks for: `from` and `to` (ISO dates; one alone is a single day... to today for `from`),
    else the preset `range`, else `default` (None: no range). RangeError on anything else."""
    if from_text or to_text:
        first = parse_date(from_text, "from") if from_text else None
        last = parse_date(to_text, "to") if to_text else None
        first = first or last
        last = last or today
        if first is None or last < first:
            raise RangeError("to is before from: a range ends on or after the day it starts")
        if (last - first).days + 1 > MAX_DAYS:
            raise RangeError(f"a range is at most {MAX_DAYS} days")
        return DateRange(first, last)
    if range_name:
        return preset_range(range_name, today)
    return preset_range(default, today) if default else None


def parse_date(text: str, name: str) -> date:
    if not _DATE.fullmatch(text):
        raise RangeError(f"{name} is a date such as 2026-01-31")
    try:
        return date.fromisoformat(text)
    except ValueError as exc:
        raise RangeError(f"{name} is a date such as 2026-01-31") from exc


def parse_month(text: str) -> DateRange:
    """`2026-01` -> its whole month."""
    if not _MONTH.fullmatch(text):
        raise RangeError("a month is written such as 2026-01")
    try:
        first = date(int(text[:4]), int(text[5:7]), 1)
    except ValueError as exc:
        raise RangeError("a month is written such as 2026-01") from exc
    following = (first + timedelta(days=32)).replace(day=1)
    return DateRange(first, following - timedelta(days=1))


def day_of(start_ms: int) -> str:
    return datetime.fromtimestamp(start_ms / 1000, tz=UTC).date().isoformat()


def _ms(day: date) -> int:
    return int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()) * 1000
