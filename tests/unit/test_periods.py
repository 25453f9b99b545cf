"""Billing periods: alignment, keys, parsing."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from billing.periods import DEFAULT_PERIOD_MS, Periods, format_utc

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
HOUR = 3_600_000


def test_t0_is_2026_01_01_utc() -> None:
    assert datetime.fromtimestamp(T0 // 1000, UTC) == datetime(2026, 1, 1, tzinfo=UTC)


def test_default_period_is_an_hour() -> None:
    assert Periods().length_ms == DEFAULT_PERIOD_MS == HOUR


def test_start_and_key_of_a_timestamp() -> None:
    periods = Periods()
    ts = T0 + 2 * HOUR + 59 * 60_000 + 59_999  # 02:59:59.999
    assert periods.start_of(ts) == T0 + 2 * HOUR
    assert periods.end_of(ts) == T0 + 3 * HOUR
    assert periods.key_of(ts) == "20260101T0200Z"
    assert periods.key_of(T0 + 3 * HOUR) == "20260101T0300Z"  # the end is exclusive


def test_key_has_no_colon_and_round_trips() -> None:
    periods = Periods(15 * 60_000)
    start = T0 + 45 * 60_000
    key = periods.key(start)
    assert key == "20260101T0045Z"
    assert ":" not in key and "/" not in key
    assert periods.parse_key(key) == start


def test_key_refuses_a_timestamp_that_is_not_a_period_start() -> None:
    with pytest.raises(ValueError, match="not the start"):
        Periods().key(T0 + 1)


@pytest.mark.parametrize(
    "bad", ["2026-01-01T00:00Z", "20260101T0000", "20261301T0000Z", "20260101T2400Z", "", "x20260101T0000Z"]
)
def test_parse_key_refuses_bad_keys(bad: str) -> None:
    with pytest.raises(ValueError, match="period key"):
        Periods().parse_key(bad)


def test_parse_key_refuses_a_key_of_another_period_length() -> None:
    with pytest.raises(ValueError, match="not the start"):
        Periods().parse_key("20260101T0030Z")


@pytest.mark.parametrize("length", [0, -HOUR, 30_000, 7 * 60_000, 2 * 86_400_000])
def test_period_length_must_be_whole_minutes_dividing_a_day(length: int) -> None:
    with pytest.raises(ValueError, match="divides a day"):
        Periods(length)


def test_period_length_must_be_an_integer() -> None:
    with pytest.raises(TypeError):
        Periods(3_600_000.0)  # type: ignore[arg-type]


def test_range_keys_cover_the_half_open_interval() -> None:
    periods = Periods()
    assert periods.range_keys(T0 + 30 * 60_000, T0 + 2 * HOUR) == ["20260101T0000Z", "20260101T0100Z"]
    assert periods.range_keys(T0, T0 + 2 * HOUR + 1) == ["20260101T0000Z", "20260101T0100Z", "20260101T0200Z"]
    assert periods.range_keys(T0, T0) == []


def test_days_roll_over_in_utc() -> None:
    periods = Periods(6 * HOUR)
    assert periods.key_of(T0 - 1) == "20251231T1800Z"
    assert periods.range_keys(T0 - HOUR, T0 + HOUR) == ["20251231T1800Z", "20260101T0000Z"]


def test_format_utc_is_iso_8601_with_z() -> None:
    assert format_utc(T0 + 5_007) == "2026-01-01T00:00:05.007Z"
    assert format_utc(0) == "1970-01-01T00:00:00.000Z"
