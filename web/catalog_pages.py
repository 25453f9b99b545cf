"""The catalog's pages: an advertiser's ads with their status and prices; every ad for finance and admin; an admin's
forms to create an ad and to set, pause and resume its price (CSRF-protected POSTs, `web.auth.check_csrf`); the
campaigns' daily budgets (every campaign's budget and its day so far, the campaigns capped today first; a campaign's
budget history and an admin's form to set it); the IP exclusion list (an admin's: the ranges in force, the changes
planned, the history, and the form to exclude or include a range).

A refused change answers 400 with the form again and the command line's one-line message (`web.ad_catalog`); a
change made redirects (303) to the ad's page, which names the entry it added. Whatever a person may not see answers
404, as everywhere (`web.guards`).
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, abort, redirect, render_template, request, url_for
from werkzeug.wrappers import Response

from billing.budgets import utc_day
from billing.catalog import CatalogError
from billing.catalog_changes import AdRequest, change_action
from web.ad_catalog import (
    ADS_PAGE,
    UNTYPED,
    AdStatus,
    BudgetStatus,
    Typed,
    ads_of,
    ads_page,
    catalog_now,
    catalog_or_404,
    change_or_404,
    check_ids,
    check_not_past,
    effective_from_text,
    exclusions_in_force,
    exclusions_or_404,
    form_micros,
    known_ad,
    known_campaign,
    make_budget_change,
    make_change,
    make_exclusion_change,
)
from web.guards import advertiser_or_404, form_fields, made_arg, page_login, paging_args
from web.naming import want
from web.responses import with_status
from web.services import services

bp = Blueprint("catalog_pages", __name__)
bp.before_request(page_login)


@bp.get("/advertisers/<advertiser_id>/ads")
def advertiser_ads(advertiser_id: str) -> str:
    """The advertiser's ads: status, price now, the next planned change and the price history."""
    advertiser_or_404(advertiser_id)
    catalog, now = catalog_now()
    listed = [AdStatus.of(ad, now) for ad in ads_of(catalog, advertiser_id)]
    want("ad", (s.ad.ad_id for s in listed))  # the names the page shows, in one query
    return render_template(
        "catalog_advertiser.html",
        advertiser_id=advertiser_id,
        ads=listed,
        now_ms=now,
        opened=request.args.get("open"),  # the ad whose history a link opens (the ad page's "Price history")
    )


@bp.get("/catalog")
def catalog(typed: Typed = UNTYPED) -> str | tuple[str, int]:
    """Every ad of the catalog, a page at a time, and an admin's form to create one."""
    catalog_or_404()
    current, now = catalog_now()
    offset, limit = paging_args(ADS_PAGE)
    listed = [AdStatus.of(ad, now) for ad in ads_page(current, offset, limit)]
    values: dict[str, Any] = {"ads": listed, "total": len(current), "offset": offset, "limit": limit}
    return _page("catalog.html", now, typed, **values)


@bp.post("/catalog/ads")
def create_ad() -> Response | str | tuple[str, int]:
    catalog_or_404(change=True)
    form = form_fields(_CREATE_FIELDS)
    try:
        check_ids(
            ad_id=form["ad_id"], campaign_id=form["campaign_id"] or None, advertiser_id=form["advertiser_id"] or None
        )
        currency = form["currency"].upper() or services().catalog.get().currency_of(form["advertiser_id"]) or ""
        price = form_micros(form, "price", "cpc_micros", "a price", currency)
        made = make_change(
            AdRequest("create-ad", form["ad_id"], price, **_owners(form)), typed_time(form["effective_from"])
        )
    except CatalogError as refused:
        return catalog(Typed.refused(form, refused))
    return redirect(url_for(".ad", ad_id=made.ad.ad_id, made=made.entry.version), code=303)


@bp.get("/catalog/ads/<ad_id>")
def ad(ad_id: str, typed: Typed = UNTYPED) -> str | tuple[str, int]:
    """The ad's history and, for an admin, the forms to change it; a refused change of an ad that does not exist
    answers with the catalog's page (400), and a page of one 404."""
    catalog_or_404()
    found = known_ad(ad_id)
    if found is None:
        if typed.status == 200:
            abort(404)
        return catalog(Typed(error=typed.error, status=typed.status))
    now = services().clock()
    values: dict[str, Any] = {"a": AdStatus.of(found, now), "made": made_arg()}
    return _page("catalog_ad.html", now, typed, **values)


@bp.post("/catalog/ads/<ad_id>/changes")
def change_ad(ad_id: str) -> Response | str | tuple[str, int]:
    """Set, pause or resume the ad's price from now or a later time; the optional `campaign_id`, `advertiser_id` and
    `currency` fields are checked against the ad's own (they never change)."""
    change_or_404(ad_id)
    form = form_fields(_CHANGE_FIELDS)
    try:
        action = change_action(form["action"])
        known = services().catalog.get().get(ad_id)
        price = form_micros(form, "price", "cpc_micros", "a price", known.currency if known else "")
        made = make_change(AdRequest(action, ad_id, price, **_owners(form)), typed_time(form["effective_from"]))
    except CatalogError as refused:
        return ad(ad_id, Typed.refused(form, refused))
    return redirect(url_for(".ad", ad_id=made.ad.ad_id, made=made.entry.version), code=303)


def _owners(form: dict[str, str]) -> dict[str, str | None]:
    """The ad's campaign, advertiser and currency as the form names them (None where a field is left empty)."""
    return {name: form[name] or None for name in ("campaign_id", "advertiser_id", "currency")}


_CREATE_FIELDS = ("ad_id", "campaign_id", "advertiser_id", "currency", "price", "cpc_micros", "effective_from")
_CHANGE_FIELDS = ("action", "price", "cpc_micros", "effective_from", "campaign_id", "advertiser_id", "currency")


def typed_time(text: str) -> int | None:
    """A form's effective time (`effective_from_text`), refused beside its field when it is in the past."""
    at_ms = effective_from_text(text)
    check_not_past(at_ms, services().clock())
    return at_ms


# Daily budgets ------------------------------------------------------------------------------------------------------
@bp.get("/catalog/budgets")
def budgets(typed: Typed = UNTYPED) -> str | tuple[str, int]:
    """Every campaign's daily budget now and its UTC day so far, the campaigns capped today first."""
    catalog_or_404()
    catalog, now = catalog_now()
    today = services().budgets.today(now)
    rows = [BudgetStatus.of(catalog, c, now) for c in catalog.campaign_ids]
    rows.sort(
        key=lambda b: (not (today.get(b.campaign_id) and today[b.campaign_id].capped), b.advertiser_id, b.campaign_id)
    )
    capped = [d for d in today.values() if d.capped]
    values: dict[str, Any] = {"rows": rows, "today": today, "capped": capped, "day": utc_day(now)}
    return _page("catalog_budgets.html", now, typed, **values)


@bp.get("/catalog/campaigns/<campaign_id>")
def campaign_budget(campaign_id: str, typed: Typed = UNTYPED) -> str | tuple[str, int]:
    """A campaign's budget history and, for an admin, the form to change it; a refused change of a campaign that
    does not exist answers with the budgets page (400), and a page of one 404."""
    catalog_or_404()
    svc = services()
    catalog = svc.catalog.get()
    if not known_campaign(catalog, campaign_id):
        if typed.status == 200:
            abort(404)
        return budgets(Typed(error=typed.error, status=typed.status))
    now = svc.clock()
    days = svc.budgets.campaign_days([campaign_id], [utc_day(now)], now, budgeted_only=False)
    ads = [ad for ad in ads_of(catalog, catalog.advertiser_of_campaign(campaign_id)) if ad.campaign_id == campaign_id]
    b, today = BudgetStatus.of(catalog, campaign_id, now), days[0] if days else None
    values: dict[str, Any] = {"b": b, "ads": ads, "today": today, "made": made_arg()}
    return _page("catalog_campaign.html", now, typed, **values)


@bp.post("/catalog/campaigns/<campaign_id>/budgets")
def set_budget(campaign_id: str) -> Response | str | tuple[str, int]:
    """Set the campaign's daily budget (micros, or unlimited) from now or a later time."""
    change_or_404(campaign_id)
    form = form_fields(("daily_amount", "daily_micros", "unlimited", "effective_from"))
    catalog = services().catalog.get()
    currency = catalog.currency_of(catalog.advertiser_of_campaign(campaign_id) or "") or ""
    try:
        made = make_budget_change(
            campaign_id,
            typed_time(form["effective_from"]),
            daily_micros=form_micros(form, "daily_amount", "daily_micros", "a daily budget", currency, minor_unit=True),
            unlimited=bool(form["unlimited"]),
        )
    except CatalogError as refused:
        return campaign_budget(campaign_id, Typed.refused(form, refused))
    return redirect(url_for(".campaign_budget", campaign_id=made.campaign_id, made=made.entry.version), code=303)


# The IP exclusion list ----------------------------------------------------------------------------------------------
@bp.get("/catalog/ip-exclusions")
def ip_exclusions(typed: Typed = UNTYPED) -> str | tuple[str, int]:
    """The ranges excluded now, the changes planned, the history; an admin's form to exclude or include a range."""
    exclusions_or_404()
    catalog, now = catalog_now()
    exclusions = catalog.exclusions
    in_force = exclusions_in_force(exclusions, now)
    planned = sorted((e for e in exclusions.changes if e.effective_from > now), key=lambda e: e.effective_from)
    history = sorted(exclusions.changes, key=lambda e: e.version, reverse=True)
    values: dict[str, Any] = {"in_force": in_force, "planned": planned, "history": history, "made": made_arg()}
    return _page("catalog_exclusions.html", now, typed, **values)


@bp.post("/catalog/ip-exclusions")
def change_ip_exclusions() -> Response | str | tuple[str, int]:
    exclusions_or_404()
    form = form_fields(("cidr", "action", "effective_from"))
    try:
        _, entry = make_exclusion_change(form["action"], form["cidr"], typed_time(form["effective_from"]))
    except CatalogError as refused:
        return ip_exclusions(Typed.refused(form, refused))
    return redirect(url_for(".ip_exclusions", made=entry.version), code=303)


def _page(template: str, now_ms: int, typed: Typed, **values: Any) -> str | tuple[str, int]:
    """A catalog page with its forms: what was typed in them and why a change was refused (`Typed`), answered with
    that status (400) or 200."""
    body = render_template(
        template, now_ms=now_ms, form=typed.form, error=typed.error, error_field=typed.error_field, **values
    )
    return with_status(body, typed.status)
