"""The catalog's change log on a page and in the API: every change (ads, prices, pauses, budgets, IP exclusions, and the
advertisers' billing profiles) with who made it, when and through which door (`billing.change_log`, kept by
`billing.store.catalog_db.CatalogDatabase`; the profiles' by `billing.store.profiles_db.ProfileDatabase`).

- `GET /catalog/changes`: finance and admin, newest first, with filters: `who`, `door` (`command`, `page`, `api`,
  `replay`, `simulator`), `kind`, `advertiser_id`, `campaign_id`, `ad_id`, `from` and `to` (UTC days, both
  included, by when the change was made); `offset` and `limit` page through them.
- `GET /api/v1/catalog/changes`: the same as JSON (prices and budgets as strings of micros).

Each ad's price history shows the same beside each entry (`web.ad_catalog.changes_by_version`).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from flask import Blueprint, Response, abort, jsonify, render_template, request

from billing.change_log import DOORS, KINDS, ChangeEntry, ChangeFilter, filtered, profile_changes
from web.ad_catalog import catalog_or_404, store
from web.guards import api_login, page_login, paging_args
from web.invoice_views import profile_store
from web.readers import is_id
from web.responses import micros_text

bp = Blueprint("change_pages", __name__)
bp.before_request(page_login)
api_bp = Blueprint("change_api", __name__, url_prefix="/api/v1")
api_bp.before_request(api_login)

_ID_ARGS = ("advertiser_id", "campaign_id", "ad_id")


def change_filter() -> ChangeFilter:
    """The filters of the query; 400 when one cannot be read."""
    args = request.args
    who = args.get("who", "").strip() or None
    if who is not None and (len(who) > 128 or not who.isprintable()):
        abort(400, description="who is an account or user name of up to 128 characters")
    door = args.get("door", "").strip() or None
    if door is not None and door not in DOORS:
        abort(400, description=f"door is one of {', '.join(DOORS)}")
    kind = args.get("kind", "").strip() or None
    if kind is not None and kind not in KINDS:
        abort(400, description=f"kind is one of {', '.join(KINDS)}")
    ids: dict[str, str | None] = {}
    for name in _ID_ARGS:
        value = args.get(name, "").strip() or None
        if value is not None and not is_id(value):
            abort(400, description=f"{name} is an id of up to 128 letters, digits and . _ : @ -")
        ids[name] = value
    return ChangeFilter(who, door, kind, since_ms=_day(args.get("from")), until_ms=_day(args.get("to"), 1), **ids)


def _day(text: str | None, after: int = 0) -> int | None:
    """Midnight UTC of a `YYYY-MM-DD` day (of the day after it, for `to`: both ends are included)."""
    if not text:
        return None
    try:
        day = datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=UTC) + timedelta(days=after)
    except ValueError:
        abort(400, description="from and to are UTC days such as 2026-01-31")
    return int(day.timestamp() * 1000)


def listed() -> dict[str, Any]:
    """What the page and its API twin both give: the page of changes asked for (`changes`), how many match (`total`),
    where the page starts and how long it may be (`offset`, `limit`)."""
    catalog_or_404()
    wanted = change_filter()
    offset, limit = paging_args(100)
    profiles = profile_store().current()
    every = [*store().changes(), *profile_changes(e for a in profiles.advertiser_ids for e in profiles.history(a))]
    found = filtered(every, wanted)
    return {"changes": found[offset : offset + limit], "total": len(found), "offset": offset, "limit": limit}


@bp.get("/catalog/changes")
def changes_page() -> str:
    return render_template("catalog_changes.html", **listed(), doors=DOORS, kinds=KINDS, args=request.args)


@api_bp.get("/catalog/changes")
def changes_document() -> Response:
    page = listed()
    return jsonify({**page, "changes": [change_document(e) for e in page["changes"]]})


def change_document(entry: ChangeEntry) -> dict[str, Any]:
    """A change as the API gives it: prices and budgets as strings of micros."""
    document = entry.to_dict()
    document["cpc_micros"] = micros_text(entry.cpc_micros)
    document["daily_budget_micros"] = micros_text(entry.daily_budget_micros)
    document["door_kind"] = entry.door_kind
    document["token_id"] = entry.token_id
    return document
