"""The health page and its API say what the data folder's upkeep last did: the closed periods' compaction, the open
periods' and the click filters (`ops.reconcile.record_compaction`), from Redis, with a failure in red."""

from __future__ import annotations

import pytest
from flask.testing import FlaskClient
from markupsafe import escape

from billing.catalog import generate_catalog
from billing.store.click_filters import DayFilter
from billing.store.redis_totals import RedisTotals
from ops.reconcile import (
    OpenPasses,
    compact_closed_periods,
    compaction_record,
    rebuild_click_filters,
    reconcile_config,
    record_compaction,
    refresh_click_filters,
    run_lock,
)
from ops.settings import Settings
from tests.unit.test_click_files import P0, P2, write_data
from tests.web_support import login
from web.app import create_app

pytestmark = pytest.mark.integration

NOW_MS = 1_767_261_960_000


def _admin(settings: Settings) -> FlaskClient:
    from web.access import Role

    settings.catalog_store().start(generate_catalog(1, 1, 1, seed=1))
    settings.accounts_store().add("ada", Role.ADMIN, "correct horse battery staple")
    client = create_app(settings, clock=lambda: NOW_MS, cache_s=0).test_client()
    assert login(client, "ada").status_code == 302
    return client


def test_the_health_page_says_what_each_compaction_pass_and_the_click_filters_last_did(
    redis_settings: Settings,
) -> None:
    ada = _admin(redis_settings)
    assert 'id="no-compaction"' in ada.get("/health").text
    assert ada.get("/api/v1/health").json["compaction"] == []  # type: ignore[index]

    layout = redis_settings.layout
    write_data(layout.root)  # two closed periods (compacted), an open one
    config = reconcile_config(redis_settings)
    said: list[str] = []
    with run_lock(config):
        closed = compact_closed_periods(config)  # no checkpoint here: the stream's position is unknown
        record_compaction(config, "closed", compaction_record(closed))
        filters = refresh_click_filters(config)
    OpenPasses(config, said.append)._pass()
    assert filters.startswith("click filters: 2 period(s) written"), filters
    assert set(DayFilter(layout.click_day_filter(P0[:8])).parts) == {P0}
    assert set(DayFilter(layout.click_day_filter(P2[:8])).parts) == {P2}

    parts = {c["part"]: c for c in ada.get("/api/v1/health").json["compaction"]}  # type: ignore[index]
    assert list(parts) == ["closed", "open", "filters"]
    assert parts["closed"]["summary"] == closed.describe() and "position is unknown" in parts["closed"]["summary"]
    assert parts["open"]["summary"] == said[-1]
    assert parts["filters"]["summary"] == filters and parts["filters"]["failed"] == []
    assert all(p["finished_at_ms"] > 0 for p in parts.values())
    page = ada.get("/health").text
    for part, text in (("closed", "Compaction of the closed periods"), ("filters", "Click filters")):
        row = page.split(f'id="compaction-{part}"')[1].split("</tr>")[0]
        assert text in row and str(escape(parts[part]["summary"])) in row and 'class="bad"' not in row, row

    # A pass that left a folder as written says so in red; the next run's record replaces it.
    totals = RedisTotals.from_url(redis_settings.redis_url, redis_settings.redis_prefix)
    failed = {"finished_at_ms": NOW_MS, "summary": "compaction: ledger/period=P left as written", "failed": ["x"]}
    totals.record_compaction("closed", failed)
    row = ada.get("/health").text.split('id="compaction-closed"')[1].split("</tr>")[0]
    assert '<strong class="bad">compaction: ledger/period=P left as written</strong>' in row, row
    with run_lock(config):
        assert refresh_click_filters(config) == "click filters: up to date"
    assert next(c for c in ada.get("/api/v1/health").json["compaction"] if c["part"] == "filters")["summary"] == (  # type: ignore[index]
        "click filters: up to date"
    )


def test_adbill_click_filters_writes_a_days_filters_again(
    redis_settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = redis_settings.layout
    write_data(layout.root)
    assert rebuild_click_filters(redis_settings, "2026-01-01") == 0
    out = capsys.readouterr().out
    assert "click filters of 20260101: 1 period(s)" in out and "click-filters: 1 period(s)," in out, out
    assert set(DayFilter(layout.click_day_filter("20260101")).parts) == {P0}
    assert not layout.click_day_filter("20260102").exists()
    assert rebuild_click_filters(redis_settings, None) == 0  # every closed period
    assert set(DayFilter(layout.click_day_filter("20260102")).parts) == {P2}
    assert rebuild_click_filters(redis_settings, "2026-02-30") == 2
    assert "is not a day" in capsys.readouterr().err
    assert rebuild_click_filters(redis_settings, "2026-03-01") == 1
    assert "no closed period of 2026-03-01" in capsys.readouterr().err
