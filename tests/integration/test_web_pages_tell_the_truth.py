"""Pages that say what is true, over real Redis and the sample: one count on one page, the future not shown as
real, a bad date range kept beside its form, prices typed in currency units stored exactly, finance's month per
advertiser, the ad's and campaign's own charges, and the small things a walk-through found."""

from __future__ import annotations

import csv
import io
import re

import pytest
from flask.testing import FlaskClient

from billing.catalog import AdChange
from billing.money import format_amount
from billing.store.redis_totals import UnbilledCount
from ops.settings import Settings
from tests.catalog_rows import catalog_rows
from tests.invoice_month import write_closed_month
from tests.redis_figures import RedisFigures
from tests.web_support import OTHER, OWN, Seeded, client_at, form_token, seed
from web import display

pytestmark = pytest.mark.integration

NOW_MS = 1_767_250_000_000  # 2026-01-01T06:46:40Z, just after the sample's six hours


@pytest.fixture
def seeded(redis_settings: Settings) -> Seeded:
    return seed(redis_settings)


def client_of(seeded: Seeded, who: str, now_ms: int = NOW_MS) -> FlaskClient:
    return client_at(seeded, who, now_ms)


def test_the_unbilled_clicks_of_a_period_are_the_sum_of_its_ads(seeded: Seeded) -> None:
    """Clicks on an ad the catalog did not know yet count under the ad alone (the stream could not tell whose it
    was); once an admin creates the ad, the advertiser's box, its ads table and the API say the same number."""
    totals = RedisFigures(seeded.client, seeded.settings.redis_prefix)
    latest = totals.periods()[-1]
    start = int(seeded.client.zscore(totals.keys.periods(), latest) or 0)
    campaign = next(a for a in seeded.catalog if a.advertiser_id == OWN).campaign_id
    batch = (totals.last_applied("billing") or 0) + 1
    totals.apply_batch(
        "billing",
        batch,
        [],
        unbilled=[
            UnbilledCount(latest, start, "", "admin-ad-1", "unknown_ad", 24),
            UnbilledCount(latest, start, "", "admin-ad-2", "unknown_ad", 36),
            UnbilledCount(latest, start, "", "nobody-s-ad", "unknown_ad", 7),  # still unknown: the health page's
        ],
    )
    store = seeded.settings.catalog_store()
    for ad_id in ("admin-ad-1", "admin-ad-2"):
        store.change(AdChange(ad_id, 0, 250_000, campaign, OWN, "EUR"), backfill=True)
    alice = client_of(seeded, "alice")
    doc = alice.get(f"/api/v1/advertisers/{OWN}/dashboard?period={latest}").json
    per_ad = sum(a["unbilled_unknown_ad"] for a in doc["ads"])
    assert doc["unbilled"]["unbilled_unknown_ad"] == per_ad >= 60
    series = {p["period"]: p["unbilled_unknown_ad"] for p in doc["series"]}
    assert series[latest] == per_ad
    page = alice.get(f"/advertisers/{OWN}?period={latest}").text
    assert f'id="unbilled-unknown-ad">{per_ad}<' in page
    assert "nobody-s-ad" not in page


def test_the_future_is_not_shown_as_real(seeded: Seeded) -> None:
    alice = client_of(seeded, "alice")
    # A month that has not begun has no statement; the month now running is provisional however its hours stand.
    future = alice.get(f"/advertisers/{OWN}/statements/2030-01")
    assert future.status_code == 404 and "2030-01 has not begun" in future.text
    assert alice.get(f"/advertisers/{OWN}/statements/2030-01/statement.pdf").status_code == 404
    current = alice.get(f"/advertisers/{OWN}/statements/2026-01").text
    assert 'id="statement-status">provisional<' in current and "the month is not over" in current
    rows = list(csv.DictReader(io.StringIO(alice.get(f"/advertisers/{OWN}/statements/2026-01/statement.csv").text)))
    assert rows[-1]["period"] == "TOTAL" and rows[-1]["status"] == "provisional"
    # An hour in the future: "not begun", never "open", and the picker shows it selected.
    page = alice.get(f"/advertisers/{OWN}?period=20991231T2300Z").text
    assert 'class="badge future"' in page and "not begun" in page
    assert re.search(r'<option value="20991231T2300Z" selected>2099-12-31 23:00 UTC \(not begun\)</option>', page)
    doc = alice.get(f"/api/v1/advertisers/{OWN}/dashboard?period=20991231T2300Z").json
    assert doc["period"] == {"period": "20991231T2300Z", "start_ms": 4_102_441_200_000, "closed": False, "future": True}


def test_a_bad_date_range_is_shown_beside_the_form_with_what_was_typed(seeded: Seeded) -> None:
    alice = client_of(seeded, "alice")
    ad = next(a for a in seeded.catalog if a.advertiser_id == OWN)
    for url in (
        f"/advertisers/{OWN}",
        f"/advertisers/{OWN}/campaigns/{ad.campaign_id}",
        f"/advertisers/{OWN}/ads/{ad.ad_id}",
        "/finance",
    ):
        client = alice if url != "/finance" else client_of(seeded, "fiona")
        page = client.get(f"{url}?from=2026-01-31&to=2026-01-01")
        assert page.status_code == 400, url
        text = page.text
        assert 'id="range-error"' in text, url
        assert "to is before from: a range ends on or after the day it starts" in text, url
        assert 'id="range-from" value="2026-01-31"' in text and 'id="range-to" value="2026-01-01"' in text, url
        assert 'id="range-form"' in text, "the page is all there"
    # The API keeps its plain 400; the page's live refresh asks it for the range shown, not the bad one.
    assert alice.get(f"/api/v1/advertisers/{OWN}/dashboard?from=2026-01-31&to=2026-01-01").status_code == 400
    page = alice.get(f"/advertisers/{OWN}?from=2026-01-31&to=2026-01-01").text
    assert "from=2026-01-31" not in page.split('data-api="')[1].split('"')[0]
    # The last 30 days.
    doc = alice.get(f"/api/v1/advertisers/{OWN}/dashboard?range=last-30-days").json
    assert doc["range"]["from"] == "2025-12-03" and doc["range"]["to"] == "2026-01-01"
    assert 'data-preset="last-30-days"' in alice.get(f"/advertisers/{OWN}").text


def test_a_price_typed_in_the_currency_is_stored_exactly_in_micros(seeded: Seeded) -> None:
    ada = client_of(seeded, "ada")
    ad = next(a for a in seeded.catalog if a.advertiser_id == OWN)
    token = form_token(ada.get(f"/catalog/ads/{ad.ad_id}").text)
    far = "2099-01-01T00:00"
    for typed, micros in (("0.50", 500_000), ("9000000000000.123456", 9_000_000_000_000_123_456), ("3", 3_000_000)):
        made = ada.post(
            f"/catalog/ads/{ad.ad_id}/changes",
            data={"csrf_token": token, "action": "set-price", "price": typed, "effective_from": far},
        )
        assert made.status_code == 303, made.text
        page = ada.get(made.headers["Location"]).text
        assert f'id="stored-micros">{display.count(micros)} micros<' in page, typed
        kept = seeded.settings.catalog_store().current()[ad.ad_id].prices[-1]
        assert kept.cpc_micros == micros
        far = far.replace("2099", str(int(far[:4]) + 1))
    before = catalog_rows(seeded.settings.database_url)
    for typed, word in (("0.1234567", "at most 6 decimals"), ("1,50", "at most 6 decimals"), ("-1", "negative")):
        refused = ada.post(
            f"/catalog/ads/{ad.ad_id}/changes",
            data={"csrf_token": token, "action": "set-price", "price": typed, "effective_from": "2150-01-01T00:00"},
        )
        assert refused.status_code == 400 and word in refused.text, typed
    assert catalog_rows(seeded.settings.database_url) == before
    # A daily budget in the currency too.
    made = ada.post(
        f"/catalog/campaigns/{ad.campaign_id}/budgets",
        data={"csrf_token": token, "daily_amount": "49.99", "effective_from": "2099-06-01T00:00"},
    )
    assert made.status_code == 303
    assert 'id="stored-micros">49,990,000 micros<' in ada.get(made.headers["Location"]).text
    form = ada.get(f"/catalog/ads/{ad.ad_id}").text
    assert 'name="price"' in form and "New price, EUR" in form and 'data-micros-preview="set-price-micros"' in form


def test_finance_sees_a_month_per_advertiser(seeded: Seeded) -> None:
    fiona = client_of(seeded, "fiona")
    totals = RedisFigures(seeded.client, seeded.settings.redis_prefix)
    want: dict[str, int] = {}
    for period in totals.periods():
        for advertiser in (OWN, OTHER):
            billed = totals.advertiser(period, advertiser)
            fix = seeded.client.hmget(totals.keys.corrections(period, "adv", advertiser), "clicks", "micros")
            want[advertiser] = want.get(advertiser, 0) + billed.micros + int(fix[1] or 0)  # type: ignore[index]
    doc = fiona.get("/api/v1/finance?range=month-to-date").json
    got = {a["advertiser_id"]: int(a["corrected"]["micros"]) for a in doc["range_advertisers"]}
    assert {a: got[a] for a in (OWN, OTHER)} == want
    assert doc["range"]["preset"] == "month-to-date" and doc["range_open_periods"] == 2 and not doc["range_closed"]
    assert "range" not in fiona.get("/api/v1/finance").json, "the range only when asked for"
    page = fiona.get("/finance?from=2026-01-01&to=2026-01-31").text
    assert 'id="range-advertisers"' in page and display.money(want[OWN], "EUR") in page
    assert 'id="month-advertisers-csv"' in page  # a whole month: its file per advertiser
    rows = list(csv.DictReader(io.StringIO(fiona.get("/finance/months/2026-01/advertisers.csv").text)))
    by = {r["advertiser_id"]: r for r in rows}
    assert int(by[OWN]["micros"]) == want[OWN] and by[OWN]["status"] == "provisional" and by[OWN]["currency"] == "EUR"
    assert by[OWN]["amount"] == format_amount(want[OWN], "EUR")  # the minor unit, finer only where needed
    # The month's clicks: times in UTC beside the epoch ms (December, closed on files, has them).
    write_closed_month(seeded.settings.layout, seeded.catalog, OWN, OTHER, seeded.settings.database_url)
    clicks = list(csv.DictReader(io.StringIO(fiona.get("/finance/months/2025-12/billing.csv").text)))
    first = next(r for r in clicks if r["record_type"] == "click")
    assert first["click_time_utc"] == "2025-12-31T22:00:00.000Z" and first["click_time"] == "1767218400000"
    assert next(r for r in clicks if r["record_type"] == "adjustment")["click_time_utc"] == ""
    # The audit says how it runs.
    assert "ADBILL_AUDIT_AFTER_CLOSE" in page or "adbill audit" in page


def test_the_ad_and_campaign_pages_offer_their_own_charges_and_the_history_link_opens_the_ad(seeded: Seeded) -> None:
    alice = client_of(seeded, "alice")
    ad = next(a for a in seeded.catalog if a.advertiser_id == OWN)
    page = alice.get(f"/advertisers/{OWN}/ads/{ad.ad_id}").text
    link = re.search(r'id="charges-csv" href="([^"]+)"', page)
    assert link and f"ad={ad.ad_id}" in link.group(1).replace("&amp;", "&") and "this ad&#39;s charges" in page
    rows = list(csv.DictReader(io.StringIO(alice.get(link.group(1).replace("&amp;", "&")).text)))
    assert rows and {r["ad_id"] for r in rows} == {ad.ad_id}
    campaign = alice.get(f"/advertisers/{OWN}/campaigns/{ad.campaign_id}").text
    link = re.search(r'id="charges-csv" href="([^"]+)"', campaign)
    assert link
    rows = list(csv.DictReader(io.StringIO(alice.get(link.group(1).replace("&amp;", "&")).text)))
    assert rows and {r["campaign_id"] for r in rows} == {ad.campaign_id}
    history = re.search(r'id="price-history-link"[^>]*|href="([^"]+)" id="price-history-link"', page)
    assert history and f"open={ad.ad_id}" in history.group(0)
    listed = alice.get(f"/advertisers/{OWN}/ads?open={ad.ad_id}").text
    assert f'id="history-{ad.ad_id}" open>' in listed
    others = [a for a in seeded.catalog if a.advertiser_id == OWN and a.ad_id != ad.ad_id]
    assert f'id="history-{others[0].ad_id}">' in listed, "only that one is opened"
    # Words, not "(s)".
    assert "period(s)" not in client_of(seeded, "fiona").get("/finance").text


def test_an_api_price_change_of_an_unknown_ad_is_404(seeded: Seeded) -> None:
    ada = client_of(seeded, "ada")
    token = form_token(ada.get("/catalog").text)
    response = ada.post(
        "/api/v1/catalog/ads/no-such-ad/prices", json={"cpc_micros": "5"}, headers={"X-CSRF-Token": token}
    )
    assert response.status_code == 404 and "unknown ad no-such-ad" in response.json["error"]


def test_campaigns_and_ads_have_names_an_admin_gives_them(seeded: Seeded) -> None:
    ada, alice = client_of(seeded, "ada"), client_of(seeded, "alice")
    ad = next(a for a in seeded.catalog if a.advertiser_id == OWN)
    token = form_token(ada.get(f"/catalog/ads/{ad.ad_id}").text)
    named = ada.post(f"/catalog/ads/{ad.ad_id}/name", data={"csrf_token": token, "name": "Winter  banner"})
    assert named.status_code == 303 and 'id="ad-name">Winter banner<' in ada.get(named.headers["Location"]).text
    assert (
        ada.post(
            f"/catalog/campaigns/{ad.campaign_id}/name", data={"csrf_token": token, "name": "Winter sale"}
        ).status_code
        == 303
    )
    assert ada.post(f"/catalog/ads/{ad.ad_id}/name", data={"csrf_token": token, "name": "x" * 121}).status_code == 400
    assert ada.post("/catalog/ads/no-such-ad/name", data={"csrf_token": token, "name": "x"}).status_code == 404
    assert alice.post(f"/catalog/ads/{ad.ad_id}/name", data={"csrf_token": token, "name": "mine"}).status_code in (
        400,
        404,
    )
    assert 'id="ad-name">· Winter banner<' in alice.get(f"/advertisers/{OWN}/ads/{ad.ad_id}").text
    assert 'id="campaign-name">· Winter sale<' in alice.get(f"/advertisers/{OWN}/campaigns/{ad.campaign_id}").text
    doc = alice.get(f"/api/v1/advertisers/{OWN}/dashboard").json
    assert {c["campaign_id"]: c["name"] for c in doc["campaigns"]}[ad.campaign_id] == "Winter sale"
    assert {a["ad_id"]: a["name"] for a in doc["ads"]}[ad.ad_id] == "Winter banner"
    # An invoice keeps the campaign's name it was issued with.
    from billing.invoices import Issuer
    from billing.store.invoice_files import ExportInvoiceSource

    layout = seeded.settings.layout
    write_closed_month(layout, seeded.catalog, OWN, OTHER, seeded.settings.database_url)
    names = seeded.settings.names_store().named("campaign")
    profiles = seeded.settings.profile_store().current()
    issuer = Issuer(
        seeded.settings.invoice_store(), ExportInvoiceSource(layout), profiles, lambda: NOW_MS, campaign_names=names
    )
    [own, _] = issuer.issue_month("2025-12")
    assert own.lines[0].campaign_name == "Winter sale"
    assert "Winter sale" in alice.get(f"/advertisers/{OWN}/invoices/2025-12").text
