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

Ground truth. `GroundTruth` admits every arrival through `billing.intake.Intake` in arrival order, with
the arrival time as the receive time (so a valid event is never "in the future"), and applies
`billing.rule.attribute` to what was accepted. For long runs it spills to disk and works partition by
partition (by event id for the intake, by (ad, user) for the rule), so memory stays bounded.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import math
import os
import pickle  # only for the simulator's own spill files, written and read by this process  # nosec B403
import random
import shutil
import tempfile
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import IO, Any

from billing.catalog import AdChange, Catalog, generate_catalog, generated_price
from billing.events import TOPIC_OF, Click, Event, Impression
from billing.intake import MIN_EVENT_TIME_MS, Intake, QuarantineReason
from billing.rule import ATTRIBUTION_WINDOW_MS, BILLABLE_FIELDS, BillableClick, attribute
from billing.schemas import schema_text
from billing.store.catalog_file import save_catalog
from producers.capture import capture_line
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
        ):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1")
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
        """Arrivals per second of event time, on average: impressions, clicks, duplicates and bad records."""
        primary = self.impression_rate * (1.0 + self.click_through_rate * (1.0 + self.edge_fraction / 4))
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

    def catalog_history(self, start_ms: int) -> Catalog:
        """The run's catalog with every change it makes (`catalog_changes`): the history the run is billed by."""
        catalog = self.catalog()
        for change in self.catalog_changes(start_ms):
            catalog = catalog.with_change(change, change.effective_from, backfill=True)
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


class ArrivalKind(StrEnum):
    """What an arrival is to the pipeline."""

    EVENT = "event"
    """A valid event, first copy."""
    DUPLICATE = "duplicate"
    """An exact re-send of an earlier valid event."""
    BAD = "bad"
    """Bad input: `expected_reason` says why the pipeline must quarantine it."""


class Timing(StrEnum):
    """How an arrival relates to its event time."""

    IN_ORDER = "in_order"
    OUT_OF_ORDER = "out_of_order"
    LATE = "late"


@dataclass(frozen=True, slots=True)
class Arrival:
    """One record to send, in send order: an event, or raw bytes for bad input that no event can express."""

    position: int
    """0-based place in the send order."""
    arrival_ms: int
    """Simulated receive time on the event-time line (>= event_time for valid events)."""
    item: Event | RawRecord
    kind: ArrivalKind
    timing: Timing = Timing.IN_ORDER
    """For events and their duplicates: how the original was delayed."""
    expected_reason: QuarantineReason | None = None

    @property
    def event(self) -> Event | None:
        """The event, or None for a raw record."""
        return None if isinstance(self.item, RawRecord) else self.item

    @property
    def raw(self) -> RawRecord | None:
        """The raw record, or None for an event."""
        return self.item if isinstance(self.item, RawRecord) else None


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
        """The run's catalog changes, by effective time (`SimulationConfig.catalog_changes`)."""
        self.catalog = config.catalog_history(self.start_ms)
        """The run's catalog with its changes: every ad the traffic uses, and the prices it is billed by."""

    def arrivals(self) -> Iterator[Arrival]:
        """Every arrival of the run, in send order; memory holds only pending clicks and delayed arrivals."""
        return _Generation(self.config, self.catalog, self.start_ms).run()


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
    """One pass of the generator. Two heaps: future events by event time, created arrivals by arrival time."""

    def __init__(self, config: SimulationConfig, catalog: Catalog, start_ms: int) -> None:
        self.config = config
        self.rng = random.Random(f"adbill-simulator-{config.seed}")
        self.ad_ids = sorted(catalog.ad_ids)
        self.start_ms = start_ms
        self.end_ms = None if config.duration_s is None else start_ms + math.ceil(config.duration_s * 1000)
        self.budget = config.events  # arrivals left to create, or None for a duration run
        self.scheduled: list[tuple[int, int, str, str, str]] = []  # (event_time, seq, "i"|"c", ad, user)
        self.pending: list[tuple[int, int, Event | RawRecord, ArrivalKind, Timing, QuarantineReason | None]] = []
        self.seq = 0
        self.next_id = {"impression": 0, "click": 0}
        self.click_schema = parse_avro_schema(schema_text("click"))
        self.impression_schema = parse_avro_schema(schema_text("impression"))

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
            if from_schedule:
                _, _, what, ad_id, user_id = heapq.heappop(self.scheduled)
                event: Event = self._new(what, ad_id, user_id, event_time)
            else:
                event = self._new("i", rng.choice(self.ad_ids), f"u{rng.randrange(config.users):07d}", event_time)
                offset += rng.random() * 2 * mean_gap_ms
                next_impression = self.start_ms + int(offset)
            # Everything created from now on arrives at or after event_time: what arrives earlier can go out.
            while self.pending and self.pending[0][0] < event_time:
                yield self._arrival(position, heapq.heappop(self.pending))
                position += 1
            self._send(event)
            if isinstance(event, Impression) and rng.random() < config.click_through_rate:
                self._schedule_click(event)
        while self.pending:
            yield self._arrival(position, heapq.heappop(self.pending))
            position += 1

    def _new(self, what: str, ad_id: str, user_id: str, event_time: int) -> Event:
        if what == "i":
            return Impression(self._id("impression"), ad_id, user_id, event_time)
        return Click(self._id("click"), ad_id, user_id, event_time)

    def _id(self, event_type: str) -> str:
        number = self.next_id[event_type]
        self.next_id[event_type] = number + 1
        return f"{self.config.prefix}-{event_type[0]}{number:010d}"

    def _schedule(self, event_time: int, what: str, ad_id: str, user_id: str) -> None:
        self.seq += 1
        heapq.heappush(self.scheduled, (event_time, self.seq, what, ad_id, user_id))

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
            self._schedule(t + min(delay, ATTRIBUTION_WINDOW_MS), "c", ad_id, user_id)

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
    ) -> None:
        # The sequence number breaks ties in creation order and keeps the heap from ever comparing items.
        self.seq += 1
        heapq.heappush(self.pending, (arrival_ms, self.seq, item, kind, timing, reason))

    @staticmethod
    def _arrival(position: int, entry: tuple[int, int, Any, ArrivalKind, Timing, Any]) -> Arrival:
        arrival_ms, _, item, kind, timing, reason = entry
        return Arrival(position, arrival_ms, item, kind, timing, reason)

    def _send(self, event: Event) -> None:
        rng, config = self.rng, self.config
        if not self._take():
            return
        u = rng.random()
        if u < config.late_fraction:
            timing, delay = Timing.LATE, rng.randint(config.late_min_ms, config.late_max_ms)
        elif u < config.late_fraction + config.out_of_order_fraction:
            timing, delay = Timing.OUT_OF_ORDER, rng.randint(1, config.max_disorder_ms)
        else:
            timing, delay = Timing.IN_ORDER, 0
        arrival_ms = event.event_time + delay
        self._push(arrival_ms, event, ArrivalKind.EVENT, timing, None)
        if rng.random() < config.duplicate_fraction and self._take():
            resend_ms = arrival_ms + rng.randint(0, config.max_resend_delay_ms)
            self._push(resend_ms, event, ArrivalKind.DUPLICATE, timing, None)
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


# --- Ground truth ----------------------------------------------------------------------------------

EVENTS_PER_TRUTH_PARTITION = 500_000
"""Events the ground truth holds in memory at a time; a longer run is partitioned on disk."""


RECEIVED_TIME = "arrival_ms: the simulated receive time (event time + arrival delay), never before event_time"


@dataclass
class Truth:
    """The billable set (in a file, sorted by click_id) and the counts of one run."""

    billable_path: Path
    counts: dict[str, Any] = field(default_factory=dict)

    def billable(self) -> Iterator[dict[str, Any]]:
        """The billable clicks, one dict (`BillableClick.to_dict()`) each, by click_id."""
        with open(self.billable_path, encoding="utf-8") as lines:
            for line in lines:
                yield json.loads(line)


class GroundTruth:
    """Observes arrivals in send order and computes, with `Intake` and `attribute`, what must be billed.

    With `partitions` > 1 the events are spilled to `workdir` by event id (the intake's state is per id) and
    the accepted ones re-spilled by (ad, user) (the rule's state is per pair): each step holds one partition
    in memory.
    """

    def __init__(self, catalog: Catalog, partitions: int = 1, workdir: str | os.PathLike[str] | None = None) -> None:
        if partitions < 1:
            raise ValueError("partitions must be at least 1")
        self.catalog = catalog
        self.partitions = partitions
        self._own_workdir = workdir is None
        self.workdir = Path(tempfile.mkdtemp(prefix="adbill-truth-") if workdir is None else workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.sent: Counter[str] = Counter()
        self.primary: Counter[str] = Counter()
        self.timing: Counter[str] = Counter()
        self.duplicates: Counter[str] = Counter()
        self.bad: Counter[str] = Counter()
        self.raw_quarantined: Counter[str] = Counter()
        self.first_event_ms: int | None = None
        self.last_event_ms: int | None = None
        self._intake = Intake() if partitions == 1 else None
        self._spill = _Spill(self.workdir / "by-id", partitions) if partitions > 1 else None

    @classmethod
    def for_config(cls, config: SimulationConfig, catalog: Catalog, workdir: str | None = None) -> GroundTruth:
        """Sized for the run: one partition per `EVENTS_PER_TRUTH_PARTITION` expected arrivals."""
        partitions = max(1, math.ceil(config.expected_arrivals() / EVENTS_PER_TRUTH_PARTITION))
        return cls(catalog, partitions, workdir)

    def observe(self, arrival: Arrival) -> None:
        """Take the next arrival, in send order."""
        item = arrival.item
        if isinstance(item, RawRecord):
            self.sent["raw"] += 1
            reason = arrival.expected_reason or QuarantineReason.UNDECODABLE
            self.bad[reason.value] += 1
            # Raw records never decode to an event: the pipeline quarantines them before the intake.
            self.raw_quarantined[reason.value] += 1
            return
        self.sent[item.type] += 1
        if arrival.kind == ArrivalKind.EVENT:
            self.primary[item.type] += 1
            self.timing[arrival.timing.value] += 1
            if self.first_event_ms is None or item.event_time < self.first_event_ms:
                self.first_event_ms = item.event_time
            if self.last_event_ms is None or item.event_time > self.last_event_ms:
                self.last_event_ms = item.event_time
        elif arrival.kind == ArrivalKind.DUPLICATE:
            self.duplicates[item.type] += 1
        elif arrival.expected_reason is not None:
            self.bad[arrival.expected_reason.value] += 1
        if self._intake is not None:
            self._intake.admit(item, arrival.arrival_ms)
        else:
            assert self._spill is not None
            self._spill.add(item.event_id, (arrival.arrival_ms, *_event_tuple(item)))

    def finish(self, billable_path: str | os.PathLike[str]) -> Truth:
        """Write the billable clicks to `billable_path` (JSON Lines by click_id) and return the counts."""
        intake_counts: Counter[str] = Counter()
        runs: list[Path] = []
        totals = _Totals()
        if self._intake is not None:
            intake_counts.update(self._intake.counts)
            rows = attribute(self._intake.impressions, self._intake.clicks, self.catalog)
            runs.append(self._write_run(rows, totals, 0))
            self._intake = Intake()  # release the events
        else:
            assert self._spill is not None
            by_pair = _Spill(self.workdir / "by-pair", self.partitions)
            for arrivals in self._spill.partitions():
                intake = Intake()
                for received_ms, *stored in arrivals:
                    intake.admit(_event_of(stored), received_ms)
                intake_counts.update(intake.counts)
                accepted: list[Event] = [*intake.impressions, *intake.clicks]
                for event in accepted:
                    by_pair.add(f"{event.ad_id}\x00{event.user_id}", _event_tuple(event))
            self._spill.remove()
            for number, tuples in enumerate(by_pair.partitions()):
                events = [_event_of(stored) for stored in tuples]
                impressions = [e for e in events if isinstance(e, Impression)]
                clicks = [e for e in events if isinstance(e, Click)]
                runs.append(self._write_run(attribute(impressions, clicks, self.catalog), totals, number))
            by_pair.remove()
        for reason, count in self.raw_quarantined.items():
            intake_counts[reason] += count
        _merge_runs(runs, Path(billable_path))
        for run in runs:
            run.unlink()
        self.close()
        counts = {
            "arrivals": sum(self.sent.values()),
            "sent": _ordered(self.sent, ("impression", "click", "raw")),
            "primary": _ordered(self.primary, ("impression", "click")),
            "timing": _ordered(self.timing, [t.value for t in Timing]),
            "duplicates": _ordered(self.duplicates, ("impression", "click")),
            "bad": {
                **_ordered(self.bad, [r.value for r in QuarantineReason]),
                "total": sum(self.bad.values()),
            },
            "intake": dict(sorted(intake_counts.items())),
            "first_event_time": self.first_event_ms,
            "last_event_time": self.last_event_ms,
            "billable": totals.as_dict(),
        }
        return Truth(Path(billable_path), counts)

    def close(self) -> None:
        """Remove the spill files (and the work folder when this object made it)."""
        if self._spill is not None:
            self._spill.remove()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _write_run(self, rows: list[BillableClick], totals: _Totals, number: int) -> Path:
        path = self.workdir / f"billable-{number:05d}.jsonl"
        with open(path, "w", encoding="utf-8") as out:
            for row in rows:  # `attribute` returns rows by click_id
                totals.add(row)
                # `BillableClick.to_dict()` goes through `asdict`, which is slow; this is the same dict.
                out.write(json.dumps({name: getattr(row, name) for name in BILLABLE_FIELDS}) + "\n")
        return path


def _event_tuple(event: Event) -> tuple[bool, str, str, str, int]:
    """A compact, picklable form of an event: (is_click, id, ad_id, user_id, event_time)."""
    return (isinstance(event, Click), event.event_id, event.ad_id, event.user_id, event.event_time)


def _event_of(stored: tuple[bool, str, str, str, int] | list[Any]) -> Event:
    is_click, event_id, ad_id, user_id, event_time = stored
    return (Click if is_click else Impression)(event_id, ad_id, user_id, event_time)


def _ordered(counter: Counter[str], keys: Iterable[str]) -> dict[str, int]:
    return {key: counter.get(key, 0) for key in keys}


class _Totals:
    def __init__(self) -> None:
        self.clicks = 0
        self.by_advertiser: dict[str, dict[str, Any]] = {}
        self.by_currency: Counter[str] = Counter()

    def add(self, row: BillableClick) -> None:
        self.clicks += 1
        entry = self.by_advertiser.setdefault(row.advertiser_id, {"clicks": 0, "micros": 0, "currency": row.currency})
        entry["clicks"] += 1
        entry["micros"] += row.amount_micros
        self.by_currency[row.currency] += row.amount_micros

    def as_dict(self) -> dict[str, Any]:
        return {
            "clicks": self.clicks,
            "total_micros_by_currency": dict(sorted(self.by_currency.items())),
            "by_advertiser": dict(sorted(self.by_advertiser.items())),
        }


class _Spill:
    """Items spread over N files by a stable hash of a key; read back a partition at a time, in order."""

    _BATCH = 4096

    def __init__(self, folder: Path, count: int) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.count = count
        self._buffers: list[list[Any]] = [[] for _ in range(count)]
        self._files: list[IO[bytes]] = [open(folder / f"{n:05d}.pickle", "wb") for n in range(count)]  # noqa: SIM115

    def add(self, key: str, item: Any) -> None:
        number = zlib.crc32(key.encode("utf-8")) % self.count
        buffer = self._buffers[number]
        buffer.append(item)
        if len(buffer) >= self._BATCH:
            pickle.dump(buffer, self._files[number], protocol=pickle.HIGHEST_PROTOCOL)
            buffer.clear()

    def partitions(self) -> Iterator[list[Any]]:
        """Each partition's items in the order they were added; closes the files for writing first."""
        for number, out in enumerate(self._files):
            if self._buffers[number]:
                pickle.dump(self._buffers[number], out, protocol=pickle.HIGHEST_PROTOCOL)
                self._buffers[number] = []
            out.close()
        for number in range(self.count):
            items: list[Any] = []
            with open(self.folder / f"{number:05d}.pickle", "rb") as source:
                while True:
                    try:
                        items.extend(pickle.load(source))  # our own spill file, in our temp folder  # nosec B301
                    except EOFError:
                        break
            yield items

    def remove(self) -> None:
        for out in self._files:
            out.close()
        self._buffers = [[] for _ in range(self.count)]
        shutil.rmtree(self.folder, ignore_errors=True)


def _merge_runs(runs: list[Path], target: Path) -> None:
    """Merge sorted JSON Lines runs by click_id into `target`, atomically."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        sources = [stack.enter_context(open(run, encoding="utf-8")) for run in runs]
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}-")
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            for line in heapq.merge(*sources, key=lambda text: json.loads(text)["click_id"]):
                out.write(line)
        os.replace(tmp, target)


def write_run(
    run_dir: str | os.PathLike[str],
    config: SimulationConfig,
    start_ms: int,
    truth: GroundTruth,
    catalog: Catalog,
    complete: bool = True,
) -> Truth:
    """Write the run folder: `catalog.json`, `billable.jsonl` (by click_id) and `summary.json`."""
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
    truth = GroundTruth.for_config(config, simulator.catalog)
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


def write_capture(arrivals: Iterable[Arrival | Event | RawRecord], path: str | os.PathLike[str]) -> int:
    """Write arrivals (or bare events and raw records) as a JSON Lines capture, atomically; returns lines."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}-")
    lines = 0
    try:
        with open(fd, "w", encoding="utf-8") as out:
            for arrival in arrivals:
                item = arrival.item if isinstance(arrival, Arrival) else arrival
                out.write(capture_line(item) + "\n")
                lines += 1
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return lines


def _write_json(path: Path, data: Any) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(data, out, indent=1, sort_keys=False)
        out.write("\n")
    os.replace(tmp, path)
