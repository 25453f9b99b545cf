"""Dense, adversarial traffic from a seed, for holding the rule to the oracle where the simulator's traffic is thin.

The simulator's clicks fall on random milliseconds, so the contract's edges (a click exactly 10 s after its
impression, two clicks exactly 30 s or 60 s apart, a price, budget or exclusion change at a click's own millisecond,
two events at one millisecond) are rare in it. Here times fall on a coarse grid (1, 5 or 10 s, some a millisecond
off), a few users click a few ads within five minutes around a UTC midnight, and the catalog's prices, pauses,
daily budgets and IP exclusions change on the same grid: every edge is hit many times per draw. Clicks carry
browsers, crawlers and no user agent, and addresses in and out of the excluded ranges, of both families, and text
that is not an address. `arrivals` adds copies (the same content, or the same id with other content) and an
arrival order with receipt times behind and ahead of the events' own.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any

from billing.catalog import Ad, AdChange, Catalog
from billing.events import Click, Impression
from billing.rule import bill
from billing.store.crawler_list import crawler_list
from tests import oracle

MIDNIGHT = 1_767_225_600_000  # 2026-01-01T00:00:00Z
START = MIDNIGHT - 150_000
"""The traffic spans five minutes from here: two UTC days (budgets) and two hourly periods."""
SPAN_MS = 300_000

PEOPLE = [
    None,
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0 Safari/537.36",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Mobile/15E148",
]
CRAWLERS = [
    "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
    "curl/7.68.0",
    "python-requests/2.31.0",
    # Where regular-expression engines differ (Java's, for one): Python's `\d` is any decimal digit, so this is a
    # crawler to the package; Python's `$` matches before a trailing newline but not a carriage return, so the next
    # is not one.
    "BlogTraffic/\u0663.\u0664 Feed-Fetcher",
    "x GoogleAssociationService\r\n",
]
ADDRESSES = [
    None,
    "203.0.113.7",
    "203.0.113.255",
    "10.0.0.1",
    "198.51.100.1",
    "2001:db8::1",
    "2001:DB8:0:0::2",
    "::ffff:203.0.113.7",  # IPv4-mapped: an IPv6 address, not in an IPv4 range
    " 203.0.113.7",  # not an address: judged as if the click had none
    "203.0.113.7:80",
    "",
    "not an address",
]
RANGES = ["203.0.113.0/24", "203.0.113.7/32", "2001:db8::/32", "10.0.0.0/8"]


def dense_catalog(rng: random.Random) -> Catalog:
    """Four ads of two advertisers (EUR, JPY) in three campaigns, with price changes, pauses, budgets (zero, unlimited,
    one price, several) and exclusions made on the grid of the traffic."""
    catalog = Catalog(
        [
            Ad("a0", "cmp1", "adv1", 1_000_000, "EUR"),
            Ad("a1", "cmp1", "adv1", 2_000_000, "EUR"),
            Ad("a2", "cmp2", "adv1", 3_000_000, "EUR"),
            Ad("a3", "cmp3", "adv2", 700, "JPY"),
        ]
    )
    for _ in range(rng.randrange(1, 6)):
        price = rng.choice([None, 0, 500_000, 1_500_000, 2_500_000])
        catalog = catalog.with_change(AdChange(rng.choice(["a0", "a1", "a2", "a3"]), _on_grid(rng), price), 0, True)
    for _ in range(rng.randrange(6)):
        budget = rng.choice([None, 0, 1_400, 2_000_000, 3_000_000, 5_000_000])
        at = rng.choice([0, MIDNIGHT, _on_grid(rng)])
        catalog = catalog.with_budget(rng.choice(["cmp1", "cmp2", "cmp3"]), at, budget, 0, backfill=True)
    for _ in range(rng.randrange(5)):
        cidr, at, excluded = rng.choice(RANGES), rng.choice([0, _on_grid(rng)]), rng.random() < 0.7
        if catalog.exclusions.in_force(cidr, at) != excluded:  # the catalog refuses a change to the state in force
            catalog = catalog.with_exclusion(cidr, at, excluded, 0, backfill=True)
    return catalog


def dense_events(rng: random.Random) -> tuple[list[Impression], list[Click]]:
    """Up to 80 impressions and 120 clicks of one to three users on the catalog's ads and one it does not know,
    each bound of the rules hit exactly and missed by a millisecond (`_edges`), and in some draws a flood of one
    user's clicks around the rule's 21 clicks in 60 s."""
    users = [f"u{n}" for n in range(rng.randrange(1, 4))]
    ads = ["a0", "a1", "a2", "a3", "unknown"]
    grid = rng.choice([1_000, 5_000, 10_000])

    def at() -> int:
        return START + rng.randrange(SPAN_MS // grid) * grid + rng.choice([0, 0, 0, 1, -1])

    def user_agent() -> str | None:
        return rng.choice(CRAWLERS if rng.random() < 0.15 else PEOPLE)

    impressions = [
        Impression(f"i{n:03d}", rng.choice(ads), rng.choice(users), at()) for n in range(rng.randrange(20, 80))
    ]
    clicks = [
        Click(f"c{n:03d}", rng.choice(ads), rng.choice(users), at(), user_agent(), rng.choice(ADDRESSES))
        for n in range(rng.randrange(5, 120))
    ]
    edge_impressions, edge_clicks = _edges(rng, at)
    impressions += edge_impressions
    clicks += edge_clicks
    if rng.random() < 0.4:  # a flood: 19 to 23 more clicks of one user within 45 to 75 s, on any ads
        user, first, span = rng.choice(users), at(), rng.choice([45_000, 60_000, 75_000])
        clicks += [
            Click(f"f{n:03d}", rng.choice(ads), user, first + rng.randrange(0, span + 1, 1_000), user_agent())
            for n in range(rng.randrange(19, 24))
        ]
    return impressions, clicks


def _edges(rng: random.Random, at: Callable[[], int]) -> tuple[list[Impression], list[Click]]:
    """Each bound of the rules exactly and a millisecond past it, every draw, each by a user of its own (so that no
    other rule of another user's traffic hides it): a click 10 s after its impression, a second click on the ad
    30 s after the first, and 21 clicks spanning 60 s; then the same with 1 ms more."""
    impressions: list[Impression] = []
    clicks: list[Click] = []
    for past in (0, 1):
        user, ad, start = f"edge{past}", rng.choice(["a0", "a1", "a2", "a3"]), at()
        impressions.append(Impression(f"ei{past}-attr", ad, f"{user}-attr", start))
        clicks.append(Click(f"ec{past}-attr", ad, f"{user}-attr", start + 10_000 + past))
        for n, offset in enumerate((0, 30_000 + past)):
            impressions.append(Impression(f"ei{past}-dup{n}", ad, f"{user}-dup", start + offset - 1_000))
            clicks.append(Click(f"ec{past}-dup{n}", ad, f"{user}-dup", start + offset))
        times = [start, *sorted(start + rng.randrange(1, 60_000) for _ in range(19)), start + 60_000 + past]
        for n, time in enumerate(times):
            ad = rng.choice(["a0", "a1", "a2", "a3"])
            impressions.append(Impression(f"ei{past}-flood{n}", ad, f"{user}-flood", time - 2_000))
            clicks.append(Click(f"ec{past}-flood{n}", ad, f"{user}-flood", time))
    return impressions, clicks


def arrivals(rng: random.Random, events: list[Impression | Click]) -> list[dict[str, Any]]:
    """The events as received, in the oracle's row shape (`tests.oracle.RAW_EVENT_SCHEMA`): shuffled, some sent
    twice, some with a second copy of other content (a conflict), each received up to 50 s before its own time (a
    clock ahead, within the hour that is valid) or up to 2 minutes after it, on one of two partitions."""
    copies: list[Impression | Click] = []
    for event in events:
        copies.append(event)
        draw = rng.random()
        if draw < 0.08:
            copies.append(event)
        elif draw < 0.14:
            copies.append(dataclasses.replace(event, event_time=event.event_time + rng.choice([1, 1_000, 5_000])))
    rng.shuffle(copies)
    return [
        _received(event, event.event_time + rng.randrange(-50_000, 120_000), rng.randrange(2), offset)
        for offset, event in enumerate(copies)
    ]


def received_once(events: list[Impression | Click]) -> list[dict[str, Any]]:
    """The events as received, each once, in order and at its own time."""
    return [_received(event, event.event_time, 0, offset) for offset, event in enumerate(events)]


def outcomes_each_billable(clicks: list[Click], catalog: Catalog) -> tuple[dict[str, str], dict[str, str]]:
    """(the plain rule's, the oracle's) outcome of every click: `charged` or the reason. Each click gets its own
    impression 1 s before it, so every click is billable."""
    impressions = [Impression(f"i-{c.click_id}", c.ad_id, c.user_id, c.event_time - 1_000) for c in clicks]
    result = bill(impressions, clicks, catalog, is_bot=crawler_list().matches)
    plain = {row.click_id: "charged" for row in result.charged} | result.reasons()
    received = received_once([*impressions, *clicks])
    return plain, {row["click_id"]: row["outcome"] for row in oracle.outcomes(received, catalog)}


def _received(event: Impression | Click, received_ms: int, partition: int, offset: int) -> dict[str, Any]:
    return {
        "type": event.type,
        "id": event.event_id,
        "ad_id": event.ad_id,
        "user_id": event.user_id,
        "event_time": event.event_time,
        "received_ms": received_ms,
        "partition": partition,
        "offset": offset,
        "user_agent": event.user_agent,
        "ip": event.ip,
    }


def _on_grid(rng: random.Random) -> int:
    return START + rng.randrange(0, SPAN_MS, 5_000)
