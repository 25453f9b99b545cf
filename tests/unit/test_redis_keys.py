"""The Redis keyspace is a stored format: running jobs and stored data read these exact names."""

from __future__ import annotations

from billing.store.redis_keys import RedisKeys

P = "adbill"
PERIOD = "20260101T0000Z"


def test_every_key_family_keeps_its_name() -> None:
    k = RedisKeys(P)
    assert k.totals(PERIOD, "adv", "adv-1") == "adbill:totals:20260101T0000Z:adv:adv-1"
    assert k.totals(PERIOD, "cmp", "cmp-1") == "adbill:totals:20260101T0000Z:cmp:cmp-1"
    assert k.totals(PERIOD, "ad", "ad-1") == "adbill:totals:20260101T0000Z:ad:ad-1"
    assert k.corrections(PERIOD, "ad", "ad-1") == "adbill:corrections:20260101T0000Z:ad:ad-1"
    assert k.corrections_applied() == "adbill:corrections:applied"
    assert k.correction_list("adv-1") == "adbill:correction-list:adv-1"
    assert k.periods() == "adbill:periods"
    assert k.closed_periods() == "adbill:periods:closed"
    assert k.period_advertisers(PERIOD) == "adbill:period:20260101T0000Z:advertisers"
    assert k.period_campaigns(PERIOD, "adv-1") == "adbill:period:20260101T0000Z:campaigns:adv-1"
    assert k.period_ads(PERIOD, "adv-1") == "adbill:period:20260101T0000Z:ads:adv-1"
    assert k.applied("billing") == "adbill:applied:billing"
    assert k.counters() == "adbill:counters"
    assert k.late(PERIOD, "adv", "adv-1") == "adbill:late:20260101T0000Z:adv:adv-1"
    assert k.late_periods() == "adbill:late-periods"
    assert k.clock_ahead(PERIOD, "ad", "ad-1") == "adbill:clock-ahead:20260101T0000Z:ad:ad-1"
    assert k.clock_ahead_ads(PERIOD) == "adbill:clock-ahead:20260101T0000Z:ads"
    assert k.clock_ahead_periods() == "adbill:clock-ahead-periods"
    assert k.quarantine("undecodable") == "adbill:quarantine:undecodable"
    assert k.quarantined("adv-1") == "adbill:quarantined:adv:adv-1"
    assert k.conflicts_applied() == "adbill:conflicts:applied"
    assert k.released_applied() == "adbill:released:applied"
    assert k.last_reconciliation() == "adbill:reconcile:last"
    assert k.last_audit() == "adbill:audit:last"
    assert k.health_query("billing") == "adbill:health:query:billing"
    assert k.health_history("billing") == "adbill:health:history:billing"
    assert k.heartbeat("billing") == "adbill:health:heartbeat:billing"
    assert k.web_session("abc") == "adbill:web:session:abc"
    assert k.login_failures_of_account("abc") == "adbill:web:login-failures:account:abc"
    assert k.login_failures_of_address("10.0.0.1") == "adbill:web:login-failures:address:10.0.0.1"


def test_the_billing_figures_are_every_key_but_health_and_sessions() -> None:
    assert RedisKeys(P).billing_patterns() == [
        f"{P}:{pattern}"
        for pattern in (
            "totals:*",
            "period:*",
            "periods",
            "periods:closed",
            "applied:*",
            "late:*",
            "late-periods",
            "clock-ahead:*",
            "clock-ahead-periods",
            "unbilled:*",
            "unbilled-periods",
            "not-charged:*",
            "not-charged-periods",
            "budget-day:*",
            "budget-day-campaigns:*",
            "budget-days",
            "corrections:*",
            "correction-list:*",
            "quarantine:*",
            "quarantined:*",
            "conflicts:applied",
            "released:applied",
            "reconcile:last",
            "audit:last",
        )
    ]
