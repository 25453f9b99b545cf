"""After every close the audit finds the open hour differing (its late data is corrected when it closes): that period
is awaiting close, never a failure. Only a closed period that differs turns the health page red, is named there, and
counts in `adbill_audit_periods_differing` (which `AdbillBooksDiffer` pages on)."""

from __future__ import annotations

import pytest
from flask.testing import FlaskClient

import attribution.audit
from attribution.audit import PeriodAudit
from billing.catalog import generate_catalog
from billing.store.stream_offsets import LagReading
from ops.reconcile import audit_after_run, reconcile_config
from ops.settings import Settings
from tests.redis_figures import RedisFigures
from tests.web_support import login
from web.app import create_app

pytestmark = pytest.mark.integration

NOW_MS = 1_767_261_960_000  # 2026-01-01T10:06Z, right after the 09:00 hour closed
CLOSED, OPEN = "20260101T0900Z", "20260101T1000Z"
CAUGHT_UP = LagReading({"clicks": 0, "impressions": 0}, True, NOW_MS)


def _admin(settings: Settings) -> FlaskClient:
    from web.access import Role

    settings.catalog_store().start(generate_catalog(1, 1, 1, seed=1))
    settings.accounts_store().add("ada", Role.ADMIN, "correct horse battery staple")
    settings.accounts_store().add("fiona", Role.FINANCE, "correct horse battery staple")
    client = create_app(settings, clock=lambda: NOW_MS, cache_s=0, kafka_lag=lambda: CAUGHT_UP).test_client()
    assert login(client, "ada").status_code == 302
    return client


def _audited(settings: Settings, monkeypatch: pytest.MonkeyPatch, audits: list[PeriodAudit]) -> None:
    """The audit after a reconciliation run (`adbill reconcile --every`) as it records its outcome, finding `audits`."""
    monkeypatch.setattr(attribution.audit, "audit", lambda spark, config, catalog: audits)
    audit_after_run(object(), reconcile_config(settings), settings.catalog_store().current())


def _scraped_differing(settings: Settings) -> float | None:
    from prometheus_client import CollectorRegistry

    from attribution.progress import ReconciliationCollector

    registry = CollectorRegistry()
    registry.register(ReconciliationCollector(settings.redis_url, settings.redis_prefix))
    return registry.get_sample_value("adbill_audit_periods_differing")


def test_an_open_period_that_differs_is_awaiting_close_and_a_closed_one_is_a_failure_named_on_health(
    redis_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures = RedisFigures.from_url(redis_settings.redis_url, redis_settings.redis_prefix)
    figures.record_reconciliation(
        {"run_id": "r1", "finished_at_ms": NOW_MS - 60_000, "periods": [CLOSED], "closed": [CLOSED], "held": {}}
    )
    figures.client.set(figures.keys.heartbeat("billing"), str(NOW_MS - 2_000))
    ada = _admin(redis_settings)

    # Right after the 09:00 close: 09:00 balances; the open 10:00 hour misses a late click until it closes.
    _audited(
        redis_settings,
        monkeypatch,
        [
            PeriodAudit(CLOSED, True, 3, {"EUR": 750_000}, 3, {"EUR": 750_000}),
            PeriodAudit(OPEN, False, 2, {"EUR": 500_000}, 1, {"EUR": 250_000}),
        ],
    )
    status = ada.get("/api/v1/health").json["status"]  # type: ignore[index]
    reconciliation = next(c for c in status["components"] if c["name"] == "Reconciliation")
    assert reconciliation["level"] == "ok", reconciliation
    assert "awaiting close" in reconciliation["text"] and "2026-01-01 10:00 UTC" in reconciliation["text"]
    assert status["overall"] == "ok", status
    page = ada.get("/health").text
    assert 'data-level="red"' not in page and "failing" not in page.split('id="overall-status"')[1][:200]
    assert "awaiting close" in page
    assert _scraped_differing(redis_settings) == 0, "an open period never counts toward AdbillBooksDiffer"
    fiona = create_app(redis_settings, clock=lambda: NOW_MS, cache_s=0).test_client()
    assert login(fiona, "fiona").status_code == 302
    audit = fiona.get("/api/v1/finance").json["last_audit"]  # type: ignore[index]
    assert audit["differences"] == [] and audit["awaiting_close"] == [OPEN], audit
    finance = fiona.get("/finance").text.split('id="audit"')[1].split("</p>")[0]
    assert "awaiting close" in finance and "2026-01-01 10:00 UTC" in finance and 'class="bad"' not in finance

    # A closed period differs from what finance was given: a failure, named on the health page, and the alert's input.
    _audited(
        redis_settings,
        monkeypatch,
        [
            PeriodAudit(CLOSED, True, 3, {"EUR": 750_000}, 4, {"EUR": 1_000_000}),
            PeriodAudit(OPEN, False, 2, {"EUR": 500_000}, 1, {"EUR": 250_000}),
        ],
    )
    status = ada.get("/api/v1/health").json["status"]  # type: ignore[index]
    reconciliation = next(c for c in status["components"] if c["name"] == "Reconciliation")
    assert reconciliation["level"] == "red" and status["overall"] == "red"
    assert "2026-01-01 09:00 UTC" in reconciliation["text"], reconciliation
    page = ada.get("/health").text
    assert 'id="overall-status" data-level="red"' in page and "2026-01-01 09:00 UTC" in page
    assert _scraped_differing(redis_settings) == 1
    audit = fiona.get("/api/v1/finance").json["last_audit"]  # type: ignore[index]
    assert audit["differences"] == [CLOSED] and audit["awaiting_close"] == [OPEN], audit
