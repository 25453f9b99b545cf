"""The catalog under `/api/v1`: an advertiser's ads, every ad for finance and admin, and an admin's changes.

- `GET /api/v1/advertisers/ID/ads`: the advertiser's ads with status, price now and history (the page's twin).
- `GET /api/v1/catalog/ads`, `GET /api/v1/catalog/ads/AD`, `GET /api/v1/catalog/ads/AD/prices`: every ad, one ad,
  one ad's price history (finance and admin).
- `POST /api/v1/catalog/ads`: create an ad, `{"ad_id", "campaign_id", "advertiser_id", "currency", "cpc_micros",
  "effective_from"?}` (admin).
- `POST /api/v1/catalog/ads/AD/prices`: `{"cpc_micros": int | null, "effective_from": ms?}` sets the price, or
  pauses with null; `"action": "set-price" | "pause" | "resume"` says it explicitly (a resume without a price goes
  back to the last one); `campaign_id`, `advertiser_id`, `currency` when given must be the ad's own (admin); an ad
  the catalog does not know answers 404, with the command's message.
- `GET /api/v1/catalog/budgets`, `GET /api/v1/catalog/campaigns/CMP/budgets`: every campaign's daily budget with its
  UTC day so far and the campaigns capped today, one campaign's budget history (finance and admin).
- `POST /api/v1/catalog/campaigns/CMP/budgets`: `{"daily_budget_micros": int | null, "effective_from": ms?}` sets
  the daily budget (null: unlimited) (admin).
- `GET /api/v1/catalog/ip-exclusions`, `POST /api/v1/catalog/ip-exclusions` `{"cidr", "excluded": bool,
  "effective_from": ms?}`: the IP exclusion list, and a range excluded or included again (admin only).

Prices and budgets are micros written as JSON strings (`"cpc_micros": "250000"`, as every amount of the API,
`web.api`); a request may send one as a string or a number. Each budget and exclusion entry says who made it,
through which door (`page`, `api`, `api token TOKEN_ID`, `command`) and when. A refused change answers 400
`{"error": MESSAGE, "status": 400}` with the command line's one-line message (`refused`, the blueprint's handler of
`CatalogError`: 404 for an ad the catalog does not know); a change made answers 201 with the ad,
the campaign's budget or the list. Access as the pages
(`web.ad_catalog.catalog_or_404`, `web.guards`); the login and token checks are the API blueprint's
(`web.guards.api_login`), and a request with a token needs no CSRF token.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, abort, jsonify, request, url_for

from billing.budgets import utc_day
from billing.catalog import Ad, CatalogError, PriceChange, UnknownAdError
from billing.catalog_changes import AdRequest, change_action
from billing.invalid import ExclusionChange, IpExclusions
from web.ad_catalog import (
    ADS_PAGE,
    AdStatus,
    BudgetStatus,
    Made,
    ads_of,
    ads_page,
    catalog_now,
    catalog_or_404,
    change_or_404,
    changes_by_version,
    check_ids,
    effective_from_json,
    exclusions_in_force,
    exclusions_or_404,
    known_ad,
    known_campaign,
    make_budget_change,
    make_change,
    make_exclusion_change,
)
from web.api import (
    budget_document,
    budget_entry_document,
    campaign_day_document,
    made_document,
)
from web.guards import advertiser_or_404, api_login, paging_args
from web.responses import micros_text
from web.services import services

bp = Blueprint("catalog_api", __name__, url_prefix="/api/v1")
bp.before_request(api_login)

_CREATE_FIELDS = frozenset({"ad_id", "campaign_id", "advertiser_id", "currency", "cpc_micros", "effective_from"})
_CHANGE_FIELDS = frozenset({"action", "cpc_micros", "effective_from", "campaign_id", "advertiser_id", "currency"})


@bp.get("/advertisers/<advertiser_id>/ads")
def advertiser_ads(advertiser_id: str) -> Response:
    advertiser_or_404(advertiser_id)
    catalog, now = catalog_now()
    return jsonify(
        {
            "advertiser_id": advertiser_id,
            "ads": [ad_document(ad, now) for ad in ads_of(catalog, advertiser_id)],
        }
    )


@bp.get("/catalog/ads")
def catalog_ads() -> Response:
    catalog_or_404()
    catalog, now = catalog_now()
    offset, limit = paging_args(ADS_PAGE)
    ads = ads_page(catalog, offset, limit)
    changes_by_version().read(p.version for ad in ads for p in ad.prices)
    return jsonify(
        {
            "catalog_version": catalog.version,
            "total": len(catalog),
            "offset": offset,
            "limit": limit,
            "ads": [ad_document(ad, now) for ad in ads],
        }
    )


@bp.get("/catalog/ads/<ad_id>")
def catalog_ad(ad_id: str) -> Response:
    return jsonify(ad_document(_ad_or_404(ad_id), services().clock()))


@bp.get("/catalog/ads/<ad_id>/prices")
def catalog_ad_prices(ad_id: str) -> Response:
    """The ad's price history alone, oldest first (the collection a change is posted to)."""
    found = _ad_or_404(ad_id)
    return jsonify({"ad_id": found.ad_id, "currency": found.currency, "prices": [_entry(p) for p in found.prices]})


@bp.post("/catalog/ads")
def create_ad() -> Response:
    catalog_or_404(change=True)
    body = _body(_CREATE_FIELDS)
    ad_id = _text(body, "ad_id") or ""
    owners = _owners(body)
    check_ids(ad_id=ad_id, campaign_id=owners["campaign_id"], advertiser_id=owners["advertiser_id"])
    asked = AdRequest("create-ad", ad_id, body.get("cpc_micros"), **owners)
    made = make_change(asked, effective_from_json(body.get("effective_from")))
    return _made(made, services().clock())


@bp.post("/catalog/ads/<ad_id>/prices")
def change_ad(ad_id: str) -> Response:
    change_or_404(ad_id)
    body = _body(_CHANGE_FIELDS)
    action = body.get("action")
    if action is None:
        action = "pause" if "cpc_micros" in body and body["cpc_micros"] is None else "set-price"
    action = change_action(action)
    if action == "pause" and body.get("cpc_micros") is not None:
        raise CatalogError(f"pause {ad_id}: a pause has no price (cpc_micros null or absent)")
    asked = AdRequest(action, ad_id, body.get("cpc_micros"), **_owners(body))
    made = make_change(asked, effective_from_json(body.get("effective_from")))
    return _made(made, services().clock())


def _ad_or_404(ad_id: str) -> Ad:
    """The catalog's ad `ad_id`, for finance and admin (`catalog_or_404`); 404 when the catalog has no such ad."""
    catalog_or_404()
    found = known_ad(ad_id)
    if found is None:
        abort(404)
    return found


def ad_document(ad: Ad, at_ms: int) -> dict[str, Any]:
    """An ad as the API gives it: owners, currency, status and price at `at_ms`, the next change, the history."""
    status = AdStatus.of(ad, at_ms)
    return {
        "ad_id": ad.ad_id,
        "campaign_id": ad.campaign_id,
        "advertiser_id": ad.advertiser_id,
        "currency": ad.currency,
        "status": status.status.value,
        "cpc_micros": micros_text(status.cpc_micros),
        "next_change": _entry(status.next_change) if status.next_change else None,
        "prices": [_entry(p) for p in ad.prices],
    }


def _entry(p: PriceChange) -> dict[str, Any]:
    change = changes_by_version().get(p.version)
    recorded = change is not None and change.recorded
    return {
        "effective_from": p.effective_from,
        "cpc_micros": micros_text(p.cpc_micros),
        "version": p.version,
        "made_by": change.who if recorded and change else None,
        "door": change.door if recorded and change else None,
        "made_at": change.made_at if recorded and change else None,
    }


def _body(allowed: frozenset[str]) -> dict[str, Any]:
    """The request's JSON object; CatalogError when it is not one or names a field the route does not take."""
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        raise CatalogError("the request body is a JSON object (Content-Type: application/json)")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise CatalogError(f"unknown field {unknown[0]!r}; the fields are {', '.join(sorted(allowed))}")
    return body


def _text(body: dict[str, Any], name: str) -> str | None:
    """The request's text field `name` without the white space around it; None when absent, null or empty (as an
    empty form field); CatalogError when it is not a string."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise CatalogError(f"{name} is a string, got {value!r}")
    return value.strip() or None


def _owners(body: dict[str, Any]) -> dict[str, str | None]:
    """The ad's campaign, advertiser and currency as the request names them (`_text`; None where it does not)."""
    return {name: _text(body, name) for name in ("campaign_id", "advertiser_id", "currency")}


@bp.errorhandler(CatalogError)
def refused(error: CatalogError) -> Response:
    """A change refused, with the command line's one-line message: 400, or 404 when the ad to change is what is
    missing (`UnknownAdError`)."""
    status = 404 if isinstance(error, UnknownAdError) else 400
    response = jsonify({"error": str(error), "status": status})
    response.status_code = status
    return response


def _made(made: Made, now: int) -> Response:
    document = {**ad_document(made.ad, now), "catalog_version": made.catalog.version, "made": _entry(made.entry)}
    return _created(document, url_for(".catalog_ad", ad_id=made.ad.ad_id))


def _created(document: dict[str, Any], location: str) -> Response:
    """What a change made answers: 201 with `document`, and where the thing changed is read (`Location`)."""
    response = jsonify(document)
    response.status_code = 201
    response.headers["Location"] = location
    return response


# Daily budgets ------------------------------------------------------------------------------------------------------
_BUDGET_FIELDS = frozenset({"daily_budget_micros", "effective_from"})


@bp.get("/catalog/budgets")
def budgets() -> Response:
    """Every campaign's budget now and history, with its UTC day so far; `capped_today` names the capped ones."""
    catalog_or_404()
    catalog, now = catalog_now()
    today = services().budgets.today(now)
    return jsonify(
        {
            "catalog_version": catalog.version,
            "day": utc_day(now),
            "capped_today": sorted(c for c, d in today.items() if d.capped),
            "campaigns": [
                {
                    **budget_document(BudgetStatus.of(catalog, c, now)),
                    "today": campaign_day_document(today[c]) if c in today else None,
                }
                for c in catalog.campaign_ids
            ],
        }
    )


@bp.get("/catalog/campaigns/<campaign_id>/budgets")
def campaign_budgets(campaign_id: str) -> Response:
    """One campaign's budget now, the next change and the history, oldest first (the collection a change is posted
    to)."""
    catalog_or_404()
    svc = services()
    catalog = svc.catalog.get()
    if not known_campaign(catalog, campaign_id):
        abort(404)
    return jsonify(budget_document(BudgetStatus.of(catalog, campaign_id, svc.clock())))


@bp.post("/catalog/campaigns/<campaign_id>/budgets")
def set_budget(campaign_id: str) -> Response:
    """`{"daily_budget_micros": "50000000" | 50000000 | null, "effective_from": ms?}`: null is unlimited."""
    change_or_404(campaign_id)
    body = _body(_BUDGET_FIELDS)
    given = body.get("daily_budget_micros")
    made = make_budget_change(
        campaign_id,
        effective_from_json(body.get("effective_from")),
        daily_micros=given,
        unlimited="daily_budget_micros" in body and given is None,
    )
    document = {
        **budget_document(BudgetStatus.of(made.catalog, campaign_id, services().clock())),
        "catalog_version": made.catalog.version,
        "made": budget_entry_document(made.entry),
    }
    return _created(document, url_for(".campaign_budgets", campaign_id=campaign_id))


# The IP exclusion list ----------------------------------------------------------------------------------------------
_EXCLUSION_FIELDS = frozenset({"cidr", "excluded", "effective_from"})


@bp.get("/catalog/ip-exclusions")
def ip_exclusions() -> Response:
    """The ranges excluded now (with the entry that put each in force), and the whole history, oldest first."""
    exclusions_or_404()
    catalog = services().catalog.get()
    return jsonify(_exclusions_document(catalog.exclusions, catalog.version, services().clock()))


@bp.post("/catalog/ip-exclusions")
def change_ip_exclusions() -> Response:
    """`{"cidr": "203.0.113.0/24", "excluded": true | false, "effective_from": ms?}`: exclude the range, or include
    it again, from then on."""
    exclusions_or_404()
    body = _body(_EXCLUSION_FIELDS)
    excluded = body.get("excluded")
    if not isinstance(excluded, bool):
        raise CatalogError("give excluded: true to exclude the range, or false to include it again")
    cidr = body.get("cidr")
    if not isinstance(cidr, str):
        raise CatalogError(f"cidr is an IP range such as 203.0.113.0/24 or 2001:db8::/32, got {cidr!r}")
    changed, entry = make_exclusion_change(
        "exclude" if excluded else "include", cidr, effective_from_json(body.get("effective_from"))
    )
    document = {
        **_exclusions_document(changed.exclusions, changed.version, services().clock()),
        "made": _exclusion(entry),
    }
    return _created(document, url_for(".ip_exclusions"))


def _exclusions_document(exclusions: IpExclusions, version: int, now: int) -> dict[str, Any]:
    return {
        "catalog_version": version,
        "in_force": [
            {"cidr": cidr, "since": entry.effective_from, "entry": _exclusion(entry)}
            for cidr, entry in exclusions_in_force(exclusions, now)
        ],
        "history": [_exclusion(e) for e in sorted(exclusions.changes, key=lambda e: e.version)],
    }


def _exclusion(e: ExclusionChange) -> dict[str, Any]:
    return {
        "cidr": e.cidr,
        "effective_from": e.effective_from,
        "excluded": e.excluded,
        "version": e.version,
        **made_document(e),
    }
