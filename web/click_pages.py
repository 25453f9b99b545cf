"""A click's story on a page and in the API: "Why was I charged for this click?" (docs/billing-rules.md, "Who sees
what").

- `GET /clicks?click_id=ID`: the search (a form on the dashboard and on every page's header) goes to the click's
  page; without an id, the search form alone.
- `GET /clicks/ID`: the click's story (`billing.story`, found in the data folder's files by
  `billing.store.click_story.ClickStories`; `?day=YYYY-MM-DD`, the click's UTC day, searches that day only): its
  outcome and why, every copy received, its impressions, the price in force and who set it, the invalid traffic rule
  or budget that stopped it, what the stream did, its corrections and the export rows that carry it. Without a day,
  the last `story_days` days (ADBILL_STORY_DAYS) are searched, by the app's clock: a click not among them answers 404
  with the plain answer (where it looked, and that its day finds it). A day older than them is told from its
  exports (what finance was given), marked so; a day after today is refused (400) as a malformed one is.
- `GET /api/v1/clicks/ID`: the same as JSON, money as strings of micros (`web.api`), with the same `?day=`; its
  `searched` says where the story looked (`past_horizon`, `from_exports`).

An advertiser sees the clicks of its own ads only, without what names another advertiser (`billing.story
.for_advertiser`, from the exports too: their rows name the advertiser); another advertiser's click, a click without
an ad the catalog knows, a click never received and one not found within the horizon answer it 404, alike. Finance
and admin see every click, and a page (or a 404 document) saying so of a click never received or not found within
the horizon.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import Blueprint, Flask, Response, abort, current_app, jsonify, redirect, render_template, request, url_for
from werkzeug.wrappers import Response as WerkzeugResponse

from billing.invalid import DEFAULT_RULES
from billing.layout import DataLayout
from billing.periods import Periods
from billing.store.catalog_db import CatalogDatabase
from billing.store.click_files import parse_day
from billing.store.click_story import ClickStories
from billing.story import NOT_RECEIVED, PAST_HORIZON, ClickStory, describe, for_advertiser
from web import display
from web.access import Role
from web.guards import api_login, logged_in, page_login
from web.price_split import EXTENSION, clicks_by_price
from web.readers import is_id
from web.services import services

bp = Blueprint("click_pages", __name__)
bp.before_request(page_login)
api_bp = Blueprint("click_api", __name__, url_prefix="/api/v1")
api_bp.before_request(api_login)


def register(app: Flask, settings: Any, catalogs: CatalogDatabase, clock: Callable[[], int] | None = None) -> None:
    """The app's click stories, over its data folder and the catalog's store, back `story_days` days from the app's
    clock (`create_app` calls this once)."""
    app.extensions[EXTENSION] = ClickStories(
        DataLayout(settings.root),
        catalogs,
        Periods(settings.period_ms),
        getattr(settings, "ivt_rules", DEFAULT_RULES),
        getattr(settings, "topic_clicks", None),
        story_days=settings.story_days,
        clock=clock,
    )
    app.register_blueprint(bp)
    app.register_blueprint(api_bp)
    app.jinja_env.globals["clicks_by_price"] = clicks_by_price
    app.jinja_env.globals["story_days"] = settings.story_days


def stories() -> ClickStories:
    found: ClickStories = current_app.extensions[EXTENSION]
    return found


def story_or_404(click_id: str) -> ClickStory:
    """The click's story as the person may see it; 404 for an advertiser unless the click is its own."""
    principal = logged_in()
    if not is_id(click_id):
        abort(404)
    try:
        day = parse_day(request.args["day"]) if request.args.get("day") else None
        stories().searched(day)  # a day after today is refused as a malformed one is
    except ValueError as exc:
        abort(400, description=str(exc))
    story = stories().tell(click_id, day)
    if principal.role is Role.ADVERTISER:
        if principal.advertiser_id is None or story.advertiser_id != principal.advertiser_id:
            abort(404)
        return for_advertiser(story, principal.advertiser_id, services().catalog.get())
    return story


@bp.get("/clicks")
def search() -> WerkzeugResponse | str:
    """The search: a click id goes to its page."""
    logged_in()
    wanted = request.args.get("click_id", "").strip()
    day = request.args.get("day", "").strip()
    if wanted:
        return redirect(url_for(".click", click_id=wanted, day=day) if day else url_for(".click", click_id=wanted))
    return render_template("click_search.html")


@bp.get("/clicks/<click_id>")
def click(click_id: str) -> str | tuple[str, int]:
    story = story_or_404(click_id)
    principal = logged_in()
    status = 404 if story.outcome.status in (NOT_RECEIVED, PAST_HORIZON) else 200
    page = render_template(
        "click.html",
        s=story,
        why=describe(story, display.money, display.utc),
        finance=principal.role is not Role.ADVERTISER,
    )
    return page if status == 200 else (page, status)


@api_bp.get("/clicks/<click_id>")
def click_document(click_id: str) -> Response:
    story = story_or_404(click_id)
    if story.outcome.status == NOT_RECEIVED:
        response = jsonify({"error": f"no click {click_id} was ever received", "status": 404})
        response.status_code = 404
        return response
    if story.outcome.status == PAST_HORIZON:
        # Not found where the story searched, which is not all there is: the plain answer, and where it looked.
        response = jsonify(
            {"error": " ".join(describe(story)), "status": 404, "searched": story_document(story)["searched"]}
        )
        response.status_code = 404
        return response
    return jsonify(story_document(story))


def story_document(story: ClickStory) -> dict[str, Any]:
    """The story as the API gives it: every amount in micros a string of digits (`web.responses.micros_text`)."""
    document: dict[str, Any] = _micros_as_text(story.to_dict())
    return document


def _micros_as_text(value: Any, key: str = "") -> Any:
    if isinstance(value, dict):
        return {k: _micros_as_text(v, k) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_micros_as_text(v, key) for v in value]
    if key.endswith("_micros") and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value
