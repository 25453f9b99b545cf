"""The HTML pages: thin views that check access (`web.guards`), read (`web.readers`) and render a template.

Anonymous requests are sent to the login page; whatever the person may not see answers 404.
"""

from __future__ import annotations

from flask import Blueprint, abort, redirect, render_template, request, send_file, url_for
from markupsafe import Markup
from werkzeug.wrappers import Response

from web.auth import home_for
from web.guards import advertiser_or_404, finance_or_404, health_or_404, paging_args, period_arg
from web.services import current_principal, services

bp = Blueprint("pages", __name__)


@bp.before_request
def require_login() -> Response | None:
    if current_principal() is None:
        return redirect(url_for("auth.login_form", next=request.full_path.rstrip("?")))
    return None


@bp.get("/")
def index() -> Response:
    principal = current_principal()
    if principal is None:  # require_login answered already; this keeps it so under `python -O` too
        abort(401)
    return redirect(home_for(principal))


@bp.get("/advertisers/<advertiser_id>")
def advertiser(advertiser_id: str) -> str:
    advertiser_or_404(advertiser_id)
    period = period_arg()
    content = services().recent.get(
        ("dashboard.html", advertiser_id, period), lambda: _dashboard(advertiser_id, period)
    )
    if content is None:
        abort(404)
    return render_template("advertiser.html", advertiser_id=advertiser_id, content=content)


def _dashboard(advertiser_id: str, period: str | None) -> Markup | None:
    """The dashboard's content, the same for everyone allowed to see it (kept a second by `web.cache`)."""
    svc = services()
    dashboard = svc.reader.dashboard(advertiser_id, period)
    if dashboard is None:
        return None
    corrections = svc.reader.corrections(advertiser_id, 0, 10)
    return Markup(  # our own template's output, escaped by Jinja as it was rendered  # nosec B704
        render_template(
            "_advertiser_main.html", d=dashboard, corrections=corrections, refresh_ms=svc.refresh_ms, follow=period
        )
    )


@bp.get("/advertisers/<advertiser_id>/campaigns/<campaign_id>")
def campaign(advertiser_id: str, campaign_id: str) -> str:
    advertiser_or_404(advertiser_id)
    detail = services().reader.campaign(advertiser_id, campaign_id, period_arg())
    if detail is None:
        abort(404)
    return render_template("campaign.html", c=detail)


@bp.get("/advertisers/<advertiser_id>/ads/<ad_id>")
def ad(advertiser_id: str, ad_id: str) -> str:
    advertiser_or_404(advertiser_id)
    detail = services().reader.ad(advertiser_id, ad_id)
    if detail is None:
        abort(404)
    return render_template("ad.html", a=detail)


@bp.get("/advertisers/<advertiser_id>/corrections")
def corrections(advertiser_id: str) -> str:
    advertiser_or_404(advertiser_id)
    offset, limit = paging_args()
    page = services().reader.corrections(advertiser_id, offset, limit)
    return render_template("corrections.html", page=page)


@bp.get("/advertisers/<advertiser_id>/corrections/<correction_id>")
def correction(advertiser_id: str, correction_id: str) -> str:
    advertiser_or_404(advertiser_id)
    found = services().reader.correction(advertiser_id, correction_id)
    if found is None:
        abort(404)
    return render_template("correction.html", c=found, currency=services().reader.currency(advertiser_id))


@bp.get("/finance")
def finance() -> str:
    finance_or_404()
    overview = services().reader.finance(period_arg())
    if overview is None:
        abort(404)
    return render_template("finance.html", f=overview)


@bp.get("/exports/<period>/<name>")
def export_file(period: str, name: str) -> Response:
    """A closed period's reconciled export: Parquet, CSV or its manifest, as an attachment."""
    finance_or_404()
    path = services().reader.export_file(period, name)
    if path is None:
        abort(404)
    mimetypes = {"parquet": "application/vnd.apache.parquet", "csv": "text/csv", "json": "application/json"}
    response = send_file(
        path,
        mimetype=mimetypes[name.rsplit(".", 1)[1]],
        as_attachment=True,
        download_name=f"adbill-{period}-{name}",
    )
    response.headers["Cache-Control"] = "no-store"  # billing data: not kept by the browser or a proxy
    return response


@bp.get("/health")
def health() -> str:
    health_or_404()
    return render_template("health.html", h=services().reader.health(), now_ms=services().clock())
