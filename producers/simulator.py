"""A deterministic, bounded traffic simulator that knows its ground truth.

Everything follows from the configuration and the seed (like flink-training's `DataGenerator`): the same
config, seed and start time give the same arrivals, byte for byte, and the same ground-truth files.

Time. The simulator lives on one event-time line (epoch ms, UTC). Impressions happen at `impression_rate`
per second of event time; each may lead to a click some delay later. Every event then gets an *arrival
time* on the same line, `event_time + delay`, where the delay is 0 for most events, 1 ms to
`max_disorder_ms` for out-of-order ones (a small disorder that a watermark absorbs) and `late_min_ms` to
`late_max_ms` for late ones (they arrive after the watermark has passed them). Arrivals are yielded in
arrival-time order (ties: creation order), which is the order they are sent in. Nothing reads the wall
clock except `resolve_start_ms`, which places the line when `start_ms` is not given, and `LiveSchedule`,
which sends a run in real time: each arrival when the clock reaches its arrival time, so that the stream's
event time tracks "now" (the live mode of the local stack).

Invalid traffic and budgets. Every event carries a user agent and an IP address, fixed per user from the seed
(a handful of browsers; IPv4 and some IPv6). On request the run adds clicks from known crawlers, from excluded IP
ranges, click floods, double clicks and late clicks that make an earlier click a duplicate (`Made` tags each
arrival so made), gives some campaigns daily budgets that its traffic exhausts, and changes them halfway (or at
`changes_at_s`): the catalog's history (`SimulationConfig.catalog_lines`) holds the budgets and the IP exclusion
list with the prices.

Ground truth. `GroundTruth` admits every arrival through `billing.intake.Intake` in arrival order, with
the arrival time as the receive time (so a valid event is never "in the future"), and applies the whole contract
(`billing.rule.bill`: attribution, price, the invalid traffic rules with the crawler list, budgets) to what was
accepted. For long runs it spills to disk and works partition by partition (by event id for the intake, by user
for attribution and the invalid traffic rules, by campaign and UTC day for budgets), so memory stays bounded.
"""

from __future__ import annotations

import hashlib
import heapq
import ipaddress
import json
import math
import os
import random
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import IO, Any

from billing.catalog import AdChange, Catalog, generate_catalog, generated_price
from billing.events import TOPIC_OF, Click, Event, Impression
from billing.intake import MIN_EVENT_TIME_MS, QuarantineReason
from billing.money import minor_digits
from billing.periods import DAY_MS
from billing.rule import (
    ATTRIBUTION_WINDOW_MS,
)
from billing.schemas import schema_text
from billing.store.catalog_file import save_catalog
from billing.store.crawler_list import CrawlerList, crawler_list
from billing.store.durable import write_whole
from producers.arrivals import Arrival, ArrivalKind, Made, Timing
from producers.capture import (
    BudgetLine,
    CatalogEdit,
    CatalogLine,
    ExclusionLine,
    SchemaLine,
    apply_line,
    capture_line,
)
from producers.ground_truth import RECEIVED_TIME, GroundTruth, Truth
from producers.wire import RawRecord, encode_body, event_record, frame, parse_avro_schema

Clock = Callable[[], int]
"""Returns "now" as epoch milliseconds, UTC."""

Sleep = Callable[[float], None]
"""Waits the given number of seconds (`time.sleep`; a fake one in tests advances a fake clock)."""


def system_clock_ms() -> int:
    """The wall clock, epoch milliseconds UTC."""
    return time.time_ns() // 1_000_000


UNKNOWN_SCHEMA_ID_BASE = 2_000_000_000
"""Frames of `unknown_schema` bad records carry ids from here on: far above any id a registry hands out."""

BAD_KINDS: tuple[QuarantineReason, ...] = (
    QuarantineReason.UNDECODABLE,
    QuarantineReason.UNKNOWN_SCHEMA,
    QuarantineReason.TIME_OUT_OF_RANGE,
    QuarantineReason.ID_CONFLICT,
)
"""The bad records the simulator makes, by the quarantine reason the pipeline must give them."""

BROWSER_USER_AGENTS: tuple[str, ...] = (
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36 "
    "Edg/124.0.2478.80",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 "
    "Mobile/15E148 Safari/604.1",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 "
    "Safari/605.1.15",
    "Mozilla/5.0 (X11; Linux x86_64; rv:125.0) Gecko/20100101 Firefox/125.0",
    "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.6367.113 Mobile "
    "Safari/537.36",
    "Mozilla/5.0 (Linux; Android 14; SM-S918B) AppleWebKit/537.36 (KHTML, like Gecko) SamsungBrowser/24.0 "
    "Chrome/117.0.0.0 Mobile Safari/537.36",
)
"""The user agents of ordinary users: browsers people use; none matches the crawler list (unit-tested)."""

PUBLIC_FIRST_OCTETS: tuple[int, ...] = (24, 31, 37, 46, 62, 77, 78, 81, 86, 88, 91, 109, 151, 176, 185, 188, 212, 217)
"""Ordinary users' IPv4 addresses start with one of these (public, none in an excluded range)."""

PUBLIC_IPV6_PREFIX = 0x2A02 << 112
"""Ordinary users' IPv6 addresses lie in 2a02::/16 (a RIPE block), outside the excluded ranges."""

IPV6_SHARE = 5
"""One ordinary user in this many has an IPv6 address."""

EXCLUDED_RANGES: tuple[str, ...] = ("198.51.100.0/24", "2001:db8::/32", "203.0.113.0/24")
"""The IP exclusion list of a run with `excluded_ip_fraction` (documentation ranges, RFC 5737 and RFC 3849): the
first two from the run's start, the last from halfway through it (`SimulationConfig.changes_at_ms`)."""

FLOOD_CLICKS = (25, 40)
"""How many clicks a flood has (uniform, inclusive): more than the 20 a minute that make one."""
FLOOD_SPAN_MS = (15_000, 55_000)
"""The span of a flood's clicks (uniform, inclusive): within the rule's 60 s."""
DOUBLE_CLICK_GAP_MS = (100, 900)
"""How long after a click its double click comes."""


@dataclass(frozen=True)
class SimulationConfig:
    """What traffic to simulate. Give exactly one size: `events` (arrivals) or `duration_s` (of event time).

    Fractions are per generated valid event ("primary" event): `click_through_rate` per impression, the click
    delay fractions per click, and timing, duplicate and bad fractions per primary event of either type.
    """

    advertisers: int = 3
    campaigns_per_advertiser: int = 2
    ads_per_campaign: int = 4
    users: int = 1_000
    impression_rate: float = 200.0
    """Impressions per second of event time."""
    click_through_rate: float = 0.1
    click_delay_mean_ms: int = 2_000
    """Mean of the (truncated exponential) delay of clicks that fall inside the attribution window."""
    beyond_window_fraction: float = 0.05
    """Clicks later than the window: uniform in (10 s, max_click_delay_ms]."""
    max_click_delay_ms: int = 60_000
    edge_fraction: float = 0.02
    """Clicks at the rule's edges: exactly 0 ms and 10 s after the impression, 10 s + 1 ms after it, and a
    click 1 ms before a new impression of the same ad and user (neither of the last two qualifies)."""
    out_of_order_fraction: float = 0.05
    max_disorder_ms: int = 2_000
    """Out-of-order events arrive 1..max_disorder_ms after their event time: keep it below the watermark."""
    late_fraction: float = 0.01
    late_min_ms: int = 60_000
    late_max_ms: int = 300_000
    """Late events arrive late_min_ms..late_max_ms after their event time: keep it above the watermark."""
    duplicate_fraction: float = 0.01
    """Exact re-sends, arriving 0..max_resend_delay_ms after the original."""
    max_resend_delay_ms: int = 2_000
    bad_fraction: float = 0.002
    """Bad records, one kind of `BAD_KINDS` each, chosen evenly."""
    seed: int = 1
    start_ms: int | None = None
    """Event time of the first impression; None: placed by `resolve_start_ms` from the injected clock."""
    events: int | None = None
    """Total arrivals: valid events, duplicates and bad records together."""
    duration_s: float | None = None
    """Seconds of event time; every arrival of an event in that span is sent, late ones included."""
    id_prefix: str | None = None
    """Prefix of event ids; default `s<seed>`, so runs with different seeds never share an id."""
    catalog_change_every_s: float = 0.0
    """Seconds of event time between two changes to the catalog during the run (`catalog_changes`: mostly a new
    price, sometimes a pause and its resume a step later, and the `new_ads` created); 0: the catalog stands still."""
    new_ads: int = 0
    """Ads created during the run, one at each of the first changes. Their traffic starts with the run, so their
    clicks before they exist are not billable (`unknown_ad`), and the ones after are."""
    crawler_fraction: float = 0.0
    """Per click of ordinary traffic, the chance of one more impression and click, a moment later, from a known
    crawler: a user (`bot-NNN`, one of a pool) whose user agent is one of the crawler list's own examples
    (`crawler_list().examples`). Rule `known_bot`."""
    excluded_ip_fraction: float = 0.0
    """Per ordinary click, the chance of one more impression and click from an address in `EXCLUDED_RANGES` (a
    user `xip-NNN` of a pool). A run with it above 0 has that IP exclusion list, one range added halfway through
    the run (`changes_at_s`), so its earlier clicks are not excluded. Rule `excluded_ip`."""
    flood_fraction: float = 0.0
    """Per ordinary click, the expected number of flood clicks: a flood is a user of its own (`flood-NNNNNN`) making
    25 to 40 clicks within at most 55 s, each on a random ad after an impression of it. Rule `click_flood`."""
    double_click_fraction: float = 0.0
    """Per ordinary click inside the attribution window, the chance that its user clicks the same ad again 100 to
    900 ms later (still inside the window). Rule `duplicate_click`, for the second click."""
    late_duplicate_fraction: float = 0.0
    """Per ordinary click inside the window, the chance of another click of the same user and ad with an event
    time before it (after the impression, so at most 10 s before it) that arrives late: the click is sent in
    order and billed first, and the late one, arriving more than 10 s and at least `late_min_ms` after its own
    time, makes it a `duplicate_click`."""
    budget_campaigns: int = 0
    """Campaigns (chosen by the seed) given a daily budget from the run's start, `budget_share` of what the ordinary
    traffic is expected to spend on each in the run's span (at most a day), so the run exhausts it. Halfway
    through the run (`changes_at_s`) the first one's budget is raised by half, the second's halved, the third made
    unlimited."""
    budget_share: float = 0.3
    """The size of each budget of `budget_campaigns`, as a share of the campaign's expected spend."""
    changes_at_s: float | None = None
    """Seconds of event time after the run's start when its mid-run changes of budgets and of the IP exclusion list
    take effect (`changes_at_ms`); None: halfway through the run's span."""

    def __post_init__(self) -> None:
        if (self.events is None) == (self.duration_s is None):
            raise ValueError("give exactly one size: events or duration_s")
        if self.events is not None and self.events < 0:
            raise ValueError("events must not be negative")
        if self.duration_s is not None and not self.duration_s >= 0:
            raise ValueError("duration_s must not be negative")
        for name in ("advertisers", "campaigns_per_advertiser", "ads_per_campaign", "users"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if not self.impression_rate > 0:
            raise ValueError("impression_rate must be positive")
        for name in (
            "click_through_rate",
            "beyond_window_fraction",
            "edge_fraction",
            "out_of_order_fraction",
            "late_fraction",
            "duplicate_fraction",
            "bad_fraction",
            "crawler_fraction",
            "excluded_ip_fraction",
            "flood_fraction",
            "double_click_fraction",
            "late_duplicate_fraction",
        ):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1")
        if self.double_click_fraction + self.late_duplicate_fraction > 1.0:
            raise ValueError("double_click_fraction + late_duplicate_fraction must not exceed 1")
        campaigns = self.advertisers * self.campaigns_per_advertiser
        if not 0 <= self.budget_campaigns <= campaigns:
            raise ValueError(f"budget_campaigns must be between 0 and the {campaigns} campaigns of the catalog")
        if not self.budget_share > 0:
            raise ValueError("budget_share must be positive")
        if self.changes_at_s is not None and not self.changes_at_s >= 0:
            raise ValueError("changes_at_s must not be negative")
        if self.beyond_window_fraction + self.edge_fraction > 1.0:
            raise ValueError("beyond_window_fraction + edge_fraction must not exceed 1")
        if self.out_of_order_fraction + self.late_fraction > 1.0:
            raise ValueError("out_of_order_fraction + late_fraction must not exceed 1")
        if not self.click_delay_mean_ms > 0:
            raise ValueError("click_delay_mean_ms must be positive")
        if self.max_click_delay_ms <= ATTRIBUTION_WINDOW_MS + 1:
            raise ValueError(f"max_click_delay_ms must exceed the {ATTRIBUTION_WINDOW_MS} ms window")
        if not self.max_disorder_ms >= 1:
            raise ValueError("max_disorder_ms must be at least 1")
        if not 0 <= self.late_min_ms <= self.late_max_ms:
            raise ValueError("need 0 <= late_min_ms <= late_max_ms")
        if self.max_resend_delay_ms < 0:
            raise ValueError("max_resend_delay_ms must not be negative")
        if not self.catalog_change_every_s >= 0 or self.new_ads < 0:
            raise ValueError("catalog_change_every_s and new_ads must not be negative")
        if self.new_ads and not self.catalog_change_every_s:
            raise ValueError("new_ads are created by catalog changes: set catalog_change_every_s too")
        if self.start_ms is not None and self.start_ms < MIN_EVENT_TIME_MS:
            raise ValueError("start_ms must not be before 2000-01-01: such events are quarantined")

    @property
    def prefix(self) -> str:
        """The prefix of this run's event ids."""
        return self.id_prefix if self.id_prefix is not None else f"s{self.seed}"

    def expected_arrival_rate(self) -> float:
        """Arrivals per second of event time, on average: impressions, clicks (ordinary and invalid traffic),
        duplicates and bad records."""
        in_window = 1.0 - self.beyond_window_fraction - self.edge_fraction
        # Per ordinary click: the crawler, excluded and flood episodes bring an impression with each click.
        added = 2 * (self.crawler_fraction + self.excluded_ip_fraction + self.flood_fraction) + in_window * (
            self.double_click_fraction + self.late_duplicate_fraction
        )
        primary = self.impression_rate * (1.0 + self.click_through_rate * (1.0 + self.edge_fraction / 4 + added))
        return primary * (1.0 + self.duplicate_fraction + self.bad_fraction)

    def at_arrival_rate(self, rate_per_s: float) -> SimulationConfig:
        """The same traffic with the impression rate that makes `expected_arrival_rate()` equal `rate_per_s`."""
        if not rate_per_s > 0:
            raise ValueError("an arrival rate is a positive number of records per second")
        return replace(self, impression_rate=self.impression_rate * rate_per_s / self.expected_arrival_rate())

    def expected_arrivals(self) -> int:
        """How many arrivals the run sends: exactly `events`, or an estimate for a `duration_s` run."""
        if self.events is not None:
            return self.events
        return math.ceil(self.expected_arrival_rate() * (self.duration_s or 0.0))

    def expected_span_ms(self) -> int:
        """An upper estimate of the event-time span of the run, from the first event to the last."""
        if self.duration_s is not None:
            return math.ceil(self.duration_s * 1000)
        estimate = (self.events or 0) / self.expected_arrival_rate() * 1000
        # The first seconds have fewer clicks (theirs come later): add the mean click delay. Then a margin for
        # randomness: 20 impression gaps weigh in small runs, 3 % in large ones (the spread is ~1/sqrt(n)).
        mean_click_delay = self.click_delay_mean_ms + self.beyond_window_fraction * self.max_click_delay_ms
        margin = 0.03 * estimate + 20 * 1000 / self.impression_rate
        return math.ceil(estimate + self.click_through_rate * mean_click_delay + margin)

    def catalog(self) -> Catalog:
        """The run's ad catalog as it stands at the start, from the same seed."""
        return generate_catalog(self.advertisers, self.campaigns_per_advertiser, self.ads_per_campaign, self.seed)

    def catalog_changes(self, start_ms: int) -> list[AdChange]:
        """The changes the run makes to the catalog, in order, at event times `start_ms + k *
        catalog_change_every_s` within the run's span: the `new_ads` created first, one a step (in the
        advertisers' existing campaigns and currencies, at a price of their own); then at each step a new price for
        one ad (in whole minor units of its currency, as `billing.catalog.generated_price` draws them), or, one step
        in six, a pause of one ad that the next step resumes."""
        if not self.catalog_change_every_s:
            return []
        rng = random.Random(f"adbill-catalog-changes-{self.seed}")
        base = self.catalog()
        ads = sorted(base.ad_ids)
        campaigns = sorted({(ad.campaign_id, ad.advertiser_id, ad.currency) for ad in base})
        every_ms = max(1, round(self.catalog_change_every_s * 1000))
        changes: list[AdChange] = []
        paused: str | None = None
        for step in range(1, self.expected_span_ms() // every_ms + 1):
            at_ms = start_ms + step * every_ms
            if step <= self.new_ads:
                campaign, advertiser, currency = campaigns[(step - 1) % len(campaigns)]
                price = generated_price(currency, rng)
                changes.append(AdChange(self.new_ad_ids()[step - 1], at_ms, price, campaign, advertiser, currency))
            elif paused is not None:
                changes.append(AdChange(paused, at_ms, generated_price(base[paused].currency, rng)))
                paused = None
            elif rng.random() < 1 / 6:
                paused = rng.choice(ads)
                changes.append(AdChange(paused, at_ms, None))
            else:
                ad_id = rng.choice(ads)
                changes.append(AdChange(ad_id, at_ms, generated_price(base[ad_id].currency, rng)))
        return changes

    def new_ad_ids(self) -> list[str]:
        """The ids of the ads the run creates (`new_ads`)."""
        return [f"{self.prefix}-new-ad-{n:03d}" for n in range(self.new_ads)]

    def changes_at_ms(self, start_ms: int) -> int:
        """When the run's mid-run changes of budgets and exclusions take effect: `changes_at_s` after its start, or
        halfway through its span."""
        if self.changes_at_s is not None:
            return start_ms + round(self.changes_at_s * 1000)
        return start_ms + self.expected_span_ms() // 2

    def daily_budgets(self) -> dict[str, int]:
        """The budgets of `budget_campaigns` (campaign -> micros a day, whole cents, or whole units of a currency
        without a minor unit, such as JPY: a budget is in the minor unit): `budget_share` of what the ordinary traffic
        is expected to spend on the campaign in the run's span, or in one day of a longer run."""
        if not self.budget_campaigns:
            return {}
        base = self.catalog()
        prices: dict[str, int] = defaultdict(int)
        for ad in base:
            prices[ad.campaign_id] += ad.cpc_micros or 0
        billable_share = 1.0 - self.beyond_window_fraction - self.edge_fraction / 2
        clicks = self.impression_rate * self.click_through_rate * billable_share * min(self.expected_span_ms(), DAY_MS)
        rng = random.Random(f"adbill-budgets-{self.seed}")
        chosen = rng.sample(sorted(prices), self.budget_campaigns)
        steps = self.budget_steps()
        return {
            campaign: max(
                steps[campaign],
                int(self.budget_share * clicks / 1000 * prices[campaign] / len(base))
                // steps[campaign]
                * steps[campaign],
            )
            for campaign in chosen
        }

    def budget_steps(self) -> dict[str, int]:
        """Per campaign, the micros its budgets are a multiple of: a whole cent, or the currency's minor unit when
        that is coarser (a whole yen)."""
        return {ad.campaign_id: max(10_000, 10 ** (6 - minor_digits(ad.currency))) for ad in self.catalog()}

    def budget_changes(self, start_ms: int) -> list[BudgetLine]:
        """The run's budget history (`budget_campaigns`): each budget from `start_ms`; at `changes_at_ms` the first
        raised by half, the second halved, the third made unlimited."""
        budgets = self.daily_budgets()
        changes = [BudgetLine(campaign, start_ms, micros) for campaign, micros in budgets.items()]
        changed_at = self.changes_at_ms(start_ms)
        steps = self.budget_steps()
        for number, (campaign, micros) in enumerate(list(budgets.items())[:3]):
            step = steps[campaign]
            later = (micros * 3 // 2 // step * step, micros // 2 // step * step, None)[number]
            changes.append(BudgetLine(campaign, changed_at, later))
        return changes

    def exclusion_changes(self, start_ms: int) -> list[ExclusionLine]:
        """The run's IP exclusion list (with `excluded_ip_fraction`): `EXCLUDED_RANGES`, the last one from
        `changes_at_ms`."""
        if not self.excluded_ip_fraction:
            return []
        first, second, later = EXCLUDED_RANGES
        return [
            ExclusionLine(first, start_ms, True),
            ExclusionLine(second, start_ms, True),
            ExclusionLine(later, self.changes_at_ms(start_ms), True),
        ]

    def catalog_lines(self, start_ms: int) -> list[CatalogEdit]:
        """Every change the run makes to the catalog (prices, budgets, the IP exclusion list), by effective time, as
        capture lines: what a capture of the run records, and what the publisher makes in the pipeline's catalog."""
        lines: list[CatalogEdit] = [CatalogLine(change) for change in self.catalog_changes(start_ms)]
        lines += self.budget_changes(start_ms)
        lines += self.exclusion_changes(start_ms)
        return sorted(lines, key=lambda line: line.effective_from)

    def catalog_history(self, start_ms: int) -> Catalog:
        """The run's catalog with every change it makes (`catalog_lines`): the history the run is billed by."""
        catalog = self.catalog()
        for line in self.catalog_lines(start_ms):
            catalog = apply_line(catalog, line, line.effective_from)
        return catalog


def resolve_start_ms(config: SimulationConfig, now_ms: int, rate_per_s: float | None = None, live: bool = False) -> int:
    """Event time of the first impression: `config.start_ms`, or placed so no event time is in the future.

    Live (`LiveSchedule` sends each arrival when the clock reaches it), the line starts at `now_ms` and event
    time tracks the clock for the whole run. Sent as fast as possible (`rate_per_s` None), the whole span lies
    before `now_ms` and ends near it. Paced, the run takes `expected_arrivals / rate_per_s` seconds of real
    time: when that is at least the event-time span, the line starts at `now_ms` and runs no faster than real
    time (at the natural rate, it tracks it on average); when the offered rate is faster, the start moves back
    by the difference so the last events are not in the future, and event time gains on the clock all run long.
    """
    if config.start_ms is not None:
        return config.start_ms
    if live:
        return now_ms
    span_ms = config.expected_span_ms()
    if rate_per_s is None:
        return now_ms - span_ms
    send_ms = config.expected_arrivals() / rate_per_s * 1000
    return now_ms - max(0, math.ceil(span_ms - send_ms))


class Simulator:
    """Generates the arrivals of one run; `arrivals()` starts over at each call, with the same result.

    `live`: the run will be sent by a `LiveSchedule`, so its line starts at the clock's "now" (unless
    `config.start_ms` pins it); the rate then follows from the config (`SimulationConfig.at_arrival_rate`),
    and `rate_per_s` must be None.
    """

    def __init__(
        self,
        config: SimulationConfig,
        clock: Clock = system_clock_ms,
        rate_per_s: float | None = None,
        live: bool = False,
    ) -> None:
        if live and rate_per_s is not None:
            raise ValueError("a live run goes at the config's own rate: set it with at_arrival_rate, not rate_per_s")
        self.config = config
        self.start_ms = resolve_start_ms(config, clock(), rate_per_s, live)
        self.changes = config.catalog_changes(self.start_ms)
        """The run's price changes, by effective time (`SimulationConfig.catalog_changes`)."""
        self.catalog_lines = config.catalog_lines(self.start_ms)
        """All its changes of the catalog, prices, budgets and exclusions, by effective time, as capture lines."""
        self.catalog = config.catalog_history(self.start_ms)
        """The run's catalog with its changes: every ad the traffic uses, the prices, budgets and IP exclusion list
        it is billed by."""

    def arrivals(self, ads: AdsAt | None = None) -> Iterator[Arrival]:
        """Every arrival of the run, in send order; memory holds only pending clicks and delayed arrivals. With
        `ads`, each impression's ad is drawn from the ads it gives at the impression's time (the pipeline's catalog
        as it is: `CatalogFollower`) instead of the run's own catalog: the same seed then draws other ads."""
        return _Generation(self.config, self.catalog, self.start_ms, ads).run()

    def recording(self) -> Iterator[Arrival | CatalogEdit]:
        """The arrivals with the run's catalog changes among them (`with_catalog_lines`): a capture of the run that
        replays with its prices, budgets and exclusions."""
        return with_catalog_lines(self.arrivals(), self.catalog_lines)


CATALOG_LEAD_MS = 2_000
"""How long before it takes effect, in the run's time, a simulated catalog change is made."""

AdsAt = Callable[[int], Sequence[str]]
"""The ads traffic may go to at an event time (epoch ms), sorted."""


class CatalogFollower:
    """The ads of a catalog as it is, for traffic that follows it (`adbill up`'s): every ad the catalog holds, the
    ones an admin created included, read again at most once a second of event time (a `stat` of the file when
    `current` is `CatalogDatabase.current`)."""

    def __init__(self, current: Callable[[], Catalog], every_ms: int = 1_000) -> None:
        self.current, self.every_ms = current, every_ms
        self._at: int | None = None
        self._ads: list[str] = []

    def __call__(self, event_time: int) -> Sequence[str]:
        if self._at is None or event_time - self._at >= self.every_ms or event_time < self._at:
            self._at = event_time
            ads = sorted(self.current().ad_ids)
            self._ads = ads or self._ads
        return self._ads


class RunEdits:
    """Which of a run's own changes of the catalog (`catalog_lines`) a run that follows the catalog still makes: it
    leaves alone an ad, a campaign's budget or an IP range that someone else changed (an entry the run did not make,
    added since the run started, or one that records a person as its maker), so the demo's traffic never undoes an
    admin's change."""

    def __init__(self, start_version: int) -> None:
        self.start_version = start_version
        self.own: set[int] = set()

    def made(self, catalog: Catalog) -> None:
        """The run made a change: `catalog` is the catalog after it."""
        self.own.add(catalog.version)

    def someone_else(self, entries: Iterable[Any]) -> bool:
        return any(
            (e.version > self.start_version and e.version not in self.own) or getattr(e, "made_by", None)
            for e in entries
        )

    def leaves_alone(self, catalog: Catalog, line: CatalogEdit) -> str | None:
        """Why the run leaves `line` alone in `catalog` (the catalog as it is), or None when it makes it."""
        if isinstance(line, CatalogLine):
            ad = catalog.get(line.change.ad_id)
            if ad is not None and self.someone_else(ad.prices):
                return f"ad {ad.ad_id}'s price was changed by someone else: left as it is"
        elif isinstance(line, BudgetLine):
            if self.someone_else(catalog.budget_history(line.campaign_id)):
                return f"campaign {line.campaign_id}'s budget was changed by someone else: left as it is"
        elif self.someone_else(e for e in catalog.exclusions.changes if e.cidr == line.cidr):
            return f"range {line.cidr} was changed by someone else: left as it is"
        return None


def with_catalog_lines(
    arrivals: Iterable[Arrival], lines: Sequence[CatalogEdit], lead_ms: int = CATALOG_LEAD_MS
) -> Iterator[Arrival | CatalogEdit]:
    """The arrivals, each change of `lines` (by effective time) placed before the first arrival at or after its
    effective time minus `lead_ms`, the changes left at the end after the last arrival."""
    pending = list(lines)
    for arrival in arrivals:
        while pending and pending[0].effective_from - lead_ms <= arrival.arrival_ms:
            yield pending.pop(0)
        yield arrival
    yield from pending


class LiveSchedule:
    """Sends a run in real time: each arrival goes out when the clock reaches its arrival time.

    The simulated line is anchored on the clock at the first arrival: that one is due at once, every later one
    `arrival_ms - first arrival_ms` after it. Event time therefore advances exactly as fast as the clock, an
    in-order event goes out at its event time plus `offset_ms` (the moments between placing the line and the
    first send: near zero when the line starts "now"), and out-of-order and late events keep their simulated
    delays. The content of the run is untouched: only when each record goes out.

    Behind schedule (a slow broker, a rate this process cannot generate), records go out as fast as they can
    until they are on time again; nothing is dropped or re-timed. `max_behind_ms` says how late the worst one
    went out.
    """

    def __init__(self, clock: Clock = system_clock_ms, sleep: Sleep = time.sleep) -> None:
        self._clock, self._sleep = clock, sleep
        self.offset_ms: int | None = None
        """Clock time minus simulated time, fixed at the first arrival; None before it."""
        self.max_behind_ms = 0

    def due_ms(self, arrival_ms: int) -> int:
        """When, by the clock, the arrival at `arrival_ms` goes out (the first call anchors the line)."""
        if self.offset_ms is None:
            self.offset_ms = self._clock() - arrival_ms
        return arrival_ms + self.offset_ms

    def wait_for(self, arrival_ms: int) -> None:
        """Return once the clock has reached the arrival's due time (at once for the first arrival)."""
        due = self.due_ms(arrival_ms)
        now = self._clock()
        while now < due:
            self._sleep((due - now) / 1000)
            now = self._clock()
        self.max_behind_ms = max(self.max_behind_ms, now - due)

    def run(self, arrivals: Iterable[Arrival]) -> Iterator[Arrival]:
        """The arrivals, unchanged and in their order, each yielded when it is due."""
        for arrival in arrivals:
            self.wait_for(arrival.arrival_ms)
            yield arrival


class _Generation:
    """One pass of the generator. Two heaps: future events by event time, created arrivals by arrival time.

    Ordinary traffic draws from `rng`; the invalid traffic (`Made`) from `ivt`, a generator of its own, so a run
    without it draws exactly what it did before there was any."""

    def __init__(self, config: SimulationConfig, catalog: Catalog, start_ms: int, ads: AdsAt | None = None) -> None:
        self.config = config
        self.rng = random.Random(f"adbill-simulator-{config.seed}")
        self.ivt = random.Random(f"adbill-invalid-traffic-{config.seed}")
        own = sorted(catalog.ad_ids)
        self.ads_at: AdsAt = ads or (lambda event_time: own)
        self.start_ms = start_ms
        self.end_ms = None if config.duration_s is None else start_ms + math.ceil(config.duration_s * 1000)
        self.budget = config.events  # arrivals left to create, or None for a duration run
        # (event_time, seq, "i"|"c", ad, user, made: a `Made` value or "")
        self.scheduled: list[tuple[int, int, str, str, str, str]] = []
        self.pending: list[
            tuple[int, int, Event | RawRecord, ArrivalKind, Timing, QuarantineReason | None, Made | None]
        ] = []
        self.seq = 0
        self.next_id = {"impression": 0, "click": 0}
        self.click_schema = parse_avro_schema(schema_text("click"))
        self.impression_schema = parse_avro_schema(schema_text("impression"))
        self.profiles = _Profiles(config.seed)
        self.pool = max(10, config.users // 20)
        """How many crawler users, and how many users from excluded ranges, there are."""
        self.floods = 0

    def run(self) -> Iterator[Arrival]:
        rng, config = self.rng, self.config
        mean_gap_ms = 1000.0 / config.impression_rate
        offset = 0.0
        next_impression = self.start_ms
        position = 0
        while self.budget is None or self.budget > 0:
            from_schedule = bool(self.scheduled) and self.scheduled[0][0] <= next_impression
            event_time = self.scheduled[0][0] if from_schedule else next_impression
            if self.end_ms is not None and event_time >= self.end_ms:
                break  # events come in event-time order: every later one is past the end too
            made = ""
            if from_schedule:
                _, _, what, ad_id, user_id, made = heapq.heappop(self.scheduled)
                event: Event = self._new(what, ad_id, user_id, event_time, made)
            else:
                user_id = f"u{rng.randrange(config.users):07d}"
                event = self._new("i", rng.choice(self.ads_at(event_time)), user_id, event_time, made)
                offset += rng.random() * 2 * mean_gap_ms
                next_impression = self.start_ms + int(offset)
            # Everything created from now on arrives at or after event_time: what arrives earlier can go out.
            while self.pending and self.pending[0][0] < event_time:
                yield self._arrival(position, heapq.heappop(self.pending))
                position += 1
            self._send(event, Made(made) if made else None)
            # The invalid traffic's impressions come with their clicks, made by `ivt`.
            if isinstance(event, Impression) and not made and rng.random() < config.click_through_rate:
                self._schedule_click(event)
        while self.pending:
            yield self._arrival(position, heapq.heappop(self.pending))
            position += 1

    def _new(self, what: str, ad_id: str, user_id: str, event_time: int, made: str = "") -> Event:
        user_agent, ip = self.profiles.of(user_id, made)
        if what == "i":
            return Impression(self._id("impression"), ad_id, user_id, event_time, user_agent, ip)
        return Click(self._id("click"), ad_id, user_id, event_time, user_agent, ip)

    def _id(self, event_type: str) -> str:
        number = self.next_id[event_type]
        self.next_id[event_type] = number + 1
        return f"{self.config.prefix}-{event_type[0]}{number:010d}"

    def _schedule(self, event_time: int, what: str, ad_id: str, user_id: str, made: str = "") -> None:
        self.seq += 1
        heapq.heappush(self.scheduled, (event_time, self.seq, what, ad_id, user_id, made))

    def _schedule_click(self, impression: Impression) -> None:
        rng, config = self.rng, self.config
        t, ad_id, user_id = impression.event_time, impression.ad_id, impression.user_id
        u = rng.random()
        if u < config.edge_fraction:
            edge = rng.randrange(4)
            if edge < 3:
                self._schedule(t + (0, ATTRIBUTION_WINDOW_MS, ATTRIBUTION_WINDOW_MS + 1)[edge], "c", ad_id, user_id)
            else:
                # A click 1 ms before an impression of the same ad and user, past this impression's window.
                at = t + rng.randint(ATTRIBUTION_WINDOW_MS + 1, config.max_click_delay_ms)
                self._schedule(at, "c", ad_id, user_id)
                self._schedule(at + 1, "i", ad_id, user_id)
        elif u < config.edge_fraction + config.beyond_window_fraction:
            self._schedule(t + rng.randint(ATTRIBUTION_WINDOW_MS + 1, config.max_click_delay_ms), "c", ad_id, user_id)
        else:
            # Exponential with the configured mean, truncated to the window: one draw, inverse CDF.
            mean = config.click_delay_mean_ms
            tail = 1.0 - math.exp(-ATTRIBUTION_WINDOW_MS / mean)
            delay = int(-mean * math.log(1.0 - rng.random() * tail))
            self._schedule_in_window(t, t + min(delay, ATTRIBUTION_WINDOW_MS), ad_id, user_id)
        self._add_invalid_traffic(t)

    def _schedule_in_window(self, t: int, at: int, ad_id: str, user_id: str) -> None:
        """An ordinary click at `at`, inside the window of the impression at `t`, made a double click or made a
        duplicate by a late earlier one as the config asks."""
        config, ivt = self.config, self.ivt
        u = ivt.random() if config.double_click_fraction or config.late_duplicate_fraction else 1.0
        if u < config.double_click_fraction:
            gap = ivt.randint(*DOUBLE_CLICK_GAP_MS)
            first = min(at, t + ATTRIBUTION_WINDOW_MS - gap)  # both clicks inside the window
            self._schedule(first, "c", ad_id, user_id)
            self._schedule(first + gap, "c", ad_id, user_id, Made.DOUBLE_CLICK)
        elif u < config.double_click_fraction + config.late_duplicate_fraction:
            at = max(at, t + 1)  # room for an earlier click after the impression
            self._schedule(at, "c", ad_id, user_id, Made.MADE_DUPLICATE)
            self._schedule(ivt.randint(t, at - 1), "c", ad_id, user_id, Made.LATE_EARLIER)
        else:
            self._schedule(at, "c", ad_id, user_id)

    def _add_invalid_traffic(self, t: int) -> None:
        """After an ordinary click drawn at the impression time `t`: a crawler's click, a click from an excluded
        range and a flood, each with its chance."""
        config, ivt = self.config, self.ivt
        if config.crawler_fraction and ivt.random() < config.crawler_fraction:
            self._impression_and_click(t, f"bot-{ivt.randrange(self.pool):03d}", Made.CRAWLER)
        if config.excluded_ip_fraction and ivt.random() < config.excluded_ip_fraction:
            self._impression_and_click(t, f"xip-{ivt.randrange(self.pool):03d}", Made.EXCLUDED_IP)
        if config.flood_fraction and ivt.random() < config.flood_fraction / (sum(FLOOD_CLICKS) / 2):
            self._flood(t)

    def _impression_and_click(self, t: int, user_id: str, made: Made) -> None:
        ivt = self.ivt
        ad_id = ivt.choice(self.ads_at(t))
        shown = t + ivt.randint(0, 2_000)
        self._schedule(shown, "i", ad_id, user_id, made)
        self._schedule(shown + ivt.randint(0, ATTRIBUTION_WINDOW_MS), "c", ad_id, user_id, made)

    def _flood(self, t: int) -> None:
        """A user of its own clicking 25 to 40 times within at most 55 s, on random ads, each after an impression."""
        ivt = self.ivt
        user_id = f"flood-{self.floods:06d}"
        self.floods += 1
        begin = t + 2_000
        span = ivt.randint(*FLOOD_SPAN_MS)
        for _ in range(ivt.randint(*FLOOD_CLICKS)):
            at = begin + ivt.randint(0, span)
            ad_id = ivt.choice(self.ads_at(at))
            self._schedule(at - ivt.randint(0, 2_000), "i", ad_id, user_id, Made.FLOOD)
            self._schedule(at, "c", ad_id, user_id, Made.FLOOD)

    def _take(self) -> bool:
        """Spend one arrival of the budget; False when it is spent."""
        if self.budget is None:
            return True
        if self.budget <= 0:
            return False
        self.budget -= 1
        return True

    def _push(
        self,
        arrival_ms: int,
        item: Event | RawRecord,
        kind: ArrivalKind,
        timing: Timing,
        reason: QuarantineReason | None,
        made: Made | None = None,
    ) -> None:
        # The sequence number breaks ties in creation order and keeps the heap from ever comparing items.
        self.seq += 1
        heapq.heappush(self.pending, (arrival_ms, self.seq, item, kind, timing, reason, made))

    @staticmethod
    def _arrival(position: int, entry: tuple[int, int, Any, ArrivalKind, Timing, Any, Made | None]) -> Arrival:
        arrival_ms, _, item, kind, timing, reason, made = entry
        return Arrival(position, arrival_ms, item, kind, timing, reason, made)

    def _send(self, event: Event, made: Made | None = None) -> None:
        rng, config = self.rng, self.config
        if not self._take():
            return
        u = rng.random()
        if made == Made.LATE_EARLIER:
            # Late, and after the click it precedes (at most 10 s after it in event time) was sent in order.
            least = ATTRIBUTION_WINDOW_MS + 1
            timing, delay = Timing.LATE, rng.randint(max(config.late_min_ms, least), max(config.late_max_ms, least))
        elif made == Made.MADE_DUPLICATE:
            timing, delay = Timing.IN_ORDER, 0
        elif u < config.late_fraction:
            timing, delay = Timing.LATE, rng.randint(config.late_min_ms, config.late_max_ms)
        elif u < config.late_fraction + config.out_of_order_fraction:
            timing, delay = Timing.OUT_OF_ORDER, rng.randint(1, config.max_disorder_ms)
        else:
            timing, delay = Timing.IN_ORDER, 0
        arrival_ms = event.event_time + delay
        self._push(arrival_ms, event, ArrivalKind.EVENT, timing, None, made)
        if rng.random() < config.duplicate_fraction and self._take():
            resend_ms = arrival_ms + rng.randint(0, config.max_resend_delay_ms)
            self._push(resend_ms, event, ArrivalKind.DUPLICATE, timing, None, made)
        if rng.random() < config.bad_fraction and self._take():
            self._send_bad(event, arrival_ms, timing)

    def _send_bad(self, event: Event, arrival_ms: int, timing: Timing) -> None:
        rng = self.rng
        reason = BAD_KINDS[rng.randrange(len(BAD_KINDS))]
        topic = TOPIC_OF[event.type]
        key = event.ad_id.encode("utf-8")
        now = event.event_time
        if reason == QuarantineReason.UNDECODABLE:
            body = self._body(event)
            variant = rng.randrange(3)
            if variant == 0:
                value = b"\x00\x00\x01"  # shorter than a frame header
            elif variant == 1:
                value = b"\x01" + frame(1, body)[1:]  # a wrong magic byte
            else:
                value = json.dumps(event.to_record()).encode("utf-8")  # JSON where Avro was expected
            self._push(now, RawRecord(topic, key, value), ArrivalKind.BAD, Timing.IN_ORDER, reason)
        elif reason == QuarantineReason.UNKNOWN_SCHEMA:
            value = frame(UNKNOWN_SCHEMA_ID_BASE + rng.randrange(1000), self._body(event))
            self._push(now, RawRecord(topic, key, value), ArrivalKind.BAD, Timing.IN_ORDER, reason)
        elif reason == QuarantineReason.TIME_OUT_OF_RANGE:
            bad = self._new(event.type[0], event.ad_id, event.user_id, rng.randrange(0, MIN_EVENT_TIME_MS))
            bad = replace(bad, user_agent=event.user_agent, ip=event.ip)
            self._push(now, bad, ArrivalKind.BAD, Timing.IN_ORDER, reason)
        else:
            # Same id, different content, sent after the original so that the original stands.
            if rng.random() < 0.5:
                conflict = replace(event, user_id=f"{event.user_id}-x")
            else:
                conflict = replace(event, event_time=event.event_time + 1)
            resend_ms = arrival_ms + rng.randint(1, self.config.max_resend_delay_ms + 1)
            self._push(resend_ms, conflict, ArrivalKind.BAD, timing, reason)

    def _body(self, event: Event) -> bytes:
        schema = self.impression_schema if isinstance(event, Impression) else self.click_schema
        return encode_body(schema, event_record(event))


class _Profiles:
    """Each user's user agent and IP address, fixed by the seed and the user id: a browser of
    `BROWSER_USER_AGENTS` (a crawler's example for `Made.CRAWLER`) and a public address, one in `IPV6_SHARE`
    IPv6 (one in `EXCLUDED_RANGES` for `Made.EXCLUDED_IP`)."""

    _LIMIT = 200_000

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._known: dict[tuple[str, str], tuple[str, str]] = {}
        self._crawlers: tuple[str, ...] | None = None

    def of(self, user_id: str, made: str) -> tuple[str, str]:
        key = (user_id, made)
        found = self._known.get(key)
        if found is None:
            if len(self._known) >= self._LIMIT:
                self._known.clear()  # a bound on memory for runs with many users; recomputing is cheap
            found = self._known[key] = self._profile(user_id, made)
        return found

    def _profile(self, user_id: str, made: str) -> tuple[str, str]:
        digest = hashlib.blake2b(f"{self.seed}/{user_id}".encode(), digest_size=16).digest()
        bits = int.from_bytes(digest, "big")
        agents = self.crawler_agents() if made == Made.CRAWLER else BROWSER_USER_AGENTS
        user_agent = agents[bits % len(agents)]
        bits >>= 16
        if made == Made.EXCLUDED_IP:
            network = ipaddress.ip_network(EXCLUDED_RANGES[bits % len(EXCLUDED_RANGES)])
            host = 1 + (bits >> 8) % (network.num_addresses - 2)
            return user_agent, str(network.network_address + host)
        if bits % IPV6_SHARE == 0:
            return user_agent, str(ipaddress.IPv6Address(PUBLIC_IPV6_PREFIX | (bits >> 8) & (2**96 - 1) | 1))
        first = PUBLIC_FIRST_OCTETS[(bits >> 8) % len(PUBLIC_FIRST_OCTETS)]
        rest = (bits >> 16) & 0xFFFFFF
        return user_agent, f"{first}.{rest >> 16}.{(rest >> 8) & 0xFF}.{1 + (rest & 0xFF) % 254}"

    def crawler_agents(self) -> tuple[str, ...]:
        """The user agents of the crawler list's own examples, in a fixed order."""
        if self._crawlers is None:
            self._crawlers = crawler_agents(crawler_list())
        return self._crawlers


def crawler_agents(crawlers: CrawlerList) -> tuple[str, ...]:
    """The example user agents the crawler list gives for its patterns, sorted and without repeats."""
    return tuple(sorted({agent for _, agents in crawlers.examples for agent in agents}))


def write_run(
    run_dir: str | os.PathLike[str],
    config: SimulationConfig,
    start_ms: int,
    truth: GroundTruth,
    catalog: Catalog,
    complete: bool = True,
) -> Truth:
    """Write the run folder: `catalog.json`, `billable.jsonl` (the charged clicks), `not_charged.jsonl` (the billable
    clicks not charged, with their reasons), both by click_id, and `summary.json`."""
    folder = Path(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    save_catalog(catalog, folder / "catalog.json")
    result = truth.finish(folder / "billable.jsonl")
    summary = {
        "config": asdict(config),
        "start_ms": start_ms,
        "complete": complete,
        "received_time": RECEIVED_TIME,
        **result.counts,
    }
    _write_json(folder / "summary.json", summary)
    return result


def simulate(
    config: SimulationConfig,
    run_dir: str | os.PathLike[str],
    clock: Clock = system_clock_ms,
    rate_per_s: float | None = None,
) -> Iterator[Arrival]:
    """The run's arrivals, in send order; the run folder is written once the iteration has seen them all.

    A caller that stops early gets no ground truth (the folder would not describe what was sent); use
    `GroundTruth` and `write_run` directly to record a partial run.
    """
    simulator = Simulator(config, clock, rate_per_s)
    truth = GroundTruth.for_arrivals(config.expected_arrivals(), simulator.catalog)
    try:
        for arrival in simulator.arrivals():
            truth.observe(arrival)
            yield arrival
        write_run(run_dir, config, simulator.start_ms, truth, simulator.catalog)
    finally:
        truth.close()


def write_ground_truth(
    config: SimulationConfig, run_dir: str | os.PathLike[str], clock: Clock = system_clock_ms
) -> dict[str, Any]:
    """Generate the run without sending it, write its folder and return its summary.

    To keep a capture of the same run as well: `write_capture(simulate(config, run_dir, clock), path)`.
    """
    for _ in simulate(config, run_dir, clock):
        pass
    return json.loads((Path(run_dir) / "summary.json").read_text(encoding="utf-8"))


def write_capture(
    arrivals: Iterable[Arrival | Event | RawRecord | SchemaLine | CatalogEdit], path: str | os.PathLike[str]
) -> int:
    """Write arrivals (or bare events and raw records, schema versions and changes of the catalog, such as
    `Simulator.recording()` gives) as a JSON Lines capture, atomically; returns lines."""
    lines = 0

    def write(out: IO[str]) -> None:
        nonlocal lines
        for arrival in arrivals:
            item = arrival.item if isinstance(arrival, Arrival) else arrival
            out.write(capture_line(item) + "\n")
            lines += 1

    write_whole(Path(path), write)
    return lines


def _write_json(path: Path, data: Any) -> None:
    write_whole(path, json.dumps(data, indent=1, sort_keys=False) + "\n")
