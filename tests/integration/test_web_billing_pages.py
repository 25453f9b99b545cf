"""The billing pages as people use them, over real Redis and the sample: freshness that tells the truth, the
health page's status, correction reasons, the price behind a charge, an hour without data, a malformed period."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from billing.money import format_amount
from billing.store.part_status import STREAM_PART, PartStatus
from billing.store.redis_keys import RedisKeys
from billing.store.stream_offsets import LagReading
from ops import deps
from ops.settings import Settings
from tests.redis_figures import RedisFigures
from tests.web_support import OWN, Seeded, login, seed, web_screens_dir
from web import display
from web.app import create_app
from web.reasons import REASONS
from web.sample_data import health_record

pytestmark = pytest.mark.integration

NOW_MS = 1_767_250_000_000  # 2026-01-01T06:46:40Z, just after the sample's six hours


@pytest.fixture
def seeded(redis_settings: Settings) -> Seeded:
    return seed(redis_settings)


def client_of(seeded: Seeded, who: str, now_ms: list[int] | None = None) -> FlaskClient:
    clock = (lambda: now_ms[0]) if now_ms else (lambda: NOW_MS)
    lag = LagReading({"clicks": 0, "impressions": 0}, True, NOW_MS)  # Kafka's own figures: test_web_health_lag
    client = create_app(seeded.settings, clock=clock, cache_s=0, kafka_lag=lambda: lag).test_client()
    assert login(client, who).status_code == 302
    return client


def beat(seeded: Seeded, at_ms: int) -> None:
    seeded.client.set(RedisKeys(seeded.settings.redis_prefix).heartbeat("billing"), str(at_ms))


@pytest.mark.parametrize(
    "age_s, level, words",
    [
        (5, "ok", "Data last billed at"),
        (90, "amber", "Delayed"),
        (400, "red", "Stale"),
        (None, "unknown", "not reported"),
    ],
)
def test_every_live_page_says_when_the_data_was_last_billed(
    seeded: Seeded, age_s: int | None, level: str, words: str
) -> None:
    """The job's heartbeat, not the page's fetch, decides: a stalled job turns the banner amber, then red."""
    if age_s is not None:
        beat(seeded, NOW_MS - age_s * 1000)
    ids = next(a for a in seeded.catalog if a.advertiser_id == OWN)
    alice, fiona, ada = (client_of(seeded, who) for who in ("alice", "fiona", "ada"))
    pages = [
        (alice, f"/advertisers/{OWN}"),
        (alice, f"/advertisers/{OWN}/campaigns/{ids.campaign_id}"),
        (alice, f"/advertisers/{OWN}/ads/{ids.ad_id}"),
        (fiona, "/finance"),
        (ada, "/health"),
    ]
    for client, url in pages:
        page = client.get(url)
        assert page.status_code == 200, url
        match = re.search(
            r'id="freshness" class="freshness (\w+)"[^>]*>\s*<span class="freshness-text">([^<]*)', page.text
        )
        assert match and match.group(1) == level and words in match.group(2), (url, match and match.groups())
    document = alice.get(f"/api/v1/advertisers/{OWN}/dashboard").json
    assert document["freshness"]["level"] == level
    assert document["freshness"]["last_batch_ms"] == (None if age_s is None else NOW_MS - age_s * 1000)


def test_the_health_page_sums_up_the_job_kafka_redis_and_reconciliation(seeded: Seeded) -> None:
    ada = client_of(seeded, "ada")
    beat(seeded, NOW_MS - 2_000)
    # Its last batch two seconds ago, its watermark its delay and two seconds behind the clock.
    seeded.writer.health({**health_record("billing", 70, NOW_MS - 2_000), "watermark_ms": NOW_MS - 12_000})
    status = ada.get("/api/v1/health").json["status"]
    levels = {c["name"]: c["level"] for c in status["components"]}
    # The sample's last reconciliation finished long before NOW_MS: amber; the rest is fine, the catalog's database
    # answering at the catalog's version.
    assert levels == {
        "Streaming job": "ok",
        "Kafka": "ok",
        "Redis": "ok",
        "Catalog database": "ok",
        "Reconciliation": "amber",
    }
    database = next(c for c in status["components"] if c["name"] == "Catalog database")
    assert database["text"] == "Answering: catalog version 0."
    assert status["overall"] == "amber"
    beat(seeded, NOW_MS - 600_000)  # the job stalled 10 min ago
    page = ada.get("/health").text
    assert 'id="overall-status" data-level="red"' in page and "Stale" in page
    RedisFigures(seeded.client, seeded.settings.redis_prefix).record_audit(
        {"ran_at_ms": NOW_MS, "periods": 6, "differences": ["20260101T0100Z"]}
    )
    levels = {c["name"]: c["level"] for c in ada.get("/api/v1/health").json["status"]["components"]}
    assert levels["Reconciliation"] == "red"
    # The job waits for disk space: its silence is explained, in its own words, not called stale.
    PartStatus(seeded.settings.redis_url, seeded.settings.redis_prefix, STREAM_PART)(
        "waiting for disk space in /data: writing batch 7 failed (No space left on device); trying again"
    )
    components = {c["name"]: c for c in ada.get("/api/v1/health").json["status"]["components"]}
    assert components["Streaming job"]["level"] == "red"
    assert components["Streaming job"]["text"].startswith("Waiting for disk space for "), components
    assert "writing batch 7 failed" in components["Streaming job"]["text"]
    PartStatus(seeded.settings.redis_url, seeded.settings.redis_prefix, STREAM_PART)(None)
    components = {c["name"]: c for c in ada.get("/api/v1/health").json["status"]["components"]}
    assert "Stale" in components["Streaming job"]["text"]


def test_an_hour_without_data_is_zero_spend_and_a_malformed_period_is_400(seeded: Seeded) -> None:
    alice, fiona = client_of(seeded, "alice"), client_of(seeded, "fiona")
    campaign = next(a for a in seeded.catalog if a.advertiser_id == OWN).campaign_id
    empty = "20251231T2300Z"  # before the sample's first hour
    doc = alice.get(f"/api/v1/advertisers/{OWN}/dashboard?period={empty}").json
    assert doc["period"] == {"period": empty, "start_ms": 1_767_222_000_000, "closed": False, "future": False}
    assert doc["totals"]["corrected"] == {"clicks": 0, "micros": "0"}
    page = alice.get(f"/advertisers/{OWN}?period={empty}")
    assert page.status_code == 200 and 'id="corrected-spend">0.00 EUR<' in page.text
    assert alice.get(f"/api/v1/advertisers/{OWN}/campaigns/{campaign}?period={empty}").status_code == 200
    assert fiona.get(f"/api/v1/finance?period={empty}").json["advertisers"] == []
    for bad in ("2026-01-01", "20260101T0030Z", "20261301T0000Z", "../x", "20260101t0000z"):
        for client, url in (
            (alice, f"/advertisers/{OWN}?period={bad}"),
            (alice, f"/api/v1/advertisers/{OWN}/dashboard?period={bad}"),
            (alice, f"/advertisers/{OWN}/campaigns/{campaign}?period={bad}"),
            (fiona, f"/finance?period={bad}"),
            (fiona, f"/api/v1/finance?period={bad}"),
        ):
            assert client.get(url).status_code == 400, url
    assert (
        "period is the key of a billing period"
        in alice.get(f"/api/v1/advertisers/{OWN}/dashboard?period=x").json["error"]
    )


def test_the_dashboards_corrections_follow_the_selected_period_and_explain_their_reason(seeded: Seeded) -> None:
    alice = client_of(seeded, "alice")
    everything = alice.get(f"/api/v1/advertisers/{OWN}/corrections?limit=500").json["corrections"]
    period = everything[-1]["corrects_period"]  # the oldest corrected period
    page = alice.get(f"/advertisers/{OWN}?period={period}").text
    table = page[page.index('id="corrections"') :]
    listed = re.findall(r'/corrections/([^"]+)"', table)
    expected = [c["correction_id"] for c in everything if period in (c["corrects_period"], c["booked_period"])]
    assert listed == expected[:10] and listed, "only the selected period's corrections, newest first"
    assert f"Corrections of {display.period_label(period)}" in page
    for reason in {c["reason"] for c in everything if c["correction_id"] in listed}:
        assert f'title="{REASONS[reason].explanation}">{REASONS[reason].label}<' in page.replace("&#39;", "'")
    live = alice.get(f"/advertisers/{OWN}").text
    assert "Latest corrections, all periods" in live
    one = everything[0]
    detail = alice.get(f"/advertisers/{OWN}/corrections/{one['correction_id']}").text.replace("&#39;", "'")
    assert REASONS[one["reason"]].explanation in detail
    assert 'id="reasons"' in alice.get(f"/advertisers/{OWN}/corrections").text


def test_ad_and_campaign_pages_show_the_price_per_click(seeded: Seeded) -> None:
    alice = client_of(seeded, "alice")
    ad = next(a for a in seeded.catalog if a.advertiser_id == OWN)
    page = alice.get(f"/advertisers/{OWN}/ads/{ad.ad_id}").text
    assert f"Price per click: <strong>{display.money(ad.cpc_micros, 'EUR')}</strong>" in page
    assert alice.get(f"/api/v1/advertisers/{OWN}/ads/{ad.ad_id}").json["price_per_click_micros"] == str(ad.cpc_micros)
    campaign = alice.get(f"/advertisers/{OWN}/campaigns/{ad.campaign_id}").text
    assert display.money(ad.cpc_micros, "EUR") in campaign


def test_labels_say_their_scope_and_the_chart_legend_names_every_mark(seeded: Seeded) -> None:
    page = client_of(seeded, "alice").get(f"/advertisers/{OWN}").text
    assert "<caption>Late, clock-ahead and unbilled events, this period</caption>" in page
    assert "<caption>Quarantined events, all time</caption>" in page
    legend = page[page.index('id="chart-legend"') :].split("</figcaption>")[0]
    for mark in ("closed period", "open period", "provisional spend"):
        assert mark in legend


def test_date_ranges_give_day_and_month_totals_equal_to_redis_and_bad_ranges_400(seeded: Seeded) -> None:
    alice = client_of(seeded, "alice")
    totals = RedisFigures(seeded.client, seeded.settings.redis_prefix)
    want_clicks = want_micros = 0
    for period in totals.periods():
        provisional = totals.advertiser(period, OWN)
        fix = seeded.client.hmget(totals.keys.corrections(period, "adv", OWN), "clicks", "micros")
        want_clicks += provisional.clicks + int(fix[0] or 0)
        want_micros += provisional.micros + int(fix[1] or 0)
    doc = alice.get(f"/api/v1/advertisers/{OWN}/dashboard?from=2026-01-01&to=2026-01-01").json
    assert doc["range"]["from"] == doc["range"]["to"] == "2026-01-01" and doc["range"]["preset"] is None
    assert [d["key"] for d in doc["days"]] == ["2026-01-01"] and [m["key"] for m in doc["months"]] == ["2026-01"]
    day, month = doc["days"][0], doc["months"][0]
    assert day["corrected"] == month["corrected"] == doc["range_total"]["corrected"]
    assert day["corrected"] == {"clicks": want_clicks, "micros": str(want_micros)}
    assert (day["periods"], day["open_periods"], day["closed"]) == (6, 2, False), "two open hours: provisional"
    page = alice.get(f"/advertisers/{OWN}?from=2026-01-01&to=2026-01-01").text
    assert (
        f'id="range-spend" data-k="range_total.corrected.micros" data-f="money">{display.money(want_micros, "EUR")}<'
        in page
    )
    # Presets follow the app's clock (NOW_MS is 2026-01-01): today and month to date hold the sample; last month not.
    for preset, clicks in (
        ("today", want_clicks),
        ("month-to-date", want_clicks),
        ("last-7-days", want_clicks),
        ("last-month", 0),
    ):
        got = alice.get(f"/api/v1/advertisers/{OWN}/dashboard?range={preset}").json
        assert got["range"]["preset"] == preset and got["range_total"]["corrected"]["clicks"] == clicks, preset
    assert alice.get(f"/api/v1/advertisers/{OWN}/dashboard").json["range"]["preset"] == "month-to-date"
    ad = next(a for a in seeded.catalog if a.advertiser_id == OWN)
    for url in (f"/api/v1/advertisers/{OWN}/ads/{ad.ad_id}", f"/api/v1/advertisers/{OWN}/campaigns/{ad.campaign_id}"):
        got = alice.get(f"{url}?from=2026-01-01&to=2026-01-31").json
        want = sum(int(b["corrected"]["micros"]) for b in got["series"])
        assert got["range_total"]["corrected"]["micros"] == str(want), url
    for bad in ("from=2026-13-01", "from=yesterday", "from=2026-01-02&to=2026-01-01", "range=fortnight",
                "from=2020-01-01&to=2026-01-01", "to=2026-1-1"):  # fmt: skip
        for url in (f"/api/v1/advertisers/{OWN}/dashboard?{bad}", f"/advertisers/{OWN}?{bad}",
                    f"/api/v1/advertisers/{OWN}/ads/{ad.ad_id}?{bad}"):  # fmt: skip
            assert alice.get(url).status_code == 400, url


def test_finance_shows_a_total_row_amounts_per_period_and_why_a_period_is_held(seeded: Seeded) -> None:
    fiona = client_of(seeded, "fiona")
    totals = RedisFigures(seeded.client, seeded.settings.redis_prefix)
    periods = totals.periods()
    held = {periods[-1]: "held: the streaming job is 1.2 M record(s) behind"}
    totals.record_reconciliation({"run_id": "r9", "finished_at_ms": NOW_MS, "periods": [], "closed": [], "held": held})

    currency_of = {a.advertiser_id: a.currency for a in seeded.catalog}

    def corrected(period: str) -> dict[str, int]:
        """Every advertiser's corrected micros in the period, added up per currency."""
        out: dict[str, int] = {}
        for advertiser, currency in currency_of.items():
            fix = seeded.client.hmget(totals.keys.corrections(period, "adv", advertiser), "micros")
            micros = totals.advertiser(period, advertiser).micros + int(fix[0] or 0)
            out[currency] = out.get(currency, 0) + micros
        return {c: m for c, m in sorted(out.items()) if m}

    doc = fiona.get("/api/v1/finance").json
    listed = doc["advertisers"]
    currencies = sorted({a["currency"] for a in listed})
    assert len(currencies) > 1, "the sample's advertisers bill in several currencies"
    assert [{k: v for k, v in t.items() if k != "not_charged"} for t in doc["totals"]] == [
        {
            "currency": c,
            **{
                part: {
                    "clicks": sum(a[part]["clicks"] for a in listed if a["currency"] == c),
                    "micros": str(sum(int(a[part]["micros"]) for a in listed if a["currency"] == c)),
                }
                for part in ("provisional", "corrections", "corrected")
            },
        }
        for c in currencies
    ]
    assert {t["currency"]: int(t["corrected"]["micros"]) for t in doc["totals"]} == corrected(periods[-1])
    recent = {p["period"]: p for p in doc["recent_periods"]}
    assert [p["period"] for p in doc["recent_periods"]] == list(reversed(periods)), "newest first"
    for period in periods:
        shown = {t["currency"]: int(t["corrected"]["micros"]) for t in recent[period]["totals"]}
        assert {c: m for c, m in shown.items() if m} == corrected(period), period
    assert recent[periods[-1]]["held"] == held[periods[-1]] and recent[periods[0]]["held"] is None
    page = fiona.get("/finance").text
    for currency, micros in corrected(periods[-1]).items():
        total_row = page[page.index(f'<tr class="total" data-currency="{currency}"') :].split("</tr>")[0]
        assert display.money(micros, currency) in total_row
    row = page[page.index(f'<tbody data-period="{periods[-1]}">') :].split("</tbody>")[0]
    assert "1.2 M record(s) behind" in row and 'class="badge held"' in row
    assert all(display.money(m, c) in row for c, m in corrected(periods[-1]).items())


def advertiser_corrected(seeded: Seeded, period: str, advertiser: str) -> tuple[int, int]:
    totals = RedisFigures(seeded.client, seeded.settings.redis_prefix)
    provisional = totals.advertiser(period, advertiser)
    fix = seeded.client.hmget(totals.keys.corrections(period, "adv", advertiser), "clicks", "micros")
    return provisional.clicks + int(fix[0] or 0), provisional.micros + int(fix[1] or 0)


def test_the_statement_is_the_exports_plus_adjustments_and_the_open_remainder_as_page_csv_and_pdf(
    seeded: Seeded, tmp_path: Path
) -> None:
    import pyarrow.parquet as pq

    alice = client_of(seeded, "alice")
    exports = seeded.settings.root / "exports"
    totals = RedisFigures(seeded.client, seeded.settings.redis_prefix)
    closed_from_exports = adjustments = provisional = closed_from_redis = 0
    closed_keys = set(seeded.client.zrange(totals.keys.closed_periods(), 0, -1))
    for period in totals.periods():
        folder = exports / period
        if (folder / "manifest.json").is_file():
            rows = [r for r in pq.read_table(folder / "billing.parquet").to_pylist() if r["advertiser_id"] == OWN]
            closed_from_exports += sum(r["net_micros"] for r in rows if r["record_type"] == "click")
            adjustments += sum(r["net_micros"] for r in rows if r["record_type"] == "adjustment")
            # The reconciliation run sets Redis to the export's figures: both agree.
            assert advertiser_corrected(seeded, period, OWN)[1] == sum(r["net_micros"] for r in rows)
        elif period in closed_keys:
            closed_from_redis += advertiser_corrected(seeded, period, OWN)[1]
        else:
            provisional += advertiser_corrected(seeded, period, OWN)[1]
    assert closed_from_exports and provisional
    total = closed_from_exports + closed_from_redis + adjustments + provisional

    page = alice.get(f"/advertisers/{OWN}/statements/2026-01").text
    assert f'id="statement-total">{display.money(total, "EUR")}<' in page
    assert f'id="provisional">{display.money(provisional, "EUR")}<' in page
    assert f'id="closed-charges">{display.money(closed_from_exports + closed_from_redis, "EUR")}<' in page
    assert "provisional" in page

    csv_response = alice.get(f"/advertisers/{OWN}/statements/2026-01/statement.csv")
    assert csv_response.headers["Content-Disposition"].startswith("attachment")
    rows = list(csv.DictReader(io.StringIO(csv_response.text)))
    total_row = rows[-1]
    assert total_row["period"] == "TOTAL" and int(total_row["total_micros"]) == total
    assert total_row["total"] == format_amount(total, "EUR") and total_row["status"] == "provisional"
    assert sum(int(r["total_micros"]) for r in rows[:-1]) == total
    assert {r["status"] for r in rows[:-1]} == {"closed", "closed (export not on file)", "provisional"}

    pdf = alice.get(f"/advertisers/{OWN}/statements/2026-01/statement.pdf")
    assert pdf.mimetype == "application/pdf" and pdf.data.startswith(b"%PDF")
    path = tmp_path / "statement.pdf"
    path.write_bytes(pdf.data)
    try:
        tool = deps.ensure_pdftoppm()
    except deps.DependencyError as exc:
        pytest.skip(str(exc))
    text = subprocess.run(
        [str(Path(tool).with_name("pdftotext")), "-layout", str(path), "-"], capture_output=True, text=True, check=True
    ).stdout
    assert f"Total (provisional) {display.money(total, 'EUR')}" in " ".join(text.split())
    subprocess.run([tool, "-png", "-r", "80", str(path), str(tmp_path / "statement")], check=True)
    pngs = sorted(tmp_path.glob("statement*.png"))
    assert pngs and pngs[0].stat().st_size > 10_000
    screens = web_screens_dir()
    shutil.copy(pngs[0], screens / "statement-pdf-page-1.png")


def test_charges_csv_and_finances_month_are_redis_and_the_exports(seeded: Seeded) -> None:
    alice, fiona = client_of(seeded, "alice"), client_of(seeded, "fiona")
    totals = RedisFigures(seeded.client, seeded.settings.redis_prefix)
    response = alice.get(f"/advertisers/{OWN}/charges.csv?from=2026-01-01&to=2026-01-01")
    assert response.headers["Content-Disposition"] == (
        f'attachment; filename="adbill-charges-{OWN}-2026-01-01-2026-01-01.csv"'
    )
    rows = list(csv.DictReader(io.StringIO(response.text)))
    assert {r["advertiser_id"] for r in rows} == {OWN}
    for period in totals.periods():
        mine = [r for r in rows if r["period"] == period]
        clicks, micros = advertiser_corrected(seeded, period, OWN)
        assert sum(int(r["amount_micros"]) for r in mine) == micros, period
        assert sum(int(r["clicks"]) for r in mine) == clicks, period
    for r in rows:
        assert r["amount"] == format_amount(int(r["amount_micros"]), r["currency"])
        assert int(r["provisional_micros"]) + int(r["corrections_micros"]) == int(r["amount_micros"])
    assert alice.get(f"/advertisers/{OWN}/charges.csv?from=2026-01-02&to=2026-01-01").status_code == 400

    month = fiona.get("/finance/months/2026-01/billing.csv")
    assert month.status_code == 200
    lines = list(csv.DictReader(io.StringIO(month.text)))
    manifests = [json.loads(p.read_text()) for p in sorted((seeded.settings.root / "exports").glob("*/manifest.json"))]
    assert len(lines) == sum(m["rows"] for m in manifests)
    by_currency: dict[str, int] = {}
    for r in lines:
        by_currency[r["currency"]] = by_currency.get(r["currency"], 0) + int(r["net_micros"])
    exported: dict[str, int] = {}
    for m in manifests:
        for currency, micros in m["total_micros_by_currency"].items():
            exported[currency] = exported.get(currency, 0) + micros
    assert by_currency == exported and len(exported) > 1
    assert all(r["net_amount"] == format_amount(int(r["net_micros"]), r["currency"]) for r in lines)
    assert fiona.get("/finance/months/2025-12/billing.csv").status_code == 404
    assert fiona.get("/finance/months/2026-13/billing.csv").status_code == 400
    assert alice.get("/finance/months/2026-01/billing.csv").status_code == 404


def test_csv_cells_never_start_a_formula() -> None:
    from web.statements import safe_cell

    assert [safe_cell(t) for t in ("=1+1", "+a", "-x", "@SUM", "adv-1", "")] == [
        "'=1+1",
        "'+a",
        "'-x",
        "'@SUM",
        "adv-1",
        "",
    ]


def test_an_adjustment_booked_in_a_later_closed_period_shows_on_the_statement(seeded: Seeded) -> None:
    """Finance was given the adjustment in the export of the period it is booked in: the statement counts it
    there, as an adjustment, beside the period's own clicks (none here)."""
    alice = client_of(seeded, "alice")
    before = list(csv.DictReader(io.StringIO(alice.get(f"/advertisers/{OWN}/statements/2026-01/statement.csv").text)))
    ad = next(a for a in seeded.catalog if a.advertiser_id == OWN)
    booked, start = "20260102T0000Z", 1_767_312_000_000
    row = {
        "record_type": "adjustment", "click_id": "click-late-retracted", "impression_id": None, "ad_id": ad.ad_id,
        "campaign_id": ad.campaign_id, "advertiser_id": OWN, "user_id": None, "click_time": None,
        "impression_time": None, "amount_micros": ad.cpc_micros, "net_micros": -ad.cpc_micros, "currency": "EUR",
        "status": "retracted", "reason": "duplicate", "correction_id": "adj-1", "corrects_period": "20260101T0200Z",
        "booked_period": booked,
    }  # fmt: skip
    seeded.writer.close(booked, start)
    seeded.writer.export(booked, start, start + 3_600_000, start + 7_200_000, [row])
    after = list(csv.DictReader(io.StringIO(alice.get(f"/advertisers/{OWN}/statements/2026-01/statement.csv").text)))
    adjusted = next(r for r in after if r["period"] == booked)
    assert (adjusted["status"], adjusted["charges_micros"], adjusted["adjustments_micros"]) == (
        "closed", "0", str(-ad.cpc_micros)
    )  # fmt: skip
    assert int(after[-1]["total_micros"]) == int(before[-1]["total_micros"]) - ad.cpc_micros
    assert int(after[-1]["adjustments_micros"]) == -ad.cpc_micros
    page = alice.get(f"/advertisers/{OWN}/statements/2026-01").text
    assert f'id="adjustments">{display.signed_money(-ad.cpc_micros, "EUR")}<' in page


def test_figures_over_several_advertisers_total_per_currency_and_each_advertiser_keeps_its_own(
    seeded: Seeded, tmp_path: Path
) -> None:
    """An advertiser bills in one currency: its statements and downloads carry it, an admin cannot give it an ad in
    another; finance's totals, per period too, and the last reconciliation's net are one figure per currency."""
    currency_of = {ad.advertiser_id: ad.currency for ad in seeded.catalog}
    assert len(set(currency_of.values())) >= 3, "the seeded advertisers bill in several currencies"
    fiona, ada = client_of(seeded, "fiona"), client_of(seeded, "ada")

    # An ad in another currency than its advertiser's is refused through the admin's API, with the catalog's line.
    token = ada.get("/catalog").text
    refused = ada.post(
        "/api/v1/catalog/ads",
        json={"ad_id": "yen-ad", "campaign_id": f"{OWN}-cmp-000", "advertiser_id": OWN, "currency": "JPY",
              "cpc_micros": 5_000_000},
        headers={"X-CSRF-Token": re.search(r'name="csrf_token" value="([^"]+)"', token).group(1)},  # type: ignore[union-attr]
    )  # fmt: skip
    assert refused.status_code == 400 and f"advertiser {OWN} bills in {currency_of[OWN]}" in refused.json["error"]

    # Each advertiser's statement (page, CSV, PDF) and charges carry its currency on every row.
    for advertiser, currency in sorted(currency_of.items()):
        rows = list(
            csv.DictReader(io.StringIO(fiona.get(f"/advertisers/{advertiser}/statements/2026-01/statement.csv").text))
        )
        assert rows and {r["currency"] for r in rows} == {currency}, (advertiser, rows[-1])
        total = int(rows[-1]["total_micros"])
        page = fiona.get(f"/advertisers/{advertiser}/statements/2026-01").text
        assert f'id="statement-total">{display.money(total, currency)}<' in page
        charges = list(
            csv.DictReader(io.StringIO(fiona.get(f"/advertisers/{advertiser}/charges.csv?range=month-to-date").text))
        )
        assert {r["currency"] for r in charges} <= {currency}

    # Finance: one total per currency, each the sum of that currency's advertisers, never two currencies added.
    doc = fiona.get("/api/v1/finance").json
    by_currency: dict[str, int] = {}
    for line in doc["advertisers"]:
        assert line["currency"] == currency_of[line["advertiser_id"]]
        by_currency[line["currency"]] = by_currency.get(line["currency"], 0) + int(line["corrected"]["micros"])
    assert {t["currency"]: int(t["corrected"]["micros"]) for t in doc["totals"]} == by_currency
    assert len(by_currency) >= 3
    for recent in doc["recent_periods"]:
        assert "" not in {t["currency"] for t in recent["totals"]}
    page = fiona.get("/finance").text
    total_rows = re.findall(r'<tr class="total" data-currency="(\w*)">(.*?)</tr>', page, re.S)
    assert [c for c, _ in total_rows] == sorted(by_currency)
    for currency, row in total_rows:
        assert display.money(by_currency[currency], currency) in row

    # The last reconciliation's net, per currency on the health page and in its document.
    totals = RedisFigures(seeded.client, seeded.settings.redis_prefix)
    net = {"EUR": 1_250_000, "JPY": -40_000_000}
    totals.record_reconciliation(
        {"run_id": "r9", "started_at_ms": NOW_MS, "finished_at_ms": NOW_MS, "net_micros_by_currency": net}
    )
    health = ada.get("/health").text
    shown = health[health.index('id="reconcile-net"') :].split("</td>")[0]
    assert display.signed_money(1_250_000, "EUR") in shown and display.signed_money(-40_000_000, "JPY") in shown
    assert "several currencies" not in shown
    document = ada.get("/api/v1/health").json["last_reconciliation"]
    assert {c: int(m) for c, m in document["net_micros_by_currency"].items()} == net
