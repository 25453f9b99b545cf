"""Open endpoints for load balancers, orchestrators and scrapers: `/healthz`, `/readyz` and `/metrics`.

`/healthz` answers 200 while the process serves requests, and touches nothing else. `/readyz` answers 200 when
Redis answers, the streaming job's last batch (or idle trigger) is recent and the catalog's database answers (this
process, and the job by its record), else 503; its JSON body says which check failed. Neither needs a login, and
neither shows any billing figure.
"""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from billing.store.part_status import PRICING_WITH_HELD, STREAM_CATALOG_PART
from web import metrics as web_metrics
from web.services import Services, services

bp = Blueprint("probes", __name__)


@bp.get("/healthz")
def healthz() -> Response:
    """Alive: the process serves requests."""
    return jsonify({"status": "ok"})


@bp.get("/metrics")
def metrics() -> Response:
    """The web UI's Prometheus metrics (`web.metrics`)."""
    return web_metrics.scrape()


@bp.get("/readyz")
def readyz() -> tuple[Response, int]:
    """Ready: Redis answers, the streaming job reported within `ADBILL_WEB_READY_BATCH_AGE_S`, and the catalog's
    database answers (this process's reading and the job's own record)."""
    svc = services()
    now = svc.clock()
    checks: dict[str, str] = {}
    try:
        beat_ms = svc.job.heartbeat_ms()
        checks["redis"] = "ok"
    except Exception as exc:  # any failure to read Redis is "not ready", with its reason
        checks["redis"] = f"unreachable: {exc}"
        beat_ms = None
    if beat_ms is None:
        checks["job"] = "no batch yet" if checks["redis"] == "ok" else "unknown (Redis unreachable)"
    else:
        age_s = max(0, now - beat_ms) / 1000
        recent = age_s <= svc.ready_batch_age_s
        checks["job"] = (
            f"ok: last batch {age_s:.0f} s ago"
            if recent
            else f"last batch {age_s:.0f} s ago, more than {svc.ready_batch_age_s} s"
        )
    checks["catalog"] = catalog_check(svc)
    ready = all(value == "ok" or value.startswith("ok:") for value in checks.values())
    return jsonify({"status": "ready" if ready else "not ready", "checks": checks}), 200 if ready else 503


def catalog_check(svc: Services) -> str:
    """`ok: catalog version N`, or why the catalog may be behind: the database does not answer this process, or
    the streaming job prices with the catalog it holds (its status record, `billing.store.part_status`)."""
    catalog = svc.catalog
    version = catalog.get().version
    if catalog.behind is not None:
        return catalog.behind
    try:
        job = svc.job.part_waiting(STREAM_CATALOG_PART)
    except Exception:  # Redis unreachable: said under "redis"
        job = {}
    if job:
        return f"the streaming job is {job.get('state', PRICING_WITH_HELD)}: {job.get('message', '')}"
    return f"ok: catalog version {version}"
