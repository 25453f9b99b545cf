"""The checks a view makes before it reads anything: someone is logged in (`page_login`, `api_login`, each
blueprint's first check), and the person may see the thing asked for, else 404.

The same checks serve the pages and the JSON API, so both follow the same access rules (`web.access`). A thing the
person may not see and a thing that does not exist give the same 404, so other advertisers' ids cannot be probed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from flask import Response, abort, g, jsonify, redirect, request, url_for

from web.access import Principal, may_see_advertiser, may_see_finance, may_see_health
from web.readers import is_id, is_period_key
from web.services import current_principal, services

MAX_PAGE = 500
MAX_OFFSET = 2**53 - 1
"""The largest offset: the API echoes it back, and JSON readers hold whole numbers exactly up to 2^53 - 1."""
_DIGITS = re.compile(r"[0-9]{1,16}", re.ASCII)


def page_login() -> Response | None:
    """A page's blueprint's first check: a person not logged in is sent to the login form, and back after it."""
    if current_principal() is None:
        return redirect(url_for("auth.login_form", next=request.full_path.rstrip("?")))  # type: ignore[return-value]
    return None


PUBLIC_API_ENDPOINTS = frozenset({"api.openapi"})
"""The API's one public document: its OpenAPI description (it holds no data)."""


def api_login() -> Response | None:
    """An API blueprint's first check: 401 for anonymous requests and unknown or revoked tokens."""
    if current_principal() is None and request.endpoint not in PUBLIC_API_ENDPOINTS:
        if g.get("bad_token"):
            response = jsonify({"error": "invalid or revoked token", "status": 401})
            response.headers["WWW-Authenticate"] = 'Bearer realm="adbill", error="invalid_token"'
        else:
            response = jsonify({"error": "login required", "status": 401})
            response.headers["WWW-Authenticate"] = 'Bearer realm="adbill"'
        response.status_code = 401
        return response
    return None


def logged_in() -> Principal:
    principal = current_principal()
    if principal is None:
        abort(401)
    return principal


def advertiser_or_404(advertiser_id: str) -> Principal:
    """The advertiser's data may be shown: its own account, or finance and admin for a known advertiser."""
    principal = logged_in()
    if not is_id(advertiser_id) or not may_see_advertiser(principal, advertiser_id):
        abort(404)
    if principal.advertiser_id != advertiser_id:
        svc = services()
        if advertiser_id not in svc.recent.get(("known-advertisers",), svc.periods.known_advertisers):
            abort(404)
    return principal


def allowed_or_404(may: Callable[[Principal], bool]) -> Principal:
    """The person logged in (401 when nobody is) when `may` lets them in; 404 otherwise: what a person may not see is
    not there for them."""
    principal = logged_in()
    if not may(principal):
        abort(404)
    return principal


def finance_or_404() -> Principal:
    return allowed_or_404(may_see_finance)


def health_or_404() -> Principal:
    return allowed_or_404(may_see_health)


def period_arg() -> str | None:
    """The `period` query argument: absent (the latest period), or the key of a period (one that holds no data shows
    zero spend); anything else is 400."""
    value = request.args.get("period")
    if value is None or value == "":
        return None
    try:
        if not is_period_key(value):
            raise ValueError(value)
        services().periods.length.parse_key(value)
    except ValueError:
        abort(400, description="period is the key of a billing period, such as 20260101T0000Z")
    return value


def paging_args(default_limit: int = 50) -> tuple[int, int]:
    """(offset, limit) from the query; 400 unless each is plain digits within its bounds."""
    offset = _whole_arg("offset", 0, 0, MAX_OFFSET)
    limit = _whole_arg("limit", default_limit, 1, MAX_PAGE)
    return offset, limit


def made_arg() -> int | None:
    """The version of the change just made, which the redirect after a form names (`?made=`), or None."""
    made = request.args.get("made", "")
    return int(made) if made.isdigit() and len(made) < 16 else None


def form_fields(names: Iterable[str]) -> dict[str, str]:
    """The posted form's fields `names`, each without the white space around it (empty when absent)."""
    return {name: request.form.get(name, "").strip() for name in names}


def _whole_arg(name: str, default: int, low: int, high: int) -> int:
    """A whole-number query argument: ASCII digits only (no sign, blank, underscore or other script's digits)."""
    value = request.args.get(name)
    if value is None:
        return default
    if not _DIGITS.fullmatch(value) or not low <= int(value) <= high:
        abort(400, description=f"{name} is a whole number from {low} to {high}")
    return int(value)
