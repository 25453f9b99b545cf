"""The names people give campaigns and ads (`billing.store.names_db`): shown beside the ids on the pages, the API
documents and the invoices; set by an admin on the catalog's ad and campaign pages (CSRF-protected POSTs) or with
`adbill names set`. A name bills nothing, so it has no history: it may change at any time.

A page reads the names it shows, not every name (a million ads have tens of MB of them): the worker's store keeps
the names it was asked before, brought up to date once per request by version (one row when nothing changed), and a
list asks the names of its ids in one query first (`want`). A name bills nothing: while the database cannot be
reached, a page shows the names its worker knows."""

from __future__ import annotations

from collections.abc import Iterable

from flask import Blueprint, Flask, abort, current_app, g, has_app_context, redirect, request, url_for
from werkzeug.wrappers import Response

from billing.names import NamingError
from billing.store.names_db import NamesDatabase
from web.access import may_change_catalog
from web.guards import logged_in, page_login
from web.readers import is_id
from web.services import services

EXTENSION = "adbill_names"

bp = Blueprint("naming", __name__)
bp.before_request(page_login)


def register(app: Flask, store: NamesDatabase) -> None:
    """Keep the names' store (one per process) for the views and templates, and add the routes."""
    app.extensions[EXTENSION] = store
    app.register_blueprint(bp)


def _store() -> NamesDatabase | None:
    found: NamesDatabase | None = current_app.extensions.get(EXTENSION) if has_app_context() else None
    return found


def _checked() -> bool:
    """Whether this request already brought the worker's names up to date (once per request)."""
    checked = bool(g.get("names_checked"))
    g.names_checked = True
    return checked


def want(kind: str, item_ids: Iterable[str]) -> None:
    """Read the names of a list's ids in one query before the list is shown (its `name_of`s then ask nothing)."""
    store = _store()
    if store is not None:
        store.shown(kind, item_ids, check=not _checked())


def name_of(kind: str, item_id: str) -> str:
    """The name of a campaign or an ad (empty: none), as the database holds it at this request."""
    store = _store()
    return store.name_of(kind, item_id, check=not _checked()) if store is not None else ""


@bp.post("/catalog/ads/<ad_id>/name")
def name_ad(ad_id: str) -> Response:
    return _name("ad", ad_id, services().catalog.get().get(ad_id) is not None)


@bp.post("/catalog/campaigns/<campaign_id>/name")
def name_campaign(campaign_id: str) -> Response:
    return _name("campaign", campaign_id, services().catalog.get().advertiser_of_campaign(campaign_id) is not None)


def _name(kind: str, item_id: str, known: bool) -> Response:
    if not may_change_catalog(logged_in()) or not is_id(item_id) or not known:
        abort(404)
    try:
        current_app.extensions[EXTENSION].set(kind, item_id, request.form.get("name", ""))
    except NamingError as refused:
        abort(400, description=str(refused))
    page = (
        url_for("catalog_pages.ad", ad_id=item_id)
        if kind == "ad"
        else url_for("catalog_pages.campaign_budget", campaign_id=item_id)
    )
    return redirect(page, code=303)
