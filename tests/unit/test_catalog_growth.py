"""A catalog grown change by change (`Catalog.grown`: the changed ads layered over the shared ones, made whole
again from time to time) reads exactly as the same catalog built whole: the same ads in the same order, the same
prices, budgets and exclusions, the same JSON; an ad read from a store, built without its checks, is the ad built with
them."""

from __future__ import annotations

import gc
import random
from dataclasses import astuple

import pytest

from billing.catalog import Ad, AdChange, Catalog, PriceChange, Unbillable, _Layered, generate_catalog
from billing.store.catalog_db import collector_paused

NOW = 1_800_000_000_000


@pytest.mark.parametrize("flatten_at", [3, 16, 4096])
def test_a_catalog_grown_by_hundreds_of_changes_reads_as_the_same_catalog_built_whole(
    flatten_at: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_Layered, "FLATTEN_AT", flatten_at)
    rng = random.Random(flatten_at)
    catalog = generate_catalog(10, 5, 4, seed=3)  # 200 ads
    ads = catalog.ad_ids
    layered = 0
    for step in range(300):
        at = NOW + step
        roll = rng.random()
        if roll < 0.1:
            owner = catalog[rng.choice(ads)]
            ad_id = f"new-{step}"
            change = AdChange(
                ad_id, at, rng.randrange(1, 10**6), owner.campaign_id, owner.advertiser_id, owner.currency
            )
            ads.append(ad_id)
        elif roll < 0.2:
            change = AdChange(rng.choice(ads), at, None)
        else:
            change = AdChange(rng.choice(ads), at + rng.randrange(0, 10**6), rng.randrange(0, 10**7))
        catalog = catalog.with_change(change, at)
        if step % 50 == 7:
            catalog = catalog.with_budget(catalog[rng.choice(ads)].campaign_id, at, rng.randrange(10**6, 10**9), at)
        layered += isinstance(catalog._ads, _Layered)
        whole = Catalog.from_json(catalog.to_json())
        assert catalog.ad_ids == whole.ad_ids
        assert len(catalog) == len(whole) and list(catalog) == list(whole)
        probe = rng.choice(ads)
        assert probe in catalog and catalog.get(probe) == whole.get(probe)
        assert catalog.price(probe, at + 10**7) == whole.price(probe, at + 10**7)
        assert "no-such-ad" not in catalog and catalog.get("no-such-ad") is None
    assert catalog.version == 300 + 6
    assert catalog == Catalog.from_json(catalog.to_json())
    if flatten_at > 3:
        assert layered > 0, "changes were layered over the shared ads, not copied"


def test_a_change_shares_the_unchanged_ads_instead_of_copying_them() -> None:
    catalog = generate_catalog(50, 10, 4, seed=2)
    changed = catalog.with_change(AdChange(catalog.ad_ids[5], NOW, 7), NOW)
    assert isinstance(changed._ads, _Layered) and changed._ads.base is catalog._ads
    assert changed[catalog.ad_ids[5]].price_at(NOW) == 7 and catalog[catalog.ad_ids[5]].price_at(NOW) != 7


def test_a_campaigns_ads_and_each_ads_advertiser_are_read_through_the_catalog_as_it_grows() -> None:
    catalog = generate_catalog(2, 2, 3, seed=4)
    campaign = catalog.campaign_ids[0]
    before = [ad.ad_id for ad in catalog if ad.campaign_id == campaign]
    assert [ad.ad_id for ad in catalog.ads_of_campaign(campaign)] == before  # the index is made here
    owner = catalog[before[0]]
    grown = catalog.with_change(AdChange("late-ad", NOW, 9, campaign, owner.advertiser_id, owner.currency), NOW)
    grown = grown.with_change(AdChange(before[0], NOW, 11), NOW)
    assert [ad.ad_id for ad in grown.ads_of_campaign(campaign)] == [*before, "late-ad"]
    assert grown.ads_of_campaign(campaign)[0].price_at(NOW) == 11
    assert [ad.ad_id for ad in catalog.ads_of_campaign(campaign)] == before, "the older catalog is unchanged"
    assert grown.ads_of_campaign("no-such-campaign") == []
    assert grown.advertisers_by_ad["late-ad"] == owner.advertiser_id
    assert grown.advertisers_by_ad.get("no-such-ad", "") == "" and len(grown.advertisers_by_ad) == len(grown)


def test_an_advertisers_campaigns_are_read_through_an_index_kept_as_the_catalog_grows() -> None:
    catalog = generate_catalog(3, 2, 2, seed=5)
    advertiser = catalog[catalog.ad_ids[0]].advertiser_id
    owned = sorted({ad.campaign_id for ad in catalog if ad.advertiser_id == advertiser})
    assert catalog.campaigns_of(advertiser) == owned  # the index is made here
    currency = catalog.currency_of(advertiser) or ""
    grown = catalog.with_change(AdChange("new-ad", NOW, 9, "a-new-campaign", advertiser, currency), NOW)
    grown = grown.with_change(AdChange("newer-ad", NOW, 9, "zz-campaign", "a-new-advertiser", "JPY"), NOW)
    assert grown.campaigns_of(advertiser) == sorted([*owned, "a-new-campaign"])
    assert grown.campaigns_of("a-new-advertiser") == ["zz-campaign"]
    assert catalog.campaigns_of(advertiser) == owned, "the older catalog is unchanged"
    assert grown.campaigns_of("no-such-advertiser") == []
    whole = Catalog.from_json(grown.to_json())
    assert all(grown.campaigns_of(a) == whole.campaigns_of(a) for a in {ad.advertiser_id for ad in whole})


def test_a_catalog_of_no_ads_is_still_a_catalog() -> None:
    empty = Catalog([])
    assert len(empty) == 0 and bool(empty)


def test_an_ad_as_a_store_holds_it_is_the_ad_built_and_checked_from_the_same_values() -> None:
    entries = (PriceChange(NOW, None, 7), PriceChange(0, 150_000, 0), PriceChange(NOW, 90_000, 3))
    checked = Ad("ad-1", "cmp-1", "adv-1", 150_000, "KWD", entries)
    stored = Ad.stored("ad-1", "cmp-1", "adv-1", "KWD", tuple(PriceChange.stored(*astuple(e)) for e in entries))
    assert stored == checked and hash(stored) == hash(checked)
    assert stored.prices == checked.prices and stored.cpc_micros == 150_000
    assert [stored.price_at(t) for t in (0, NOW - 1, NOW)] == [checked.price_at(t) for t in (0, NOW - 1, NOW)]
    assert stored.price_at(NOW) is Unbillable.AD_PAUSED  # version 7 after version 3 at the same time


def test_the_collector_is_paused_while_any_whole_read_runs_and_left_as_found() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():  # a second read overlapping the first
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()  # paused by someone else: not resumed by a read
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
