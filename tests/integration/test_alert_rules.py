"""The Prometheus alert rules of `ops/alerts/`: `promtool test rules` passes (Debian's `prometheus` package, installed
by `ops.deps` where it may), and every metric they name is one the job or reconciliation exports."""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from pathlib import Path

import pytest
import redis

from attribution.progress import ReconciliationCollector
from billing.store.redis_keys import RedisKeys
from ops import deps
from ops.redis_service import LocalRedis
from ops.settings import Settings

pytestmark = pytest.mark.integration

ALERTS = Path(deps.__file__).resolve().parent / "alerts"
BOOKS_DIFFER_DESCRIPTION = (
    "The last `adbill audit` found a closed period whose export and adjustments differ from the rule over every "
    "event; the health and finance pages name it. An open period that differs is awaiting close and never counts."
)
PROJECT = ALERTS.parent.parent


def promtool() -> str:
    try:
        return deps.ensure_promtool()
    except deps.DependencyError as exc:
        pytest.skip(str(exc))


def test_promtool_checks_and_tests_the_rules() -> None:
    tool = promtool()
    checked = subprocess.run([tool, "check", "rules", "adbill.rules.yml"], cwd=ALERTS, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [tool, "test", "rules", "adbill.rules.test.yml"], cwd=ALERTS, capture_output=True, text=True, timeout=120
    )
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


def test_every_metric_the_rules_name_is_exported() -> None:
    rules = (ALERTS / "adbill.rules.yml").read_text()
    named = set(re.findall(r"\b(adbill_[a-z_]+)", rules))
    source = "\n".join(p.read_text() for d in ("attribution", "ops") for p in (PROJECT / d).rglob("*.py"))
    for name in named:
        base = name.removesuffix("_total")
        assert f'"{base}"' in source, f"{name} is named by an alert rule but exported by nothing"


def test_the_heartbeat_and_the_audit_are_scraped_from_redis(redis_server: LocalRedis) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    prefix = f"t{uuid.uuid4().hex[:10]}"
    keys = RedisKeys(prefix)
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    client.set(keys.heartbeat("billing"), "1767225600000")
    client.hset(keys.last_audit(), mapping={"ran_at_ms": 1, "periods": 3, "differences": '["20260101T0000Z"]'})
    registry = CollectorRegistry()
    registry.register(ReconciliationCollector(redis_server.url, prefix))
    scraped = generate_latest(registry).decode()
    assert 'adbill_heartbeat_timestamp_seconds{query="billing"} 1.7672256e+09' in scraped
    assert "adbill_audit_periods_differing 1.0" in scraped
    client.close()


def test_invalid_over_budget_and_capped_campaigns_are_scraped_from_redis(
    redis_server: LocalRedis, database: str
) -> None:
    """`adbill_invalid_clicks_total{reason}` and `adbill_over_budget_clicks_total` count what the stream did not
    charge; `adbill_campaigns_capped_today` the campaigns whose day reached their budget now (the alert's input)."""
    from prometheus_client import CollectorRegistry

    from attribution.progress import BillingCollector
    from billing.catalog import Ad, Catalog
    from billing.store.catalog_db import CatalogDatabase
    from billing.store.redis_totals import BudgetDayCount, NotChargedCount, RedisTotals

    now = 1_767_261_600_000  # 2026-01-01T10:00Z
    catalog = (
        Catalog(
            [
                Ad("ad-1", "cmp-1", "adv-1", 300_000, "EUR"),
                Ad("ad-2", "cmp-2", "adv-1", 300_000, "EUR"),
                Ad("ad-3", "cmp-3", "adv-1", 300_000, "EUR"),
            ]
        )  # fmt: skip
        .with_budget("cmp-1", 0, 1_000_000, 0, backfill=True)  # reached: 0.90 charged leaves less than a click
        .with_budget("cmp-2", 0, 5_000_000, 0, backfill=True)  # room for more clicks
    )  # cmp-3 has no budget: never capped
    store = CatalogDatabase(database)
    store.load(catalog, [])  # a catalog with a history: each version its entry in the change log
    prefix = f"t{uuid.uuid4().hex[:10]}"
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    period, start = "20260101T0900Z", 1_767_258_000_000
    not_charged = [
        NotChargedCount(period, start, "adv-1", "cmp-1", "ad-1", "known_bot", 4, 1_200_000),
        NotChargedCount(period, start, "adv-1", "cmp-1", "ad-1", "duplicate_click", 2, 600_000),
        NotChargedCount(period, start, "adv-1", "cmp-1", "ad-1", "over_budget", 7, 2_100_000),
    ]
    days = [
        BudgetDayCount(period, "cmp-1", "2026-01-01", 1_767_225_600_000, 3, 900_000, 7, 2_100_000),
        BudgetDayCount(period, "cmp-2", "2026-01-01", 1_767_225_600_000, 3, 900_000),
        BudgetDayCount(period, "cmp-3", "2026-01-01", 1_767_225_600_000, 30, 9_000_000),
    ]
    assert RedisTotals(client, prefix).apply_batch("billing", 0, [], not_charged=not_charged, budget_days=days)
    registry = CollectorRegistry()
    registry.register(BillingCollector(redis_server.url, prefix, store, clock=lambda: now))
    assert registry.get_sample_value("adbill_invalid_clicks_total", {"reason": "known_bot"}) == 4
    assert registry.get_sample_value("adbill_invalid_clicks_total", {"reason": "duplicate_click"}) == 2
    assert registry.get_sample_value("adbill_invalid_clicks_total", {"reason": "excluded_ip"}) == 0
    assert registry.get_sample_value("adbill_over_budget_clicks_total") == 7
    assert registry.get_sample_value("adbill_campaigns_capped_today") == 1
    # The next day nothing is charged yet: nobody is capped.
    registry = CollectorRegistry()
    registry.register(BillingCollector(redis_server.url, prefix, store, clock=lambda: now + 86_400_000))
    assert registry.get_sample_value("adbill_campaigns_capped_today") == 0
    client.close()


def test_an_open_period_that_differs_never_fires_books_differ(redis_settings: Settings, tmp_path: Path) -> None:
    """From the audit's record to the page: three hourly audits, each finding the open hour differing, recorded as
    `adbill reconcile --every` records them and scraped from the job's `/metrics`, never fire `AdbillBooksDiffer`
    under the real rules; a closed period that differs does."""
    from prometheus_client import CollectorRegistry

    from attribution.audit import PeriodAudit
    from ops.reconcile import reconcile_config, record_audit

    tool = promtool()
    config = reconcile_config(redis_settings)

    def scraped(audits: list[PeriodAudit]) -> int:
        record_audit(config, audits)
        registry = CollectorRegistry()
        registry.register(ReconciliationCollector(redis_settings.redis_url, redis_settings.redis_prefix))
        return int(registry.get_sample_value("adbill_audit_periods_differing") or 0)

    hours = [f"20260101T{h:02}00Z" for h in range(5)]
    values = [
        scraped(
            [PeriodAudit(p, True, 3, {"EUR": 750_000}, 3, {"EUR": 750_000}) for p in hours[:n]]
            + [PeriodAudit(hours[n], False, 2, {"EUR": 500_000}, 1, {"EUR": 250_000})]
        )
        for n in (1, 2, 3)
    ]
    failing = scraped([PeriodAudit(hours[0], True, 3, {"EUR": 750_000}, 2, {"EUR": 500_000})])
    assert (values, failing) == ([0, 0, 0], 1)
    series = " ".join(f"{v}x59" for v in values) + f" {failing}x10"
    (tmp_path / "adbill.rules.yml").write_text((ALERTS / "adbill.rules.yml").read_text())
    quiet = "\n".join(
        f"      - eval_time: {minute}m\n        alertname: AdbillBooksDiffer\n        exp_alerts: []"
        for minute in (5, 65, 125, 178)
    )
    (tmp_path / "scraped.test.yml").write_text(
        "rule_files: [adbill.rules.yml]\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n"
        f"      - series: 'adbill_audit_periods_differing{{job=\"adbill-stream\"}}'\n        values: '{series}'\n"
        f"    alert_rule_test:\n{quiet}\n      - eval_time: 185m\n        alertname: AdbillBooksDiffer\n"
        "        exp_alerts:\n          - exp_labels: {severity: page}\n            exp_annotations:\n"
        '              summary: "adbill audit: 1 closed period(s) differ from the rule"\n'
        f"              description: {json.dumps(BOOKS_DIFFER_DESCRIPTION)}\n"
    )
    tested = subprocess.run(
        [tool, "test", "rules", "scraped.test.yml"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr
