"""The access matrix: every route of the web UI, for each role, another advertiser and an anonymous visitor.

Real Redis (the session's server, a key prefix of this module), real export files, the accounts and API tokens in
the module's own database; requests go through the Flask test client. The data is only read here, so one seeded
app serves the whole module.

Targets are adv-0000's campaign, ad, correction and export; `alice` is adv-0000's advertiser, `bob` another
advertiser's. Expected: alice, finance and admin see adv-0000 (200), bob gets 404, as for an id that exists
nowhere; pages send the anonymous visitor to the login form, the API answers 401; finance pages and exports are for
finance and admin, health for finance and admin. No response to an advertiser ever holds another advertiser's id. Each
account's API token opens every API route exactly as its session does (the same status, the same bytes) and no page;
a revoked, unknown or malformed token, or a disabled account's, gets 401.
A campaign id names one advertiser's campaign: a catalog where two share one is refused (by the catalog, its change
door and its database's constraints), and an id that moved from one advertiser to another between catalogs shows
each only the figures of its own hours.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from flask import Flask
from flask.testing import FlaskClient

from billing.budgets import day_start, utc_day
from billing.catalog import FORMAT, Ad, AdChange, BudgetSetting, Catalog, CatalogError, MadeBy
from billing.corrections import Correction, CorrectionKind
from billing.invoices import Issuer
from billing.periods import Periods
from billing.store.database import connection_pool
from billing.store.invoice_files import ExportInvoiceSource
from billing.store.redis_totals import BudgetDayCount, NotChargedCount, TotalsRow
from billing.store.stream_offsets import LagReading
from ops.postgres_service import LocalPostgres
from ops.redis_service import LocalRedis
from tests.catalog_rows import catalog_rows
from tests.conftest import isolated_settings, new_database
from tests.invoice_month import MONTH as INVOICED
from tests.invoice_month import write_closed_month
from tests.redis_figures import RedisFigures
from tests.web_support import (
    ACCOUNTS,
    FIRST_PERIOD_MS,
    OTHER,
    OWN,
    Seeded,
    form_token,
    login,
    plant_exported_click,
    seed,
)
from web import display
from web.access import Role
from web.accounts import AccountsDatabase
from web.app import create_app

pytestmark = pytest.mark.integration

THIRD = "adv-0002"
PLANTED_CLICKS = (6_217, 7_919, 8_837)  # a batch for each of OWN, OTHER, THIRD in the latest period
PLANTED_INVALID = (3_119, 4_231, 5_347)  # invalid clicks of each, not charged, in the latest period
PLANTED_BUDGETS = (61_234_567, 72_345_678, 83_456_789)  # each one's campaign's daily budget, in micros
PLANTED_OVER = (2_113, 2_237, 2_351)  # each one's clicks over budget that day
ACTORS = ["alice", "bob", "fiona", "ada", "anonymous"]


@dataclass(frozen=True)
class World:
    app: Flask
    seeded: Seeded
    clients: dict[str, FlaskClient]
    ids: dict[str, dict[str, str]]  # advertiser -> {campaign, ad, correction}
    export_period: str
    tokens: dict[str, str]  # actor -> API token


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory, redis_server: LocalRedis, postgres_server: LocalPostgres
) -> Iterator[World]:
    home = tmp_path_factory.mktemp("web-access")
    settings = isolated_settings(
        home=home,
        database_url=new_database(postgres_server),
        redis_url=redis_server.url,
        redis_prefix=f"t{uuid.uuid4().hex[:10]}",
    )
    seeded = seed(settings)
    ids: dict[str, dict[str, str]] = {}
    totals = RedisFigures(seeded.client, settings.redis_prefix)
    latest = totals.periods()[-1]
    start_ms = int(seeded.client.zscore(totals.keys.periods(), latest) or 0)
    for n, advertiser in enumerate((OWN, OTHER, THIRD)):
        ad = next(a for a in seeded.catalog if a.advertiser_id == advertiser)
        # Ids that do not name the advertiser, and a batch of a click count no sample figure reaches: a leak of
        # these shows only as a figure or an id, never as the advertiser's id.
        correction_id = f"matrix-{n}7e1"
        clicks = PLANTED_CLICKS[n]
        totals.apply_batch(
            "billing",
            90_000 + n,
            [TotalsRow(latest, start_ms, advertiser, ad.campaign_id, ad.ad_id, clicks, clicks * ad.cpc_micros)],
        )
        seeded.writer.corrections(
            [
                Correction(
                    correction_id, CorrectionKind.RETRACTION, f"click-{correction_id}", None, ad.ad_id,
                    ad.campaign_id, advertiser, -ad.cpc_micros, ad.currency, "duplicate", "20260101T0000Z",
                    "20260101T0000Z", 1_767_230_000_000,
                )
            ]
        )  # fmt: skip
        ids[advertiser] = {"campaign": ad.campaign_id, "ad": ad.ad_id, "correction": correction_id}
        # What was not charged, and the campaign's daily budget and day: figures of this advertiser alone.
        invalid, over = PLANTED_INVALID[n], PLANTED_OVER[n]
        totals.apply_batch(
            "billing",
            90_100 + n,
            [],
            not_charged=[
                NotChargedCount(latest, start_ms, advertiser, ad.campaign_id, ad.ad_id, "known_bot", invalid, 10**6),
                NotChargedCount(latest, start_ms, advertiser, ad.campaign_id, ad.ad_id, "over_budget", over, 10**6),
            ],
            budget_days=[
                BudgetDayCount(latest, ad.campaign_id, utc_day(start_ms), day_start(start_ms), 0, 0, over, 10**6)
            ],
        )
        settings.catalog_store().change(
            BudgetSetting(ad.campaign_id, 0, PLANTED_BUDGETS[n], MadeBy("ada", "command")), backfill=True
        )
        # One of its clicks not charged, as the stream writes them: the lists of clicks not charged show it.
        folder = settings.layout.not_charged / f"period={latest}" / f"batch_id={90_200 + n}"
        folder.mkdir(parents=True)
        refused = {
            "click_id": f"refused-{n}9c4", "impression_id": f"i-refused-{n}", "ad_id": ad.ad_id,
            "campaign_id": ad.campaign_id, "advertiser_id": advertiser, "user_id": f"u-refused-{n}",
            "click_time": start_ms + 1_000, "impression_time": start_ms, "amount_micros": ad.cpc_micros,
            "currency": ad.currency, "reason": "known_bot",
        }  # fmt: skip
        pq.write_table(pa.Table.from_pylist([refused]), folder / "part-00000.parquet")
    lag = LagReading({"clicks": 0, "impressions": 0}, True, 0)  # Kafka's own figures: test_web_health_lag
    app = create_app(settings, kafka_lag=lambda: lag)
    clients = {"anonymous": app.test_client()}
    for name in ACCOUNTS:
        clients[name] = app.test_client()
        assert login(clients[name], name).status_code == 302
    exports = sorted(p.name for p in (settings.root / "exports").iterdir())
    assert len(exports) == 2
    for advertiser in (OWN, OTHER, THIRD):  # a click of each, whose story the click routes tell
        ids[advertiser]["click"] = plant_exported_click(settings.root, exports[-1], advertiser)
    # December closed on files and invoiced: adv-0000's and adv-0001's invoices (adv-0002 has none).
    write_closed_month(settings.layout, seeded.catalog, OWN, OTHER, settings.database_url)
    Issuer(
        settings.invoice_store(),
        ExportInvoiceSource(settings.layout),
        settings.profile_store().current(),
        lambda: 1_767_250_000_000,
    ).issue_month(INVOICED)
    store = settings.tokens_store()
    tokens = {name: store.create(name)[0] for name in ACCOUNTS}
    yield World(app, seeded, clients, ids, exports[-1], tokens)
    seeded.client.close()
    connection_pool(settings.database_url).close()


# The URL of each GET route for advertiser `adv`'s things; `None` for routes that are not an advertiser's.
def get_routes(world: World, adv: str) -> dict[str, str]:
    ids = world.ids[adv]
    return (
        {
            "/": "/",
            "/login": "/login",
            "/advertisers/<advertiser_id>": f"/advertisers/{adv}",
            "/advertisers/<advertiser_id>/campaigns/<campaign_id>": f"/advertisers/{adv}/campaigns/{ids['campaign']}",
            "/advertisers/<advertiser_id>/ads/<ad_id>": f"/advertisers/{adv}/ads/{ids['ad']}",
            "/advertisers/<advertiser_id>/corrections": f"/advertisers/{adv}/corrections",
            "/advertisers/<advertiser_id>/corrections/<correction_id>": (
                f"/advertisers/{adv}/corrections/{ids['correction']}"
            ),
            "/advertisers/<advertiser_id>/charges.csv": f"/advertisers/{adv}/charges.csv?from=2026-01-01&to=2026-01-31",
            "/advertisers/<advertiser_id>/not-charged": f"/advertisers/{adv}/not-charged?from=2026-01-01&to=2026-01-31",
            "/advertisers/<advertiser_id>/not-charged.csv": (
                f"/advertisers/{adv}/not-charged.csv?from=2026-01-01&to=2026-01-31"
            ),
            "/advertisers/<advertiser_id>/statements/<month>": f"/advertisers/{adv}/statements/2026-01",
            "/advertisers/<advertiser_id>/statements/<month>/statement.csv": (
                f"/advertisers/{adv}/statements/2026-01/statement.csv"
            ),
            "/advertisers/<advertiser_id>/statements/<month>/statement.pdf": (
                f"/advertisers/{adv}/statements/2026-01/statement.pdf"
            ),
            "/finance": "/finance",
            "/finance/months/<month>/billing.csv": "/finance/months/2026-01/billing.csv",
            "/exports/<period>/<name>": f"/exports/{world.export_period}/billing.parquet",
            "/health": "/health",
            "/static/<path:filename>": "/static/adbill.js",
            "/api/v1/openapi.json": "/api/v1/openapi.json",
            "/api/v1/me": "/api/v1/me",
            "/api/v1/periods": "/api/v1/periods",
            "/api/v1/advertisers": "/api/v1/advertisers",
            "/api/v1/advertisers/<advertiser_id>/dashboard": f"/api/v1/advertisers/{adv}/dashboard",
            "/api/v1/advertisers/<advertiser_id>/campaigns/<campaign_id>": (
                f"/api/v1/advertisers/{adv}/campaigns/{ids['campaign']}"
            ),
            "/api/v1/advertisers/<advertiser_id>/ads/<ad_id>": f"/api/v1/advertisers/{adv}/ads/{ids['ad']}",
            "/api/v1/advertisers/<advertiser_id>/corrections": f"/api/v1/advertisers/{adv}/corrections",
            "/api/v1/advertisers/<advertiser_id>/not-charged": (
                f"/api/v1/advertisers/{adv}/not-charged?from=2026-01-01&to=2026-01-31"
            ),
            "/api/v1/advertisers/<advertiser_id>/corrections/<correction_id>": (
                f"/api/v1/advertisers/{adv}/corrections/{ids['correction']}"
            ),
            "/api/v1/finance": "/api/v1/finance",
            "/api/v1/exports": "/api/v1/exports",
            "/api/v1/exports/<period>/<name>": f"/api/v1/exports/{world.export_period}/billing.csv",
            "/api/v1/health": "/api/v1/health",
            "/healthz": "/healthz",
            "/readyz": "/readyz",
            "/metrics": "/metrics",
        }
        | catalog_get_routes(world, adv)
        | story_get_routes(world, adv)
        | invoice_get_routes(adv)
    )


def invoice_get_routes(adv: str) -> dict[str, str]:
    """The monthly invoices and the billing profiles: an advertiser's invoices its own, finance's month of every
    advertiser's, the profiles for finance and admin."""
    return {
        "/advertisers/<advertiser_id>/invoices": f"/advertisers/{adv}/invoices",
        "/advertisers/<advertiser_id>/invoices/<month>": f"/advertisers/{adv}/invoices/{INVOICED}",
        "/advertisers/<advertiser_id>/invoices/<month>/invoice.csv": (
            f"/advertisers/{adv}/invoices/{INVOICED}/invoice.csv"
        ),
        "/advertisers/<advertiser_id>/invoices/<month>/invoice.pdf": (
            f"/advertisers/{adv}/invoices/{INVOICED}/invoice.pdf"
        ),
        "/api/v1/advertisers/<advertiser_id>/invoices": f"/api/v1/advertisers/{adv}/invoices",
        "/api/v1/advertisers/<advertiser_id>/invoices/<month>": f"/api/v1/advertisers/{adv}/invoices/{INVOICED}",
        "/finance/invoices": f"/finance/invoices?month={INVOICED}",
        "/finance/months/<month>/advertisers.csv": "/finance/months/2026-01/advertisers.csv",
        "/api/v1/finance/invoices": f"/api/v1/finance/invoices?month={INVOICED}",
        "/billing-profiles": "/billing-profiles",
        "/billing-profiles/<advertiser_id>": f"/billing-profiles/{adv}",
    }


PUBLIC = {"/login", "/static/<path:filename>", "/api/v1/openapi.json", "/healthz", "/metrics"}
FINANCE = {
    "/finance/invoices",
    "/finance/months/<month>/advertisers.csv",
    "/api/v1/finance/invoices",
    "/billing-profiles",
    "/billing-profiles/<advertiser_id>",
    "/finance",
    "/finance/months/<month>/billing.csv",
    "/exports/<period>/<name>",
    "/api/v1/finance",
    "/api/v1/exports",
    "/api/v1/exports/<period>/<name>",
}
HEALTH = {"/health", "/api/v1/health"}
POST_ROUTES = {"/login", "/logout"}


def expected_status(actor: str, rule: str) -> int:
    """The access rules of docs/billing-rules.md ("Who sees what"), route by route, for adv-0000's things."""
    if rule == "/readyz":
        return 503  # open to all; no streaming job runs for this sample, so not ready, for anyone alike
    if rule in PUBLIC:
        return 200
    if actor == "anonymous":
        return 401 if rule.startswith("/api/") else 302
    if rule == "/":
        return 302
    if rule in EXCLUSIONS:
        return 200 if actor == "ada" else 404
    if rule in CATALOG_READ:
        return 200 if actor in ("fiona", "ada") else 404
    if rule in HEALTH:
        return 200 if actor in ("fiona", "ada") else 404
    if rule in FINANCE:
        return 200 if actor in ("fiona", "ada") else 404
    if "<advertiser_id>" in rule or rule in CLICK_ROUTES:
        return 404 if actor == "bob" else 200
    return 200  # /api/v1/me, /periods, /advertisers, /clicks: any logged-in person, each sees its own view


def test_the_matrix_covers_every_route(world: World) -> None:
    rules = {rule.rule for rule in world.app.url_map.iter_rules()}
    assert rules == set(get_routes(world, OWN)) | POST_ROUTES | set(CATALOG_POST_ROUTES)


@pytest.mark.parametrize("actor", ACTORS)
def test_every_get_route_for_every_actor(world: World, actor: str) -> None:
    client = world.clients[actor]
    failures = []
    for rule, url in get_routes(world, OWN).items():
        response = client.get(url)
        want = expected_status(actor, rule)
        if response.status_code != want:
            failures.append(f"{url}: {response.status_code}, expected {want}")
            continue
        if want == 302 and actor == "anonymous":
            assert response.headers["Location"].startswith("/login"), url
        if want == 401:
            assert response.json == {"error": "login required", "status": 401}, url
        if want == 200 and ("<advertiser_id>" in rule or rule in CLICK_ROUTES):
            assert OWN.encode() in response.get_data(), f"{url} answered without adv-0000's data"
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("actor", ["alice", "bob"])
def test_no_response_to_an_advertiser_holds_another_advertisers_data(world: World, actor: str) -> None:
    client = world.clients[actor]
    own = ACCOUNTS[actor][1]
    others = [a for a in (OWN, OTHER, THIRD) if a != own]
    urls = [*get_routes(world, OWN).values(), *get_routes(world, OTHER).values(), *get_routes(world, THIRD).values()]
    theirs = {figure for other in others for figure in figures_of(world, other)} - set(figures_of(world, own))
    assert any(f.startswith("matrix-") for f in theirs) and len(theirs) > 20, theirs
    for url in urls:
        response = client.get(url, follow_redirects=True)
        body = response.get_data().decode("latin-1")  # a PDF too; ids and figures are ASCII
        for other in others:
            assert other not in body, f"{actor} got {other}'s data from {url}"
        for figure in theirs:
            assert not re.search(rf"(?<![\w.,]){re.escape(figure)}(?![\w]|[.,]\d)", body), (
                f"{actor} got another advertiser's figure {figure!r} from {url}"
            )


def figures_of(world: World, advertiser: str) -> set[str]:
    """What would betray `advertiser` without its id, as the admin's API gives it: its correction and click ids
    and amounts, and its click counts and micros of every period (of four digits and more), as JSON and as
    pages write them (with the advertiser's currency: short amounts such as `0.05` alone are found anywhere)."""
    admin = world.clients["ada"]
    currency = world.seeded.catalog.currency_of(advertiser) or ""
    out: set[str] = set()
    for c in admin.get(f"/api/v1/advertisers/{advertiser}/corrections?limit=500").json["corrections"]:
        out |= {
            c["correction_id"],
            c["click_id"],
            c["amount_micros"],  # micros as the API writes them: a string of digits
            display.signed_money(int(c["amount_micros"]), currency),
        }
    for period in admin.get("/api/v1/periods").json["periods"]:
        dashboard = admin.get(f"/api/v1/advertisers/{advertiser}/dashboard?period={period['period']}").json
        totals = {**dashboard["totals"], "not_charged": dashboard["not_charged"]}
        lines = [totals, *dashboard["campaigns"], *dashboard["ads"]]
        for line in lines:
            for kind in ("provisional", "corrections", "corrected"):
                clicks, micros = line[kind]["clicks"], int(line[kind]["micros"])
                if abs(clicks) >= 1_000:
                    out |= {str(clicks), display.count(abs(clicks))}
                if abs(micros) >= 1_000:
                    out |= {str(micros), display.money(abs(micros), currency)}
            for figures in line["not_charged"].values():
                if not isinstance(figures, dict):
                    continue  # the rate
                clicks, micros = figures["clicks"], int(figures["micros"])
                if abs(clicks) >= 1_000:
                    out |= {str(clicks), display.count(abs(clicks))}
                if abs(micros) >= 1_000:
                    out |= {str(micros), display.money(abs(micros), currency)}
        for day in dashboard["budget_days"]:
            if day["budget_micros"] is not None:
                out |= {day["budget_micros"], display.money(int(day["budget_micros"]), currency)}
            if day["over_budget"]["clicks"] >= 1_000:
                out |= {str(day["over_budget"]["clicks"]), display.count(day["over_budget"]["clicks"])}
    return out


def test_advertiser_sees_its_own_things_and_gets_404_for_the_same_kind_of_another(world: World) -> None:
    bob = world.clients["bob"]
    mine = [
        u
        for r, u in get_routes(world, OTHER).items()
        if ("<advertiser_id>" in r and r not in FINANCE) or r in CLICK_ROUTES
    ]
    assert all(bob.get(u).status_code == 200 for u in mine)
    assert all(world.clients["alice"].get(u).status_code == 404 for u in mine)


def test_a_forbidden_id_answers_exactly_like_an_id_that_does_not_exist(world: World) -> None:
    alice = world.clients["alice"]
    for forbidden, missing in [
        (f"/advertisers/{OTHER}", "/advertisers/adv-9999"),
        (f"/api/v1/advertisers/{OTHER}/dashboard", "/api/v1/advertisers/adv-9999/dashboard"),
        (f"/api/v1/advertisers/{OTHER}/corrections", "/api/v1/advertisers/adv-9999/corrections"),
        (f"/clicks/{world.ids[OTHER]['click']}", "/clicks/click-never-received"),
        (f"/api/v1/clicks/{world.ids[OTHER]['click']}", "/api/v1/clicks/click-never-received"),
    ]:
        a, b = alice.get(forbidden), alice.get(missing)
        assert (a.status_code, a.get_data()) == (b.status_code, b.get_data()) and a.status_code == 404


@pytest.mark.parametrize("actor", ["alice", "fiona", "ada"])
def test_another_advertisers_campaign_ad_or_correction_under_ones_own_id_is_404(world: World, actor: str) -> None:
    client = world.clients[actor]
    theirs = world.ids[OTHER]
    for url in [
        f"/advertisers/{OWN}/campaigns/{theirs['campaign']}",
        f"/advertisers/{OWN}/ads/{theirs['ad']}",
        f"/advertisers/{OWN}/corrections/{theirs['correction']}",
        f"/api/v1/advertisers/{OWN}/campaigns/{theirs['campaign']}",
        f"/api/v1/advertisers/{OWN}/ads/{theirs['ad']}",
        f"/api/v1/advertisers/{OWN}/corrections/{theirs['correction']}",
    ]:
        response = client.get(url)
        assert response.status_code == 404, url
        assert OTHER not in response.get_data(as_text=True)


def test_an_advertiser_sees_its_own_campaigns_budgets_and_not_charged_clicks_only(world: World) -> None:
    """The budget history on the campaign page, the days of each budget on the dashboard, the clicks not charged:
    each advertiser its own; another's campaign answers 404, as one that does not exist."""
    latest = world.clients["ada"].get("/api/v1/periods").json["periods"][-1]["period"]
    day = f"{latest[:4]}-{latest[4:6]}-{latest[6:8]}"
    for actor, advertiser, n in (("alice", OWN, 0), ("bob", OTHER, 1)):
        client, campaign = world.clients[actor], world.ids[advertiser]["campaign"]
        doc = client.get(f"/api/v1/advertisers/{advertiser}/campaigns/{campaign}?from={day}&to={day}").json
        assert doc["budget"]["daily_budget_micros"] == str(PLANTED_BUDGETS[n])
        assert [(e["made_by"], e["door"]) for e in doc["budget"]["history"]] == [("ada", "command")]
        assert [d["day"] for d in doc["budget_days"]] == [day]
        assert doc["budget_days"][0]["over_budget"]["clicks"] >= PLANTED_OVER[n]  # the sample's own add to it
        page = client.get(f"/advertisers/{advertiser}/campaigns/{campaign}?from={day}&to={day}").text
        assert display.money(PLANTED_BUDGETS[n], world.seeded.catalog.currency_of(advertiser) or "") in page
        dashboard = client.get(f"/api/v1/advertisers/{advertiser}/dashboard?from={day}&to={day}").json
        assert {d["campaign_id"] for d in dashboard["budget_days"]} == {campaign}
        assert dashboard["not_charged"]["invalid"]["clicks"] >= PLANTED_INVALID[n]
        assert dashboard["not_charged"]["over_budget"]["clicks"] >= PLANTED_OVER[n]
    theirs = world.ids[OTHER]["campaign"]
    alice = world.clients["alice"]
    for forbidden, missing in [
        (f"/advertisers/{OTHER}/campaigns/{theirs}", "/advertisers/adv-9999/campaigns/no-such-cmp"),
        (f"/api/v1/advertisers/{OTHER}/campaigns/{theirs}", "/api/v1/advertisers/adv-9999/campaigns/no-such-cmp"),
        (f"/catalog/campaigns/{theirs}", "/catalog/campaigns/no-such-cmp"),
        (f"/api/v1/catalog/campaigns/{theirs}/budgets", "/api/v1/catalog/campaigns/no-such-cmp/budgets"),
        ("/catalog/budgets", "/catalog/no-such-page"),
        ("/api/v1/catalog/ip-exclusions", "/api/v1/catalog/no-such-route"),
    ]:
        a, b = alice.get(forbidden), alice.get(missing)
        assert (a.status_code, a.get_data()) == (b.status_code, b.get_data()) and a.status_code == 404, forbidden
    assert alice.get(f"/advertisers/{OWN}/campaigns/{theirs}").status_code == 404
    fiona = world.clients["fiona"]
    assert fiona.get("/catalog/ip-exclusions").status_code == 404  # the operator's list: an admin's only
    assert 'id="set-budget"' not in fiona.get(f"/catalog/campaigns/{theirs}").text  # finance reads, never changes


def test_query_arguments_do_not_widen_what_an_advertiser_sees(world: World) -> None:
    alice = world.clients["alice"]
    for url in [
        f"/api/v1/advertisers/{OWN}/dashboard?advertiser_id={OTHER}",
        f"/advertisers/{OWN}?advertiser={OTHER}",
        f"/api/v1/advertisers?advertiser_id={OTHER}",
    ]:
        response = alice.get(url)
        assert response.status_code == 200 and OTHER not in response.get_data(as_text=True), url
    assert alice.get("/api/v1/advertisers").json == {"advertisers": [{"advertiser_id": OWN, "currency": "EUR"}]}
    assert alice.get(f"/advertisers/{OWN}?period=../../etc").status_code == 400
    assert alice.get(f"/api/v1/advertisers/{OTHER}/dashboard?period=../../etc").status_code == 404, "access first"
    # A well-formed period without data is zero spend, for one's own advertiser only.
    empty = alice.get(f"/api/v1/advertisers/{OWN}/dashboard?period=20990101T0000Z")
    assert empty.status_code == 200 and empty.json["totals"]["corrected"] == {"clicks": 0, "micros": "0"}
    assert alice.get(f"/api/v1/advertisers/{OTHER}/dashboard?period=20990101T0000Z").status_code == 404


def test_finance_and_admin_list_every_advertiser(world: World) -> None:
    for actor in ("fiona", "ada"):
        listed = [a["advertiser_id"] for a in world.clients[actor].get("/api/v1/advertisers").json["advertisers"]]
        assert listed == [OWN, OTHER, THIRD]


def test_exports_only_by_name_of_a_closed_periods_folder(world: World) -> None:
    fiona = world.clients["fiona"]
    assert fiona.get(f"/exports/{world.export_period}/manifest.json").json["period"] == world.export_period
    for url in [
        f"/exports/{world.export_period}/../users.json",
        f"/exports/{world.export_period}/users.json",
        "/exports/..%2F..%2Fusers.json/billing.csv",
        "/exports/20260101T0000Z/billing.csv",  # closed but not exported in this sample
    ]:
        assert fiona.get(url).status_code == 404, url
    # The last case asks for a period that is closed indeed, and has no export folder.
    closed = {p["period"] for p in fiona.get("/api/v1/periods").json["periods"] if p["closed"]}
    assert "20260101T0000Z" in closed and world.export_period in closed
    assert not (world.seeded.settings.root / "exports" / "20260101T0000Z").exists()


@pytest.mark.parametrize("actor", ["alice", "bob", "fiona", "ada"])
def test_logout_and_login_posts_for_every_actor(world: World, actor: str) -> None:
    client = world.app.test_client()
    assert login(client, actor).status_code == 302
    token = form_token(client.get("/", follow_redirects=True).text)
    assert client.post("/logout", data={"csrf_token": token}).status_code == 302
    assert client.get("/api/v1/me").status_code == 401
    wrong = login(client, actor, password="not the password at all")
    assert wrong.status_code == 200 and "Wrong username or password" in wrong.text


def test_anonymous_posts_are_refused_without_a_token(world: World) -> None:
    anonymous = world.app.test_client()
    assert anonymous.post("/logout").status_code == 400
    assert anonymous.post("/login", data={"username": "alice", "password": "x"}).status_code == 400


# The catalog: advertisers' ads (theirs only), every ad for finance and admin, changes by an admin only ----------------
CATALOG_READ = {
    "/catalog/changes",
    "/api/v1/catalog/changes",
    "/catalog",
    "/catalog/ads/<ad_id>",
    "/api/v1/catalog/ads",
    "/api/v1/catalog/ads/<ad_id>",
    "/api/v1/catalog/ads/<ad_id>/prices",
    "/catalog/budgets",
    "/catalog/campaigns/<campaign_id>",
    "/api/v1/catalog/budgets",
    "/api/v1/catalog/campaigns/<campaign_id>/budgets",
}
# The IP exclusion list is the operator's: an admin's only, to see and to change.
EXCLUSIONS = {"/catalog/ip-exclusions", "/api/v1/catalog/ip-exclusions"}
# Each POST-only route, with a change it accepts from an admin (an ad planned far ahead, so nothing read here moves).
FAR_AHEAD_MS = 4_102_444_800_000  # 2100-01-01T00:00Z
CATALOG_POST_ROUTES = {
    "/catalog/ads": (
        "/catalog/ads",
        {"ad_id": "matrix-page-ad", "campaign_id": "matrix-cmp", "advertiser_id": OWN, "currency": "EUR",
         "cpc_micros": "5", "effective_from": str(FAR_AHEAD_MS)},
    ),
    "/catalog/ads/<ad_id>/changes": (
        "/catalog/ads/matrix-page-ad/changes",
        {"action": "set-price", "cpc_micros": "6", "effective_from": str(FAR_AHEAD_MS + 1)},
    ),
    "/api/v1/catalog/ads/<ad_id>/prices": (
        "/api/v1/catalog/ads/matrix-page-ad/prices", {"cpc_micros": 7, "effective_from": FAR_AHEAD_MS + 2}
    ),
    "/catalog/campaigns/<campaign_id>/budgets": (
        "/catalog/campaigns/matrix-cmp/budgets", {"daily_micros": "9000000", "effective_from": str(FAR_AHEAD_MS + 3)}
    ),
    "/api/v1/catalog/campaigns/<campaign_id>/budgets": (
        "/api/v1/catalog/campaigns/matrix-cmp/budgets",
        {"daily_budget_micros": "9500000", "effective_from": FAR_AHEAD_MS + 4},
    ),
    "/catalog/ip-exclusions": (
        "/catalog/ip-exclusions", {"cidr": "198.51.100.0/24", "action": "exclude", "effective_from": str(FAR_AHEAD_MS)}
    ),
    "/api/v1/catalog/ip-exclusions": (
        "/api/v1/catalog/ip-exclusions", {"cidr": "2001:db8::/32", "excluded": True, "effective_from": FAR_AHEAD_MS}
    ),
    "/catalog/ads/<ad_id>/name": ("/catalog/ads/matrix-page-ad/name", {"name": "Spring sale, banner"}),
    "/catalog/campaigns/<campaign_id>/name": ("/catalog/campaigns/matrix-cmp/name", {"name": "Spring sale"}),
}  # fmt: skip
API_CREATE = {"ad_id": "matrix-api-ad", "campaign_id": "matrix-cmp", "advertiser_id": OWN, "currency": "EUR",
              "cpc_micros": 5, "effective_from": FAR_AHEAD_MS}  # fmt: skip


def catalog_get_routes(world: World, adv: str) -> dict[str, str]:
    ad, campaign = world.ids[adv]["ad"], world.ids[adv]["campaign"]
    return {
        "/advertisers/<advertiser_id>/ads": f"/advertisers/{adv}/ads",
        "/api/v1/advertisers/<advertiser_id>/ads": f"/api/v1/advertisers/{adv}/ads",
        "/catalog": "/catalog",
        "/catalog/ads/<ad_id>": f"/catalog/ads/{ad}",
        "/api/v1/catalog/ads": "/api/v1/catalog/ads",
        "/api/v1/catalog/ads/<ad_id>": f"/api/v1/catalog/ads/{ad}",
        "/api/v1/catalog/ads/<ad_id>/prices": f"/api/v1/catalog/ads/{ad}/prices",
        "/catalog/budgets": "/catalog/budgets",
        "/catalog/campaigns/<campaign_id>": f"/catalog/campaigns/{campaign}",
        "/api/v1/catalog/budgets": "/api/v1/catalog/budgets",
        "/api/v1/catalog/campaigns/<campaign_id>/budgets": f"/api/v1/catalog/campaigns/{campaign}/budgets",
        "/catalog/ip-exclusions": "/catalog/ip-exclusions",
        "/api/v1/catalog/ip-exclusions": "/api/v1/catalog/ip-exclusions",
    }


def test_an_advertisers_ads_of_another_answer_exactly_like_an_advertiser_that_does_not_exist(world: World) -> None:
    alice = world.clients["alice"]
    for forbidden, missing in [
        (f"/advertisers/{OTHER}/ads", "/advertisers/adv-9999/ads"),
        (f"/api/v1/advertisers/{OTHER}/ads", "/api/v1/advertisers/adv-9999/ads"),
        (f"/catalog/ads/{world.ids[OTHER]['ad']}", "/catalog/ads/no-such-ad"),
        (f"/api/v1/catalog/ads/{world.ids[OTHER]['ad']}", "/api/v1/catalog/ads/no-such-ad"),
    ]:
        a, b = alice.get(forbidden), alice.get(missing)
        assert (a.status_code, a.get_data()) == (b.status_code, b.get_data()) and a.status_code == 404, forbidden
    listed = alice.get(f"/api/v1/advertisers/{OWN}/ads").json
    assert listed["ads"] and {a["advertiser_id"] for a in listed["ads"]} == {OWN}


@pytest.mark.parametrize("actor", ACTORS)
def test_catalog_changes_by_each_actor_with_its_session_and_its_token(world: World, actor: str) -> None:
    """Only an admin changes the catalog; anyone else logged in gets 404 (the route does not exist for it), an
    anonymous visitor 400 on a page (no session, no CSRF token) and 401 on the API; a token needs no CSRF token."""
    client = world.clients[actor]
    token = form_token(client.get("/", follow_redirects=True).text) if actor != "anonymous" else ""
    admin = actor == "ada"
    settings = world.seeded.settings
    before = catalog_rows(settings.database_url)
    for rule, (url, fields) in CATALOG_POST_ROUTES.items():
        if url.startswith("/api/"):
            response = client.post(url, json=fields, headers={"X-CSRF-Token": token})
            want = 401 if actor == "anonymous" else 201 if admin else 404
        else:
            response = client.post(url, data={**fields, "csrf_token": token})
            want = 400 if actor == "anonymous" else 303 if admin else 404
        assert response.status_code == want, (rule, response.status_code, response.get_data(as_text=True)[:300])
    scripted = world.app.test_client()
    headers = bearer(world.tokens[actor]) if actor in world.tokens else {}
    created = scripted.post("/api/v1/catalog/ads", json=API_CREATE, headers=headers)
    assert created.status_code == (401 if actor == "anonymous" else 201 if admin else 404)
    if admin:
        made = json.loads(settings.catalog_store().current().to_json())
        assert {"matrix-page-ad", "matrix-api-ad"} <= {ad["ad_id"] for ad in made["ads"]}
        assert [b["daily_budget_micros"] for b in made["budgets"]["matrix-cmp"]] == [9_000_000, 9_500_000]
        assert {(e["cidr"], e["door"]) for e in made["ip_exclusions"]} == {
            ("198.51.100.0/24", "page"),
            ("2001:db8::/32", "api"),  # the browser's session on the API
        }
    else:
        assert catalog_rows(settings.database_url) == before, f"{actor} changed the catalog"


def test_a_non_admins_change_answers_exactly_like_one_to_a_route_that_does_not_exist(world: World) -> None:
    for actor in ("alice", "bob", "fiona"):
        scripted = world.app.test_client()
        real = scripted.post(
            f"/api/v1/catalog/ads/{world.ids[OWN]['ad']}/prices",
            json={"cpc_micros": 5},
            headers=bearer(world.tokens[actor]),
        )
        missing = scripted.post("/api/v1/no-such-route", json={"cpc_micros": 5}, headers=bearer(world.tokens[actor]))
        assert (
            (real.status_code, real.get_data())
            == (missing.status_code, missing.get_data())
            == (404, missing.get_data())
        )


# API tokens: exactly the account's access, on the API only -----------------------------------------------------
def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize("actor", ["alice", "bob", "fiona", "ada"])
def test_a_token_opens_every_api_route_exactly_as_its_accounts_session_and_no_page(world: World, actor: str) -> None:
    scripted = world.app.test_client()  # no cookie: the token is the only credential
    failures = []
    for rule, url in get_routes(world, OWN).items():
        response = scripted.get(url, headers=bearer(world.tokens[actor]))
        want = expected_status(actor if rule.startswith("/api/") else "anonymous", rule)
        if response.status_code != want:
            failures.append(f"{url}: {response.status_code}, expected {want}")
        elif rule.startswith("/api/"):
            assert response.get_data() == world.clients[actor].get(url).get_data(), url
    assert not failures, "\n".join(failures)


def test_another_advertisers_token_gets_404_like_an_id_that_does_not_exist(world: World) -> None:
    bob = world.app.test_client()
    for rule, url in get_routes(world, OWN).items():
        if rule.startswith("/api/") and ("<advertiser_id>" in rule or rule in CLICK_ROUTES):
            response = bob.get(url, headers=bearer(world.tokens["bob"]))
            assert response.status_code == 404 and OWN not in response.get_data(as_text=True), url
    mine = bob.get(f"/api/v1/advertisers/{OTHER}/dashboard", headers=bearer(world.tokens["bob"]))
    assert mine.status_code == 200 and mine.json["advertiser_id"] == OTHER


@pytest.mark.parametrize("actor", ["fiona", "ada"])
def test_every_file_url_the_exports_api_lists_opens_with_a_token(world: World, actor: str) -> None:
    """Scripts fetch what the API lists: each file's `url`, with the same token, its bytes matching the manifest."""
    import hashlib

    scripted = world.app.test_client()
    listed = scripted.get("/api/v1/exports", headers=bearer(world.tokens[actor])).json["exports"]
    assert listed
    for export in listed:
        for f in export["files"]:
            response = scripted.get(f["url"], headers=bearer(world.tokens[actor]))
            assert response.status_code == 200, f["url"]
            assert hashlib.sha256(response.get_data()).hexdigest() == f["sha256"], f["url"]
            assert response.headers["Cache-Control"] == "no-store"
    for name in ("manifest.json", "SHA256SUMS"):
        url = f"/api/v1/exports/{world.export_period}/{name}"
        assert scripted.get(url, headers=bearer(world.tokens[actor])).status_code == 200, url
    for actor_without in ("alice", "bob"):
        assert (
            scripted.get(listed[0]["files"][0]["url"], headers=bearer(world.tokens[actor_without])).status_code == 404
        )
    assert (
        scripted.get(
            f"/api/v1/exports/{world.export_period}/users.json", headers=bearer(world.tokens[actor])
        ).status_code
        == 404
    )


def test_a_revoked_unknown_or_malformed_token_and_a_disabled_accounts_token_get_401(world: World) -> None:
    settings = world.seeded.settings
    accounts = settings.accounts_store()
    store = settings.tokens_store(accounts)
    token, record = store.create("fiona")
    client = world.app.test_client()
    assert client.get("/api/v1/me", headers=bearer(token)).json["username"] == "fiona"
    assert store.revoke("fiona", record.token_id) == [record.token_id]
    for header in (
        bearer(token),  # revoked
        bearer(world.tokens["fiona"][:-4] + "AAAA"),  # the id of a live token with a wrong secret
        bearer(world.tokens["fiona"][:-1]),  # malformed
        {"Authorization": "Basic ZmlvbmE6eA=="},
    ):
        response = client.get("/api/v1/finance", headers=header)
        assert response.status_code == 401, header
        assert response.json == {"error": "invalid or revoked token", "status": 401}
        assert 'error="invalid_token"' in response.headers["WWW-Authenticate"]
    # A bad token is refused even beside a good session cookie: the header is the only credential looked at.
    assert world.clients["fiona"].get("/api/v1/me", headers=bearer(token)).status_code == 401
    assert world.clients["fiona"].get("/api/v1/me").status_code == 200
    # A disabled account's token opens nothing; enabled again, it works again.
    token, _ = store.create("bob")
    accounts.set_disabled("bob", True)
    try:
        assert client.get("/api/v1/me", headers=bearer(token)).status_code == 401
    finally:
        accounts.set_disabled("bob", False)
    assert client.get("/api/v1/me", headers=bearer(token)).status_code == 200
    assert login(world.clients["bob"], "bob").status_code == 302  # bob's session ended with the disable


def test_tokens_are_hashed_at_rest_and_shown_once_by_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], database: str
) -> None:
    from ops.cli import main

    monkeypatch.setenv("ADBILL_HOME", str(tmp_path))
    monkeypatch.setenv("ADBILL_DATABASE_URL", database)
    AccountsDatabase(database).add("ada", Role.ADMIN, "correct horse battery staple")
    assert main(["tokens", "create", "ada"]) == 0
    out = capsys.readouterr()
    token = out.out.strip()
    assert token.startswith("adbill_") and "shown this once" in out.err
    kept = json.dumps(catalog_rows(database))
    secret = token.split("_", 2)[2]  # what follows adbill_<id>_, underscores of its own included
    assert token not in kept and secret not in kept
    assert hashlib.sha256(token.encode()).hexdigest() in kept, "only its SHA-256 is kept"
    assert not list(tmp_path.glob("api-tokens*")), "no tokens file is written"
    assert main(["tokens", "list", "ada"]) == 0
    listed = capsys.readouterr().out
    assert listed.startswith(token.split("_")[1] + "\tada\t") and token not in listed
    assert main(["tokens", "revoke", "ada"]) == 0
    assert main(["tokens", "create", "nobody"]) == 1
    assert "no account nobody" in capsys.readouterr().err


# Campaigns stay inside their advertiser --------------------------------------------------------------------------
SHARED = "spring-sale"


def test_a_catalog_where_two_advertisers_share_a_campaign_id_is_refused() -> None:
    ads = [Ad("own-ad", SHARED, OWN, 250_000, "EUR"), Ad("other-ad", SHARED, OTHER, 1_000_000, "EUR")]
    with pytest.raises(ValueError, match=f"campaign {SHARED} belongs to advertiser {OWN} and to {OTHER}"):
        Catalog(ads)
    with pytest.raises(ValueError, match=f"campaign {SHARED} belongs to advertiser {OWN} and to {OTHER}"):
        Catalog.from_json(json.dumps({"format": FORMAT, "ads": [ad.to_dict() for ad in ads]}))
    assert len(Catalog([*ads[:1], Ad("own-ad-2", SHARED, OWN, 1, "EUR")])) == 2, "one advertiser's campaign is fine"


def test_a_campaign_id_that_named_another_advertisers_campaign_shows_each_only_its_own_micros(
    tmp_path: Path, redis_server: LocalRedis, database: str
) -> None:
    """The catalog refuses a shared campaign id, but ids can move between advertisers from one catalog to the
    next: the totals of the hour when the id was adv-0000's stay adv-0000's, those of the next hour adv-0001's."""
    settings = isolated_settings(
        home=tmp_path,
        database_url=database,
        redis_url=redis_server.url,
        redis_prefix=f"t{uuid.uuid4().hex[:10]}",
    )
    seeded = seed(settings)
    hours = Periods()
    earlier, later = FIRST_PERIOD_MS + 4 * hours.length_ms, FIRST_PERIOD_MS + 5 * hours.length_ms
    batch = (seeded.writer.totals.last_applied("billing") or 0) + 1
    seeded.writer.bill(batch, [TotalsRow(hours.key(earlier), earlier, OWN, SHARED, "own-ad", 3, 750_000)])
    seeded.writer.bill(batch + 1, [TotalsRow(hours.key(later), later, OTHER, SHARED, "other-ad", 7, 7_000_000)])
    app = create_app(settings, cache_s=0)
    clients = {name: app.test_client() for name in ("alice", "bob", "fiona")}
    for name, client in clients.items():
        assert login(client, name).status_code == 302

    def billed(actor: str, advertiser: str) -> dict[str, int]:
        response = clients[actor].get(f"/api/v1/advertisers/{advertiser}/campaigns/{SHARED}")
        assert response.status_code == 200, (actor, advertiser)
        series = response.json["series"]
        return {p["period"]: int(p["provisional"]["micros"]) for p in series if int(p["provisional"]["micros"])}

    def seen() -> None:
        assert billed("alice", OWN) == billed("fiona", OWN) == {hours.key(earlier): 750_000}
        assert billed("bob", OTHER) == billed("fiona", OTHER) == {hours.key(later): 7_000_000}
        for actor, own, other, others_ad in (("alice", OWN, OTHER, "other-ad"), ("bob", OTHER, OWN, "own-ad")):
            page = clients[actor].get(f"/advertisers/{own}/campaigns/{SHARED}")
            assert page.status_code == 200 and other not in page.text and others_ad not in page.text
            assert clients[actor].get(f"/api/v1/advertisers/{other}/campaigns/{SHARED}").status_code == 404

    seen()
    # A catalog in which both advertisers have the campaign at once never reaches the running UI: written into the
    # catalog's database behind the product's back, its constraints refuse it whole; the UI keeps the catalog it had.
    own, other = seeded.catalog.currency_of(OWN) or "", seeded.catalog.currency_of(OTHER) or ""
    shared = [Ad("own-ad", SHARED, OWN, 250_000, own), Ad("other-ad", SHARED, OTHER, 10**6, other)]
    before = catalog_rows(database)
    with (
        psycopg.connect(database, autocommit=True) as connection,
        pytest.raises(psycopg.errors.IntegrityError, match="campaigns_pkey"),
        connection.transaction(),
    ):
        for ad in shared:
            connection.execute(
                "INSERT INTO campaigns (campaign_id, advertiser_id) VALUES (%s, %s)",
                (ad.campaign_id, ad.advertiser_id),
            )
            connection.execute(
                "INSERT INTO ads (ad_id, campaign_id, advertiser_id, currency) VALUES (%s, %s, %s, %s)",
                (ad.ad_id, ad.campaign_id, ad.advertiser_id, ad.currency),
            )
    assert catalog_rows(database) == before
    seen()
    assert clients["alice"].get("/api/v1/advertisers").json["advertisers"] == [
        {"advertiser_id": OWN, "currency": "EUR"}
    ]
    # Through the doors, the change that would give the campaign a second advertiser is refused, naming both, and
    # writes nothing.
    store = settings.catalog_store()
    store.change(AdChange("own-ad", 0, 250_000, SHARED, OWN, own), backfill=True)
    before = catalog_rows(database)
    with pytest.raises(CatalogError, match=f"campaign {SHARED} belongs to advertiser {OWN}, not {OTHER}"):
        store.change(AdChange("other-ad", 0, 10**6, SHARED, OTHER, other), backfill=True)
    assert catalog_rows(database) == before
    seeded.client.close()


# A click's story: an advertiser's own clicks only; the catalog's change log: finance and admin ----------------------
CLICK_ROUTES = {"/clicks/<click_id>", "/api/v1/clicks/<click_id>"}


def story_get_routes(world: World, adv: str) -> dict[str, str]:
    click = world.ids[adv]["click"]
    return {
        "/clicks": "/clicks",
        "/clicks/<click_id>": f"/clicks/{click}",
        "/api/v1/clicks/<click_id>": f"/api/v1/clicks/{click}",
        "/catalog/changes": "/catalog/changes",
        "/api/v1/catalog/changes": "/api/v1/catalog/changes",
    }


def test_a_click_never_received_says_so_to_finance_and_admin_and_is_404_to_an_advertiser(world: World) -> None:
    for actor in ("fiona", "ada"):
        page = world.clients[actor].get("/clicks/click-never-received")
        assert page.status_code == 404 and "Never received" in page.text
        document = world.clients[actor].get("/api/v1/clicks/click-never-received")
        assert document.json == {"error": "no click click-never-received was ever received", "status": 404}
    alice = world.clients["alice"]
    assert alice.get("/clicks/click-never-received").get_data() == alice.get("/advertisers/adv-9999").get_data()
    own = alice.get(f"/api/v1/clicks/{world.ids[OWN]['click']}").json
    assert own["outcome"]["status"] == "charged" and own["advertiser_id"] == OWN
    assert isinstance(own["outcome"]["amount_micros"], str)
    # With the click's day (its UTC day): the same document; a day that is not one is refused.
    day = dt.datetime.fromtimestamp(own["event_time"] / 1000, dt.UTC).date().isoformat()
    with_day = alice.get(f"/api/v1/clicks/{world.ids[OWN]['click']}?day={day}").json
    assert with_day.pop("searched") == {**own.pop("searched"), "day": day} and with_day == own
    assert alice.get(f"/clicks/{world.ids[OWN]['click']}?day=2026-13-01").status_code == 400
    assert (
        alice.get(f"/clicks?click_id={world.ids[OWN]['click']}")
        .headers["Location"]
        .endswith(f"/clicks/{world.ids[OWN]['click']}")
    )


def test_past_the_story_horizon_each_door_says_where_it_looked_and_an_advertiser_sees_its_own_only(
    world: World,
) -> None:
    """The app's clock 200 days after the planted clicks and the stream's newest period 199 days after them, a horizon
    of 90 days: without a day, the plain answer (finance: a 404 that says where it looked; an advertiser: 404 as for
    any click it may not see); with the day, what the day's export gave finance, marked as such, on the page, in the
    API and from `adbill explain`."""
    start = Periods().parse_key(world.export_period)
    settings = dataclasses.replace(world.seeded.settings, story_days=90)
    # The stream went on after the planted clicks: a period 199 days later in the data folder (the horizon counts
    # back from the newest day the folder holds), removed at the end for the module's other tests.
    newer = settings.layout.ledger / f"period={Periods().key_of(start + 199 * 86_400_000)}"
    newer.mkdir(parents=True)
    try:
        lag = LagReading({"clicks": 0, "impressions": 0}, True, 0)
        app = create_app(settings, clock=lambda: start + 200 * 86_400_000, kafka_lag=lambda: lag)
        alice, fiona = app.test_client(), app.test_client()
        assert login(alice, "alice").status_code == 302 and login(fiona, "fiona").status_code == 302
        mine, theirs = world.ids[OWN]["click"], world.ids[OTHER]["click"]
        day = dt.datetime.fromtimestamp(start / 1000, dt.UTC).date().isoformat()

        plain = fiona.get(f"/api/v1/clicks/{mine}")
        assert plain.status_code == 404 and plain.json["searched"]["past_horizon"] is True
        assert "is not among the clicks of the last 90 days" in plain.json["error"] and "?day=" in plain.json["error"]
        page = fiona.get(f"/clicks/{mine}")
        assert (
            page.status_code == 404
            and "Not found in the last 90 days" in page.text
            and "Never received" not in page.text
        )
        assert alice.get(f"/api/v1/clicks/{mine}").status_code == 404

        told = alice.get(f"/api/v1/clicks/{mine}?day={day}").json
        assert (told["outcome"]["status"], told["outcome"]["settled_by"], told["advertiser_id"]) == (
            "charged",
            "export",
            OWN,
        )
        assert told["searched"]["from_exports"] is True and told["copies"] == [] and told["stream"] == []
        assert [row["file"] for row in told["exports"]] == ["billing.parquet"]
        page = alice.get(f"/clicks/{mine}?day={day}")
        assert (
            page.status_code == 200
            and "From the finance exports" in page.text
            and "The live bill did not" not in page.text
        )
        assert alice.get(f"/api/v1/clicks/{theirs}?day={day}").status_code == 404  # another advertiser's, as before
        assert fiona.get(f"/api/v1/clicks/{theirs}?day={day}").json["advertiser_id"] == OTHER
        assert alice.get(f"/api/v1/clicks/{mine}?day=2099-01-01").status_code == 400  # after the app's today

        env = {k: v for k, v in os.environ.items() if not k.startswith("ADBILL_")} | settings.to_env()
        explain = [sys.executable, "-m", "ops.cli", "explain", mine, "--json"]
        without = subprocess.run(explain, env=env, capture_output=True, text=True, check=False, timeout=120)
        assert without.returncode == 1 and json.loads(without.stdout)["outcome"]["status"] == "past_horizon"
        with_day = subprocess.run(
            [*explain, "--day", day], env=env, capture_output=True, text=True, check=False, timeout=120
        )
        assert with_day.returncode == 0, with_day.stderr
        command = json.loads(with_day.stdout)  # the command's clock is the machine's: its `since` is its own
        assert {k: v for k, v in command["searched"].items() if k != "since"} == {
            k: v for k, v in told["searched"].items() if k != "since"
        }
        assert command["why"] == fiona.get(f"/api/v1/clicks/{mine}?day={day}").json["why"]
    finally:
        newer.rmdir()


# Invoices and billing profiles -------------------------------------------------------------------------------------
def test_an_advertiser_sees_only_its_own_invoices_and_another_s_answers_like_none(world: World) -> None:
    alice = world.clients["alice"]
    listed = alice.get(f"/api/v1/advertisers/{OWN}/invoices").json["invoices"]
    assert [(i["label"], i["advertiser_id"]) for i in listed] == [("INV-000001", OWN)]
    for forbidden, missing in [
        (f"/advertisers/{OTHER}/invoices/{INVOICED}", "/advertisers/adv-9999/invoices/2025-12"),
        (f"/advertisers/{OTHER}/invoices/{INVOICED}/invoice.pdf", "/advertisers/adv-9999/invoices/2025-12/invoice.pdf"),
        (f"/api/v1/advertisers/{OTHER}/invoices/{INVOICED}", "/api/v1/advertisers/adv-9999/invoices/2025-12"),
        (f"/api/v1/advertisers/{OTHER}/invoices", "/api/v1/advertisers/adv-9999/invoices"),
        (f"/billing-profiles/{OTHER}", "/billing-profiles/adv-9999"),
        ("/finance/invoices", "/finance/no-such-page"),
    ]:
        a, b = alice.get(forbidden), alice.get(missing)
        assert (a.status_code, a.get_data()) == (b.status_code, b.get_data()) and a.status_code == 404, forbidden
    # An invoice that was never issued (THIRD had no December activity) is 404 for finance too.
    assert world.clients["fiona"].get(f"/advertisers/{THIRD}/invoices/{INVOICED}").status_code == 404
    assert world.clients["fiona"].get(f"/advertisers/{OTHER}/invoices/{INVOICED}").status_code == 200


@pytest.mark.parametrize("actor", ACTORS)
def test_only_an_admin_sets_a_billing_profile(world: World, actor: str) -> None:
    client = world.clients[actor]
    token = form_token(client.get("/", follow_redirects=True).text) if actor != "anonymous" else ""
    fields = {"name": f"Matrix {actor}", "address": "1 Test St", "tax_id": "", "tax_rate": "0"}
    response = client.post(f"/billing-profiles/{THIRD}", data={**fields, "effective_from": "", "csrf_token": token})
    want = 400 if actor == "anonymous" else 303 if actor == "ada" else 404
    assert response.status_code == want, (actor, response.status_code)
    profiles = world.seeded.settings.profile_store().current()
    names = {p.name for p in profiles.history(THIRD)}
    assert (f"Matrix {actor}" in names) == (actor == "ada")
