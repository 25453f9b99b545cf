"""The doors of budgets and the IP exclusion list in the web UI: an admin sets a campaign's daily budget and
excludes or includes an IP range on the page and through the API with a token; every change lands in the catalog's
database that every part reads (`CatalogDatabase`), under its lock, with who made it and through which door; the page
and the API refuse what `adbill catalog set-budget` and `adbill ivt` refuse, with the command's one-line message, and
a refused change leaves every row of the database as it was.

Real Redis (the session's server, a prefix per test), a real data folder and a PostgreSQL database of the test's own,
the Flask test client; the command line runs in-process (`ops.cli.main`) against the same data folder and database.
"""

from __future__ import annotations

import html
import re
import threading
import time
from collections.abc import Iterator

import pytest

from ops.settings import Settings
from tests.catalog_rows import catalog_rows
from tests.web_support import OWN, SignedIn, form_token, iso, now_ms
from web import display

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000


class Web(SignedIn):
    def token(self, actor: str, page: str) -> str:
        return form_token(self.clients[actor].get(page).text)

    def api(self, actor: str, method: str, path: str, body: object = None) -> tuple[int, dict[str, object]]:
        client = self.app.test_client()
        headers = {"Authorization": f"Bearer {self.tokens[actor]}"}
        response = (
            client.post(f"/api/v1{path}", json=body, headers=headers)
            if method == "POST"
            else client.get(f"/api/v1{path}", headers=headers)
        )
        return response.status_code, response.json  # type: ignore[return-value]


@pytest.fixture
def web(redis_settings: Settings) -> Iterator[Web]:
    signed_in = Web.of(redis_settings)
    yield signed_in
    signed_in.seeded.client.close()


def own_campaign(web: Web, advertiser: str = OWN) -> str:
    return next(ad.campaign_id for ad in web.seeded.catalog if ad.advertiser_id == advertiser)


def shown_error(page: str) -> str:
    match = re.search(r'id="catalog-error">([^<]*)<', page)
    assert match, "the page shows no refusal"
    return html.unescape(match.group(1))


# Budgets ------------------------------------------------------------------------------------------------------------
def test_an_admin_sets_a_budget_on_the_page_and_with_a_token_and_the_catalog_holds_who_and_how(web: Web) -> None:
    campaign = own_campaign(web)
    ada = web.clients["ada"]
    page = f"/catalog/campaigns/{campaign}"
    version = web.catalog.version
    before = now_ms()
    made = ada.post(f"{page}/budgets", data={"csrf_token": web.token("ada", page), "daily_micros": "50000000"})
    assert made.status_code == 303 and made.headers["Location"] == f"{page}?made={version + 1}"
    shown = ada.get(made.headers["Location"]).text
    assert "Change made: catalog version" in shown and display.money(50_000_000, "EUR") in shown
    later = now_ms() + HOUR_MS
    planned = ada.post(
        f"{page}/budgets",
        data={"csrf_token": web.token("ada", page), "unlimited": "1", "effective_from": iso(later)},
    )
    assert planned.status_code == 303
    status, body = web.api("ada", "POST", f"/catalog/campaigns/{campaign}/budgets", {"daily_budget_micros": "75000000"})
    assert status == 201 and body["daily_budget_micros"] == "75000000"
    made_entry = body["made"]
    assert isinstance(made_entry, dict) and made_entry["door"].startswith("api token ")  # type: ignore[union-attr]

    history = web.catalog.budget_history(campaign)
    assert [(b.daily_budget_micros, b.made_by, b.door) for b in history] == [
        (50_000_000, "ada", "page"),
        (75_000_000, "ada", made_entry["door"]),  # type: ignore[index]
        (None, "ada", "page"),
    ]
    assert before <= history[0].effective_from == history[0].made_at <= now_ms()  # now, read under the lock
    assert history[2].effective_from == later // 1000 * 1000 and history[2].made_at < history[2].effective_from
    assert web.catalog.budget_at(campaign, now_ms()) == 75_000_000
    assert web.catalog.budget_at(campaign, later) is None

    # The advertiser reads it on its campaign page; the API gives the same history; finance reads it too.
    mine = web.clients["alice"].get(f"/api/v1/advertisers/{OWN}/campaigns/{campaign}").json["budget"]
    status, listed = web.api("fiona", "GET", f"/catalog/campaigns/{campaign}/budgets")
    assert status == 200 and listed == mine
    assert mine["next_change"]["daily_budget_micros"] is None
    assert [e["door"] for e in mine["history"]] == ["page", made_entry["door"], "page"]  # type: ignore[index]
    text = web.clients["alice"].get(f"/advertisers/{OWN}/campaigns/{campaign}").text
    assert "planned" in text and "unlimited" in text and made_entry["door"] in text  # type: ignore[operator]


def cli_refusal(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
) -> str:
    """`adbill ARGS` on the same data folder: it must refuse; its one-line message."""
    from ops.cli import main

    for name, value in settings.to_env().items():
        monkeypatch.setenv(name, value)
    before = catalog_rows(settings.database_url)
    assert main(list(args)) == 1
    assert catalog_rows(settings.database_url) == before
    err = capsys.readouterr().err.strip()
    prefix = f"adbill {args[0]}: error: "
    assert err.startswith(prefix) and "\n" not in err, err
    return err.removeprefix(prefix)


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


def test_each_budget_refusal_of_the_page_and_the_api_is_the_commands(
    web: Web, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = web.seeded.settings
    campaign = own_campaign(web)
    past = now_ms() - HOUR_MS
    # (what, campaign, form fields, API body, the command's arguments, a word of the message)
    cases: list[tuple[str, str, dict[str, str], dict[str, object], list[str], str]] = [
        # From an hour ago: a budget changes from now on.
        ("past", campaign, {"daily_micros": "50000", "effective_from": str(past)},
         {"daily_budget_micros": 50_000, "effective_from": past},
         ["set-budget", campaign, "--daily-micros", "50000", "--at", str(past)], "in the past"),
        ("negative", campaign, {"daily_micros": "-5"}, {"daily_budget_micros": "-5"},
         ["set-budget", campaign, "--daily-micros=-5"], "must not be negative"),
        ("fraction", campaign, {"daily_micros": "2.5"}, {"daily_budget_micros": "2.5"},
         ["set-budget", campaign, "--daily-micros", "2.5"], "whole number"),
        ("neither", campaign, {"daily_micros": ""}, {}, ["set-budget", campaign], "or unlimited"),
        ("both", campaign, {"daily_micros": "5", "unlimited": "1"}, {},
         ["set-budget", campaign, "--daily-micros", "5", "--unlimited"], "not both"),
        ("unknown", "no-such-cmp", {"daily_micros": "5"}, {"daily_budget_micros": 5},
         ["set-budget", "no-such-cmp", "--daily-micros", "5"], "unknown campaign"),
    ]  # fmt: skip
    before = catalog_rows(settings.database_url)
    token = web.token("ada", f"/catalog/campaigns/{campaign}")
    for what, target, fields, body, args, word in cases:
        expected = cli_refusal(settings, monkeypatch, capsys, "catalog", *args)
        assert word in expected, (what, expected)
        page = web.clients["ada"].post(f"/catalog/campaigns/{target}/budgets", data={"csrf_token": token, **fields})
        assert page.status_code == 400, what
        assert page_says(what, shown_error(page.text), expected), (what, shown_error(page.text), expected)
        if what == "both":
            continue  # a JSON body says unlimited as null: it cannot say both
        status, answer = web.api("ada", "POST", f"/catalog/campaigns/{target}/budgets", body)
        assert status == 400 and same_message(str(answer["error"]), expected), (what, answer, expected)
        assert catalog_rows(settings.database_url) == before, f"{what}: the catalog changed"
    for body, word in [
        ({"daily_budget_micros": 5, "cpc_micros": 5}, "unknown field 'cpc_micros'"),
        ({"daily_budget_micros": True}, "whole number"),
        ({"daily_budget_micros": 5, "effective_from": "tomorrow"}, "epoch milliseconds"),
        ([5], "JSON object"),
    ]:
        status, answer = web.api("ada", "POST", f"/catalog/campaigns/{campaign}/budgets", body)
        assert status == 400 and word in str(answer["error"]), (body, answer)
    assert catalog_rows(settings.database_url) == before


def test_only_an_admin_changes_a_budget_and_a_change_needs_its_csrf_token(web: Web) -> None:
    campaign = own_campaign(web)
    before = catalog_rows(web.seeded.settings.database_url)
    for actor in ("alice", "bob", "fiona"):
        token = form_token(web.clients[actor].get("/", follow_redirects=True).text)
        response = web.clients[actor].post(
            f"/catalog/campaigns/{campaign}/budgets", data={"csrf_token": token, "daily_micros": "5"}
        )
        assert response.status_code == 404, actor
        assert web.api(actor, "POST", f"/catalog/campaigns/{campaign}/budgets", {"daily_budget_micros": 5})[0] == 404
    ada = web.clients["ada"]
    assert ada.post(f"/catalog/campaigns/{campaign}/budgets", data={"daily_micros": "5"}).status_code == 400
    assert ada.post(f"/api/v1/catalog/campaigns/{campaign}/budgets", json={"daily_budget_micros": 5}).status_code == 400
    assert catalog_rows(web.seeded.settings.database_url) == before
    page = web.clients["fiona"].get(f"/catalog/campaigns/{campaign}")
    assert page.status_code == 200 and 'id="set-budget"' not in page.text  # finance reads, with no form
    assert web.clients["alice"].get(f"/catalog/campaigns/{campaign}").status_code == 404
    assert web.clients["ada"].get("/catalog/campaigns/no-such-cmp").status_code == 404


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


def test_a_change_that_waits_for_the_lock_takes_effect_when_it_is_made(web: Web) -> None:
    campaign = own_campaign(web)
    page = f"/catalog/campaigns/{campaign}"
    token = web.token("ada", page)
    writer, released = held_lock(web, 1.0)
    assert (
        web.clients["ada"].post(f"{page}/budgets", data={"csrf_token": token, "daily_micros": "70000"}).status_code
        == 303
    )
    writer.join(30)
    assert web.catalog.budget_history(campaign)[-1].effective_from >= released[0] - 5

    writer, released = held_lock(web, 1.0)
    assert web.api("ada", "POST", "/catalog/ip-exclusions", {"cidr": "192.0.2.0/24", "excluded": True})[0] == 201
    writer.join(30)
    entry = web.catalog.exclusions.changes[-1]
    assert entry.cidr == "192.0.2.0/24" and entry.effective_from >= released[0] - 5


# The IP exclusion list ------------------------------------------------------------------------------------------
def test_an_admin_excludes_and_includes_ranges_on_the_page_and_with_a_token(web: Web) -> None:
    ada = web.clients["ada"]
    token = web.token("ada", "/catalog/ip-exclusions")
    made = ada.post("/catalog/ip-exclusions", data={"csrf_token": token, "cidr": "203.0.113.0/24", "action": "exclude"})
    assert made.status_code == 303
    later = now_ms() + HOUR_MS
    planned = ada.post(
        "/catalog/ip-exclusions",
        data={"csrf_token": token, "cidr": "203.0.113.0/24", "action": "include", "effective_from": iso(later)},
    )
    assert planned.status_code == 303
    status, body = web.api(
        "ada", "POST", "/catalog/ip-exclusions", {"cidr": "2001:db8::/32", "excluded": True, "effective_from": later}
    )
    assert status == 201
    exclusions = web.catalog.exclusions
    until = later // 1000 * 1000
    assert exclusions.excluding("203.0.113.9", now_ms()) == "203.0.113.0/24"
    assert exclusions.excluding("203.0.113.9", until) is None
    assert exclusions.excluding("2001:db8::1", later - 1) is None
    assert exclusions.excluding("2001:db8::1", later) == "2001:db8::/32"
    assert [(c.made_by, c.door) for c in sorted(exclusions.changes, key=lambda c: c.version)] == [
        ("ada", "page"),
        ("ada", "page"),
        ("ada", body["made"]["door"]),  # type: ignore[index]
    ]
    assert body["in_force"] == [
        {"cidr": "203.0.113.0/24", "since": exclusions.history("203.0.113.0/24")[0].effective_from,
         "entry": body["history"][0]}  # type: ignore[index]
    ]  # fmt: skip
    page = ada.get("/catalog/ip-exclusions").text
    now_table = page[page.index('id="excluded-now"') :].split("</table>")[0]
    planned_table = page[page.index('id="planned"') :].split("</table>")[0]
    assert "203.0.113.0/24" in now_table and "2001:db8::/32" not in now_table
    assert "2001:db8::/32" in planned_table and "include again" in planned_table
    assert len(re.findall(r"<tr", page[page.index('id="exclusion-history"') :].split("</table>")[0])) == 4


def test_each_exclusion_refusal_of_the_page_and_the_api_is_the_commands(
    web: Web, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = web.seeded.settings
    assert web.api("ada", "POST", "/catalog/ip-exclusions", {"cidr": "192.0.2.0/24", "excluded": True})[0] == 201
    past = now_ms() - HOUR_MS
    cases: list[tuple[str, dict[str, str], dict[str, object], list[str], str]] = [
        ("past", {"cidr": "198.51.100.0/24", "action": "exclude", "effective_from": str(past)},
         {"cidr": "198.51.100.0/24", "excluded": True, "effective_from": past},
         ["exclude", "198.51.100.0/24", "--at", str(past)], "in the past"),
        ("host bits", {"cidr": "198.51.100.7/24", "action": "exclude"}, {"cidr": "198.51.100.7/24", "excluded": True},
         ["exclude", "198.51.100.7/24"], "host bits set"),
        ("not a range", {"cidr": "not-a-range", "action": "exclude"}, {"cidr": "not-a-range", "excluded": True},
         ["exclude", "not-a-range"], "is not an IP range"),
        ("twice", {"cidr": "192.0.2.0/24", "action": "exclude"}, {"cidr": "192.0.2.0/24", "excluded": True},
         ["exclude", "192.0.2.0/24"], "already excluded"),
        ("not excluded", {"cidr": "198.51.100.0/24", "action": "include"},
         {"cidr": "198.51.100.0/24", "excluded": False}, ["include", "198.51.100.0/24"], "is not excluded"),
        ("no range", {"cidr": "", "action": "exclude"}, {"cidr": "", "excluded": True}, ["exclude"],
         "needs an IP range"),
    ]  # fmt: skip
    before = catalog_rows(settings.database_url)
    token = web.token("ada", "/catalog/ip-exclusions")
    for what, fields, body, args, word in cases:
        expected = cli_refusal(settings, monkeypatch, capsys, "ivt", *args)
        assert word in expected, (what, expected)
        page = web.clients["ada"].post("/catalog/ip-exclusions", data={"csrf_token": token, **fields})
        assert page.status_code == 400 and page_says(what, shown_error(page.text), expected), (what, page.text[:300])
        status, answer = web.api("ada", "POST", "/catalog/ip-exclusions", body)
        assert status == 400 and same_message(str(answer["error"]), expected), (what, answer, expected)
    for body, word in [
        ({"cidr": "10.0.0.0/8"}, "excluded: true"),
        ({"cidr": 10, "excluded": True}, "cidr is an IP range"),
        ({"cidr": "10.0.0.0/8", "excluded": True, "why": "bots"}, "unknown field 'why'"),
    ]:
        status, answer = web.api("ada", "POST", "/catalog/ip-exclusions", body)
        assert status == 400 and word in str(answer["error"]), (body, answer)
    assert catalog_rows(settings.database_url) == before
    # The list is an admin's: everyone else gets 404, as for a route that does not exist.
    for actor in ("alice", "bob", "fiona"):
        assert web.clients[actor].get("/catalog/ip-exclusions").status_code == 404
        assert web.api(actor, "GET", "/catalog/ip-exclusions")[0] == 404
        assert web.api(actor, "POST", "/catalog/ip-exclusions", {"cidr": "10.0.0.0/8", "excluded": True})[0] == 404
