"""The catalog in the web UI: an admin creates ads and sets, pauses and resumes prices through the page and the API;
the web refuses what `adbill catalog` refuses, with its one-line message, and a refused change leaves every row as it
was; the changes land in the catalog's database that every part of the product reads (`CatalogDatabase`);
advertisers see their own ads only; the unbilled counts show.

Real Redis (the session's server, a prefix per test), a real data folder and a PostgreSQL database of the test's own,
the Flask test client; the command line runs in-process (`ops.cli.main`) against the same data folder and database.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator

import pytest

from billing.store.redis_totals import RedisTotals, UnbilledCount
from ops.settings import Settings
from tests.catalog_rows import catalog_rows
from tests.web_support import OTHER, OWN, SignedIn, form_token, iso, now_ms
from web import display

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000
PRICE, RAISED = display.money(250_000, "EUR"), display.money(1_250_000, "EUR")  # 0.25 and 1.25 EUR


class Web(SignedIn):
    def form(self, actor: str, page: str = "/catalog") -> str:
        """A CSRF token of the actor's session, from a page it may see."""
        return form_token(self.clients[actor].get(page).text)

    def api(self, actor: str, path: str, body: object) -> tuple[int, dict[str, object]]:
        response = self.app.test_client().post(
            f"/api/v1{path}", json=body, headers={"Authorization": f"Bearer {self.tokens[actor]}"}
        )
        return response.status_code, response.json  # type: ignore[return-value]


@pytest.fixture
def web(redis_settings: Settings) -> Iterator[Web]:
    signed_in = Web.of(redis_settings)
    yield signed_in
    signed_in.seeded.client.close()


def own_ad(web: Web, advertiser: str = OWN) -> str:
    return next(ad.ad_id for ad in web.seeded.catalog if ad.advertiser_id == advertiser)


# Changes through the page -----------------------------------------------------------------------------------------
def test_an_admin_creates_an_ad_and_changes_its_price_on_the_page_and_the_catalog_database_holds_it(web: Web) -> None:
    ada = web.clients["ada"]
    token = web.form("ada")
    version = web.catalog.version
    created = ada.post(
        "/catalog/ads",
        data={
            "csrf_token": token,
            "ad_id": "spring-ad-1",
            "campaign_id": f"{OWN}-cmp-000",
            "advertiser_id": OWN,
            "currency": "EUR",
            "cpc_micros": "250000",
            "effective_from": "",
        },
    )
    assert created.status_code == 303
    assert created.headers["Location"] == f"/catalog/ads/spring-ad-1?made={version + 1}"
    ad = web.catalog["spring-ad-1"]
    assert (ad.campaign_id, ad.advertiser_id, ad.currency, ad.price_at(now_ms())) == (
        f"{OWN}-cmp-000",
        OWN,
        "EUR",
        250_000,
    )
    page = ada.get(created.headers["Location"])
    assert page.status_code == 200 and "Change made: catalog version" in page.text and PRICE in page.text

    later = now_ms() + HOUR_MS
    raised = ada.post(
        "/catalog/ads/spring-ad-1/changes",
        data={"csrf_token": token, "action": "set-price", "cpc_micros": "1250000", "effective_from": iso(later)},
    )
    assert raised.status_code == 303
    ad = web.catalog["spring-ad-1"]
    planned = later // 1000 * 1000
    assert [(p.effective_from, p.cpc_micros) for p in ad.prices][1:] == [(planned, 1_250_000)]
    assert ad.price_at(planned - 1) == 250_000 and ad.price_at(planned) == 1_250_000
    page = ada.get("/catalog/ads/spring-ad-1").text
    assert "planned" in page and RAISED in page

    assert (
        ada.post("/catalog/ads/spring-ad-1/changes", data={"csrf_token": token, "action": "pause"}).status_code == 303
    )
    assert web.catalog["spring-ad-1"].price_at(now_ms()) == "ad_paused"
    assert ada.get("/catalog/ads/spring-ad-1").text.count("ad-paused") >= 1
    resumed = ada.post("/catalog/ads/spring-ad-1/changes", data={"csrf_token": token, "action": "resume"})
    assert resumed.status_code == 303
    assert web.catalog["spring-ad-1"].price_at(now_ms()) == 250_000  # back to the last price
    assert web.catalog.version == version + 4

    # The advertiser sees its new ad with its status and history; another advertiser does not.
    mine = web.clients["alice"].get(f"/advertisers/{OWN}/ads").text
    assert "spring-ad-1" in mine and RAISED in mine
    listed = web.clients["alice"].get(f"/api/v1/advertisers/{OWN}/ads").json
    new = next(a for a in listed["ads"] if a["ad_id"] == "spring-ad-1")
    assert new["status"] == "live" and new["cpc_micros"] == "250000"  # micros as strings, as every amount of the API
    made_at = new["next_change"]["made_at"]
    assert new["next_change"] == {"effective_from": planned, "cpc_micros": "1250000", "version": version + 2,
                                  "made_by": "ada", "door": "page", "made_at": made_at}  # fmt: skip
    assert [p["cpc_micros"] for p in new["prices"]] == ["250000", None, "250000", "1250000"]
    assert "spring-ad-1" not in web.clients["bob"].get(f"/advertisers/{OTHER}/ads").text


def test_a_change_through_the_api_with_a_token_lands_in_the_catalog_database(web: Web) -> None:
    status, body = web.api(
        "ada",
        "/catalog/ads",
        {"ad_id": "api-ad", "campaign_id": "api-cmp", "advertiser_id": OWN, "currency": "EUR", "cpc_micros": 90_000},
    )
    assert status == 201 and body["status"] == "live" and body["cpc_micros"] == "90000"
    later = now_ms() + 2 * HOUR_MS
    # A price may be sent as a string of micros, as the API writes it, or as a number.
    status, body = web.api("ada", "/catalog/ads/api-ad/prices", {"cpc_micros": "120000", "effective_from": later})
    token_id = web.tokens["ada"].split("_")[1]
    assert status == 201 and body["made"] == {"effective_from": later, "cpc_micros": "120000", "version": 2,
                                              "made_by": "ada", "door": f"api token {token_id}",
                                              "made_at": body["made"]["made_at"]}  # fmt: skip
    status, body = web.api("ada", "/catalog/ads/api-ad/prices", {"cpc_micros": None})
    assert status == 201 and body["status"] == "paused"
    status, body = web.api("ada", "/catalog/ads/api-ad/prices", {"action": "resume", "cpc_micros": 95_000})
    assert status == 201 and body["status"] == "live" and body["cpc_micros"] == "95000"
    ad = web.catalog["api-ad"]
    assert [(p.cpc_micros, p.version) for p in ad.prices][-1] == (120_000, 2)
    assert ad.price_at(now_ms()) == 95_000 and ad.price_at(later) == 120_000
    read = web.app.test_client().get(
        "/api/v1/catalog/ads/api-ad", headers={"Authorization": f"Bearer {web.tokens['fiona']}"}
    )
    assert read.status_code == 200 and read.json["prices"] == [
        {
            "effective_from": p.effective_from,
            "cpc_micros": None if p.paused else str(p.cpc_micros),
            "version": p.version,
            "made_by": "ada",  # who made each entry, through which door and when: the catalog's change log
            "door": f"api token {token_id}",
            "made_at": entry["made_at"],
        }
        for p, entry in zip(ad.prices, read.json["prices"], strict=True)
    ]


def held_lock(web: Web, hold_s: float) -> tuple[threading.Thread, list[int]]:
    """Another writer (`adbill catalog`, say) holds the catalog's lock for `hold_s` from now, in a thread; the list
    receives when it released it (epoch ms)."""
    store, held, released_ms = web.seeded.settings.catalog_store(), threading.Event(), []

    def other_writer() -> None:
        with store.locked():
            held.set()
            time.sleep(hold_s)
            released_ms.append(now_ms())

    writer = threading.Thread(target=other_writer)
    writer.start()
    assert held.wait(10)
    return writer, released_ms


def test_a_change_that_waits_for_the_lock_takes_effect_when_it_is_made_on_the_page_and_the_api(web: Web) -> None:
    ad_id = own_ad(web)
    writer, released = held_lock(web, 1.0)
    token = web.form("ada", f"/catalog/ads/{ad_id}")
    page = web.clients["ada"].post(
        f"/catalog/ads/{ad_id}/changes", data={"csrf_token": token, "action": "set-price", "cpc_micros": "410000"}
    )
    writer.join(30)
    assert page.status_code == 303
    entry = web.catalog[ad_id].prices[-1]
    assert entry.cpc_micros == 410_000
    # "Now" is read under the lock: the change cannot take effect before the moment it could be made.
    assert entry.effective_from >= released[0] - 5, (entry.effective_from, released[0])

    writer, released = held_lock(web, 1.0)
    status, _ = web.api("ada", f"/catalog/ads/{ad_id}/prices", {"cpc_micros": 420_000})
    writer.join(30)
    assert status == 201
    entry = web.catalog[ad_id].prices[-1]
    assert entry.cpc_micros == 420_000 and entry.effective_from >= released[0] - 5, (entry, released[0])


# Refusals: the form and the API refuse what the command line refuses, with its message ----------------------------
def cli_refusal(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
) -> str:
    """`adbill catalog ARGS` on the same data folder: it must refuse; its one-line message."""
    from ops.cli import main

    for name, value in settings.to_env().items():
        monkeypatch.setenv(name, value)
    before = catalog_rows(settings.database_url)
    assert main(["catalog", *args]) == 1
    assert catalog_rows(settings.database_url) == before
    err = capsys.readouterr().err.strip()
    assert err.startswith("adbill catalog: error: ") and "\n" not in err, err
    return err.removeprefix("adbill catalog: error: ")


def same_message(web_message: str, cli_message: str) -> bool:
    """Equal, but for the instants a message names (`now is ...`: the web and the command ran a moment apart)."""
    instant = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
    return instant.sub("T", web_message) == instant.sub("T", cli_message)


_PAGE_TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"
PAGE_PAST = re.compile(
    rf"the effective time {_PAGE_TIME} is in the past \(now is {_PAGE_TIME}\): "
    r"leave it empty for now, or give a later time"
)
"""A page's own refusal of a past time, in the pages' time format, beside the field (the command's and the API's
message names ISO instants)."""


def page_says(what: str, web_message: str, cli_message: str) -> bool:
    """The page's refusal: the command's message, but for a past time, which the page says in its own terms."""
    return bool(PAGE_PAST.fullmatch(web_message)) if what == "past" else same_message(web_message, cli_message)


def test_each_refusal_of_the_form_and_the_api_is_the_commands_with_its_message(
    web: Web, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = web.seeded.settings
    ad = own_ad(web)
    campaign = web.seeded.catalog[ad].campaign_id
    theirs = web.seeded.catalog[own_ad(web, OTHER)].campaign_id
    past = now_ms() - HOUR_MS
    # (what, form action URL, form fields, API path, API body, the command's arguments, a word of the message)
    cases: list[tuple[str, str, dict[str, str], str, dict[str, object], list[str], str]] = [
        # A price from an hour ago: the past is never re-priced.
        ("past", f"/catalog/ads/{ad}/changes", {"action": "set-price", "cpc_micros": "5", "effective_from": str(past)},
         f"/catalog/ads/{ad}/prices", {"cpc_micros": 5, "effective_from": past},
         ["set-price", ad, "--cpc-micros", "5", "--at", str(past)], "in the past"),
        # A negative price.
        ("negative", f"/catalog/ads/{ad}/changes", {"action": "set-price", "cpc_micros": "-5"},
         f"/catalog/ads/{ad}/prices", {"cpc_micros": "-5"},
         ["set-price", ad, "--cpc-micros=-5"], "must not be negative"),
        # A price that is not a whole number of micros.
        ("fraction", f"/catalog/ads/{ad}/changes", {"action": "set-price", "cpc_micros": "2.5"},
         f"/catalog/ads/{ad}/prices", {"cpc_micros": "2.5"},
         ["set-price", ad, "--cpc-micros", "2.5"], "whole number"),
        # Another advertiser for an existing ad.
        ("advertiser", f"/catalog/ads/{ad}/changes", {"action": "set-price", "cpc_micros": "5", "advertiser_id": OTHER},
         f"/catalog/ads/{ad}/prices", {"cpc_micros": 5, "advertiser_id": OTHER},
         ["set-price", ad, "--cpc-micros", "5", "--advertiser", OTHER], "never change"),
        # Another campaign for an existing ad.
        ("campaign", f"/catalog/ads/{ad}/changes", {"action": "set-price", "cpc_micros": "5", "campaign_id": "x-cmp"},
         f"/catalog/ads/{ad}/prices", {"cpc_micros": 5, "campaign_id": "x-cmp"},
         ["set-price", ad, "--cpc-micros", "5", "--campaign", "x-cmp"], "never change"),
        # Another currency for an existing ad.
        ("currency", f"/catalog/ads/{ad}/changes", {"action": "set-price", "cpc_micros": "5", "currency": "USD"},
         f"/catalog/ads/{ad}/prices", {"cpc_micros": 5, "currency": "USD"},
         ["set-price", ad, "--cpc-micros", "5", "--currency", "USD"], "never change"),
        # An ad the catalog does not know.
        ("unknown", "/catalog/ads/no-such-ad/changes", {"action": "pause"},
         "/catalog/ads/no-such-ad/prices", {"cpc_micros": None},
         ["pause", "no-such-ad"], "unknown ad"),
        # A new ad in a campaign of another advertiser.
        ("their campaign", "/catalog/ads",
         {"ad_id": "mine-1", "campaign_id": theirs, "advertiser_id": OWN, "currency": "EUR", "cpc_micros": "5"},
         "/catalog/ads",
         {"ad_id": "mine-1", "campaign_id": theirs, "advertiser_id": OWN, "currency": "EUR", "cpc_micros": 5},
         ["create-ad", "mine-1", "--campaign", theirs, "--advertiser", OWN, "--currency", "EUR", "--cpc-micros", "5"],
         "belongs to advertiser"),
        # An ad created a second time, with other owners.
        ("exists", "/catalog/ads",
         {"ad_id": ad, "campaign_id": campaign, "advertiser_id": OTHER, "currency": "EUR", "cpc_micros": "5"},
         "/catalog/ads",
         {"ad_id": ad, "campaign_id": campaign, "advertiser_id": OTHER, "currency": "EUR", "cpc_micros": 5},
         ["create-ad", ad, "--campaign", campaign, "--advertiser", OTHER, "--currency", "EUR", "--cpc-micros", "5"],
         "exists already"),
        # A new ad in another currency than its advertiser's other ads: an advertiser bills in one currency.
        ("another currency", "/catalog/ads",
         {"ad_id": "mine-3", "campaign_id": "new-cmp", "advertiser_id": OWN, "currency": "KWD", "cpc_micros": "15000"},
         "/catalog/ads",
         {"ad_id": "mine-3", "campaign_id": "new-cmp", "advertiser_id": OWN, "currency": "KWD", "cpc_micros": 15_000},
         ["create-ad", "mine-3", "--campaign", "new-cmp", "--advertiser", OWN, "--currency", "KWD",
          "--cpc-micros", "15000"], f"advertiser {OWN} bills in EUR"),
        # A new ad without its campaign.
        ("no campaign", "/catalog/ads",
         {"ad_id": "mine-2", "campaign_id": "", "advertiser_id": OWN, "currency": "EUR", "cpc_micros": "5"},
         "/catalog/ads", {"ad_id": "mine-2", "advertiser_id": OWN, "currency": "EUR", "cpc_micros": 5},
         ["create-ad", "mine-2", "--advertiser", OWN, "--currency", "EUR", "--cpc-micros", "5"], "give its campaign"),
        # Pausing an ad that is paused already is refused too (after the first pause below).
    ]  # fmt: skip
    before = catalog_rows(settings.database_url)
    token = web.form("ada")
    for what, url, fields, path, body, args, word in cases:
        expected = cli_refusal(settings, monkeypatch, capsys, *args)
        assert word in expected, (what, expected)
        page = web.clients["ada"].post(url, data={"csrf_token": token, **fields})
        assert page.status_code == 400, what
        shown = re.search(r'id="catalog-error">([^<]*)<', page.text)
        assert shown, what
        assert page_says(what, _unescape(shown.group(1)), expected), (what, shown.group(1), expected)
        status, answer = web.api("ada", path, body)
        want = 404 if what == "unknown" else 400  # a change of an ad that does not exist: the ad is not found
        assert status == want and answer["status"] == want, (what, answer)
        assert same_message(str(answer["error"]), expected), (what, answer, expected)
        assert catalog_rows(settings.database_url) == before, f"{what}: the catalog changed"

    # Pausing twice: the second is refused, by the form and by the API, as by the command.
    assert (
        web.clients["ada"].post(f"/catalog/ads/{ad}/changes", data={"csrf_token": token, "action": "pause"}).status_code
        == 303
    )
    expected = cli_refusal(settings, monkeypatch, capsys, "pause", ad)
    assert "already paused" in expected
    page = web.clients["ada"].post(f"/catalog/ads/{ad}/changes", data={"csrf_token": token, "action": "pause"})
    assert page.status_code == 400 and same_message(_shown_error(page.text), expected)
    status, answer = web.api("ada", f"/catalog/ads/{ad}/prices", {"cpc_micros": None})
    assert status == 400 and same_message(str(answer["error"]), expected)


def test_the_api_refuses_a_body_it_cannot_read_with_a_json_error(web: Web) -> None:
    ad = own_ad(web)
    for body, word in [
        ([1, 2], "JSON object"),
        ({"cpc_micros": 5, "price": 5}, "unknown field 'price'"),
        ({"cpc_micros": 2.5}, "whole number"),
        ({"cpc_micros": True}, "whole number"),
        ({"cpc_micros": 5, "effective_from": "tomorrow"}, "epoch milliseconds"),
        ({"action": "delete"}, "unknown catalog action"),
        ({"action": "pause", "cpc_micros": 5}, "a pause has no price"),
    ]:
        status, answer = web.api("ada", f"/catalog/ads/{ad}/prices", body)
        assert status == 400 and word in str(answer["error"]), (body, answer)
    status, answer = web.api("ada", "/catalog/ads", {"ad_id": "has space", "campaign_id": "c", "advertiser_id": OWN,
                                                     "currency": "EUR", "cpc_micros": 5})  # fmt: skip
    assert status == 400 and "an id is" in str(answer["error"])


def test_a_change_without_the_csrf_token_is_refused_and_changes_nothing(web: Web) -> None:
    before = catalog_rows(web.seeded.settings.database_url)
    ad = own_ad(web)
    ada = web.clients["ada"]
    fields = {"action": "set-price", "cpc_micros": "5"}
    assert ada.post(f"/catalog/ads/{ad}/changes", data=fields).status_code == 400
    assert ada.post(f"/catalog/ads/{ad}/changes", data={**fields, "csrf_token": "forged"}).status_code == 400
    new = {"ad_id": "n1", "campaign_id": "c-n1", "advertiser_id": OWN, "currency": "EUR", "cpc_micros": "5"}
    assert ada.post("/catalog/ads", data=new).status_code == 400
    # The API with the browser's session cookie needs the token too; a token alone needs none (below).
    assert ada.post(f"/api/v1/catalog/ads/{ad}/prices", json={"cpc_micros": 5}).status_code == 400
    assert catalog_rows(web.seeded.settings.database_url) == before
    token = web.form("ada")
    ok = ada.post(f"/api/v1/catalog/ads/{ad}/prices", json={"cpc_micros": 5}, headers={"X-CSRF-Token": token})
    assert ok.status_code == 201


# Unbilled counts ----------------------------------------------------------------------------------------------------
def test_unbilled_clicks_show_on_the_dashboard_the_ad_page_the_health_page_and_the_api(web: Web) -> None:
    settings = web.seeded.settings
    totals = RedisTotals(web.seeded.client, settings.redis_prefix)
    periods = web.clients["ada"].get("/api/v1/periods").json["periods"]
    latest = periods[-1]
    ad = own_ad(web)
    theirs = own_ad(web, OTHER)
    held = [
        UnbilledCount(latest["period"], latest["start_ms"], OWN, ad, "ad_paused", 4_321),
        UnbilledCount(latest["period"], latest["start_ms"], OWN, ad, "unknown_ad", 17),
        UnbilledCount(latest["period"], latest["start_ms"], OTHER, theirs, "ad_paused", 9_876),
        UnbilledCount(latest["period"], latest["start_ms"], "", "ghost-ad", "unknown_ad", 5_555),
    ]
    alice = web.clients["alice"]
    sample = alice.get(f"/api/v1/advertisers/{OWN}/dashboard").json["unbilled"]  # the sample's own, on another ad
    health_before = {(u["period"], u["ad_id"]) for u in web.clients["ada"].get("/api/v1/health").json["unbilled"]}
    assert totals.apply_batch("billing", 77_000, [], unbilled=held)

    dashboard = alice.get(f"/api/v1/advertisers/{OWN}/dashboard").json
    assert dashboard["unbilled"] == {
        "unbilled_ad_paused": sample["unbilled_ad_paused"] + 4_321,
        "unbilled_unknown_ad": sample["unbilled_unknown_ad"] + 17,
    }
    line = next(a for a in dashboard["ads"] if a["ad_id"] == ad)
    assert (line["unbilled_ad_paused"], line["unbilled_unknown_ad"]) == (4_321, 17)
    assert dashboard["series"][-1]["unbilled_ad_paused"] == sample["unbilled_ad_paused"] + 4_321
    page = alice.get(f"/advertisers/{OWN}").text
    paused, unknown = (display.count(n) for n in dashboard["unbilled"].values())
    assert f'id="unbilled-ad-paused">{paused}<' in page and f'id="unbilled-unknown-ad">{unknown}<' in page
    assert "9,876" not in page and "ghost-ad" not in page
    ad_doc = alice.get(f"/api/v1/advertisers/{OWN}/ads/{ad}").json
    assert ad_doc["series"][-1]["unbilled_ad_paused"] == 4_321
    assert "4,321" in alice.get(f"/advertisers/{OWN}/ads/{ad}").text

    health = web.clients["ada"].get("/api/v1/health").json["unbilled"]
    planted = [u for u in health if (u["period"], u["ad_id"]) not in health_before]
    assert {(u["advertiser_id"], u["ad_id"], u["unbilled_ad_paused"], u["unbilled_unknown_ad"]) for u in planted} == {
        (OWN, ad, 4_321, 17),
        (OTHER, theirs, 9_876, 0),
        ("", "ghost-ad", 0, 5_555),
    }
    page = web.clients["ada"].get("/health").text
    assert "ghost-ad" in page and "not in the catalog" in page and "5,555" in page


def _shown_error(html: str) -> str:
    match = re.search(r'id="catalog-error">([^<]*)<', html)
    assert match, "the page shows no refusal"
    return _unescape(match.group(1))


def _unescape(text: str) -> str:
    import html

    return html.unescape(text)
