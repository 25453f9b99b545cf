"""The Prometheus alert rules of `ops/alerts/`: `promtool test rules` passes (Debian's `prometheus` package, installed
by `ops.deps` where it may), and every metric they name is one the job or reconciliation exports."""

from __future__ import annotations

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

pytestmark = pytest.mark.integration

ALERTS = Path(deps.__file__).resolve().parent / "alerts"
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
