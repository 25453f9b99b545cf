"""The names people give campaigns and ads (`billing.store.names_file`): shown beside the ids on the pages, the API
documents and the invoices; set by an admin on the catalog's ad and campaign pages (CSRF-protected POSTs) or with
`adbill names set`. A name bills nothing, so it has no history: it may change at any time."""

from __future__ import annotations

from pathlib import Path

from flask import Blueprint, Flask, abort, current_app, redirect, request, url_for
from werkzeug.wrappers import Response

from billing.layout import DataLayout
from billing.store.names_file import Names, NamesFile, NamingError
from web.access import may_change_catalog
from web.guards import logged_in
from web.pages import require_login
from web.readers import is_id
from web.services import services

EXTENSION = "adbill_names"

bp = Blueprint("naming", __name__)
bp.before_request(require_login)


def register(app: Flask, root: Path) -> None:
    app.extensions[EXTENSION] = NamesFile(DataLayout(root).names_file)
    app.register_blueprint(bp)


def names() -> Names:
    """The names as the file holds them now (read again when it changed); none when there is no app."""
    found: NamesFile | None = current_app.extensions.get(EXTENSION)
    return found.current() if found else Names()


def name_of(kind: str, item_id: str) -> str:
    return names().of(kind, item_id)


@bp.post("/catalog/ads/<ad_id>/name")
def name_ad(ad_id: str) -> Response:
    return _name("ad", ad_id, services().reader.catalog.get().get(ad_id) is not None)


@bp.post("/catalog/campaigns/<campaign_id>/name")
def name_campaign(campaign_id: str) -> Response:
    return _name(
        "campaign", campaign_id, services().reader.catalog.get().advertiser_of_campaign(campaign_id) is not None
    )


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
