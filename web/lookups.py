"""What a page and its JSON twin both look up: the access check, the read and the 404, each said once.

Each function goes from the request to the value that `web.pages` renders and `web.api` serializes: the guard of
`web.guards`, the query arguments, the reader, and 404 when there is nothing to show. The checks run in the same
order for both, so a page and its API document answer the same request alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from flask import abort, g, request

from billing.budget_days import CampaignDay
from billing.corrections import Correction
from billing.money import Amounts
from billing.store.part_status import RECONCILE_PART, RECONCILE_RUN_PART, STREAM_CATALOG_PART, STREAM_PART
from billing.store.stream_offsets import LagReading
from web.display import period_label
from web.freshness import (
    ComponentStatus,
    Freshness,
    database_status,
    job_status,
    kafka_status,
    reconciliation_status,
    redis_status,
    waiting_status,
    worst,
)
from web.freshness import freshness as page_freshness
from web.guards import advertiser_or_404, finance_or_404, health_or_404, paging_args, period_arg
from web.model import (
    AdDetail,
    Audit,
    CampaignDetail,
    CorrectionPage,
    Finance,
    Health,
    NotChargedClicks,
    group,
    total,
    total_not_charged,
)
from web.ranges import (
    DEFAULT_PRESET,
    DateRange,
    RangeError,
    RangeProblem,
    day_of,
    parse_range,
    today_of,
)
from web.services import services

T = TypeVar("T")


def found(value: T | None) -> T:
    """The value, or 404 when there is none."""
    if value is None:
        abort(404)
    return value


def dashboard(
    advertiser_id: str,
    form: str,
    render: Callable[[str, str | None, DateRange | None], T | None],
    lenient: bool = False,
) -> T:
    """The advertiser's dashboard in one `form` (the page's content, the API's document), as `render` makes it from
    the advertiser, the period and the date range asked for; kept a second per worker (`web.cache`), the same for
    everyone allowed to see it. `lenient` (a page): a range that cannot be read is shown beside the form
    (`page_date_range`) instead of a 400 alone."""
    advertiser_or_404(advertiser_id)
    period = period_arg()
    span = page_date_range(DEFAULT_PRESET) if lenient else date_range(DEFAULT_PRESET)
    key = (form, advertiser_id, period, span, g.get("range_problem"))
    return found(services().recent.get(key, lambda: render(advertiser_id, period, span)))


def date_range(default: str | None = None) -> DateRange | None:
    """The `range` preset or the `from`/`to` dates of the query (today from the app's clock); 400 when they cannot
    be read."""
    try:
        return parse_range(
            request.args.get("range"),
            request.args.get("from"),
            request.args.get("to"),
            today_of(services().clock()),
            default,
        )
    except RangeError as exc:
        abort(400, description=str(exc))


def page_date_range(default: str) -> DateRange | None:
    """A page's date range: as `date_range`, but one that cannot be read is not the end of the page: the default
    range is shown, and the problem (`range_problem()`: the message and what was typed) beside the range's form."""
    args = request.args
    try:
        return parse_range(args.get("range"), args.get("from"), args.get("to"), today_of(services().clock()), default)
    except RangeError as exc:
        g.range_problem = RangeProblem(
            str(exc), args.get("from", "")[:40], args.get("to", "")[:40], args.get("range", "")[:40]
        )
        return parse_range(None, None, None, today_of(services().clock()), default)


def range_problem() -> RangeProblem | None:
    """The date range this request asked for and could not be read (`page_date_range`), or None."""
    found: RangeProblem | None = g.get("range_problem")
    return found


def range_figures(level: str, ident: str, advertiser_id: str, span: DateRange) -> dict[str, Any]:
    """The range's figures per day and per month and in all (with the clicks not charged), for a page or a
    document."""
    bills = services().figures.range_bills(level, ident, advertiser_id, span.start_ms, span.end_ms)
    return {
        "range": span,
        "days": group(bills, 10),
        "months": group(bills, 7),
        "total": total(bills),
        "not_charged": total_not_charged(bills),
    }


def budget_days(
    advertiser_id: str, campaign_ids: list[str], span: DateRange | None, budgeted_only: bool = True
) -> list[CampaignDay]:
    """The advertiser's campaigns' UTC days in the range (default: today), newest first: budget, charged, over
    budget (`budgeted_only`: the days with a budget or clicks over one; else every day with figures too); the
    campaigns are the catalog's of that advertiser, so another advertiser's never show."""
    svc = services()
    now = svc.clock()
    owned = set(svc.catalog.get().campaigns_of(advertiser_id))
    days = [d.isoformat() for d in span.days()] if span else [day_of(now)]
    return svc.budgets.campaign_days([c for c in campaign_ids if c in owned], days, now, budgeted_only)


def campaign(advertiser_id: str, campaign_id: str) -> CampaignDetail:
    advertiser_or_404(advertiser_id)
    return found(services().figures.campaign(advertiser_id, campaign_id, period_arg()))


def ad(advertiser_id: str, ad_id: str) -> AdDetail:
    advertiser_or_404(advertiser_id)
    return found(services().figures.ad(advertiser_id, ad_id))


def corrections(advertiser_id: str) -> CorrectionPage:
    """The page of the advertiser's corrections that `offset` and `limit` ask for, newest first."""
    advertiser_or_404(advertiser_id)
    offset, limit = paging_args()
    return services().corrections.page(advertiser_id, offset, limit)


def correction(advertiser_id: str, correction_id: str) -> Correction:
    advertiser_or_404(advertiser_id)
    return found(services().corrections.find(advertiser_id, correction_id))


def not_charged_clicks(advertiser_id: str, paged: bool = True) -> NotChargedClicks:
    """The advertiser's billable clicks not charged in the `period` asked for, else in the date range (`range`, or
    `from` and `to`; default: month to date), newest first; the page that `offset` and `limit` ask for (`paged`),
    else every one (the CSV)."""
    advertiser_or_404(advertiser_id)
    svc = services()
    offset, limit = paging_args()
    key = period_arg()
    span: DateRange | None = None
    if key is not None:
        start = svc.periods.length.parse_key(key)
        end, label = start + svc.periods.length.length_ms, period_label(key)
    else:
        span = date_range(DEFAULT_PRESET)
        assert span is not None  # a default is given
        start, end, label = span.start_ms, span.end_ms, span.label
    clicks = svc.exports.not_charged_clicks(advertiser_id, start, end)
    would_cost = Amounts.of((c.currency, c.amount_micros) for c in clicks if c.amount_micros is not None)
    by_reason: dict[str, int] = {}
    for c in clicks:
        by_reason[c.reason] = by_reason.get(c.reason, 0) + 1
    if not paged:
        offset, limit = 0, max(len(clicks), 1)
    return NotChargedClicks(
        advertiser_id,
        svc.catalog.currency(advertiser_id),
        label,
        key,
        span,
        len(clicks),
        offset,
        limit,
        clicks[offset : offset + limit],
        would_cost.as_dict(),
        dict(sorted(by_reason.items())),
        any(not c.final for c in clicks),
    )


def finance() -> Finance:
    """Every advertiser in the period asked for (default: the latest), the periods and the exports."""
    finance_or_404()
    return found(services().finance.period(period_arg()))


def health() -> Health:
    health_or_404()
    return services().job.health()


def freshness() -> Freshness:
    """When the data was last billed (the job's heartbeat) and how that compares with the limits."""
    svc = services()
    return page_freshness(svc.job.heartbeat_ms(), svc.clock(), svc.ready_batch_age_s)


def kafka_lag() -> LagReading | None:
    """The billing query's lag, read from Kafka and its checkpoint now (kept a few seconds); None when not asked."""
    read = services().kafka_lag
    return read() if read else None


@dataclass(frozen=True, slots=True)
class HealthReport:
    """What the health page and its API twin show: the job's health, the data's freshness, the last audit (None
    before the first), Kafka's lag read now (None when not asked) and each component's status (`health_status`)."""

    health: Health
    fresh: Freshness
    audit: Audit | None
    lag: LagReading | None
    statuses: list[ComponentStatus]

    @property
    def overall(self) -> str:
        """The worst of the components' levels."""
        return worst([s.level for s in self.statuses])


def health_report() -> HealthReport:
    """What the health page and its API twin show (`HealthReport`); 404 for anyone but finance and admin (`health`)."""
    h = health()
    fresh = freshness()
    audit = services().finance.last_audit()
    lag = kafka_lag()
    return HealthReport(h, fresh, audit, lag, health_status(h, fresh, audit, lag))


def health_status(
    h: Health, fresh: Freshness, audit: Audit | None, lag: LagReading | None = None
) -> list[ComponentStatus]:
    """The job, Kafka, Redis and reconciliation, each summed up in one status; a part that says it waits (for disk
    space) shows that instead. Kafka's lag is `lag` (read from Kafka) when given, else the job's last report;
    reconciliation's takes in the last `audit` (None before the first)."""
    svc = services()
    now = svc.clock()
    query = next((q for q in h.queries if q.name == "billing"), None)
    r = h.reconciliation
    stream_waits, reconcile_waits = svc.job.part_waiting(STREAM_PART), svc.job.part_waiting(RECONCILE_PART)
    running = svc.job.part_waiting(RECONCILE_RUN_PART).get("since_ms", "")
    catalog_behind = svc.job.part_waiting(STREAM_CATALOG_PART)
    waiting = sum(n or 0 for n in (lag.lag if lag is not None and lag.lag else (query.lag if query else {})).values())
    watermark = None
    if query is not None:
        streams = [w for w in query.stream_watermarks_ms.values() if w is not None]
        watermark = query.watermark_ms if query.watermark_ms is not None else min(streams, default=None)
    job = job_status(
        fresh,
        now,
        query.recent_durations_ms if query else (),
        watermark,
        svc.watermark_delay_ms,
        flowing=waiting > 0 or bool(query and query.input_rows),
    )
    return [
        waiting_status("Streaming job", stream_waits, now) if stream_waits else job,
        kafka_status(query.lag if query else {}, query.lag_before if query else None)
        if lag is None
        else kafka_status(lag.lag, query.lag_before if query else None, lag.error, fresh, lag.committed),
        redis_status(),
        waiting_status("Catalog database", catalog_behind, now)
        if catalog_behind
        else database_status(svc.catalog.get().version, svc.catalog.behind),
        waiting_status("Reconciliation", reconcile_waits, svc.clock())
        if reconcile_waits
        else reconciliation_status(
            r.finished_at_ms if r else None,
            r.held if r else {},
            audit.differences if audit else [],
            now,
            audit.awaiting_close if audit else [],
            int(running) if running.isdigit() else None,
        ),
    ]
