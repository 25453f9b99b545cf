"""Downloads and statements: an advertiser's charges for a date range (CSV), its monthly statement (page, CSV,
PDF), and finance's month of exports as one CSV. The same access rules as the pages (`web.guards`): an advertiser
its own, finance and admin all; anything else 404, anonymous visitors to the login page.
"""

from __future__ import annotations

from flask import Blueprint, Response, abort, render_template, request

from web import lookups
from web.charges import charges_csv, month_advertisers_csv, month_export_csv, not_charged_csv, statement_periods
from web.guards import advertiser_or_404, finance_or_404, page_login
from web.invoice_views import book
from web.ranges import DEFAULT_PRESET, DateRange, RangeError, parse_month
from web.readers import is_id
from web.responses import attachment, month_document
from web.services import services
from web.statement_pdf import statement_pdf
from web.statements import Statement, build_statement, statement_csv

bp = Blueprint("downloads", __name__)
bp.before_request(page_login)


@bp.get("/advertisers/<advertiser_id>/charges.csv")
def charges(advertiser_id: str) -> Response:
    """The advertiser's charges per period and ad in the date range asked for (default: month to date); with
    `campaign=` or `ad=`, that campaign's or ad's alone (the campaign and ad pages offer those)."""
    advertiser_or_404(advertiser_id)
    span = lookups.date_range(DEFAULT_PRESET)
    assert span is not None  # a default is given
    campaign, ad = request.args.get("campaign"), request.args.get("ad")
    for value in (campaign, ad):
        if value is not None and not is_id(value):
            abort(404)
    text = charges_csv(services().periods, services().catalog, advertiser_id, span, campaign_id=campaign, ad_id=ad)
    which = f"-{ad or campaign}" if ad or campaign else ""
    return attachment(text, "text/csv", f"adbill-charges-{advertiser_id}{which}-{span.first}-{span.last}.csv")


@bp.get("/advertisers/<advertiser_id>/not-charged.csv")
def not_charged_clicks(advertiser_id: str) -> Response:
    """Every billable click of the advertiser not charged in the period or date range asked for, one row each."""
    page = lookups.not_charged_clicks(advertiser_id, paged=False)
    which = page.period or (f"{page.range.first}-{page.range.last}" if page.range else "")
    return attachment(not_charged_csv(page), "text/csv", f"adbill-not-charged-{advertiser_id}-{which}.csv")


@bp.get("/advertisers/<advertiser_id>/statements/<month>")
def statement_page(advertiser_id: str, month: str) -> str:
    s = _statement(advertiser_id, month)
    return render_template("statement.html", s=s, fresh=lookups.freshness())


@bp.get("/advertisers/<advertiser_id>/statements/<month>/statement.csv")
def statement_csv_file(advertiser_id: str, month: str) -> Response:
    s = _statement(advertiser_id, month)
    return month_document(statement_csv(s), "statement", advertiser_id, month, "csv")


@bp.get("/advertisers/<advertiser_id>/statements/<month>/statement.pdf")
def statement_pdf_file(advertiser_id: str, month: str) -> Response:
    s = _statement(advertiser_id, month)
    return month_document(statement_pdf(s, services().clock()), "statement", advertiser_id, month, "pdf")


@bp.get("/finance/months/<month>/billing.csv")
def finance_month(month: str) -> Response:
    """Every closed period's export of the month, as one CSV; 404 when none is on file."""
    finance_or_404()
    span = _month(month)
    text = month_export_csv(services().exports, span)
    if text is None:
        abort(404)
    return attachment(text, "text/csv", f"adbill-{month}-billing.csv")


@bp.get("/finance/months/<month>/advertisers.csv")
def finance_month_advertisers(month: str) -> Response:
    """The month per advertiser: one row each, its corrected clicks and spend, what was not charged, and its
    invoice once issued (finance and admin)."""
    finance_or_404()
    span = _month(month)
    figures = services().finance.between(span.start_ms, span.end_ms)
    text = month_advertisers_csv(month, figures, book().invoices_in(month), span.end_ms <= services().clock())
    return attachment(text, "text/csv", f"adbill-{month}-advertisers.csv")


def _statement(advertiser_id: str, month: str) -> Statement:
    """The month's statement; 404 for a month that has not begun (there is nothing in it to state)."""
    advertiser_or_404(advertiser_id)
    span = _month(month)
    now = services().clock()
    if span.start_ms > now:
        abort(404, description=f"{month} has not begun")
    svc = services()
    periods = statement_periods(svc.periods, svc.exports, advertiser_id, span)
    return build_statement(advertiser_id, svc.catalog.currency(advertiser_id), month, span, periods, now)


def _month(text: str) -> DateRange:
    try:
        return parse_month(text)
    except RangeError as exc:
        abort(400, description=str(exc))


def months_of(period_starts: list[str]) -> list[str]:
    """`YYYY-MM` of each month that the period keys touch, newest first."""
    return sorted({f"{key[0:4]}-{key[4:6]}" for key in period_starts}, reverse=True)
