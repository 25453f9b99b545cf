"""What the web UI shows, as plain values: billed figures, periods, corrections, exports and the pipeline's health.

Pure: no Flask, no Redis. The readers (`web.readers` and one module beside it for each thing read) fill these from
Redis and the export folder; the views and the JSON API
turn them into pages and documents; a range's periods are summed per day or month here (`group`, `SpanTotal`). A
correction is reconciliation's own `billing.corrections.Correction`, an export its manifest
(`billing.export.Manifest`). Money is integer micros throughout; `web.display` formats it for people.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Self

from web.ranges import DateRange, day_of

if TYPE_CHECKING:
    from billing.corrections import Correction
    from billing.store.export_files import Manifest
    from billing.store.not_charged_clicks import NotChargedClick


class Summable:
    """A dataclass of counts or amounts that adds up field by field (`+`), each field a whole number or itself
    `Summable`, and is zero when every field is (`is_zero`). Pages add these up by the thousand: the fields are read
    by one getter per class."""

    __slots__ = ()

    def __add__(self, other: Self) -> Self:
        values = _values_of(type(self))
        return type(self)(*map(operator.add, values(self), values(other)))

    @property
    def is_zero(self) -> bool:
        return all(v.is_zero if isinstance(v, Summable) else v == 0 for v in _values_of(type(self))(self))


_GETTERS: dict[type, Callable[[Any], tuple[Any, ...]]] = {}


def _values_of(kind: type) -> Callable[[Any], tuple[Any, ...]]:
    """A getter of a dataclass's field values, in their order (a tuple even for one field), made once per class."""
    getter = _GETTERS.get(kind)
    if getter is None:
        names = [f.name for f in fields(kind)]
        one = operator.attrgetter(*names)
        getter = _GETTERS[kind] = one if len(names) > 1 else lambda item: (one(item),)
    return getter


@dataclass(frozen=True, slots=True)
class Figures(Summable):
    """Clicks and their amount in micros (either may be negative for corrections)."""

    clicks: int = 0
    micros: int = 0


@dataclass(frozen=True, slots=True)
class Billed(Summable):
    """One advertiser, campaign or ad in one period: what the stream billed and what reconciliation corrected.

    The corrected figure is the provisional one plus the (signed) corrections, as the contract defines it.
    """

    provisional: Figures = Figures()
    corrections: Figures = Figures()

    @property
    def corrected(self) -> Figures:
        return self.provisional + self.corrections


@dataclass(frozen=True, slots=True)
class EventCounts(Summable):
    """Impressions and clicks of one kind: late ones (the watermark kept them out of the streaming join, for
    reconciliation to bill), or clock-ahead ones (their time was ahead of Kafka's receipt by more than the
    tolerance; billed on their own time)."""

    impressions: int = 0
    clicks: int = 0


@dataclass(frozen=True, slots=True)
class UnbilledCounts(Summable):
    """Clicks the rule matched that had no price at their time (docs/billing-rules.md): the ad was paused (`ad_paused`),
    or the catalog did not know it then (`unknown_ad`: not in the catalog, or before its first entry). Kept and counted,
    never dropped; reconciliation bills them if the catalog shows a price at their time after all."""

    ad_paused: int = 0
    unknown_ad: int = 0


NOT_CHARGED_REASONS: tuple[str, ...] = ("known_bot", "excluded_ip", "click_flood", "duplicate_click", "over_budget")
"""Why a priced click is not charged: the invalid traffic rules in their order (`billing.invalid`), then the budget
(`billing.budgets.OVER_BUDGET`); the fields of `NotCharged`, in that order."""


@dataclass(frozen=True, slots=True)
class NotCharged(Summable):
    """Priced clicks not charged (docs/billing-rules.md, "Invalid traffic" and "Budgets"), per reason, each with what it
    would have cost: kept, counted and shown, never dropped. The stream's and the corrections booked in the period (a
    retraction for a rule adds a click here, an addition takes one away); a closed period's are its export's."""

    known_bot: Figures = Figures()
    excluded_ip: Figures = Figures()
    click_flood: Figures = Figures()
    duplicate_click: Figures = Figures()
    over_budget: Figures = Figures()

    def of(self, reason: str) -> Figures:
        figures: Figures = getattr(self, reason)
        return figures

    @property
    def invalid(self) -> Figures:
        """Invalid clicks (not charged): the four rules together."""
        return self.known_bot + self.excluded_ip + self.click_flood + self.duplicate_click

    def invalid_rate(self, charged_clicks: int) -> str:
        """The invalid click rate for people: invalid / (charged + invalid) (`billing.invalid.format_rate`)."""
        from billing.invalid import format_rate

        return format_rate(self.invalid.clicks, charged_clicks)


@dataclass(frozen=True, slots=True)
class Period:
    """A billing period: its key (`20260101T0000Z`), start and whether reconciliation closed it."""

    key: str
    start_ms: int
    closed: bool


@dataclass(frozen=True, slots=True)
class CampaignLine:
    campaign_id: str
    billed: Billed
    not_charged: NotCharged = NotCharged()


@dataclass(frozen=True, slots=True)
class AdLine:
    ad_id: str
    campaign_id: str
    billed: Billed
    late: EventCounts
    clock_ahead: EventCounts = EventCounts()
    unbilled: UnbilledCounts = UnbilledCounts()
    not_charged: NotCharged = NotCharged()


@dataclass(frozen=True, slots=True)
class PeriodBill:
    """One period's line of a series: the chart of spend over time and the per-period tables."""

    period: Period
    billed: Billed
    late: EventCounts = EventCounts()
    clock_ahead: EventCounts = EventCounts()
    unbilled: UnbilledCounts = UnbilledCounts()
    not_charged: NotCharged = NotCharged()


@dataclass(frozen=True, slots=True)
class Dashboard:
    """An advertiser's page: the selected period in detail, and every period's totals for the chart."""

    advertiser_id: str
    currency: str
    period: Period | None
    periods: list[Period]
    billed: Billed
    late: EventCounts
    clock_ahead: EventCounts
    campaigns: list[CampaignLine]
    ads: list[AdLine]
    series: list[PeriodBill]
    quarantined: dict[str, int]
    unbilled: UnbilledCounts = UnbilledCounts()
    not_charged: NotCharged = NotCharged()


@dataclass(frozen=True, slots=True)
class CampaignDetail:
    advertiser_id: str
    campaign_id: str
    currency: str
    period: Period | None
    series: list[PeriodBill]
    ads: list[AdLine]


@dataclass(frozen=True, slots=True)
class AdDetail:
    advertiser_id: str
    campaign_id: str
    ad_id: str
    currency: str
    series: list[PeriodBill]


@dataclass(frozen=True, slots=True)
class CorrectionPage:
    advertiser_id: str
    currency: str
    total: int
    offset: int
    limit: int
    items: list[Correction]


@dataclass(frozen=True, slots=True)
class NotChargedClicks:
    """An advertiser's billable clicks that were not charged, in a period or a date range (`span`), newest first:
    one page of them (`items`, from `offset`), and what all of them would have cost, per currency."""

    advertiser_id: str
    currency: str
    span: str
    """What was asked for, for people: a period's label, or a date range's."""
    period: str | None
    """The period asked for (`period=`), or None for a date range."""
    range: DateRange | None
    total: int
    offset: int
    limit: int
    items: list[NotChargedClick]
    would_cost: dict[str, int]
    """Micros per currency of every click listed (not only this page's), never added across two; those without a
    price count in `total` only."""
    by_reason: dict[str, int]
    """Clicks per reason, every click listed."""
    provisional: bool
    """Some clicks come from a period still open: the stream's decision, which reconciliation may still correct."""


@dataclass(frozen=True, slots=True)
class AdvertiserLine:
    advertiser_id: str
    currency: str
    billed: Billed
    not_charged: NotCharged = NotCharged()


@dataclass(frozen=True, slots=True)
class Finance:
    """Finance's page: every advertiser in one period, the periods, the exports."""

    period: Period | None
    periods: list[Period]
    advertisers: list[AdvertiserLine]
    exports: list[Manifest]
    audit: Audit | None = None


@dataclass(frozen=True, slots=True)
class FinanceRange:
    """Finance's view of a date range (a month, say): every advertiser's figures over the range's periods, and how
    many of those periods are still open (their figures provisional)."""

    advertisers: list[AdvertiserLine]
    periods: int
    open_periods: int

    @property
    def closed(self) -> bool:
        return self.open_periods == 0


@dataclass(frozen=True, slots=True)
class FinancePeriod:
    """One period on finance's page: every advertiser's figures added up per currency, and why it is held."""

    period: Period
    by_currency: dict[str, Billed]
    held: str | None = None
    not_charged_by_currency: dict[str, NotCharged] = field(default_factory=dict)


def totals_by_currency(lines: Iterable[AdvertiserLine]) -> dict[str, Billed]:
    """Advertisers' figures added up per currency, never two currencies together: an advertiser whose currency is
    unknown (the catalog does not know it) is in no total."""
    out: dict[str, Billed] = {}
    for line in lines:
        if not line.currency:
            continue
        out[line.currency] = out.get(line.currency, Billed()) + line.billed
    return dict(sorted(out.items()))


def not_charged_by_currency(lines: Iterable[AdvertiserLine]) -> dict[str, NotCharged]:
    """Advertisers' clicks not charged (and what they would have cost) added up per currency, as
    `totals_by_currency` adds their bills."""
    out: dict[str, NotCharged] = {}
    for line in lines:
        if line.currency:
            out[line.currency] = out.get(line.currency, NotCharged()) + line.not_charged
    return dict(sorted(out.items()))


@dataclass(frozen=True, slots=True)
class QueryHealth:
    """The latest micro-batch of one streaming query, from its health record."""

    name: str
    batch_id: int | None
    timestamp: str
    input_rows: int
    input_rows_per_second: float
    processed_rows_per_second: float
    batch_duration_ms: int
    durations_ms: dict[str, int]
    watermark_ms: int | None
    stream_watermarks_ms: dict[str, int | None]
    state_rows: int
    state_memory_bytes: int
    rows_dropped_by_watermark: int
    lag: dict[str, int | None]
    recent_durations_ms: list[int] = field(default_factory=list)
    lag_before: dict[str, int | None] | None = None
    """The lag of an older batch of the recent history (`LAG_LOOKBACK` batches back): whether the lag grows."""


@dataclass(frozen=True, slots=True)
class CompactionPass:
    """The last pass of one part of the data folder's upkeep: the closed periods' compaction, the open periods', the
    click filters (`ops.reconcile.record_compaction`)."""

    part: str
    finished_at_ms: int
    summary: str
    failed: list[str]
    """Period folders left as written, or the error, with why."""
    waiting: int = 0
    """The filters only: closed periods whose batch files are not compacted yet (also in `summary`)."""


COMPACTION_PARTS = {
    "closed": "Compaction of the closed periods",
    "open": "Compaction of the open periods",
    "filters": "Click filters",
}
"""The parts, in the page's order, with their names there."""


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """The last reconciliation run."""

    run_id: str
    started_at_ms: int
    finished_at_ms: int
    duration_ms: int
    periods: list[str]
    closed: list[str]
    additions: int
    retractions: int
    net_micros_by_currency: dict[str, int]
    """What the run's corrections add up to, per currency (an earlier record without it: empty)."""
    held: dict[str, str] = field(default_factory=dict)
    """Periods past their lateness horizon that the streaming job has not passed yet, with the reason."""


@dataclass(frozen=True, slots=True)
class Audit:
    """The last `adbill audit`: the rule over every event against the books, per period."""

    ran_at_ms: int
    periods: int
    differences: list[str]
    """Closed periods whose books (export and adjustments) differ from the rule: a failure (empty: none)."""
    awaiting_close: list[str] = field(default_factory=list)
    """Open periods whose ledger and corrections differ from the rule: no failure, the close corrects them."""


@dataclass(frozen=True, slots=True)
class ClockAheadLine:
    """An ad's events in one period whose clock was ahead of Kafka's: where to look for the producer's clock."""

    period: Period
    advertiser_id: str
    ad_id: str
    counts: EventCounts


@dataclass(frozen=True, slots=True)
class UnbilledLine:
    """An ad's clicks in one period that had no price at their time; `advertiser_id` is empty when the catalog does
    not know the ad."""

    period: Period
    advertiser_id: str
    ad_id: str
    counts: UnbilledCounts


@dataclass(frozen=True, slots=True)
class Health:
    """The admin's page."""

    queries: list[QueryHealth]
    quarantined: dict[str, dict[str, int]]
    late: list[PeriodBill]
    clock_ahead: list[ClockAheadLine]
    reconciliation: Reconciliation | None
    unbilled: list[UnbilledLine] = field(default_factory=list)
    compaction: list[CompactionPass] = field(default_factory=list)
    """The last pass of each part that has run (`COMPACTION_PARTS` order)."""

    @property
    def quarantined_total(self) -> int:
        return sum(sum(topics.values()) for topics in self.quarantined.values())


def consumer_lag(sources: Iterable[Mapping[str, Any]]) -> dict[str, int | None]:
    """Records not yet read, per topic: latest offset minus end offset, summed over partitions.

    `end_offset` and `latest_offset` are `{topic: {partition: offset}}`, as objects or JSON text. A topic whose
    latest offsets are not reported maps to None (unknown), never to 0.
    """
    lag: dict[str, int | None] = {}
    for source in sources:
        end = _offsets(source.get("end_offset"))
        latest = _offsets(source.get("latest_offset"))
        for topic, partitions in end.items():
            if topic not in latest:
                lag.setdefault(topic, None)
                continue
            # Partitions missing from either side are left out: their lag is not known.
            behind = sum(max(0, latest[topic][p] - offset) for p, offset in partitions.items() if p in latest[topic])
            previous = lag.get(topic)
            lag[topic] = behind + (previous or 0)
        for topic in latest.keys() - end.keys():
            lag.setdefault(topic, None)
    return dict(sorted(lag.items()))


def _offsets(value: Any) -> dict[str, dict[str, int]]:
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    if not isinstance(value, Mapping):
        return {}
    out: dict[str, dict[str, int]] = {}
    for topic, partitions in value.items():
        if isinstance(partitions, Mapping):
            out[str(topic)] = {str(p): int(o) for p, o in partitions.items() if isinstance(o, int | str)}
    return out


@dataclass(frozen=True, slots=True)
class SpanTotal:
    """One day's or month's figures: `key` is `2026-01-31` or `2026-01`; `open_periods` counts the periods not yet
    closed in it (their figures may still change)."""

    key: str
    billed: Billed
    periods: int
    open_periods: int
    not_charged: NotCharged = NotCharged()

    @property
    def closed(self) -> bool:
        return self.open_periods == 0


def group(bills: Iterable[PeriodBill], key_length: int) -> list[SpanTotal]:
    """Periods summed per day (`key_length` 10) or per month (7), oldest first."""
    sums: dict[str, tuple[Billed, int, int, NotCharged]] = {}
    for bill in bills:
        key = day_of(bill.period.start_ms)[:key_length]
        billed, n, open_n, not_charged = sums.get(key, (Billed(), 0, 0, NotCharged()))
        sums[key] = (
            billed + bill.billed,
            n + 1,
            open_n + (0 if bill.period.closed else 1),
            not_charged + bill.not_charged,
        )
    return [SpanTotal(key, billed, n, open_n, nc) for key, (billed, n, open_n, nc) in sorted(sums.items())]


def total(bills: Iterable[PeriodBill]) -> Billed:
    out = Billed()
    for bill in bills:
        out += bill.billed
    return out


def total_not_charged(bills: Iterable[PeriodBill]) -> NotCharged:
    """The clicks not charged over the periods, per reason."""
    out = NotCharged()
    for bill in bills:
        out += bill.not_charged
    return out
