"""The catalog as the web UI shows it: an ad's status at a time, and the effective time a form sends."""

from __future__ import annotations

import pytest

from billing.catalog import Ad, CatalogError, PriceChange
from web.ad_catalog import AdStatus, Status, effective_from_json, effective_from_text
from web.model import UnbilledCounts

T = 1_767_225_600_000  # 2026-01-01T00:00Z


def ad(*prices: tuple[int, int | None]) -> Ad:
    entries = tuple(PriceChange(at, price, n) for n, (at, price) in enumerate(prices, start=1))
    return Ad("a1", "c1", "adv1", entries[0].cpc_micros, "EUR", entries)


@pytest.mark.parametrize(
    ("at", "status", "price", "next_from"),
    [
        (T - 1, Status.NOT_YET_LIVE, None, T),  # before its first entry: not live yet, the first entry planned
        (T, Status.LIVE, 250_000, T + 10),  # exactly at the first entry's time
        (T + 10, Status.PAUSED, None, T + 20),  # paused from T + 10
        (T + 20, Status.LIVE, 300_000, None),  # resumed at a new price; nothing planned after
    ],
)
def test_an_ads_status_price_and_next_change_at_a_time(
    at: int, status: Status, price: int | None, next_from: int | None
) -> None:
    s = AdStatus.of(ad((T, 250_000), (T + 10, None), (T + 20, 300_000)), at)
    assert (s.status, s.cpc_micros) == (status, price)
    assert (s.next_change.effective_from if s.next_change else None) == next_from


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", None),  # empty: now, read under the catalog's lock when the change is made
        ("  ", None),
        ("1767225600000", T),  # epoch ms
        ("2026-01-01T00:00", T),  # as a datetime-local field sends it, read as UTC
        ("2026-01-01T00:00:05", T + 5_000),
        ("2026-01-01T00:00:05.25Z", T + 5_250),
        ("2026-01-01 00:01", T + 60_000),
    ],
)
def test_a_forms_effective_time(text: str, expected: int | None) -> None:
    assert effective_from_text(text) == expected


@pytest.mark.parametrize("text", ["tomorrow", "2026-02-30T00:00", "2026-01-01T25:00", "-5", "2026-01-01", "1.5"])
def test_an_effective_time_that_is_no_time_is_refused_in_one_line(text: str) -> None:
    with pytest.raises(CatalogError, match="the effective time is a UTC time such as 2026-01-01 10:00") as refused:
        effective_from_text(text)
    assert "\n" not in str(refused.value)


def test_the_apis_effective_time_is_whole_epoch_ms_or_absent() -> None:
    assert effective_from_json(None) is None and effective_from_json(T) == T
    for value in (True, 1.5, "1767225600000", -1):
        with pytest.raises(CatalogError, match="non-negative number of epoch milliseconds"):
            effective_from_json(value)


def test_unbilled_counts_add_up() -> None:
    total = UnbilledCounts(1, 2) + UnbilledCounts(3, 4)
    assert total == UnbilledCounts(4, 6) and not total.is_zero and UnbilledCounts().is_zero
