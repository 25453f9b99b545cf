"""The catalog as a history of prices: pricing at a click's time, changes and their refusals, the file and its
upgrade, and the catalog as a replay of a batch saw it. Its store, the database, is tested in
tests/integration/test_catalog_history_in_database.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from billing.catalog import END_OF_TIME, Ad, AdChange, Catalog, CatalogError, PriceChange, Unbillable
from billing.catalog_changes import AdRequest, ad_line_change, parse_price
from billing.store.catalog_file import load_catalog, save_catalog

T0 = 1_767_225_600_000  # 2026-01-01T00:00Z
M = 60_000
NOW = T0 + 10 * M

BASE = Catalog([Ad("ad-1", "cmp-1", "adv-1", 250_000, "EUR"), Ad("ad-2", "cmp-2", "adv-2", 1_000_000, "USD")])


def change(action: str, ad_id: str, at_ms: int, catalog: Catalog = BASE, **given: object) -> Catalog:
    return catalog.with_change(AdRequest(action, ad_id, **given).change(at_ms, catalog), NOW)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("at_ms", "expected"),
    [
        # Before the change: the price from the beginning.
        (NOW + M - 1, 250_000),
        # Exactly at its effective_from: the new price (the entry with the greatest effective_from at or before).
        (NOW + M, 1_250_000),
        # The pause takes effect at its millisecond.
        (NOW + 2 * M - 1, 1_250_000),
        (NOW + 2 * M, Unbillable.AD_PAUSED),
        # Resumed at the price it had before the pause.
        (NOW + 3 * M, 1_250_000),
    ],
)
def test_a_click_is_priced_at_the_entry_in_force_at_its_time(at_ms: int, expected: int | Unbillable) -> None:
    catalog = change("set-price", "ad-1", NOW + M, cpc_micros="1250000")
    catalog = change("pause", "ad-1", NOW + 2 * M, catalog)
    catalog = change("resume", "ad-1", NOW + 3 * M, catalog)
    priced = catalog.price("ad-1", at_ms)
    assert (priced if isinstance(priced, Unbillable) else priced[1]) == expected
    assert catalog.version == 3
    assert [p.version for p in catalog["ad-1"].prices] == [0, 1, 2, 3]


def test_a_new_ad_is_unknown_before_its_first_entry_and_priced_from_it() -> None:
    catalog = change("create-ad", "ad-9", NOW, campaign_id="cmp-1", advertiser_id="adv-1", currency="EUR",
                     cpc_micros=70_000)  # fmt: skip
    assert catalog.price("ad-9", NOW - 1) == Unbillable.UNKNOWN_AD
    assert catalog.price("ad-9", NOW) == (catalog["ad-9"], 70_000)
    assert catalog.price("ad-nope", NOW) == Unbillable.UNKNOWN_AD
    assert BASE.price("ad-9", NOW) == Unbillable.UNKNOWN_AD  # the catalog is immutable: a change makes a new one


def test_two_changes_at_the_same_time_the_later_one_wins() -> None:
    catalog = change("set-price", "ad-1", NOW + M, cpc_micros=1)
    catalog = change("set-price", "ad-1", NOW + M, catalog, cpc_micros=2)
    assert catalog.price("ad-1", NOW + M)[1] == 2  # type: ignore[index]


@pytest.mark.parametrize(
    ("action", "ad_id", "at_ms", "given", "message"),
    [
        ("set-price", "ad-1", NOW - 1, {"cpc_micros": 1}, "is in the past"),
        ("set-price", "ad-1", NOW, {"cpc_micros": "-5"}, "must not be negative"),
        ("set-price", "ad-1", NOW, {"cpc_micros": "0.25"}, "whole number of micros"),
        ("set-price", "ad-1", NOW, {"cpc_micros": 2.5}, "whole number of micros"),
        ("set-price", "ad-1", NOW, {"cpc_micros": True}, "whole number of micros"),
        ("set-price", "ad-1", NOW, {"cpc_micros": 1, "advertiser_id": "adv-2"}, "never change"),
        ("set-price", "ad-1", NOW, {"cpc_micros": 1, "campaign_id": "cmp-9"}, "never change"),
        ("set-price", "ad-1", NOW, {"cpc_micros": 1, "currency": "USD"}, "never change"),
        ("set-price", "ad-9", NOW, {"cpc_micros": 1}, "unknown ad ad-9"),
        ("pause", "ad-9", NOW, {}, "unknown ad ad-9"),
        ("resume", "ad-1", NOW, {}, "is not paused"),
        (
            "create-ad",
            "ad-9",
            NOW,
            {"cpc_micros": 1, "campaign_id": "cmp-2", "advertiser_id": "adv-1", "currency": "EUR"},
            "campaign cmp-2 belongs to advertiser adv-2",
        ),
        ("create-ad", "ad-1", NOW, {"cpc_micros": 1, "campaign_id": "c", "advertiser_id": "a", "currency": "EUR"},
         "exists already"),
        ("create-ad", "ad-9", NOW, {"cpc_micros": 1, "campaign_id": "c", "advertiser_id": "a"}, "give its currency"),
        ("create-ad", "ad-9", NOW, {"cpc_micros": 1, "campaign_id": "c", "advertiser_id": "a", "currency": "eur"},
         "ISO 4217"),
    ],
)  # fmt: skip
def test_refusals_say_why_in_one_line(
    action: str, ad_id: str, at_ms: int, given: dict[str, object], message: str
) -> None:
    with pytest.raises(CatalogError) as refused:
        change(action, ad_id, at_ms, **given)  # type: ignore[arg-type]
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_backfill_may_take_effect_in_the_past_and_nothing_else_may() -> None:
    past = AdChange("ad-1", T0, 9)
    with pytest.raises(CatalogError):
        BASE.with_change(past, NOW)
    assert BASE.with_change(past, NOW, backfill=True).price("ad-1", T0)[1] == 9  # type: ignore[index]


def test_the_catalog_as_of_a_version_is_what_it_was_then() -> None:
    v1 = change("set-price", "ad-1", NOW + M, cpc_micros=5)
    v2 = change("create-ad", "ad-9", NOW, v1, campaign_id="cmp-1", advertiser_id="adv-1", currency="EUR",
                cpc_micros=7)  # fmt: skip
    assert v2.as_of(1) == v1
    assert v2.as_of(0).to_json() == Catalog(BASE, 0).to_json() == BASE.to_json()
    assert "ad-9" not in v2.as_of(1)
    assert v2.as_of(5) is v2


def test_what_the_changes_since_a_version_reprice_is_exactly_the_time_they_move_a_price() -> None:
    def backfill(catalog: Catalog, ad_id: str, at_ms: int, cpc_micros: int | None, **owners: str) -> Catalog:
        return catalog.with_change(AdChange(ad_id, at_ms, cpc_micros, **owners), NOW, backfill=True)

    assert BASE.repriced_since(0) == []
    # A price back-filled from T0 until the next entry of the history (there is none: for ever).
    v1 = backfill(BASE, "ad-1", T0, 400_000)
    assert v1.repriced_since(0) == [(T0, END_OF_TIME)]
    assert v1.repriced_since(1) == []
    # A price set at a later time moves the time from it on; the earlier span ends where it begins.
    v2 = backfill(v1, "ad-1", T0 + 5 * M, 100_000)
    assert v2.repriced_since(1) == [(T0 + 5 * M, END_OF_TIME)]
    # A pause between two entries moves its own span only; the same price set again moves nothing.
    v3 = backfill(v2, "ad-2", T0 + M, None)
    v4 = backfill(v3, "ad-2", T0 + 2 * M, 1_000_000)
    assert v4.repriced_since(2) == [(T0 + M, T0 + 2 * M)]
    v5 = backfill(v4, "ad-1", T0 + 5 * M, 100_000)
    assert v5.repriced_since(4) == []
    # A back-fill undone by the next: nothing moved since before either.
    v6 = backfill(backfill(v5, "ad-1", T0 + 7 * M, 1), "ad-1", T0 + 7 * M, 100_000)
    assert v6.repriced_since(5) == []
    # A new ad back-filled from its creation; spans of several ads merge where they meet or overlap.
    v7 = backfill(v6, "ad-9", T0 + 3 * M, 7, campaign_id="cmp-1", advertiser_id="adv-1", currency="EUR")
    assert v7.repriced_since(6) == [(T0 + 3 * M, END_OF_TIME)]
    assert v7.repriced_since(2) == [(T0 + M, T0 + 2 * M), (T0 + 3 * M, END_OF_TIME)]
    # A catalog older than the version asked about was replaced, not changed: every time may have moved.
    assert BASE.repriced_since(3) == [(0, END_OF_TIME)]


def test_the_file_round_trips_and_an_older_file_becomes_a_history_from_the_beginning(tmp_path: Path) -> None:
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"ads": [{"ad_id": "a", "campaign_id": "c", "advertiser_id": "v", "cpc_micros": 5,
                                        "currency": "EUR"}]}))  # fmt: skip
    upgraded = load_catalog(old)
    assert upgraded["a"].prices == (PriceChange(0, 5, 0),)
    assert upgraded.price("a", 1) == (upgraded["a"], 5)
    path = tmp_path / "catalog.json"
    catalog = change("pause", "ad-2", NOW + M)
    save_catalog(catalog, path)
    assert load_catalog(path) == catalog
    assert json.loads(path.read_text())["format"] == 3


def test_recorded_ad_lines_create_set_and_pause() -> None:
    created = BASE.with_change(
        ad_line_change({"type": "ad", "ad_id": "a9", "campaign_id": "c1", "advertiser_id": "adv1",
                        "currency": "EUR", "effective_from": T0, "cpc_micros": 250_000}),
        NOW,
        backfill=True,
    )  # fmt: skip
    paused = created.with_change(ad_line_change({"ad_id": "a9", "effective_from": T0 + M, "cpc_micros": None}), NOW,
                                 backfill=True)  # fmt: skip
    assert paused.price("a9", T0) == (paused["a9"], 250_000)
    assert paused.price("a9", T0 + M) == Unbillable.AD_PAUSED
    with pytest.raises(CatalogError):
        ad_line_change({"ad_id": "a9", "effective_from": "soon"})


def test_prices_are_whole_micros_up_to_63_bits() -> None:
    assert parse_price(" 250000 ") == 250_000
    assert parse_price(2**63 - 1) == 2**63 - 1
    with pytest.raises(CatalogError):
        parse_price(2**63)
