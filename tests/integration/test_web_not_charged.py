"""What is not charged, where people look: invalid clicks and the invalid click rate, clicks over budget, each
campaign's budget per UTC day and the campaigns capped today, on the dashboard, the campaign, ad, statement, finance
and budgets pages and in their API documents.

Real Redis (the session's server, a prefix per test), filled as the stream fills it (`RedisTotals.apply_batch` with
`not_charged` and `budget_days`) and as reconciliation does (`apply_corrections` with an invalid traffic reason); the
budget is set by an admin on the page; the Flask test client, its clock pinned at 2026-01-01T05:30Z.
"""

from __future__ import annotations

import csv
import io
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from billing.budgets import day_start, utc_day
from billing.catalog import Ad
from billing.corrections import Correction, CorrectionKind
from billing.invalid import format_rate
from billing.periods import Periods
from billing.store.redis_totals import BudgetDayCount, NotChargedCount, RedisTotals
from ops import deps
from ops.settings import Settings
from tests.web_support import FIRST_PERIOD_MS, OTHER, OWN, Seeded, form_token, login, seed, web_screens_dir
from web import display
from web.app import create_app

pytestmark = pytest.mark.integration

NOW_MS = FIRST_PERIOD_MS + 5 * 3_600_000 + 1_800_000  # 2026-01-01T05:30Z, in the sample's last (open) period
DAY = "2026-01-01"
# Invalid clicks per rule and clicks over budget planted on one ad of adv-0000 in the open period: counts no sample
# figure reaches, so each is found where it should show and nowhere else.
PLANTED = {"known_bot": 1_301, "excluded_ip": 1_402, "click_flood": 1_503, "duplicate_click": 1_604}
INVALID = sum(PLANTED.values())  # 5,810
OVER = 1_705
CHARGED_TODAY = 12  # clicks the campaign's day charged; its budget is set to exactly their price: capped
THEIRS = 9_871  # adv-0001's invalid clicks: never on adv-0000's pages


@dataclass(frozen=True)
class World:
    seeded: Seeded
    ad: Ad
    period: str
    clients: dict[str, FlaskClient]

    @property
    def budget(self) -> int:
        return CHARGED_TODAY * (self.ad.cpc_micros or 0)

    def corrected_clicks(self) -> int:
        """adv-0000's charged clicks in the period (provisional + corrections), as the rate's denominator."""
        doc = self.clients["alice"].get(f"/api/v1/advertisers/{OWN}/dashboard").json
        return int(doc["totals"]["corrected"]["clicks"])


@pytest.fixture
def world(redis_settings: Settings) -> World:
    seeded = seed(redis_settings)
    app = create_app(redis_settings, clock=lambda: NOW_MS, cache_s=0)
    clients = {}
    for name in ("alice", "bob", "fiona", "ada"):
        clients[name] = app.test_client()
        assert login(clients[name], name).status_code == 302
    ad = next(a for a in seeded.catalog if a.advertiser_id == OWN)
    theirs = next(a for a in seeded.catalog if a.advertiser_id == OTHER)
    hours = Periods()
    start = hours.start_of(NOW_MS)
    period = hours.key(start)
    price = ad.cpc_micros or 0
    not_charged = [
        NotChargedCount(period, start, OWN, ad.campaign_id, ad.ad_id, reason, n, n * price)
        for reason, n in (*PLANTED.items(), ("over_budget", OVER))
    ]
    not_charged.append(
        NotChargedCount(period, start, OTHER, theirs.campaign_id, theirs.ad_id, "known_bot", THEIRS, THEIRS)
    )
    days = [
        BudgetDayCount(
            period, ad.campaign_id, utc_day(start), day_start(start), CHARGED_TODAY, CHARGED_TODAY * price, OVER,
            OVER * price,
        )
    ]  # fmt: skip
    totals = RedisTotals(seeded.client, redis_settings.redis_prefix)
    # The sample's corrections of the day's closed hours count in the campaign's day too, and its own invalid
    # clicks in each hour: this test starts from none.
    seeded.client.delete(totals.keys.budget_day(utc_day(start), ad.campaign_id))
    seeded.client.delete(*seeded.client.scan_iter(match=totals.keys.not_charged("*", "*", "*")))
    assert totals.apply_batch("billing", 50_000, [], not_charged=not_charged, budget_days=days)
    world = World(seeded, ad, period, clients)
    # The admin sets the campaign's daily budget on its page, from now on.
    ada = clients["ada"]
    token = form_token(ada.get(f"/catalog/campaigns/{ad.campaign_id}").text)
    made = ada.post(
        f"/catalog/campaigns/{ad.campaign_id}/budgets",
        data={"csrf_token": token, "daily_micros": str(world.budget), "effective_from": ""},
    )
    assert made.status_code == 303, made.text[:500]
    return world


def test_the_dashboard_shows_invalid_clicks_their_rate_and_clicks_over_budget(world: World) -> None:
    alice = world.clients["alice"]
    doc = alice.get(f"/api/v1/advertisers/{OWN}/dashboard?from={DAY}&to={DAY}").json
    price = world.ad.cpc_micros or 0
    charged = world.corrected_clicks()
    expected = {
        "invalid": {"clicks": INVALID, "micros": str(INVALID * price)},
        "invalid_click_rate": format_rate(INVALID, charged),
        **{reason: {"clicks": n, "micros": str(n * price)} for reason, n in PLANTED.items()},
        "over_budget": {"clicks": OVER, "micros": str(OVER * price)},
    }
    assert doc["not_charged"] == expected
    assert expected["invalid_click_rate"].endswith(" %") and expected["invalid_click_rate"] != "0.0 %"
    line = next(a for a in doc["ads"] if a["ad_id"] == world.ad.ad_id)
    assert line["not_charged"]["invalid"]["clicks"] == INVALID
    campaign = next(c for c in doc["campaigns"] if c["campaign_id"] == world.ad.campaign_id)
    assert campaign["not_charged"]["over_budget"]["clicks"] == OVER
    assert doc["series"][-1]["period"] == world.period and doc["series"][-1]["not_charged"] == expected
    # Per range, month and day, like every other figure.
    assert doc["range_total"]["not_charged"]["invalid"]["clicks"] == INVALID
    assert doc["months"][0]["not_charged"]["invalid"]["clicks"] == INVALID
    assert [d["not_charged"]["invalid"]["clicks"] for d in doc["days"]] == [INVALID]
    assert doc["days"][0]["not_charged"]["invalid_click_rate"] == format_rate(
        INVALID, doc["days"][0]["corrected"]["clicks"]
    )

    page = alice.get(f"/advertisers/{OWN}?from={DAY}&to={DAY}").text
    assert f'id="invalid-clicks">{display.count(INVALID)}<' in page
    assert f'id="invalid-rate">{format_rate(INVALID, charged)}<' in page
    assert f'id="over-budget-clicks">{display.count(OVER)}<' in page
    assert f'id="invalid-click-flood">{display.count(PLANTED["click_flood"])}<' in page
    assert (
        f'id="range-invalid" data-k="range_total.not_charged.invalid.clicks" data-f="count">{display.count(INVALID)}<'
        in page
    )
    assert display.count(THEIRS) not in page and OTHER not in page


def test_budget_per_campaign_and_day_on_the_dashboard_and_the_campaign_page(world: World) -> None:
    alice, campaign = world.clients["alice"], world.ad.campaign_id
    price = world.ad.cpc_micros or 0
    doc = alice.get(f"/api/v1/advertisers/{OWN}/dashboard?from={DAY}&to={DAY}").json
    day = {
        "campaign_id": campaign,
        "day": DAY,
        "budget_micros": str(world.budget),
        # Unlimited when the day began, the admin's budget from 05:30 on.
        "budgets": [
            {"from_ms": FIRST_PERIOD_MS, "daily_budget_micros": None},
            {"from_ms": NOW_MS, "daily_budget_micros": str(world.budget)},
        ],
        "charged": {"clicks": CHARGED_TODAY, "micros": str(CHARGED_TODAY * price)},
        "over_budget": {"clicks": OVER, "micros": str(OVER * price)},
        "room_micros": "0",
        "capped": True,
    }
    assert doc["budget_days"] == [day]  # only the campaign with a budget
    page = alice.get(f"/advertisers/{OWN}?from={DAY}&to={DAY}").text
    table = page[page.index('id="budget-days"') :].split("</table>")[0]
    assert display.money(world.budget, "EUR") in table and 'class="badge capped"' in table and "(changed)" in table

    cmp = alice.get(f"/api/v1/advertisers/{OWN}/campaigns/{campaign}?from={DAY}&to={DAY}").json
    assert cmp["budget"]["daily_budget_micros"] == str(world.budget)
    assert cmp["budget"]["in_force_since"] == NOW_MS
    assert [(e["made_by"], e["door"], e["made_at"]) for e in cmp["budget"]["history"]] == [("ada", "page", NOW_MS)]
    assert cmp["budget_days"] == [day]
    assert cmp["range_total"]["not_charged"]["invalid"]["clicks"] == INVALID
    page = alice.get(f"/advertisers/{OWN}/campaigns/{campaign}?from={DAY}&to={DAY}").text
    history = page[page.index('id="budget-history"') :].split("</table>")[0]
    assert "ada" in history and "page" in history and "in force" in history
    assert display.money(world.budget, "EUR") in page[page.index('id="budget-now"') :].split("</p>")[0]
    assert 'class="badge capped"' in page[page.index('id="campaign-budget-days"') :].split("</table>")[0]

    # A campaign without a budget: its days show what was charged, the budget unlimited.
    other_campaign = next(
        a.campaign_id for a in world.seeded.catalog if a.advertiser_id == OWN and a.campaign_id != campaign
    )
    plain = alice.get(f"/api/v1/advertisers/{OWN}/campaigns/{other_campaign}?from={DAY}&to={DAY}").json
    assert plain["budget"]["daily_budget_micros"] is None and plain["budget"]["history"] == []
    assert "No daily budget was ever set" in alice.get(f"/advertisers/{OWN}/campaigns/{other_campaign}").text


def test_the_ad_page_and_its_document_show_its_invalid_clicks(world: World) -> None:
    alice = world.clients["alice"]
    doc = alice.get(f"/api/v1/advertisers/{OWN}/ads/{world.ad.ad_id}?from={DAY}&to={DAY}").json
    assert doc["series"][-1]["not_charged"]["invalid"]["clicks"] == INVALID
    assert doc["range_total"]["not_charged"]["over_budget"]["clicks"] == OVER
    page = alice.get(f"/advertisers/{OWN}/ads/{world.ad.ad_id}").text
    assert display.count(INVALID) in page and display.count(OVER) in page


def test_an_admin_sees_the_campaigns_capped_today(world: World) -> None:
    campaign = world.ad.campaign_id
    for who in ("ada", "fiona"):
        page = world.clients[who].get("/catalog/budgets").text
        capped = page[page.index('id="capped-today"') :].split("</table>")[0]
        assert f'id="capped-{campaign}"' in capped and display.money(world.budget, "EUR") in capped
        assert display.count(OVER) in capped
        doc = world.clients[who].get("/api/v1/catalog/budgets").json
        assert doc["day"] == DAY and doc["capped_today"] == [campaign]
        listed = {c["campaign_id"]: c for c in doc["campaigns"]}
        assert listed[campaign]["daily_budget_micros"] == str(world.budget) and listed[campaign]["today"]["capped"]
        others = [c for cid, c in listed.items() if cid != campaign]
        assert all(c["daily_budget_micros"] is None and not (c["today"] or {}).get("capped") for c in others)
    # Raised above what was charged: the campaign has room again, and nobody is capped.
    ada = world.clients["ada"]
    token = form_token(ada.get(f"/catalog/campaigns/{campaign}").text)
    raised = ada.post(
        f"/catalog/campaigns/{campaign}/budgets", data={"csrf_token": token, "daily_micros": str(world.budget * 2)}
    )
    assert raised.status_code == 303
    assert ada.get("/api/v1/catalog/budgets").json["capped_today"] == []
    assert 'id="none-capped"' in ada.get("/catalog/budgets").text


def test_the_statement_has_a_line_for_invalid_clicks_and_one_for_clicks_over_budget(
    world: World, tmp_path: Path
) -> None:
    alice = world.clients["alice"]
    price = world.ad.cpc_micros or 0
    page = alice.get(f"/advertisers/{OWN}/statements/2026-01").text
    assert f'id="invalid-clicks">{display.count(INVALID)}<' in page
    assert f'id="invalid-micros">{display.money(INVALID * price, "EUR")}<' in page
    assert f'id="over-budget-clicks">{display.count(OVER)}<' in page
    assert "Invalid clicks (not charged)" in page and "Not charged: over budget" in page

    rows = list(csv.DictReader(io.StringIO(alice.get(f"/advertisers/{OWN}/statements/2026-01/statement.csv").text)))
    total = rows[-1]
    assert total["period"] == "TOTAL"
    assert int(total["invalid_clicks_not_charged"]) == INVALID
    assert int(total["invalid_micros_not_charged"]) == INVALID * price
    assert (int(total["over_budget_clicks_not_charged"]), int(total["over_budget_micros_not_charged"])) == (
        OVER,
        OVER * price,
    )
    mine = next(r for r in rows if r["period"] == world.period)
    assert int(mine["invalid_clicks_not_charged"]) == INVALID and int(mine["total_micros"]) == sum(
        int(r["total_micros"]) for r in rows if r["period"] == world.period
    )
    # What is not charged never enters the total: the sum of the periods is the total.
    assert sum(int(r["total_micros"]) for r in rows[:-1]) == int(total["total_micros"])

    pdf = alice.get(f"/advertisers/{OWN}/statements/2026-01/statement.pdf")
    path = tmp_path / "statement.pdf"
    path.write_bytes(pdf.data)
    try:
        tool = deps.ensure_pdftoppm()
    except deps.DependencyError as exc:
        pytest.skip(str(exc))
    text = " ".join(
        subprocess.run(
            [str(Path(tool).with_name("pdftotext")), "-layout", str(path), "-"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    )
    assert f"Invalid clicks (not charged) {display.count(INVALID)} {display.money(INVALID * price, 'EUR')}" in text
    assert f"Not charged: over budget {display.count(OVER)} {display.money(OVER * price, 'EUR')}" in text
    subprocess.run([tool, "-png", "-r", "80", "-f", "1", "-l", "1", str(path), str(tmp_path / "page")], check=True)
    shutil.copy(next(tmp_path.glob("page*.png")), web_screens_dir() / "statement-pdf-not-charged-page-1.png")


def test_finance_totals_per_period_show_invalid_clicks(world: World) -> None:
    fiona = world.clients["fiona"]
    doc = fiona.get("/api/v1/finance").json
    latest = next(p for p in doc["recent_periods"] if p["period"] == world.period)
    eur = next(t for t in latest["totals"] if t["currency"] == "EUR")
    assert eur["not_charged"]["invalid"]["clicks"] == INVALID
    assert eur["not_charged"]["over_budget"]["clicks"] == OVER
    jpy = next(t for t in latest["totals"] if t["currency"] == world.seeded.catalog.currency_of(OTHER))
    assert jpy["not_charged"]["invalid"]["clicks"] == THEIRS  # per currency, never added together
    mine = next(a for a in doc["advertisers"] if a["advertiser_id"] == OWN)
    assert mine["not_charged"]["invalid"]["clicks"] == INVALID
    page = fiona.get("/finance").text
    rows = page[page.index(f'<tbody data-period="{world.period}">') :].split("</tbody>")[0]
    # A row per currency, each naming it: the counts of two currencies are never stacked in one cell.
    cells = dict(re.findall(r'<td class="currency">(\w+)</td>.*?class="num invalid-clicks">([^<]*)</td>', rows, re.S))
    assert cells[world.seeded.catalog.currency_of(OWN)] == display.count(INVALID)
    assert cells[world.seeded.catalog.currency_of(OTHER)] == display.count(THEIRS)


def test_a_correction_for_an_invalid_click_moves_it_to_not_charged_with_its_reason(world: World) -> None:
    """Reconciliation retracts a click the stream charged and the rules find a double click: the period's invalid
    clicks count it, and the correction shows the rule's label."""
    ad, period = world.ad, world.period
    retraction = Correction(
        "corr-dup-1", CorrectionKind.RETRACTION, "click-dup-1", "imp-dup-1", ad.ad_id, ad.campaign_id, OWN,
        -(ad.cpc_micros or 0), "EUR", "duplicate_click", period, period, NOW_MS,
    )  # fmt: skip
    totals = RedisTotals(world.seeded.client, world.seeded.settings.redis_prefix)
    assert totals.apply_corrections([retraction], {period: Periods().parse_key(period)}) == 1
    alice = world.clients["alice"]
    doc = alice.get(f"/api/v1/advertisers/{OWN}/dashboard").json
    assert doc["not_charged"]["duplicate_click"]["clicks"] == PLANTED["duplicate_click"] + 1
    assert doc["not_charged"]["invalid"]["clicks"] == INVALID + 1
    assert "Invalid: double click" in alice.get(f"/advertisers/{OWN}/corrections").text
    # The day's budget figures follow the correction too (reconciliation's day total).
    assert doc["budget_days"][0]["charged"]["clicks"] == CHARGED_TODAY - 1


def test_the_budget_history_lives_in_the_catalog_every_part_reads(world: World) -> None:
    catalog = world.seeded.settings.catalog_store().current()
    (entry,) = catalog.budget_history(world.ad.campaign_id)
    assert (entry.effective_from, entry.daily_budget_micros, entry.made_by, entry.door, entry.made_at) == (
        NOW_MS,
        world.budget,
        "ada",
        "page",
        NOW_MS,
    )
    assert catalog.budget_at(world.ad.campaign_id, NOW_MS - 1) is None
