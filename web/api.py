"""The JSON API under `/api/v1`: the pages' data for scripts, with the pages' access rules (`web.guards`).

Authentication is the session cookie of a login, or an API token (`Authorization: Bearer TOKEN`, made with
`adbill tokens create USER`) with exactly its account's access (see `web/README.md`); without either every route but
the OpenAPI document answers 401. Money is integer micros, written as JSON strings (`"9007199254740993"`), as the
proto3 JSON mapping writes 64-bit integers: a JSON number past 2^53 loses digits in a reader that takes numbers as
doubles (JavaScript's `JSON.parse`, the dashboard's refresh); every document names its currency where one is known.
The routes are described in `web/openapi.json`, which a unit test keeps equal to the routes below.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from flask import Blueprint, Response, jsonify, url_for

from billing.budget_days import CampaignDay
from billing.budgets import BudgetChange
from billing.corrections import Correction
from billing.invalid import ExclusionChange
from billing.store.export_files import Manifest
from web import lookups, pages
from web.access import visible_advertisers
from web.ad_catalog import BudgetStatus, made_of
from web.guards import api_login, finance_or_404, logged_in
from web.model import (
    NOT_CHARGED_REASONS,
    AdLine,
    Billed,
    CorrectionPage,
    EventCounts,
    Figures,
    NotCharged,
    NotChargedClicks,
    Period,
    PeriodBill,
    SpanTotal,
    UnbilledCounts,
    not_charged_by_currency,
    totals_by_currency,
)
from web.naming import name_of, want
from web.price_split import by_price_document, clicks_by_price
from web.pricing import price_per_click
from web.ranges import DEFAULT_PRESET, DateRange
from web.responses import micros_by_currency, micros_text
from web.services import services

bp = Blueprint("api", __name__, url_prefix="/api/v1")
bp.before_request(api_login)

OPENAPI_FILE = Path(__file__).resolve().parent / "openapi.json"


@bp.get("/openapi.json")
def openapi() -> Response:
    """The OpenAPI 3 description of this API (public: it holds no data)."""
    return Response(_openapi_text(), mimetype="application/json")


@bp.get("/me")
def me() -> Response:
    principal = logged_in()
    return jsonify(
        {"username": principal.username, "role": principal.role.value, "advertiser_id": principal.advertiser_id}
    )


@bp.get("/periods")
def periods() -> Response:
    principal = logged_in()
    reader = services().periods
    # An advertiser sees the periods of its own activity and the closed ones, nothing of the others' activity.
    listed = reader.periods() if principal.advertiser_id is None else reader.periods_of(principal.advertiser_id)
    return jsonify({"periods": [_period(p) for p in listed]})


@bp.get("/advertisers")
def advertisers() -> Response:
    principal = logged_in()
    svc = services()
    known = svc.periods.known_advertisers() if principal.advertiser_id is None else []
    return jsonify(
        {
            "advertisers": [
                {"advertiser_id": a, "currency": svc.catalog.currency(a)} for a in visible_advertisers(principal, known)
            ]
        }
    )


@bp.get("/advertisers/<advertiser_id>/dashboard")
def dashboard(advertiser_id: str) -> Response:
    """What the dashboard polls: kept a second per worker (`web.cache`), like the page."""
    return Response(lookups.dashboard(advertiser_id, "dashboard.json", _dashboard), mimetype="application/json")


def _dashboard(advertiser_id: str, period: str | None, span: DateRange | None) -> bytes | None:
    d = services().figures.dashboard(advertiser_id, period)
    if d is None:
        return None
    ranged = _range_document(lookups.range_figures("adv", advertiser_id, advertiser_id, span)) if span else {}
    want("campaign", (c.campaign_id for c in d.campaigns))  # the names the document gives, two queries
    want("ad", (a.ad_id for a in d.ads))
    document = {
        "advertiser_id": d.advertiser_id,
        "currency": d.currency,
        "period": _period(d.period) if d.period else None,
        "totals": _billed(d.billed),
        "late": _late(d.late),
        "clock_ahead": _clock_ahead(d.clock_ahead),
        "unbilled": _unbilled(d.unbilled),
        **not_charged_document(d.not_charged, d.billed),
        "campaigns": [
            {
                "campaign_id": c.campaign_id,
                "name": name_of("campaign", c.campaign_id),
                **_billed(c.billed),
                **not_charged_document(c.not_charged, c.billed),
            }
            for c in d.campaigns
        ],
        "ads": [_ad_line(a) for a in d.ads],
        "series": [_period_bill(b) for b in d.series],
        "quarantined": d.quarantined,
        "freshness": lookups.freshness().as_json(),
        "budget_days": [
            campaign_day_document(day)
            for day in lookups.budget_days(advertiser_id, services().catalog.get().campaigns_of(advertiser_id), span)
        ],
        **ranged,
    }
    return json.dumps(document, separators=(",", ":")).encode()


@bp.get("/advertisers/<advertiser_id>/campaigns/<campaign_id>")
def campaign(advertiser_id: str, campaign_id: str) -> Response:
    c = lookups.campaign(advertiser_id, campaign_id)
    span = lookups.date_range(DEFAULT_PRESET)
    ranged = _range_document(lookups.range_figures("cmp", campaign_id, advertiser_id, span)) if span else {}
    svc = services()
    catalog = svc.catalog.get()
    owned = catalog.advertiser_of_campaign(campaign_id) == advertiser_id
    budget = BudgetStatus.of(catalog, campaign_id, svc.clock()) if owned else None
    return jsonify(
        {
            "advertiser_id": c.advertiser_id,
            "campaign_id": c.campaign_id,
            "currency": c.currency,
            "period": _period(c.period) if c.period else None,
            "series": [_period_bill(b) for b in c.series],
            "ads": [_ad_line(a) for a in c.ads],
            "budget": budget_document(budget) if budget else None,
            "budget_days": [
                campaign_day_document(d)
                for d in lookups.budget_days(advertiser_id, [campaign_id], span, budgeted_only=False)
            ],
            **ranged,
        }
    )


@bp.get("/advertisers/<advertiser_id>/ads/<ad_id>")
def ad(advertiser_id: str, ad_id: str) -> Response:
    a = lookups.ad(advertiser_id, ad_id)
    span = lookups.date_range(DEFAULT_PRESET)
    ranged = _range_document(lookups.range_figures("ad", ad_id, advertiser_id, span)) if span else {}
    return jsonify(
        {
            "advertiser_id": a.advertiser_id,
            "campaign_id": a.campaign_id,
            "ad_id": a.ad_id,
            "currency": a.currency,
            "price_per_click_micros": micros_text(
                price_per_click(services().catalog.get(), a.ad_id, services().clock())
            ),
            "series": [_period_bill(b) for b in a.series],
            **ranged,
            "by_price": by_price_document(clicks_by_price(a.ad_id, span)),
        }
    )


@bp.get("/advertisers/<advertiser_id>/corrections")
def corrections(advertiser_id: str) -> Response:
    page = lookups.corrections(advertiser_id)
    return jsonify({**_page_document(page), "corrections": [_correction(c) for c in page.items]})


@bp.get("/advertisers/<advertiser_id>/not-charged")
def not_charged_clicks(advertiser_id: str) -> Response:
    """The advertiser's billable clicks not charged in `period`, else the date range; paged as the corrections."""
    page = lookups.not_charged_clicks(advertiser_id)
    return jsonify(
        {
            **_page_document(page),
            "period": page.period,
            "range": None if page.range is None else page.range.as_json(),
            "provisional": page.provisional,
            "by_reason": page.by_reason,
            "would_cost_micros_by_currency": micros_by_currency(page.would_cost),
            "clicks": [
                {
                    "click_id": c.click_id,
                    "click_time": c.click_time,
                    "period": c.period,
                    "ad_id": c.ad_id,
                    "campaign_id": c.campaign_id,
                    "reason": c.reason,
                    "amount_micros": None if c.amount_micros is None else micros_text(c.amount_micros),
                    "currency": c.currency,
                    "final": c.final,
                }
                for c in page.items
            ],
        }
    )


@bp.get("/advertisers/<advertiser_id>/corrections/<correction_id>")
def correction(advertiser_id: str, correction_id: str) -> Response:
    found = lookups.correction(advertiser_id, correction_id)
    return jsonify({**_correction(found), "currency": services().catalog.currency(advertiser_id)})


@bp.get("/finance")
def finance() -> Response:
    f = lookups.finance()
    span = lookups.date_range()
    ranged: dict[str, Any] = {}
    if span is not None:  # `range`, or `from` and `to`: every advertiser over those days (a month, say)
        fr = services().finance.between(span.start_ms, span.end_ms)
        ranged = {
            "range": span.as_json(),
            "range_closed": fr.closed and span.end_ms <= services().clock(),
            "range_periods": fr.periods,
            "range_open_periods": fr.open_periods,
            "range_advertisers": [
                {
                    "advertiser_id": a.advertiser_id,
                    "currency": a.currency,
                    **_billed(a.billed),
                    **not_charged_document(a.not_charged, a.billed),
                }
                for a in fr.advertisers
            ],
            "range_totals": _currency_totals(
                totals_by_currency(fr.advertisers), not_charged_by_currency(fr.advertisers)
            ),
        }
    return jsonify(
        {
            **ranged,
            "period": _period(f.period) if f.period else None,
            "periods": [_period(p) for p in f.periods],
            "advertisers": [
                {
                    "advertiser_id": a.advertiser_id,
                    "currency": a.currency,
                    **_billed(a.billed),
                    **not_charged_document(a.not_charged, a.billed),
                }
                for a in f.advertisers
            ],
            "totals": _currency_totals(totals_by_currency(f.advertisers), not_charged_by_currency(f.advertisers)),
            "recent_periods": [
                {
                    **_period(fp.period),
                    "totals": _currency_totals(fp.by_currency, fp.not_charged_by_currency),
                    "held": fp.held,
                }
                for fp in services().finance.recent()
            ],
            "exports": [_export(e) for e in f.exports],
            "last_audit": None
            if f.audit is None
            else {
                "ran_at_ms": f.audit.ran_at_ms,
                "periods": f.audit.periods,
                "differences": f.audit.differences,
                "awaiting_close": f.audit.awaiting_close,
            },
        }
    )


@bp.get("/exports")
def exports() -> Response:
    finance_or_404()
    return jsonify({"exports": [_export(e) for e in services().exports.finished()]})


# A closed period's export file, for scripts: the page's download itself, opened with an API token too.
bp.add_url_rule("/exports/<period>/<name>", view_func=pages.export_file)


@bp.get("/health")
def health() -> Response:
    report = lookups.health_report()
    h, lag = report.health, report.lag
    return jsonify(
        {
            "kafka": None
            if lag is None
            else {"lag": lag.lag, "read_at_ms": lag.read_at_ms, "committed": lag.committed, "error": lag.error},
            "status": {
                "overall": report.overall,
                "components": [{"name": s.name, "level": s.level, "text": s.text} for s in report.statuses],
                "freshness": report.fresh.as_json(),
            },
            "queries": [
                {
                    "name": q.name,
                    "batch_id": q.batch_id,
                    "timestamp": q.timestamp,
                    "input_rows": q.input_rows,
                    "input_rows_per_second": q.input_rows_per_second,
                    "processed_rows_per_second": q.processed_rows_per_second,
                    "batch_duration_ms": q.batch_duration_ms,
                    "durations_ms": q.durations_ms,
                    "recent_batch_durations_ms": q.recent_durations_ms,
                    "watermark_ms": q.watermark_ms,
                    "stream_watermarks_ms": q.stream_watermarks_ms,
                    "state_rows": q.state_rows,
                    "state_memory_bytes": q.state_memory_bytes,
                    "rows_dropped_by_watermark": q.rows_dropped_by_watermark,
                    "consumer_lag": (lag.lag if lag and not lag.error else None) if lag else q.lag,
                    "consumer_lag_reported": q.lag,
                }
                for q in h.queries
            ],
            "quarantined": h.quarantined,
            "late": [{"period": b.period.key, **_late(b.late)} for b in h.late],
            "clock_ahead": [
                {"period": c.period.key, "advertiser_id": c.advertiser_id, "ad_id": c.ad_id, **_clock_ahead(c.counts)}
                for c in h.clock_ahead
            ],
            "unbilled": [
                {"period": u.period.key, "advertiser_id": u.advertiser_id, "ad_id": u.ad_id, **_unbilled(u.counts)}
                for u in h.unbilled
            ],
            "last_reconciliation": None
            if h.reconciliation is None
            else {
                "run_id": h.reconciliation.run_id,
                "started_at_ms": h.reconciliation.started_at_ms,
                "finished_at_ms": h.reconciliation.finished_at_ms,
                "duration_ms": h.reconciliation.duration_ms,
                "periods": h.reconciliation.periods,
                "closed": h.reconciliation.closed,
                "additions": h.reconciliation.additions,
                "retractions": h.reconciliation.retractions,
                "net_micros_by_currency": micros_by_currency(h.reconciliation.net_micros_by_currency),
                "held": h.reconciliation.held,
            },
            "compaction": [
                {"part": c.part, "finished_at_ms": c.finished_at_ms, "summary": c.summary, "failed": c.failed}
                for c in h.compaction
            ],
        }
    )


@cache
def _openapi_text() -> str:
    return json.dumps(json.loads(OPENAPI_FILE.read_text()), indent=1)


def _range_document(r: dict[str, Any]) -> dict[str, Any]:
    """A date range's figures: the range, its total (and what it did not charge), and its months and days (oldest
    first)."""
    return {
        "range": r["range"].as_json(),
        "range_total": {**_billed(r["total"]), **not_charged_document(r["not_charged"], r["total"])},
        "months": [_span(s) for s in r["months"]],
        "days": [_span(s) for s in r["days"]],
    }


def _span(s: SpanTotal) -> dict[str, Any]:
    return {
        "key": s.key,
        "closed": s.closed,
        "periods": s.periods,
        "open_periods": s.open_periods,
        **_billed(s.billed),
        **not_charged_document(s.not_charged, s.billed),
    }


def _currency_totals(billed: dict[str, Billed], not_charged: dict[str, NotCharged]) -> list[dict[str, Any]]:
    """Figures per currency, each with the clicks not charged."""
    return [
        {"currency": c, **_billed(b), **not_charged_document(not_charged.get(c, NotCharged()), b)}
        for c, b in billed.items()
    ]


def not_charged_document(nc: NotCharged, billed: Billed) -> dict[str, Any]:
    """The clicks not charged beside a bill: invalid clicks (the four rules together) and the invalid click rate
    (invalid / (charged + invalid), one decimal, as the pages show it), then each reason's clicks and micros."""
    return {
        "not_charged": {
            "invalid": _figures(nc.invalid),
            "invalid_click_rate": nc.invalid_rate(billed.corrected.clicks),
            **{reason: _figures(nc.of(reason)) for reason in NOT_CHARGED_REASONS},
        }
    }


def budget_entry_document(entry: BudgetChange) -> dict[str, Any]:
    """One entry of a campaign's budget history, with who made it, through which door and when."""
    return {
        "effective_from": entry.effective_from,
        "daily_budget_micros": micros_text(entry.daily_budget_micros),
        "version": entry.version,
        **made_document(entry),
    }


def made_document(entry: BudgetChange | ExclusionChange) -> dict[str, Any]:
    """Who made a budget or exclusion entry, through which door and when, from the catalog's change log
    (`web.ad_catalog.made_of`): the same as `/api/v1/catalog/changes` says."""
    made = made_of(entry)
    return {"made_by": made.who, "door": made.door, "made_at": made.made_at}


def budget_document(b: BudgetStatus) -> dict[str, Any]:
    """A campaign's budget now (null micros: unlimited), the next change planned and the history, oldest first."""
    return {
        "campaign_id": b.campaign_id,
        "advertiser_id": b.advertiser_id,
        "currency": b.currency,
        "daily_budget_micros": micros_text(b.daily_budget_micros),
        "in_force_since": b.entry.effective_from if b.entry else None,
        "next_change": budget_entry_document(b.next_change) if b.next_change else None,
        "history": [budget_entry_document(e) for e in b.history],
    }


def campaign_day_document(d: CampaignDay) -> dict[str, Any]:
    """A campaign's UTC day: the budget in force at its end (today: now), each budget in force during it, what was
    charged, what was not charged for the budget, the room left and whether it is capped."""
    return {
        "campaign_id": d.campaign_id,
        "day": d.day,
        "budget_micros": micros_text(d.budget_micros),
        "budgets": [
            {"from_ms": b.start_ms, "daily_budget_micros": micros_text(b.daily_budget_micros)} for b in d.budgets
        ],
        "charged": {"clicks": d.figures.charged_clicks, "micros": micros_text(d.figures.charged_micros)},
        "over_budget": {"clicks": d.figures.over_clicks, "micros": micros_text(d.figures.over_micros)},
        "room_micros": micros_text(d.room_micros),
        "capped": d.capped,
    }


def _figures(f: Figures) -> dict[str, Any]:
    return {"clicks": f.clicks, "micros": micros_text(f.micros)}


def _billed(b: Billed) -> dict[str, Any]:
    return {
        "provisional": _figures(b.provisional),
        "corrections": _figures(b.corrections),
        "corrected": _figures(b.corrected),
    }


def _late(late: EventCounts) -> dict[str, int]:
    return {"late_impressions": late.impressions, "late_clicks": late.clicks}


def _clock_ahead(ahead: EventCounts) -> dict[str, int]:
    return {"clock_ahead_impressions": ahead.impressions, "clock_ahead_clicks": ahead.clicks}


def _unbilled(u: UnbilledCounts) -> dict[str, int]:
    return {"unbilled_ad_paused": u.ad_paused, "unbilled_unknown_ad": u.unknown_ad}


def _period(p: Period) -> dict[str, Any]:
    """A period: its key, start and whether it is closed; `future` when it has not begun (nothing is billed in it)."""
    return {"period": p.key, "start_ms": p.start_ms, "closed": p.closed, "future": p.start_ms > services().clock()}


def _period_bill(b: PeriodBill) -> dict[str, Any]:
    return {**_period(b.period), **_figures_and_counts(b)}


def _ad_line(a: AdLine) -> dict[str, Any]:
    return {"ad_id": a.ad_id, "name": name_of("ad", a.ad_id), "campaign_id": a.campaign_id, **_figures_and_counts(a)}


def _figures_and_counts(line: PeriodBill | AdLine) -> dict[str, Any]:
    """A period's or an ad's billed figures, late, clock-ahead and unbilled events, and clicks not charged."""
    return {
        **_billed(line.billed),
        **_late(line.late),
        **_clock_ahead(line.clock_ahead),
        **_unbilled(line.unbilled),
        **not_charged_document(line.not_charged, line.billed),
    }


def _page_document(page: CorrectionPage | NotChargedClicks) -> dict[str, Any]:
    """What a paged list of an advertiser's opens with: the advertiser, its currency, how many there are in all,
    and where this page starts and how long it may be."""
    return {
        "advertiser_id": page.advertiser_id,
        "currency": page.currency,
        "total": page.total,
        "offset": page.offset,
        "limit": page.limit,
    }


def _correction(c: Correction) -> dict[str, Any]:
    return {
        "correction_id": c.correction_id,
        "click_id": c.click_id,
        "impression_id": c.impression_id,
        "ad_id": c.ad_id,
        "campaign_id": c.campaign_id,
        "advertiser_id": c.advertiser_id,
        "amount_micros": micros_text(c.amount_micros),
        "reason": c.reason,
        "corrects_period": c.corrects_period,
        "booked_period": c.booked_period,
        "created_at_ms": c.created_at_ms,
    }


def _export(e: Manifest) -> dict[str, Any]:
    return {
        "period": e.period,
        "period_start_ms": e.period_start_ms,
        "period_end_ms": e.period_end_ms,
        "closed_at_ms": e.closed_at_ms,
        "rows": e.rows,
        "total_micros": micros_text(e.total_micros),
        "total_micros_by_currency": micros_by_currency(e.total_micros_by_currency),
        "files": [
            {
                "name": name,
                "bytes": f.size_bytes,
                "sha256": f.sha256,
                "url": url_for("api.export_file", period=e.period, name=name),
                "page_url": url_for("pages.export_file", period=e.period, name=name),
            }
            for name, f in e.files.items()
        ],
    }
