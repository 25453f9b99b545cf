"""The attribution rule, case by case at explicit timestamps, against a brute-force recomputation, and with invalid
traffic and budgets against the DuckDB oracle on dense traffic."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from billing.catalog import Ad, Catalog
from billing.events import Click, Impression
from billing.rule import ATTRIBUTION_WINDOW_MS, BillableClick, bill
from billing.store.crawler_list import crawler_list
from tests import oracle
from tests.dense_traffic import dense_catalog, dense_events, received_once

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
S = 1_000  # one second in ms

CATALOG = Catalog(
    [
        Ad("ad-1", "cmp-1", "adv-1", 250_000, "EUR"),
        Ad("ad-2", "cmp-2", "adv-2", 1_000_000, "USD"),
    ]
)


def imp(impression_id: str, at: int, ad: str = "ad-1", user: str = "u1") -> Impression:
    return Impression(impression_id, ad, user, at)


def click(click_id: str, at: int, ad: str = "ad-1", user: str = "u1") -> Click:
    return Click(click_id, ad, user, at)


CASES = [
    # The upper edge of the window is inclusive: a click exactly 10 s after its impression is billed.
    pytest.param([imp("i1", T0)], [click("c1", T0 + 10 * S)], {"c1": "i1"}, id="exactly-10s-billed"),
    # One millisecond past the window is not billed.
    pytest.param([imp("i1", T0)], [click("c1", T0 + 10 * S + 1)], {}, id="10s-plus-1ms-not-billed"),
    # A click before its impression is not billed, however close.
    pytest.param([imp("i1", T0)], [click("c1", T0 - 1)], {}, id="click-before-impression"),
    # The lower edge is inclusive too: a click in the same millisecond as the impression is billed.
    pytest.param([imp("i1", T0)], [click("c1", T0)], {"c1": "i1"}, id="same-millisecond-billed"),
    # Two qualifying impressions: the click is billed once, attributed to the latest one.
    pytest.param([imp("i1", T0), imp("i2", T0 + 3 * S)], [click("c1", T0 + 5 * S)], {"c1": "i2"}, id="latest-of-two"),
    # An impression after the click does not qualify, even when it is the latest one.
    pytest.param(
        [imp("i1", T0), imp("i2", T0 + 6 * S)],
        [click("c1", T0 + 5 * S)],
        {"c1": "i1"},
        id="later-imp-ignored",
    ),
    # Two qualifying impressions at the same millisecond: the smallest impression id wins.
    pytest.param(
        [imp("i9", T0 + 2 * S), imp("i3", T0 + 2 * S), imp("i5", T0 + 2 * S)],
        [click("c1", T0 + 4 * S)],
        {"c1": "i3"},
        id="tie-smallest-impression-id",
    ),
    # The same user saw another ad: no impression of this ad, not billed.
    pytest.param([imp("i1", T0, ad="ad-2")], [click("c1", T0 + S, ad="ad-1")], {}, id="same-user-other-ad"),
    # Another user saw this ad: not billed for this user.
    pytest.param([imp("i1", T0, user="u2")], [click("c1", T0 + S, user="u1")], {}, id="other-user-same-ad"),
    # An ad the catalog does not know is not billed (the intake quarantines it).
    pytest.param([imp("i1", T0, ad="ad-x")], [click("c1", T0 + S, ad="ad-x")], {}, id="unknown-ad"),
    # One impression may be the attribution of several clicks: each click is billed (by other users, since the
    # second click of one user on one ad within 30 s is a duplicate click: billing.invalid).
    pytest.param(
        [imp("i1", T0), imp("i2", T0 + S, user="u2")],
        [click("c1", T0 + S), click("c2", T0 + 2 * S, user="u2")],
        {"c1": "i1", "c2": "i2"},
        id="two-clicks",
    ),
    # An identical repeat of a click is billed once.
    pytest.param([imp("i1", T0)], [click("c1", T0 + S), click("c1", T0 + S)], {"c1": "i1"}, id="repeat-once"),
]


@pytest.mark.parametrize(("impressions", "clicks", "expected"), CASES)
def test_attribution_cases(impressions: list[Impression], clicks: list[Click], expected: dict[str, str]) -> None:
    billed = bill(impressions, clicks, CATALOG).charged
    assert {row.click_id: row.impression_id for row in billed} == expected
    assert len(billed) == len(expected)


def test_billable_click_carries_the_ad_price_and_owners() -> None:
    billed = bill([imp("i1", T0, ad="ad-2")], [click("c1", T0 + 2 * S, ad="ad-2")], CATALOG).charged
    assert billed == [
        BillableClick(
            click_id="c1",
            impression_id="i1",
            ad_id="ad-2",
            campaign_id="cmp-2",
            advertiser_id="adv-2",
            user_id="u1",
            click_time=T0 + 2 * S,
            impression_time=T0,
            amount_micros=1_000_000,
            currency="USD",
        )
    ]
    row = billed[0].to_dict()
    assert row["amount_micros"] == 1_000_000 and isinstance(row["amount_micros"], int)
    assert list(row)[:2] == ["click_id", "impression_id"]


def test_result_is_sorted_by_click_id() -> None:
    impressions = [imp(f"i{n}", T0, user=f"u{n}") for n in (5, 1, 3)]
    clicks = [click(f"c{n}", T0 + S, user=f"u{n}") for n in (5, 1, 3)]
    assert [row.click_id for row in bill(impressions, clicks, CATALOG).charged] == ["c1", "c3", "c5"]


def test_conflicting_event_ids_are_refused() -> None:
    with pytest.raises(ValueError, match="share the id 'c1'"):
        bill([imp("i1", T0)], [click("c1", T0 + S), click("c1", T0 + 2 * S)], CATALOG)
    with pytest.raises(ValueError, match="share the id 'i1'"):
        bill([imp("i1", T0), imp("i1", T0 + 1)], [], CATALOG)


def brute_force(impressions: list[Impression], clicks: list[Click], catalog: Catalog) -> dict[str, tuple]:
    """The contract read literally: every click against every impression."""
    result = {}
    for c in clicks:
        ad = catalog.get(c.ad_id)
        if ad is None:
            continue
        qualifying = [
            i
            for i in impressions
            if i.ad_id == c.ad_id and i.user_id == c.user_id and i.event_time <= c.event_time <= i.event_time + 10_000
        ]
        if qualifying:
            latest = max(i.event_time for i in qualifying)
            chosen = min(i.impression_id for i in qualifying if i.event_time == latest)
            result[c.click_id] = (chosen, latest, ad.cpc_micros, ad.advertiser_id)
    return result


@pytest.mark.parametrize("seed", range(8))
def test_attribute_matches_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    ads = [*CATALOG.ad_ids, "ad-unknown"]
    users = [f"u{n}" for n in range(4)]
    span = 60 * S  # dense enough that many clicks have several qualifying impressions and many have none
    impressions = [
        # Times on a 500 ms grid make ties on impression time common.
        Impression(f"i{n:04d}", rng.choice(ads), rng.choice(users), T0 + rng.randrange(0, span, 500))
        for n in range(400)
    ]
    clicks = [
        Click(f"c{n:04d}", rng.choice(ads), rng.choice(users), T0 + rng.randrange(-S, span + 11 * S))
        for n in range(400)
    ]
    # Attribution and price only: the clicks charged and those the invalid traffic rules stop (many, in a draw this
    # dense: tests/unit/test_invalid.py holds those rules to their own cases).
    outcome = bill(impressions, clicks, CATALOG)
    billed = [*outcome.charged, *(r for r in outcome.not_charged if r.amount_micros is not None)]
    got = {r.click_id: (r.impression_id, r.impression_time, r.amount_micros, r.advertiser_id) for r in billed}
    expected = brute_force(impressions, clicks, CATALOG)
    assert got == expected
    assert len(billed) == len(got)
    assert 0 < len(expected) < len(clicks)  # the draw exercised both outcomes
    assert all(0 <= r.click_time - r.impression_time <= ATTRIBUTION_WINDOW_MS for r in billed)


def test_the_rule_gives_every_click_the_oracles_outcome_on_dense_traffic() -> None:
    """Every edge of the contract hit many times a draw (`tests.dense_traffic`): times on a coarse grid around a UTC
    midnight, prices, pauses, budgets and exclusions changed on the same grid, crawlers, addresses of both families
    and text that is not one. The plain rule and the oracle, written apart, give every click one outcome."""
    seen: Counter[str] = Counter()
    for seed in range(60):
        rng = random.Random(seed)
        catalog = dense_catalog(rng)
        impressions, clicks = dense_events(rng)
        result = bill(impressions, clicks, catalog, is_bot=crawler_list().matches)
        plain = {row.click_id: "charged" for row in result.charged} | result.reasons()
        expected = oracle.outcomes(received_once([*impressions, *clicks]), catalog)
        assert plain == {row["click_id"]: row["outcome"] for row in expected}, f"seed {seed}"
        seen.update(plain.values())
    # The draws reach every outcome, each many times.
    outcomes = ("charged", "unknown_ad", "ad_paused", "known_bot", "excluded_ip", "click_flood", "duplicate_click")
    assert set(seen) == {*outcomes, "over_budget"} and min(seen.values()) >= 10, seen
