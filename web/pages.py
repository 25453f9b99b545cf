"""The HTML pages: thin views that look up what they show (`web.lookups`: access, read, 404) and render a template.

Anonymous requests are sent to the login page; whatever the person may not see answers 404.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from flask import Blueprint, abort, redirect, render_template, request, url_for
from markupsafe import Markup
from werkzeug.wrappers import Response

from web import lookups
from web.ad_catalog import BudgetStatus
from web.auth import home_for
from web.guards import finance_or_404, page_login
from web.invoice_views import book
from web.model import COMPACTION_PARTS, NotCharged, not_charged_by_currency, totals_by_currency
from web.naming import want
from web.pricing import price_per_click
from web.ranges import DEFAULT_PRESET, DateRange
from web.responses import send_export
from web.services import current_principal, services

bp = Blueprint("pages", __name__)
bp.before_request(page_login)


@bp.get("/")
def index() -> Response:
    principal = current_principal()
    if principal is None:  # page_login answered already; this keeps it so under `python -O` too
        abort(401)
    return redirect(home_for(principal))


@bp.get("/advertisers/<advertiser_id>")
def advertiser(advertiser_id: str) -> str | tuple[str, int]:
    content = lookups.dashboard(advertiser_id, "dashboard.html", _dashboard, lenient=True)
    return _with_range_status(render_template("advertiser.html", advertiser_id=advertiser_id, content=content))


def _with_range_status(body: str) -> str | tuple[str, int]:
    """The page, with 400 when the date range asked for could not be read (the page says why beside its form)."""
    return (body, 400) if lookups.range_problem() else body


def _dashboard(advertiser_id: str, period: str | None, span: DateRange | None) -> Markup | None:
    """The dashboard's content, the same for everyone allowed to see it (kept a second by `web.cache`)."""
    svc = services()
    ranged = lookups.range_figures("adv", advertiser_id, advertiser_id, span) if span else None
    dashboard = svc.figures.dashboard(advertiser_id, period)
    if dashboard is None:
        return None
    if period is None:
        corrections = svc.corrections.page(advertiser_id, 0, 10)
    else:
        corrections = svc.corrections.of_period(advertiser_id, period, 10)
    budget_days = lookups.budget_days(advertiser_id, svc.catalog.get().campaigns_of(advertiser_id), span)
    want("campaign", (c.campaign_id for c in dashboard.campaigns))  # the names the page shows, two queries
    want("ad", (a.ad_id for a in dashboard.ads))
    return Markup(  # our own template's output, escaped by Jinja as it was rendered  # nosec B704
        render_template(
            "_advertiser_main.html",
            d=dashboard,
            corrections=corrections,
            refresh_ms=svc.refresh_ms,
            follow=period,
            fresh=lookups.freshness(),
            r=ranged,
            range_args=_range_args(),
            budget_days=budget_days,
            budget_range_label=span.label if span else "today",
        )
    )


def _range_args() -> dict[str, str]:
    """The range arguments of this request, to carry into the links and the API address the page uses (none when
    they could not be read: the page shows the default range)."""
    if lookups.range_problem():
        return {}
    return {k: v for k in ("range", "from", "to") if (v := request.args.get(k))}


def range_url(preset: str) -> str:
    """This page with the date range `preset` (and the period it shows, if any)."""
    args: dict[str, Any] = {**(request.view_args or {}), "range": preset}
    if request.args.get("period"):
        args["period"] = request.args["period"]
    return url_for(str(request.endpoint), **args)


@bp.get("/advertisers/<advertiser_id>/campaigns/<campaign_id>")
def campaign(advertiser_id: str, campaign_id: str) -> str | tuple[str, int]:
    c = lookups.campaign(advertiser_id, campaign_id)
    catalog = services().catalog.get()
    now = services().clock()
    prices = {a.ad_id: price_per_click(catalog, a.ad_id, now) for a in c.ads}
    span = lookups.page_date_range(DEFAULT_PRESET)
    ranged = lookups.range_figures("cmp", campaign_id, advertiser_id, span) if span else None
    owned = catalog.advertiser_of_campaign(campaign_id) == advertiser_id
    return _with_range_status(
        render_template(
            "campaign.html",
            c=c,
            prices=prices,
            fresh=lookups.freshness(),
            r=ranged,
            budget=BudgetStatus.of(catalog, campaign_id, now) if owned else None,
            budget_days=lookups.budget_days(advertiser_id, [campaign_id], span, budgeted_only=False),
            now_ms=now,
        )
    )


@bp.get("/advertisers/<advertiser_id>/ads/<ad_id>")
def ad(advertiser_id: str, ad_id: str) -> str | tuple[str, int]:
    a = lookups.ad(advertiser_id, ad_id)
    price = price_per_click(services().catalog.get(), ad_id, services().clock())
    span = lookups.page_date_range(DEFAULT_PRESET)
    ranged = lookups.range_figures("ad", ad_id, advertiser_id, span) if span else None
    return _with_range_status(render_template("ad.html", a=a, price=price, fresh=lookups.freshness(), r=ranged))


@bp.get("/advertisers/<advertiser_id>/corrections")
def corrections(advertiser_id: str) -> str:
    return render_template("corrections.html", page=lookups.corrections(advertiser_id))


@bp.get("/advertisers/<advertiser_id>/not-charged")
def not_charged_clicks(advertiser_id: str) -> str:
    """The advertiser's billable clicks that were not charged, one row each, in a period or a date range."""
    return render_template("not_charged.html", page=lookups.not_charged_clicks(advertiser_id))


@bp.get("/advertisers/<advertiser_id>/corrections/<correction_id>")
def correction(advertiser_id: str, correction_id: str) -> str:
    found = lookups.correction(advertiser_id, correction_id)
    return render_template("correction.html", c=found, currency=services().catalog.currency(advertiser_id))


@bp.get("/finance")
def finance() -> str | tuple[str, int]:
    f = lookups.finance()
    span = lookups.page_date_range(DEFAULT_PRESET)
    assert span is not None  # a default is given
    ranged = services().finance.between(span.start_ms, span.end_ms)
    month = whole_month(span)
    return _with_range_status(
        render_template(
            "finance.html",
            f=f,
            fresh=lookups.freshness(),
            totals=totals_by_currency(f.advertisers),
            not_charged_totals=not_charged_by_currency(f.advertisers),
            empty_not_charged=NotCharged(),
            periods=services().finance.recent(),
            span=span,
            fr=ranged,
            range_totals=totals_by_currency(ranged.advertisers),
            range_not_charged=not_charged_by_currency(ranged.advertisers),
            month=month,
            invoices={i.advertiser_id: i for i in book().invoices_in(month)} if month else {},
        )
    )


def whole_month(span: DateRange) -> str | None:
    """`2026-01` when the range is exactly one calendar month, else None."""
    following = (span.first.replace(day=28) + timedelta(days=4)).replace(day=1)
    whole = span.first.day == 1 and span.last == following - timedelta(days=1)
    return span.first.strftime("%Y-%m") if whole else None


@bp.get("/exports/<period>/<name>")
def export_file(period: str, name: str) -> Response:
    """A closed period's reconciled export: Parquet, CSV or its manifest, as an attachment."""
    finance_or_404()
    return send_export(period, name)


@bp.get("/health")
def health() -> str:
    report = lookups.health_report()
    return render_template(
        "health.html",
        h=report.health,
        audit=report.audit,
        lag=report.lag,
        now_ms=services().clock(),
        fresh=report.fresh,
        statuses=report.statuses,
        overall=report.overall,
        compaction_parts=COMPACTION_PARTS,
    )
