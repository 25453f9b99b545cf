"""The checks a view makes before it reads anything: the person may see the thing asked for, else 404.

The same checks serve the pages and the JSON API, so both follow the same access rules (`web.access`). A thing the
person may not see and a thing that does not exist give the same 404, so other advertisers' ids cannot be probed.
"""

from __future__ import annotations

from flask import abort, request

from web.access import Principal, may_see_advertiser, may_see_finance, may_see_health
from web.readers import is_id, is_period_key
from web.services import current_principal, services

MAX_PAGE = 500


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
        if advertiser_id not in svc.recent.get(("known-advertisers",), svc.reader.known_advertisers):
            abort(404)
    return principal


def finance_or_404() -> Principal:
    principal = logged_in()
    if not may_see_finance(principal):
        abort(404)
    return principal


def health_or_404() -> Principal:
    principal = logged_in()
    if not may_see_health(principal):
        abort(404)
    return principal


def period_arg() -> str | None:
    """The `period` query argument: absent (the latest period), or a period key; anything else is 404."""
    value = request.args.get("period")
    if value is None or value == "":
        return None
    if not is_period_key(value):
        abort(404)
    return value


def paging_args(default_limit: int = 50) -> tuple[int, int]:
    """(offset, limit) from the query, bounded; 400 on nonsense."""
    try:
        offset = int(request.args.get("offset", 0))
        limit = int(request.args.get("limit", default_limit))
    except ValueError:
        abort(400, description="offset and limit are whole numbers")
    if offset < 0 or not 1 <= limit <= MAX_PAGE:
        abort(400, description=f"offset is at least 0, limit from 1 to {MAX_PAGE}")
    return offset, limit
