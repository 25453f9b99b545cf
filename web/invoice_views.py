"""The monthly invoices in the web UI, and the billing profiles they are addressed to.

Pages (`bp`):
- `/advertisers/ID/invoices`: the advertiser's invoices, and beside them the provisional statement of the open month;
- `/advertisers/ID/invoices/MONTH` (and `invoice.csv`, `invoice.pdf`): one invoice as it was issued;
- `/finance/invoices?month=MONTH`: every invoice of a month, totals per currency (finance and admin);
- `/billing-profiles`, `/billing-profiles/ID`: every advertiser's billing profile with its history (finance and
  admin), and an admin's form to set one from now or later (a CSRF-protected POST, refused in one line as
  `adbill profiles set` refuses).

API (`api_bp`, under `/api/v1`): `GET /advertisers/ID/invoices`, `GET /advertisers/ID/invoices/MONTH`,
`GET /finance/invoices?month=MONTH`; money as strings of micros, as everywhere in the API.

Access as everywhere (`web.guards`): an advertiser its own, finance and admin all; anything else 404, the same 404
as for an invoice that does not exist.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Flask, Response, abort, current_app, jsonify, redirect, render_template, request, url_for
from werkzeug.wrappers import Response as Redirect

from billing.catalog import CatalogError
from billing.invoices import Invoice, InvoiceError, month_of_ms, parse_month
from billing.money import Amounts
from billing.profiles import BillingProfiles, ProfileError, profile_change
from billing.store.invoice_db import InvoiceDatabase
from billing.store.profiles_db import ProfileDatabase
from web.access import may_change_catalog
from web.ad_catalog import UNTYPED, Typed, effective_from_text, maker
from web.charges import statement_periods
from web.guards import advertiser_or_404, api_login, finance_or_404, form_fields, logged_in, made_arg, page_login
from web.invoice_documents import SECTIONS, invoice_csv, invoice_pdf
from web.ranges import parse_month as month_span
from web.readers import is_id
from web.responses import micros_by_currency, month_document, with_status
from web.services import services
from web.statements import Statement, build_statement

EXTENSION = "adbill_invoices"

bp = Blueprint("invoices", __name__)
bp.before_request(page_login)
api_bp = Blueprint("invoices_api", __name__, url_prefix="/api/v1")
api_bp.before_request(api_login)


def register(app: Flask, invoices: InvoiceDatabase, profiles: ProfileDatabase) -> None:
    """Keep the invoices' store (the database: the pages read the invoices as issued there) and the billing
    profiles' store (one per process: a page reads the head row, and the entries made since the version it holds)
    for the views, and add the routes."""
    app.extensions[EXTENSION] = (invoices, profiles)
    app.register_blueprint(bp)
    app.register_blueprint(api_bp)


def book() -> InvoiceDatabase:
    found: InvoiceDatabase = current_app.extensions[EXTENSION][0]
    return found


def profile_store() -> ProfileDatabase:
    found: ProfileDatabase = current_app.extensions[EXTENSION][1]
    return found


# Lookups the pages and the API share ------------------------------------------------------------------------------
def month_arg(text: str) -> str:
    try:
        return parse_month(text)
    except InvoiceError as exc:
        abort(400, description=str(exc))


def invoice_or_404(advertiser_id: str, month: str) -> Invoice:
    advertiser_or_404(advertiser_id)
    found = book().invoice(month_arg(month), advertiser_id)
    if found is None:
        abort(404)
    return found


def open_month(advertiser_id: str) -> Statement:
    """The month now open (UTC), provisional: the statement so far."""
    svc = services()
    month = month_of_ms(svc.clock())
    span = month_span(month)
    periods = statement_periods(svc.periods, svc.exports, advertiser_id, span)
    return build_statement(advertiser_id, svc.catalog.currency(advertiser_id), month, span, periods, svc.clock())


def summary(invoice: Invoice, api: bool = False) -> dict[str, Any]:
    """An invoice in a list: number, month, who, totals, due date, and where to read it."""
    route = "invoices_api.invoice" if api else "invoices.invoice_page"
    return {
        "number": invoice.number,
        "label": invoice.label,
        "month": invoice.month,
        "advertiser_id": invoice.advertiser_id,
        "bill_to": invoice.bill_to.name if invoice.bill_to else None,
        "currency": invoice.currency,
        "amount_micros": str(invoice.totals.amount_micros),
        "tax_micros": str(invoice.totals.tax_micros),
        "total_micros": str(invoice.totals.total_micros),
        "issued_date": invoice.issued_date,
        "due_date": invoice.due_date,
        "url": url_for(route, advertiser_id=invoice.advertiser_id, month=invoice.month),
    }


def month_invoices(month: str | None) -> tuple[list[str], str | None, list[Invoice]]:
    """Finance's view: the months with invoices (newest first), the one asked for (default: the newest) and its
    invoices."""
    finance_or_404()
    months = sorted(book().months(), reverse=True)
    chosen = month_arg(month) if month else (months[0] if months else None)
    return months, chosen, book().invoices_in(chosen) if chosen else []


def totals_by_currency(invoices: list[Invoice]) -> dict[str, int]:
    """The invoices' totals added up per currency, never two together."""
    return Amounts.of((i.currency, i.totals.total_micros) for i in invoices).as_dict()


# Pages -------------------------------------------------------------------------------------------------------------
@bp.get("/advertisers/<advertiser_id>/invoices")
def invoices_page(advertiser_id: str) -> str:
    advertiser_or_404(advertiser_id)
    return render_template(
        "invoices.html",
        advertiser_id=advertiser_id,
        invoices=book().invoices_of(advertiser_id),
        s=open_month(advertiser_id),
    )


@bp.get("/advertisers/<advertiser_id>/invoices/<month>")
def invoice_page(advertiser_id: str, month: str) -> str:
    invoice = invoice_or_404(advertiser_id, month)
    return render_template("invoice.html", i=invoice, sections=SECTIONS, s=open_month(advertiser_id))


@bp.get("/advertisers/<advertiser_id>/invoices/<month>/invoice.csv")
def invoice_csv_file(advertiser_id: str, month: str) -> Response:
    invoice = invoice_or_404(advertiser_id, month)
    return month_document(invoice_csv(invoice), invoice.label, advertiser_id, month, "csv")


@bp.get("/advertisers/<advertiser_id>/invoices/<month>/invoice.pdf")
def invoice_pdf_file(advertiser_id: str, month: str) -> Response:
    invoice = invoice_or_404(advertiser_id, month)
    return month_document(invoice_pdf(invoice), invoice.label, advertiser_id, month, "pdf")


@bp.get("/finance/invoices")
def finance_invoices() -> str:
    months, chosen, invoices = month_invoices(request.args.get("month") or None)
    return render_template(
        "finance_invoices.html", months=months, month=chosen, invoices=invoices, totals=totals_by_currency(invoices)
    )


@bp.get("/billing-profiles")
def profiles_page() -> str:
    finance_or_404()
    svc = services()
    profiles = profile_store().current()
    advertisers = sorted(set(svc.periods.known_advertisers()) | set(profiles.advertiser_ids))
    now = svc.clock()
    rows = [(a, profiles.in_force(a, now), profiles.next_change(a, now)) for a in advertisers]
    return render_template("billing_profiles.html", rows=rows)


@bp.get("/billing-profiles/<advertiser_id>")
def profile_page(advertiser_id: str, typed: Typed = UNTYPED) -> str | tuple[str, int]:
    """The advertiser's billing profile now, its history and its latest invoices (finance and admin), and an admin's
    form to set it."""
    finance_or_404()
    _known_or_404(advertiser_id)
    profiles: BillingProfiles = profile_store().current()
    now = services().clock()
    body = render_template(
        "billing_profile.html",
        advertiser_id=advertiser_id,
        current=profiles.in_force(advertiser_id, now),
        history=list(reversed(profiles.history(advertiser_id))),
        now_ms=now,
        form=typed.form,
        error=typed.error,
        made=made_arg(),
        invoices=book().invoices_of(advertiser_id)[:12],
    )
    return with_status(body, typed.status)


@bp.post("/billing-profiles/<advertiser_id>")
def set_profile(advertiser_id: str) -> Redirect | str | tuple[str, int]:
    """Set the advertiser's billing profile from now or a later time (admin)."""
    if not may_change_catalog(logged_in()):
        abort(404)
    _known_or_404(advertiser_id)
    form = form_fields(("name", "address", "tax_id", "tax_rate", "effective_from"))
    who = maker()
    try:
        at = effective_from_text(form["effective_from"])
        kept = profile_store().change(
            lambda now: profile_change(
                advertiser_id,
                form["name"],
                form["address"],
                form["tax_id"],
                form["tax_rate"],
                now if at is None else at,
                who,
            ),
            services().clock,
        )
    except (ProfileError, CatalogError) as refused:
        return profile_page(advertiser_id, Typed.refused(form, refused))
    return redirect(url_for(".profile_page", advertiser_id=advertiser_id, made=kept.version), code=303)


def _known_or_404(advertiser_id: str) -> None:
    if not is_id(advertiser_id) or advertiser_id not in services().periods.known_advertisers():
        abort(404)


# API ---------------------------------------------------------------------------------------------------------------
@api_bp.get("/advertisers/<advertiser_id>/invoices")
def invoices(advertiser_id: str) -> Response:
    advertiser_or_404(advertiser_id)
    s = open_month(advertiser_id)
    return jsonify(
        {
            "advertiser_id": advertiser_id,
            "invoices": [summary(i, api=True) for i in book().invoices_of(advertiser_id)],
            "open_month": {
                "month": s.month,
                "currency": s.currency,
                "provisional": True,
                "total_micros": str(s.total_micros),
                "open_periods": s.open_periods,
                "statement_url": url_for("downloads.statement_page", advertiser_id=advertiser_id, month=s.month),
            },
        }
    )


@api_bp.get("/advertisers/<advertiser_id>/invoices/<month>")
def invoice(advertiser_id: str, month: str) -> Response:
    found = invoice_or_404(advertiser_id, month)
    document = found.to_dict()
    document["files"] = {
        "csv": url_for("invoices.invoice_csv_file", advertiser_id=advertiser_id, month=found.month),
        "pdf": url_for("invoices.invoice_pdf_file", advertiser_id=advertiser_id, month=found.month),
    }
    return jsonify(document)


@api_bp.get("/finance/invoices")
def finance_invoices_document() -> Response:
    months, chosen, listed = month_invoices(request.args.get("month") or None)
    return jsonify(
        {
            "months": months,
            "month": chosen,
            "invoices": [summary(i, api=True) for i in listed],
            "total_micros_by_currency": micros_by_currency(totals_by_currency(listed)),
        }
    )
