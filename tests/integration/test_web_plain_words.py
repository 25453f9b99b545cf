"""What the pages say in words, over real Redis and the sample (`tests.web_support.seed`: six hourly periods from
2026-01-01 00:00 UTC, four closed): when a provisional figure becomes final, who made a change and through which door,
errors in the terms people typed, amounts in the currency's minor unit, and the health page's news."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
from decimal import Decimal
from html import unescape
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from billing.catalog import MadeBy
from billing.store.part_status import RECONCILE_RUN_PART
from billing.store.redis_keys import RedisKeys
from ops import deps
from ops.settings import PROJECT_ROOT, Settings
from producers.capture import parse_capture_line
from producers.publisher import apply_to_store
from tests.catalog_rows import catalog_rows
from tests.web_support import FIRST_PERIOD_MS, OWN, Seeded, client_at, form_token, plant_not_charged_click, seed
from web import display
from web.sample_data import health_record
from web.security import CSRF_HEADER

pytestmark = pytest.mark.integration

NOW_MS = 1_767_246_000_000  # 2026-01-01T05:40Z: the sample's last period (05:00) is open, its horizon not passed


@pytest.fixture
def seeded(redis_settings: Settings) -> Seeded:
    return seed(redis_settings)


def client_of(seeded: Seeded, who: str, now_ms: int = NOW_MS) -> FlaskClient:
    return client_at(seeded, who, now_ms)


def text_of(html: str) -> str:
    """The page's words, without its tags and with its white space folded."""
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


def test_the_dashboard_and_the_statement_say_when_a_provisional_figure_becomes_final(seeded: Seeded) -> None:
    """The live figure is the stream's; reconciliation corrects a period once, when it closes after its lateness
    horizon (`billing.reconcile_plan.plan_run`), not every five minutes."""
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


def test_budget_and_ip_exclusion_pages_say_who_made_a_change_as_the_change_log_does(seeded: Seeded) -> None:
    """A change the simulator made (its author in the change log only) reads the same on the campaign's budget page,
    the IP exclusion page, their API documents and `/catalog/changes`: who, and through which door."""
    campaign = next(a.campaign_id for a in seeded.catalog if a.advertiser_id == OWN)
    store = seeded.settings.catalog_store()
    simulator = MadeBy("root", "simulator")
    for line in (
        {"type": "budget", "campaign_id": campaign, "effective_from": NOW_MS + 1, "daily_budget_micros": 5_000_000},
        {"type": "ip_exclusion", "cidr": "203.0.113.0/24", "effective_from": NOW_MS + 60_000, "excluded": True},
    ):
        apply_to_store(store, parse_capture_line(json.dumps(line)), NOW_MS, simulator)  # type: ignore[arg-type]
    ada = client_of(seeded, "ada")
    log = ada.get("/api/v1/catalog/changes").json["changes"]
    made = {c["kind"]: (c["who"], c["door"]) for c in log if c["kind"] in ("set-budget", "exclude-ip")}
    assert made == {"set-budget": ("root", "simulator"), "exclude-ip": ("root", "simulator")}

    budget = ada.get(f"/catalog/campaigns/{campaign}").text
    row = budget.split('id="budget-history"')[1].split("</tr>")[1]
    assert '<td class="made-by">root</td><td class="door">simulator</td>' in row
    exclusions = ada.get("/catalog/ip-exclusions").text
    assert exclusions.count('<td class="made-by">root</td>') == 2, "planned and in the history"
    assert '<td class="made-by">root</td><td class="door">simulator</td>' in exclusions
    entry = ada.get(f"/api/v1/catalog/campaigns/{campaign}/budgets").json["history"][-1]
    assert (entry["made_by"], entry["door"]) == ("root", "simulator") and entry["made_at"] == NOW_MS
    ranges = ada.get("/api/v1/catalog/ip-exclusions").json["history"]
    assert [(e["made_by"], e["door"]) for e in ranges] == [("root", "simulator")]


def test_a_refusal_is_said_beside_its_field_in_the_terms_typed(seeded: Seeded) -> None:
    """A price or budget typed in the currency is refused in the currency as typed, never in micros; a past time in the
    pages' own format; a date range whose end comes before its start says so."""
    ada = client_of(seeded, "ada")
    ad = next(a for a in seeded.catalog if a.advertiser_id == OWN)
    token = form_token(ada.get(f"/catalog/ads/{ad.ad_id}").text)
    before = catalog_rows(seeded.settings.database_url)

    def refusal(url: str, fields: dict[str, str]) -> str:
        page = ada.post(url, data={"csrf_token": token, **fields})
        assert page.status_code == 400, page.text
        return page.text

    page = refusal(f"/catalog/ads/{ad.ad_id}/changes", {"action": "set-price", "price": "-1.00"})
    beside = page.split('id="set-price-amount"')[1].split("</label>")[0]
    assert (
        '<span class="error field-error" role="alert" id="catalog-error">a price must not be negative: you typed '
        "-1.00 EUR</span>" in beside
    )
    assert "1000000" not in text_of(page)
    page = refusal(f"/catalog/campaigns/{ad.campaign_id}/budgets", {"daily_amount": "-50"})
    beside = page.split('id="budget-amount"')[1].split("</label>")[0]
    assert "a daily budget must not be negative: you typed -50 EUR" in beside and "50000000" not in text_of(page)
    page = refusal(f"/catalog/ads/{ad.ad_id}/changes", {"action": "pause", "effective_from": "2026-01-01T05:00"})
    beside = page.split('id="pause-effective-from"')[1].split("</label>")[0]
    assert (
        "the effective time 2026-01-01 05:00:00 UTC is in the past (now is 2026-01-01 05:40:00 UTC): leave it empty "
        "for now, or give a later time" in beside
    )
    page = refusal("/catalog/ip-exclusions", {"cidr": "203.0.113.0/24", "action": "exclude", "effective_from": "x"})
    beside = page.split('id="exclusion-effective-from"')[1].split("</label>")[0]
    assert "a UTC time such as 2026-01-01 10:00, or empty for now: you typed x" in beside
    assert catalog_rows(seeded.settings.database_url) == before

    alice = client_of(seeded, "alice")
    ranged = text_of(alice.get(f"/advertisers/{OWN}?from=2026-01-31&to=2026-01-01").text)
    assert "to is before from: a range ends on or after the day it starts" in ranged
    assert "to is on or after from" not in ranged


def test_amounts_are_typed_and_written_in_the_currencys_minor_unit(seeded: Seeded) -> None:
    """JPY has no minor unit, KWD three decimals (ISO 4217, `billing.money.minor_digits`): the CSVs write amounts so,
    a JPY budget is whole yen on the form and the API, and the health page names no amount without its currency."""
    fiona = client_of(seeded, "fiona")
    places = {"adv-0000": 2, "adv-0001": 0, "adv-0002": 3}  # EUR, JPY, KWD
    for advertiser, digits in places.items():
        for url, column in (
            (f"/advertisers/{advertiser}/charges.csv?from=2026-01-01&to=2026-01-01", "amount"),
            (f"/advertisers/{advertiser}/statements/2026-01/statement.csv", "total"),
        ):
            rows = list(csv.DictReader(io.StringIO(fiona.get(url).text)))
            assert rows, url
            for row in rows:
                micros = int(row[f"{column}_micros"] if f"{column}_micros" in row else row["total_micros"])
                amount = row[column]
                decimals = len(amount.split(".")[1]) if "." in amount else 0
                # The minor unit, more only where the micros need it (prices per click may be finer).
                assert decimals == max(digits, len(f"{abs(micros) % 1_000_000:06d}".rstrip("0"))), (url, row)
                assert Decimal(amount) * 1_000_000 == micros, (url, row)
    month = list(csv.DictReader(io.StringIO(fiona.get("/finance/months/2026-01/advertisers.csv").text)))
    assert {r["advertiser_id"]: "." in r["amount"] for r in month}["adv-0001"] is False

    ada = client_of(seeded, "ada")
    jpy_campaign = next(a.campaign_id for a in seeded.catalog if a.currency == "JPY")
    token = form_token(ada.get(f"/catalog/campaigns/{jpy_campaign}").text)
    before = catalog_rows(seeded.settings.database_url)
    page = ada.post(f"/catalog/campaigns/{jpy_campaign}/budgets", data={"csrf_token": token, "daily_amount": "1000.5"})
    assert page.status_code == 400
    assert (
        "a daily budget is an amount in JPY such as 50, in whole JPY (it has no minor unit): you typed 1000.5 JPY"
        in (page.text.split('id="budget-amount"')[1].split("</label>")[0])
    )
    answer = ada.post(
        f"/api/v1/catalog/campaigns/{jpy_campaign}/budgets",
        json={"daily_budget_micros": 1_000_500_000},
        headers={CSRF_HEADER: token},
    )
    assert answer.status_code == 400
    assert "in whole JPY" in answer.json["error"] and "multiple of 1,000,000" in answer.json["error"]
    assert catalog_rows(seeded.settings.database_url) == before
    made = ada.post(f"/catalog/campaigns/{jpy_campaign}/budgets", data={"csrf_token": token, "daily_amount": "1000"})
    assert made.status_code == 303
    # A KWD budget to the fils, and a EUR price finer than the cent: both kept exactly.
    kwd_campaign = next(a.campaign_id for a in seeded.catalog if a.currency == "KWD")
    made = ada.post(f"/catalog/campaigns/{kwd_campaign}/budgets", data={"csrf_token": token, "daily_amount": "12.345"})
    assert made.status_code == 303
    eur_ad = next(a.ad_id for a in seeded.catalog if a.currency == "EUR")
    made = ada.post(
        f"/catalog/ads/{eur_ad}/changes", data={"csrf_token": token, "action": "set-price", "price": "0.0035"}
    )
    assert made.status_code == 303

    # A run that booked nothing: its net is said in words, not as an amount without a currency.
    seeded.writer.reconciliation(
        {"run_id": "nothing", "started_at_ms": NOW_MS - 60_000, "finished_at_ms": NOW_MS - 30_000,
         "duration_ms": 30_000, "periods": [], "closed": [], "additions": 0, "retractions": 0,
         "net_micros_by_currency": {}}
    )  # fmt: skip
    net = ada.get("/health").text.split('id="reconcile-net">')[1].split("</td>")[0]
    assert text_of(net) == "nothing booked"


def test_a_not_charged_clicks_story_never_calls_it_billed_and_says_times_as_the_pages_do(seeded: Seeded) -> None:
    campaign = next(a.campaign_id for a in seeded.catalog if a.advertiser_id == OWN)
    store = seeded.settings.catalog_store()
    budget = {
        "type": "budget",
        "campaign_id": campaign,
        "effective_from": FIRST_PERIOD_MS,
        "daily_budget_micros": 10_000,
    }
    apply_to_store(store, parse_capture_line(json.dumps(budget)), NOW_MS - 120_000, MadeBy("root", "simulator"))  # type: ignore[arg-type]
    click_id = plant_not_charged_click(seeded, FIRST_PERIOD_MS + 5 * 3_600_000)
    alice = client_of(seeded, "alice")
    page = alice.get(f"/clicks/{click_id}")
    assert page.status_code == 200, page.text
    copies = text_of(page.text.split('id="copies"')[1].split("</table>")[0])
    assert "the one billed" not in copies
    assert "The first copy to arrive: the one the rule judged; not charged (Over budget)." in copies
    why = text_of(page.text.split('id="why"')[1].split("</ul>")[0])
    assert f"Campaign {campaign}'s daily budget on 2026-01-01: 0.01 EUR" in why
    assert "made by root through the simulator at 2026-01-01 05:38:00 UTC" in why
    assert not re.search(r"\dT\d\d:\d\d:\d\d\.\d{3}Z", why), why


def test_the_health_page_says_a_frozen_job_a_watermark_behind_and_a_run_under_way_and_finance_reads_it(
    seeded: Seeded,
) -> None:
    keys = RedisKeys(seeded.settings.redis_prefix)
    client = seeded.client

    def job(who: str = "ada") -> tuple[str, str]:
        page = client_of(seeded, who).get("/health")
        assert page.status_code == 200
        row = page.text.split('id="status-streaming-job"')[1].split("</tr>")[0]
        return row.split('data-level="')[0], text_of(row)

    # The job beat 27 s ago and nothing since: frozen, long before the banner's 60 s.
    client.set(keys.heartbeat("billing"), NOW_MS - 27_000)
    seeded.writer.health({**health_record("billing", 90, NOW_MS - 27_000), "watermark_ms": NOW_MS - 37_000})
    _, said = job()
    assert "amber" in said and "Silent for 27 s: no batch and no idle report since 2026-01-01 05:39:33 UTC" in said
    assert "the job may be frozen" in said
    overall = client_of(seeded, "ada").get("/health").text.split('id="overall-status"')[1]
    assert 'data-level="amber"' in overall.split(">")[0] and "all good" not in overall.split("</span>")[0]
    # Under load: billed a second ago, its watermark 38 s behind the clock.
    client.set(keys.heartbeat("billing"), NOW_MS - 1_000)
    seeded.writer.health({**health_record("billing", 91, NOW_MS - 1_000), "watermark_ms": NOW_MS - 38_000})
    _, said = job()
    assert "amber" in said and "(1 s ago)" in said
    assert "Watermark 2026-01-01 05:39:22 UTC, 38 s behind the clock (10 s of that is its delay)" in said
    # Healthy: a batch a second ago, its watermark its delay and a little behind.
    seeded.writer.health({**health_record("billing", 92, NOW_MS - 1_000), "watermark_ms": NOW_MS - 12_000})
    _, said = job()
    assert "Streaming job ok Data last billed" in said and "12 s behind the clock" in said

    # A reconciliation under way for 14 minutes, the last one finished 12 minutes ago (it started before).
    seeded.writer.reconciliation(
        {"run_id": "r", "started_at_ms": NOW_MS - 900_000, "finished_at_ms": NOW_MS - 720_000, "duration_ms": 180_000,
         "periods": [], "closed": [], "additions": 0, "retractions": 0, "net_micros_by_currency": {}}
    )  # fmt: skip
    client.hset(keys.health_status(RECONCILE_RUN_PART), mapping={"state": "running", "since_ms": str(NOW_MS - 840_000)})
    page = client_of(seeded, "fiona").get("/health")  # finance reads the health page too
    assert page.status_code == 200
    said = text_of(page.text.split('id="status-reconciliation"')[1].split("</tr>")[0])
    assert "Running: a run under way since 2026-01-01 05:26:00 UTC (14 min); the last run finished 12 min ago." in said
    assert 'id="nav-health"' in client_of(seeded, "fiona").get("/finance").text
    assert client_of(seeded, "alice").get("/health").status_code == 404


def test_finance_periods_name_each_currency_and_the_statement_pdf_has_its_periods(seeded: Seeded) -> None:
    fiona = client_of(seeded, "fiona")
    page = fiona.get("/finance").text
    latest = "20260101T0500Z"
    rows = page.split(f'<tbody data-period="{latest}">')[1].split("</tbody>")[0].split("</tr>")[:-1]
    currencies = [re.search(r'<td class="currency">([^<]*)</td>', r).group(1) for r in rows]  # type: ignore[union-attr]
    assert sorted(currencies) == ["EUR", "JPY", "KWD"], "a row per currency, each naming it"
    for row in rows:
        assert "<br>" not in row, "no two currencies stacked in one cell"

    alice = client_of(seeded, "alice")
    html = text_of(alice.get(f"/advertisers/{OWN}/statements/2026-01").text)
    pdf = alice.get(f"/advertisers/{OWN}/statements/2026-01/statement.pdf").data
    path = Path("/tmp/statement-per-period.pdf")
    path.write_bytes(pdf)
    tool = deps.ensure_pdftoppm()
    text = " ".join(
        subprocess.run(
            [str(Path(tool).with_name("pdftotext")), "-layout", str(path), "-"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    )
    assert "Per period" in text and "Per period" in html
    rows_csv = list(csv.DictReader(io.StringIO(alice.get(f"/advertisers/{OWN}/statements/2026-01/statement.csv").text)))
    for row in rows_csv[:-1]:  # every period of the CSV, with its total, in the PDF too
        label = row["period"][:4] + "-" + row["period"][4:6] + "-" + row["period"][6:8] + " " + row["period"][9:11]
        assert f"{label}:00 UTC" in text, row["period"]
        assert display.money(int(row["total_micros"]), "EUR") in text, row
    subprocess.run([tool, "-png", "-r", "80", str(path), "/tmp/statement-per-period"], check=True)


def test_a_billing_profile_change_is_in_the_change_log_with_who_made_it_and_through_which_door(seeded: Seeded) -> None:
    """One place holds every change people make to what billing reads: a billing profile set on the admin page is on
    `/catalog/changes` and in its API document, with who, the door and when, beside the catalog's changes, and the
    change log's filters find it."""
    ada = client_of(seeded, "ada")
    form = ada.get(f"/billing-profiles/{OWN}").text
    saved = ada.post(
        f"/billing-profiles/{OWN}",
        data={
            "csrf_token": form_token(form),
            "name": "Plain Words GmbH",
            "address": "Hauptstrasse 1, Berlin",
            "tax_id": "DE123456789",
            "tax_rate": "19",
        },
    )
    assert saved.status_code in (200, 302, 303), saved.text
    log = ada.get("/api/v1/catalog/changes?kind=billing-profile").json
    assert log["total"] == 1, log
    entry = log["changes"][0]
    assert (entry["who"], entry["door_kind"], entry["advertiser_id"]) == ("ada", "page", OWN)
    assert entry["name"] == "Plain Words GmbH" and entry["tax_rate"] == "19" and entry["made_at"] == NOW_MS
    everything = ada.get("/api/v1/catalog/changes").json["changes"]
    assert everything[0]["kind"] == "billing-profile", "the newest change first, whichever record it changed"
    page = text_of(ada.get(f"/catalog/changes?advertiser_id={OWN}&who=ada").text)
    assert f"billing profile of {OWN}" in page and "Plain Words GmbH, tax 19 %" in page
