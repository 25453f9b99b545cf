"""What the pages and the API show equals what Redis and the export folder hold, written as the contract says."""

from __future__ import annotations

import json
import time

import pytest
import redis
from flask import Flask

from billing.catalog import generate_catalog
from billing.corrections import Correction, CorrectionKind
from billing.store.redis_totals import TotalsRow
from billing.store.stream_offsets import LagReading
from ops.settings import Settings
from tests.redis_figures import RedisFigures
from tests.web_support import OWN, Seeded, login, seed
from web.app import CACHE_S, create_app, exports_dir
from web.sample_data import SampleWriter, health_record

pytestmark = pytest.mark.integration

P0, P0_MS = "20260101T0000Z", 1_767_225_600_000
P1, P1_MS = "20260101T0100Z", 1_767_229_200_000


@pytest.fixture
def seeded(redis_settings: Settings) -> Seeded:
    return seed(redis_settings)


NO_BATCH_YET = LagReading({"clicks": 0, "impressions": 0}, False, 0)
"""Kafka as a pipeline that has not started billing shows it (Kafka's own figures: test_web_health_lag)."""


def _client(settings: Settings) -> object:
    app = create_app(settings, cache_s=0, kafka_lag=lambda: NO_BATCH_YET)
    client = app.test_client()
    assert login(client, "ada").status_code == 302
    return client


def test_an_empty_pipeline_shows_empty_pages_not_errors(redis_settings: Settings) -> None:
    redis_settings.catalog_store().start(generate_catalog(1, 1, 1, seed=1))
    from web.access import Role

    redis_settings.accounts_store().add("ada", Role.ADMIN, "correct horse battery staple")
    client = _client(redis_settings)
    for url in ("/advertisers/adv-0000", "/finance", "/health", "/advertisers/adv-0000/corrections"):
        response = client.get(url)  # type: ignore[attr-defined]
        assert response.status_code == 200, url
    assert "No billed clicks yet" in client.get("/advertisers/adv-0000").text  # type: ignore[attr-defined]
    assert "No progress records yet" in client.get("/health").text  # type: ignore[attr-defined]
    dashboard = client.get("/api/v1/advertisers/adv-0000/dashboard").json  # type: ignore[attr-defined]
    assert dashboard["period"] is None and dashboard["series"] == [] and dashboard["campaigns"] == []
    health = client.get("/api/v1/health").json  # type: ignore[attr-defined]
    assert health.pop("status")["overall"] == "unknown", "nothing reported yet: not known, not good"
    assert health == {
        "kafka": {"lag": {"clicks": 0, "impressions": 0}, "read_at_ms": 0, "committed": False, "error": None},
        "queries": [],
        "quarantined": {},
        "late": [],
        "clock_ahead": [],
        "unbilled": [],
        "last_reconciliation": None,
        "compaction": [],
    }


def test_dashboard_figures_are_the_streams_totals_plus_the_corrections(seeded: Seeded) -> None:
    client = _client(seeded.settings)
    totals = RedisFigures(seeded.client, seeded.settings.redis_prefix)
    shown_ahead = 0
    for period in totals.periods():
        doc = client.get(f"/api/v1/advertisers/{OWN}/dashboard?period={period}").json  # type: ignore[attr-defined]
        assert doc["period"]["period"] == period
        checks = [("adv", OWN, doc["totals"])]
        checks += [("cmp", c["campaign_id"], c) for c in doc["campaigns"]]
        checks += [("ad", a["ad_id"], a) for a in doc["ads"]]
        assert {c["campaign_id"] for c in doc["campaigns"]} == set(totals.campaigns(period, OWN))
        for level, ident, shown in checks:
            provisional = {"adv": totals.advertiser, "cmp": totals.campaign, "ad": totals.ad}[level](period, ident)
            fix = seeded.client.hmget(totals.keys.corrections(period, level, ident), "clicks", "micros")
            # Micros as strings (the proto3 JSON mapping of int64), clicks as numbers.
            assert shown["provisional"] == {"clicks": provisional.clicks, "micros": str(provisional.micros)}
            assert shown["corrections"] == {"clicks": int(fix[0] or 0), "micros": str(int(fix[1] or 0))}  # type: ignore[index]
            assert shown["corrected"]["micros"] == str(provisional.micros + int(fix[1] or 0))  # type: ignore[index]
        late = seeded.client.hmget(totals.keys.late(period, "adv", OWN), "impressions", "clicks")
        assert doc["late"] == {"late_impressions": int(late[0] or 0), "late_clicks": int(late[1] or 0)}  # type: ignore[index]
        ahead = totals.clock_ahead(period, "adv", OWN)
        assert doc["clock_ahead"] == {
            "clock_ahead_impressions": ahead.get("impression", 0),
            "clock_ahead_clicks": ahead.get("click", 0),
        }
        for a in doc["ads"]:
            ahead = totals.clock_ahead(period, "ad", a["ad_id"])
            assert (a["clock_ahead_impressions"], a["clock_ahead_clicks"]) == (
                ahead.get("impression", 0),
                ahead.get("click", 0),
            )
        shown_ahead += doc["clock_ahead"]["clock_ahead_impressions"] + doc["clock_ahead"]["clock_ahead_clicks"]
    quarantined = seeded.client.hgetall(totals.keys.quarantined(OWN))
    assert doc["quarantined"] == {k: int(v) for k, v in quarantined.items()}  # type: ignore[union-attr]
    assert shown_ahead > 0, "the sample has clock-ahead events on one of this advertiser's ads"


def test_an_ad_billed_only_by_reconciliation_shows_with_its_corrections(redis_settings: Settings) -> None:
    catalog = generate_catalog(1, 1, 2, seed=1)
    redis_settings.catalog_store().start(catalog)
    billed_ad, missed_ad = list(catalog)
    client_redis = redis.Redis.from_url(redis_settings.redis_url, decode_responses=True)
    writer = SampleWriter(client_redis, redis_settings.redis_prefix, exports_dir(redis_settings))
    writer.bill(1, [TotalsRow(P0, P0_MS, OWN, billed_ad.campaign_id, billed_ad.ad_id, 2, 2 * billed_ad.cpc_micros)])
    writer.corrections(
        [
            # Reconciliation of P0 while it was open: booked in P0 itself.
            Correction("c1", CorrectionKind.ADDITION, "k1", "i1", missed_ad.ad_id, missed_ad.campaign_id, OWN,
                       missed_ad.cpc_micros, missed_ad.currency, "late_click", P0, P0, P1_MS + 1),
            Correction("c2", CorrectionKind.RETRACTION, "k2", "i2", billed_ad.ad_id, billed_ad.campaign_id, OWN,
                       -billed_ad.cpc_micros, billed_ad.currency, "duplicate", P0, P0, P1_MS + 2),
        ]
    )  # fmt: skip
    writer.close(P0, P0_MS)
    from web.access import Role

    redis_settings.accounts_store().add("ada", Role.ADMIN, "correct horse battery staple")
    client = _client(redis_settings)
    doc = client.get(f"/api/v1/advertisers/{OWN}/dashboard").json  # type: ignore[attr-defined]
    assert doc["period"] == {"period": P0, "start_ms": P0_MS, "closed": True, "future": False}
    ads = {a["ad_id"]: a for a in doc["ads"]}
    assert ads[missed_ad.ad_id]["provisional"] == {"clicks": 0, "micros": "0"}
    assert ads[missed_ad.ad_id]["corrected"] == {"clicks": 1, "micros": str(missed_ad.cpc_micros)}
    assert ads[billed_ad.ad_id]["corrected"] == {"clicks": 1, "micros": str(billed_ad.cpc_micros)}
    assert doc["totals"]["corrected"] == {"clicks": 2, "micros": str(missed_ad.cpc_micros + billed_ad.cpc_micros)}
    listed = client.get(f"/api/v1/advertisers/{OWN}/corrections").json  # type: ignore[attr-defined]
    assert [c["correction_id"] for c in listed["corrections"]] == ["c2", "c1"], "newest first"
    assert listed["corrections"][0]["amount_micros"] == str(-billed_ad.cpc_micros)
    page = client.get(f"/advertisers/{OWN}/corrections/c1")  # type: ignore[attr-defined]
    assert page.status_code == 200 and "Late click" in page.text and "k1" in page.text


def test_health_shows_lag_watermarks_and_the_last_reconciliation(seeded: Seeded) -> None:
    client = _client(seeded.settings)
    doc = client.get("/api/v1/health").json  # type: ignore[attr-defined]
    (billing,) = doc["queries"]
    assert billing["name"] == "billing" and billing["consumer_lag_reported"] == {"clicks": 80, "impressions": 120}
    assert billing["consumer_lag"] == {"clicks": 0, "impressions": 0}, "Kafka's own figures (test_web_health_lag)"
    assert billing["state_rows"] == 52_000 and len(billing["recent_batch_durations_ms"]) == 30
    assert set(billing["stream_watermarks_ms"]) == {"impressions", "clicks"}
    assert doc["last_reconciliation"]["closed"] == ["20260101T0300Z"]
    # The sample's phone with a wrong clock: one ad, one period, by ad so that its sender can be found.
    (ahead,) = doc["clock_ahead"]
    ad = seeded.catalog.get(ahead["ad_id"])
    assert ad is not None and ahead["advertiser_id"] == ad.advertiser_id
    assert (ahead["period"], ahead["clock_ahead_impressions"], ahead["clock_ahead_clicks"]) == ("20260101T0400Z", 3, 1)
    page = client.get("/health").text  # type: ignore[attr-defined]
    assert "Clock ahead" in page and ahead["ad_id"] in page
    # A record written before the job reported latest offsets: the lag is unknown, and the page says so.
    record = health_record("billing", batch_id=99, now_ms=P1_MS)
    for source in record["sources"]:
        del source["latest_offset"]
    seeded.writer.health(record)
    assert client.get("/api/v1/health").json["queries"][0]["consumer_lag_reported"] == {  # type: ignore[attr-defined]
        "clicks": None,
        "impressions": None,
    }


def test_an_export_is_offered_only_once_its_manifest_is_written(seeded: Seeded) -> None:
    client = _client(seeded.settings)
    listed = [e["period"] for e in client.get("/api/v1/exports").json["exports"]]  # type: ignore[attr-defined]
    assert listed == ["20260101T0300Z", "20260101T0200Z"]
    unfinished = exports_dir(seeded.settings) / "20260101T0100Z"
    unfinished.mkdir()
    (unfinished / "billing.csv").write_text("click_id\n")
    assert [e["period"] for e in client.get("/api/v1/exports").json["exports"]] == listed  # type: ignore[attr-defined]
    assert client.get("/exports/20260101T0100Z/billing.csv").status_code == 404  # type: ignore[attr-defined]
    manifest = json.loads((exports_dir(seeded.settings) / "20260101T0300Z" / "manifest.json").read_text())
    export = client.get("/api/v1/exports").json["exports"][0]  # type: ignore[attr-defined]
    assert export["rows"] == manifest["rows"] and export["total_micros"] == manifest["total_micros"]
    assert {f["name"]: f["sha256"] for f in export["files"]} == {
        name: info["sha256"] for name, info in manifest["files"].items()
    }
    download = client.get(export["files"][0]["url"])  # type: ignore[attr-defined]
    assert download.status_code == 200
    assert "attachment" in download.headers["Content-Disposition"]


def test_the_dashboard_is_kept_a_second_per_worker_and_then_fresh(seeded: Seeded) -> None:
    today = time.time_ns() // 1_000_000  # the default range (the month to date) ends on one day for the whole test
    app: Flask = create_app(seeded.settings, clock=lambda: today)  # the cache time the server runs with
    assert CACHE_S == 1.0
    now = [1_000.0]
    app.extensions["adbill"].recent.clock = lambda: now[0]  # the worker's cache, on a clock of the test's
    client = app.test_client()
    login(client, "alice")

    def clicks() -> int:
        return client.get(f"/api/v1/advertisers/{OWN}/dashboard").json["totals"]["provisional"]["clicks"]

    before = clicks()
    totals = RedisFigures(seeded.client, seeded.settings.redis_prefix)
    period = totals.periods()[-1]
    start = int(seeded.client.zscore(totals.keys.periods(), period) or 0)
    ad = next(a for a in seeded.catalog if a.advertiser_id == OWN)
    totals.apply_batch("billing", 10_000, [TotalsRow(period, start, OWN, ad.campaign_id, ad.ad_id, 5, 5)])
    assert clicks() == before, "at once: the same document"
    now[0] += 0.999
    assert clicks() == before, "within the second: still the same document"
    now[0] += 0.001
    assert clicks() == before + 5, "a second after it was computed: fresh"


def test_held_periods_and_the_last_audit_show_on_the_health_and_finance_pages_and_in_the_metrics(
    redis_settings: Settings,
) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from attribution.progress import ReconciliationCollector
    from web.access import Role

    redis_settings.catalog_store().start(generate_catalog(1, 1, 1, seed=1))
    redis_settings.accounts_store().add("ada", Role.ADMIN, "correct horse battery staple")
    totals = RedisFigures.from_url(redis_settings.redis_url, redis_settings.redis_prefix)
    held = {
        P0: "held: the streaming job has been down for 22 min",
        P1: "held: the streaming job is 1.2 M record(s) behind",
    }
    totals.record_reconciliation({"run_id": "r1", "finished_at_ms": P1_MS, "periods": [], "closed": [], "held": held})
    totals.record_audit({"ran_at_ms": P1_MS, "periods": 3, "differences": [P1]})
    client = _client(redis_settings)

    assert client.get("/api/v1/health").json["last_reconciliation"]["held"] == held  # type: ignore[attr-defined]
    page = client.get("/health").text  # type: ignore[attr-defined]
    assert "has been down for 22 min" in page and "1.2 M record(s) behind" in page
    finance = client.get("/api/v1/finance").json  # type: ignore[attr-defined]
    assert finance["last_audit"] == {"ran_at_ms": P1_MS, "periods": 3, "differences": [P1], "awaiting_close": []}
    assert "1 closed differ from the rule" in client.get("/finance").text  # type: ignore[attr-defined]

    registry = CollectorRegistry()
    registry.register(ReconciliationCollector(redis_settings.redis_url, redis_settings.redis_prefix))
    scraped = generate_latest(registry).decode()
    assert "adbill_reconcile_periods_held 2.0" in scraped
    assert f'adbill_reconcile_period_held{{period="{P0}",reason="{held[P0]}"}} 1.0' in scraped
    assert "adbill_reconcile_last_run_timestamp_seconds 1.7672292e+09" in scraped


def test_a_period_whose_totals_pass_ten_to_the_fifteen_micros_closes_exact_to_the_micro(
    redis_settings: Settings,
) -> None:
    # An hour of IDR: 10^15 micros and more. The close must keep every digit (no Lua double on the way), and the
    # pages and the API show them exactly.
    from billing.catalog import Ad, Catalog
    from web.access import Role
    from web.display import money

    big = 1_234_567_890_123_456_789  # far past 2^53, below 2^63 - 1
    catalog = Catalog([Ad("ad-big", "cmp-big", OWN, 987_654_321_987_654, "IDR")])
    redis_settings.catalog_store().start(catalog)
    client_redis = redis.Redis.from_url(redis_settings.redis_url, decode_responses=True)
    writer = SampleWriter(client_redis, redis_settings.redis_prefix, exports_dir(redis_settings))
    writer.bill(1, [TotalsRow(P0, P0_MS, OWN, "cmp-big", "ad-big", 1_250, big)])
    fix = -987_654_321_987_653
    writer.corrections(
        [
            Correction("c-big", CorrectionKind.RETRACTION, "k1", "i1", "ad-big", "cmp-big", OWN, fix, "IDR",
                       "duplicate", P0, P0, P1_MS + 1),
        ]
    )  # fmt: skip
    writer.close(P0, P0_MS)
    figures = RedisFigures(client_redis, redis_settings.redis_prefix)
    assert figures.advertiser(P0, OWN).micros == big  # provisional + corrections = the export
    redis_settings.accounts_store().add("ada", Role.ADMIN, "correct horse battery staple")
    client = _client(redis_settings)
    doc = client.get(f"/api/v1/advertisers/{OWN}/dashboard?period={P0}").json  # type: ignore[attr-defined]
    assert doc["period"]["closed"] is True
    for shown in (doc["totals"], doc["campaigns"][0], doc["ads"][0]):
        assert shown["provisional"]["micros"] == str(big), shown
        assert shown["corrections"]["micros"] == str(fix), shown
        assert shown["corrected"]["micros"] == str(big + fix), shown
    finance = client.get(f"/api/v1/finance?period={P0}").json  # type: ignore[attr-defined]
    assert [a["corrected"]["micros"] for a in finance["advertisers"]] == [str(big + fix)]
    for url in (f"/advertisers/{OWN}?period={P0}", f"/finance?period={P0}"):
        page = client.get(url)  # type: ignore[attr-defined]
        assert page.status_code == 200, url
        assert money(big + fix) in page.text, url
    writer.totals.record_reconciliation(
        {"run_id": "r1", "started_at_ms": P1_MS, "net_micros_by_currency": {"EUR": fix - big}}
    )
    health = client.get("/api/v1/health").json  # type: ignore[attr-defined]
    assert health["last_reconciliation"]["net_micros_by_currency"] == {"EUR": str(fix - big)}


PAST_2_TO_THE_53 = 9_007_199_254_740_993  # 2^53 + 1: a JSON number a browser reads as a double loses its last digit


def _micros_fields(value: object, path: str = "") -> list[tuple[str, object]]:
    """Every money field of an API document, by path: keys ending in `micros`, and the values of `..._by_currency`."""
    found: list[tuple[str, object]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}"
            if key.endswith("micros"):
                found.append((where, item))
            elif key.endswith("micros_by_currency"):
                found += [(f"{where}.{c}", m) for c, m in item.items()]
            else:
                found += _micros_fields(item, where)
    elif isinstance(value, list):
        for n, item in enumerate(value):
            found += _micros_fields(item, f"{path}[{n}]")
    return found


def test_every_api_document_carries_micros_as_strings_so_no_digit_is_lost_past_2_to_the_53(seeded: Seeded) -> None:
    """As the proto3 JSON mapping does for 64-bit integers: a script, or the dashboard's `response.json()`, which
    reads every JSON number as a double, gets every digit."""
    totals = RedisFigures(seeded.client, seeded.settings.redis_prefix)
    period = totals.periods()[-1]
    ad = next(a for a in seeded.catalog if a.advertiser_id == OWN)
    start_ms = int(seeded.client.zscore(totals.keys.periods(), period) or 0)
    totals.apply_batch(
        "billing", 5_000, [TotalsRow(period, start_ms, OWN, ad.campaign_id, ad.ad_id, 1, PAST_2_TO_THE_53)]
    )
    totals.record_reconciliation({"run_id": "r-big", "net_micros_by_currency": {"EUR": -PAST_2_TO_THE_53}})
    exact = totals.advertiser(period, OWN).micros
    fix = int(seeded.client.hget(totals.keys.corrections(period, "adv", OWN), "micros") or 0)
    assert exact > 2**53 and float(exact + fix) != exact + fix, "a double cannot hold it"

    client = _client(seeded.settings)
    correction = json.loads(seeded.client.lindex(totals.keys.correction_list(OWN), 0) or "{}")["correction_id"]
    urls = [
        "/api/v1/advertisers",
        f"/api/v1/advertisers/{OWN}/dashboard",
        f"/api/v1/advertisers/{OWN}/dashboard?range=last-7-days&period={period}",
        f"/api/v1/advertisers/{OWN}/campaigns/{ad.campaign_id}",
        f"/api/v1/advertisers/{OWN}/ads/{ad.ad_id}",
        f"/api/v1/advertisers/{OWN}/corrections",
        f"/api/v1/advertisers/{OWN}/corrections/{correction}",
        f"/api/v1/advertisers/{OWN}/ads",
        "/api/v1/finance",
        f"/api/v1/finance?period={period}",
        "/api/v1/exports",
        "/api/v1/health",
        "/api/v1/catalog/ads",
        f"/api/v1/catalog/ads/{ad.ad_id}",
        f"/api/v1/catalog/ads/{ad.ad_id}/prices",
    ]
    documents = {}
    for url in urls:
        response = client.get(url)  # type: ignore[attr-defined]
        assert response.status_code == 200, url
        documents[url] = response.text
    token = client.get("/catalog").text  # type: ignore[attr-defined]
    csrf = token.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
    made = client.post(  # type: ignore[attr-defined]
        "/api/v1/catalog/ads",
        json={"ad_id": "big-ad", "campaign_id": ad.campaign_id, "advertiser_id": OWN, "currency": "EUR",
              "cpc_micros": str(PAST_2_TO_THE_53)},
        headers={"X-CSRF-Token": csrf},
    )  # fmt: skip
    assert made.status_code == 201, made.text
    documents["POST /api/v1/catalog/ads"] = made.text

    money_fields = 0
    for url, text in documents.items():
        for where, value in _micros_fields(json.loads(text)):
            assert value is None or (isinstance(value, str) and value.lstrip("-").isdigit()), (url, where, value)
            money_fields += 1
    assert money_fields > 100

    # Read as a browser reads it (every JSON number a double): still every digit.
    dashboard = json.loads(documents[f"/api/v1/advertisers/{OWN}/dashboard"], parse_int=float)
    assert dashboard["totals"]["provisional"]["micros"] == str(exact)
    assert int(dashboard["totals"]["corrected"]["micros"]) == exact + fix
    health = json.loads(documents["/api/v1/health"], parse_int=float)
    assert health["last_reconciliation"]["net_micros_by_currency"] == {"EUR": str(-PAST_2_TO_THE_53)}
    created = json.loads(documents["POST /api/v1/catalog/ads"], parse_int=float)
    assert created["cpc_micros"] == str(PAST_2_TO_THE_53) and created["made"]["cpc_micros"] == str(PAST_2_TO_THE_53)
