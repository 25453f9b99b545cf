"""What the pages say in words, over real Redis and the sample (`tests.web_support.seed`: six hourly periods from
2026-01-01 00:00 UTC, four closed): when a provisional figure becomes final, who made a change and through which door,
errors in the terms people typed, amounts in the currency's minor unit, and the health page's news."""

from __future__ import annotations

import re

import pytest
from flask.testing import FlaskClient

from billing.store.stream_offsets import LagReading
from ops.settings import PROJECT_ROOT, Settings
from tests.web_support import OWN, Seeded, login, seed
from web.app import create_app

pytestmark = pytest.mark.integration

NOW_MS = 1_767_246_000_000  # 2026-01-01T05:40Z: the sample's last period (05:00) is open, its horizon not passed


@pytest.fixture
def seeded(redis_settings: Settings) -> Seeded:
    return seed(redis_settings)


def client_of(seeded: Seeded, who: str, now_ms: int = NOW_MS) -> FlaskClient:
    lag = LagReading({"clicks": 0, "impressions": 0}, True, now_ms)
    client = create_app(seeded.settings, clock=lambda: now_ms, cache_s=0, kafka_lag=lambda: lag).test_client()
    assert login(client, who).status_code == 302
    return client


def text_of(html: str) -> str:
    """The page's words, without its tags and with its white space folded."""
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def test_the_dashboard_and_the_statement_say_when_a_provisional_figure_becomes_final(seeded: Seeded) -> None:
    """The live figure is the stream's; reconciliation corrects a period once, when it closes after its lateness
    horizon (`billing.closing.plan_run`), not every five minutes."""
    alice = client_of(seeded, "alice")
    page = text_of(alice.get(f"/advertisers/{OWN}?period=20260101T0500Z").text)
    assert "Provisional. These are the stream's live figures." in page
    assert "first run after 2026-01-01 06:15:00 UTC (the period's end plus its 15-minute lateness horizon)" in page
    assert "Until then its corrections stay at 0" in page
    closed = text_of(alice.get(f"/advertisers/{OWN}?period=20260101T0100Z").text)
    assert "Final. Reconciled and closed" in closed and "Provisional." not in closed
    # Past the horizon and not closed yet: it closes at the next run.
    an_hour_later = client_of(seeded, "alice", NOW_MS + 3_600_000)
    later = text_of(an_hour_later.get(f"/advertisers/{OWN}?period=20260101T0500Z").text)
    assert "lateness horizon, passed: it closes at the next run" in later

    statement = text_of(alice.get(f"/advertisers/{OWN}/statements/2026-01").text)
    assert "Open periods are provisional: the stream's live figures, which reconciliation corrects" in statement
    assert "becomes final at the earliest at 2026-01-01 06:15:00 UTC" in statement

    readme = " ".join((PROJECT_ROOT / "README.md").read_text().split())
    assert "every five minutes reconciliation applies the rule" not in readme
    assert "provisional" in readme and "lateness horizon" in readme
