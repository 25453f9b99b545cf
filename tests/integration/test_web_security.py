"""CSRF, sessions, cookies, security headers and the failed-login limit, on real Redis through the Flask test client."""

from __future__ import annotations

import base64
import json
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest
from flask import Flask

from billing.store.redis_keys import RedisKeys
from ops.settings import Settings
from tests.web_support import PASSWORD, Seeded, form_token, login, seed, session_cookie
from web.access import LoginLimit, Role
from web.api import OPENAPI_FILE
from web.app import create_app
from web.sessions import LoginLimiter

pytestmark = pytest.mark.integration


class Clock:
    """Epoch milliseconds the test moves by hand."""

    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


@pytest.fixture
def seeded(redis_settings: Settings) -> Seeded:
    return seed(redis_settings)


@pytest.fixture
def clock() -> Clock:
    return Clock(1_767_300_000_000)


@pytest.fixture
def app(seeded: Seeded, clock: Clock) -> Flask:
    return create_app(seeded.settings, clock=clock)


# CSRF ---------------------------------------------------------------------------------------------------------------
def test_login_without_or_with_a_wrong_token_is_refused_with_400(app: Flask) -> None:
    client = app.test_client()
    good = form_token(client.get("/login").text)
    for data in (
        {"username": "alice", "password": PASSWORD},
        {"username": "alice", "password": PASSWORD, "csrf_token": ""},
        {"username": "alice", "password": PASSWORD, "csrf_token": good[:-2] + "00"},
    ):
        response = client.post("/login", data=data)
        assert response.status_code == 400 and session_cookie(client) is None
    # A token is bound to its browser's login cookie: another browser's token does not work here.
    other = app.test_client()
    other_token = form_token(other.get("/login").text)
    assert (
        client.post("/login", data={"username": "alice", "password": PASSWORD, "csrf_token": other_token}).status_code
        == 400
    )
    assert (
        client.post("/login", data={"username": "alice", "password": PASSWORD, "csrf_token": good}).status_code == 302
    )


def test_logout_needs_the_sessions_token_in_the_form_or_the_header(app: Flask) -> None:
    client = app.test_client()
    login(client, "alice")
    token = form_token(client.get("/advertisers/adv-0000").text)
    assert client.post("/logout").status_code == 400
    assert client.post("/logout", data={"csrf_token": "x" * len(token)}).status_code == 400
    assert client.post("/logout", headers={"X-CSRF-Token": "nope"}).status_code == 400
    assert client.get("/api/v1/me").status_code == 200, "a refused logout leaves the session as it was"
    assert client.post("/logout", headers={"X-CSRF-Token": token}).status_code == 302
    assert client.get("/api/v1/me").status_code == 401


def test_a_sessions_token_does_not_work_for_another_session(app: Flask) -> None:
    alice, bob = app.test_client(), app.test_client()
    login(alice, "alice")
    login(bob, "bob")
    alice_token = form_token(alice.get("/advertisers/adv-0000").text)
    assert bob.post("/logout", data={"csrf_token": alice_token}).status_code == 400


def test_the_refusal_says_why(app: Flask) -> None:
    response = app.test_client().post("/logout")
    assert response.status_code == 400 and "This form has expired" in response.text


# Sessions ------------------------------------------------------------------------------------------------------------
def test_login_always_starts_a_new_session_and_ends_the_old_one(app: Flask) -> None:
    client = app.test_client()
    assert login(client, "alice").status_code == 302
    first = session_cookie(client)
    assert first and client.get("/api/v1/me").json["username"] == "alice"
    assert login(client, "alice").status_code == 302
    second = session_cookie(client)
    assert second and second != first
    replay = app.test_client()
    replay.set_cookie("adbill_session", first)
    assert replay.get("/api/v1/me").status_code == 401, "the session before login no longer opens anything"


def test_a_session_cookie_set_before_login_is_not_kept(app: Flask) -> None:
    """Session fixation: a cookie planted before login is never the one that is logged in."""
    client = app.test_client()
    planted = "A" * 43
    client.set_cookie("adbill_session", planted)
    login(client, "alice")
    assert session_cookie(client) not in (None, planted)


def test_after_logout_the_old_cookie_gives_no_access(app: Flask, seeded: Seeded) -> None:
    client = app.test_client()
    login(client, "fiona")
    cookie = session_cookie(client)
    token = form_token(client.get("/finance").text)
    sessions_before = len(list(seeded.client.scan_iter(RedisKeys(seeded.settings.redis_prefix).web_session("*"))))
    response = client.post("/logout", data={"csrf_token": token})
    assert response.status_code == 302 and response.headers["Location"] == "/login"
    assert session_cookie(client) is None
    assert (
        len(list(seeded.client.scan_iter(RedisKeys(seeded.settings.redis_prefix).web_session("*"))))
        == sessions_before - 1
    )
    replay = app.test_client()
    replay.set_cookie("adbill_session", cookie or "")
    assert replay.get("/api/v1/finance").status_code == 401
    page = replay.get("/finance")
    assert page.status_code == 302 and page.headers["Location"].startswith("/login")


def test_redis_holds_no_usable_session_id(app: Flask, seeded: Seeded) -> None:
    client = app.test_client()
    response = login(client, "alice")
    cookie = session_cookie(client)
    assert cookie and len(base64.urlsafe_b64decode(cookie + "=")) == 32, "256 random bits"
    assert cookie not in response.headers["Location"], "a session id is never put in a URL"
    keys = list(seeded.client.scan_iter(RedisKeys(seeded.settings.redis_prefix).web_session("*")))
    assert keys and not any(cookie in key for key in keys)
    assert 0 < seeded.client.ttl(keys[0]) <= seeded.settings.web_session_hours * 3600


def test_disabling_an_account_or_resetting_its_password_ends_its_sessions(app: Flask, seeded: Seeded) -> None:
    accounts = seeded.settings.accounts_store()
    alice, fiona = app.test_client(), app.test_client()
    login(alice, "alice")
    login(fiona, "fiona")
    accounts.set_disabled("alice", True)
    accounts.reset_password("fiona", "a whole new passphrase")
    assert alice.get("/api/v1/me").status_code == 401
    assert fiona.get("/api/v1/me").status_code == 401
    assert "Wrong username or password" in login(alice, "alice").text, "a disabled account cannot log in"
    assert login(fiona, "fiona", "a whole new passphrase").status_code == 302
    accounts.set_disabled("alice", False)
    assert login(alice, "alice").status_code == 302


def test_after_login_the_person_goes_back_where_they_were(app: Flask) -> None:
    client = app.test_client()
    bounced = client.get("/advertisers/adv-0000/corrections?limit=5")
    assert bounced.status_code == 302
    assert bounced.headers["Location"] == "/login?next=/advertisers/adv-0000/corrections?limit%3D5"
    assert login(client, "alice", next_url="/advertisers/adv-0000/corrections?limit%3D5").headers["Location"] == (
        "/advertisers/adv-0000/corrections?limit=5"
    )


# Each is the query string of the login form's POST, as a browser or an attacker's link would send it.
HOSTILE_NEXT = [
    "next=/%09/evil.example",  # a tab: browsers strip it from the Location and land on //evil.example
    "next=/%0a/evil.example",  # a newline: must not break the header (it answered 500)
    "next=/%0d/evil.example",  # a carriage return
    "next=/%0d%0aSet-Cookie:%20x=1",  # header injection
    "next=%0a//evil.example",  # a newline before the slashes
    "next=/%20/evil.example",  # a blank
    "next=/%00/evil.example",  # NUL
    "next=//evil.example/",  # scheme-relative
    "next=///evil.example/",
    "next=/\\/evil.example",  # /\/: browsers read a backslash as a slash
    "next=/%5C/evil.example",  # the same, encoded
    "next=%5C%5Cevil.example",
    "next=/%252F%252Fevil.example",  # /%2F%2Fevil.example once decoded by the server
    "next=%2F%2Fevil.example",  # //evil.example once decoded
    "next=/%2F%2Fevil.example",  # ///evil.example once decoded
    "next=/%252F/evil.example",
    "next=/%25252F%25252Fevil.example",  # encoded three times over
    "next=/%2509/evil.example",  # a tab, encoded twice
    "next=/%ff%fe/evil.example",  # not UTF-8
    "next=https://evil.example/",  # a scheme and a host
    "next=https:evil.example",
    "next=javascript:alert(1)",
    "next=evil.example",  # a host without slashes
    "next=/%E3%80%80/evil.example",  # an ideographic space
    "next=%EF%BC%8F%EF%BC%8Fevil.example",  # fullwidth solidus twice
    "next=/" + "a" * 3000,  # longer than any link of ours
]


@pytest.mark.parametrize("query", HOSTILE_NEXT)
def test_after_login_a_hostile_next_goes_to_the_home_page(app: Flask, query: str) -> None:
    client = app.test_client()
    form = client.get("/login", query_string=query)
    assert form.status_code == 200
    assert "evil" not in form.text, "the login form carries no hostile target on"
    token = form_token(form.text)
    response = client.post(
        "/login", query_string=query, data={"username": "alice", "password": PASSWORD, "csrf_token": token}
    )
    assert response.status_code == 302
    assert response.headers["Location"] == "/advertisers/adv-0000"


# Cookies and headers -----------------------------------------------------------------------------------------------
def _set_cookie_header(response: object, name: str) -> str:
    headers = [h for h in response.headers.getlist("Set-Cookie") if h.startswith(name + "=")]  # type: ignore[attr-defined]
    assert len(headers) == 1, headers
    return headers[0]


def test_session_cookie_is_httponly_samesite_and_secure_on_https(app: Flask) -> None:
    plain = app.test_client()
    form = plain.get("/login")
    login_cookie = _set_cookie_header(form, "adbill_login")
    assert "HttpOnly" in login_cookie and "SameSite=Strict" in login_cookie and "Path=/login" in login_cookie
    response = login(plain, "alice")
    cookie = _set_cookie_header(response, "adbill_session")
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Path=/" in cookie and "Secure" not in cookie

    secure = app.test_client()
    page = secure.get("/login", base_url="https://localhost")
    response = secure.post(
        "/login",
        data={"username": "alice", "password": PASSWORD, "csrf_token": form_token(page.text)},
        base_url="https://localhost",
    )
    cookie = _set_cookie_header(response, "__Host-adbill_session")
    assert "Secure" in cookie and "HttpOnly" in cookie and "Path=/;" in cookie + ";" and "Domain" not in cookie
    assert "Secure" in _set_cookie_header(page, "__Secure-adbill_login")
    assert response.headers["Strict-Transport-Security"].startswith("max-age=")
    assert secure.get("/api/v1/me", base_url="https://localhost").status_code == 200


def test_on_https_a_session_cookie_without_the_host_prefix_opens_nothing(app: Flask) -> None:
    """A plain-HTTP page or a subdomain can set `adbill_session`, but not `__Host-adbill_session`."""
    client = app.test_client()
    page = client.get("/login", base_url="https://localhost")
    client.post(
        "/login",
        data={"username": "alice", "password": PASSWORD, "csrf_token": form_token(page.text)},
        base_url="https://localhost",
    )
    cookie = client.get_cookie("__Host-adbill_session", domain="localhost")
    assert cookie is not None
    planted = app.test_client()
    planted.set_cookie("adbill_session", cookie.value, domain="localhost")
    assert planted.get("/api/v1/me", base_url="https://localhost").status_code == 401
    assert planted.get("/api/v1/me").status_code == 200, "over plain HTTP the plain name is the session's"


def test_the_secure_setting_makes_cookies_secure_behind_a_proxy(seeded: Seeded, clock: Clock) -> None:
    app = create_app(replace(seeded.settings, web_secure_cookies=1), clock=clock)
    client = app.test_client()
    page = client.get("/login")
    assert "Secure" in _set_cookie_header(page, "__Secure-adbill_login")
    response = client.post(
        "/login", data={"username": "alice", "password": PASSWORD, "csrf_token": form_token(page.text)}
    )
    assert "Secure" in _set_cookie_header(response, "__Host-adbill_session")


def test_behind_a_trusted_tls_proxy_cookies_are_secure_and_hsts_is_sent(seeded: Seeded, clock: Clock) -> None:
    app = create_app(replace(seeded.settings, web_trusted_proxies=1, web_address_login_limit=1), clock=clock)
    client = app.test_client()
    # What the proxy adds: the client's address and the scheme it was reached by. An address the client put in the
    # header itself comes before the proxy's entry and is not believed.
    forwarded = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "192.0.2.66, 198.51.100.9"}
    page = client.get("/login", headers=forwarded)
    assert "Secure" in _set_cookie_header(page, "__Secure-adbill_login")
    assert page.headers["Strict-Transport-Security"].startswith("max-age=")
    response = client.post(
        "/login",
        headers=forwarded,
        data={"username": "alice", "password": "a wrong guess", "csrf_token": form_token(page.text)},
    )
    assert response.status_code == 200
    assert _limiter(seeded).address_failures("198.51.100.9", clock()) == 1
    assert _limiter(seeded).address_failures("192.0.2.66", clock()) == 0
    assert _limiter(seeded).address_failures("127.0.0.1", clock()) == 0, "the proxy's own address is not counted"
    response = login(client, "alice")  # from the proxy's address itself: another client
    assert response.status_code == 302 and "Secure" not in _set_cookie_header(response, "adbill_session")


def test_without_trusted_proxies_forwarded_headers_change_nothing(app: Flask, seeded: Seeded, clock: Clock) -> None:
    client = app.test_client()
    forwarded = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "198.51.100.9"}
    page = client.get("/login", headers=forwarded)
    assert "Secure" not in _set_cookie_header(page, "adbill_login")
    assert "Strict-Transport-Security" not in page.headers
    client.post(
        "/login",
        headers=forwarded,
        data={"username": "alice", "password": "a wrong guess", "csrf_token": form_token(page.text)},
    )
    assert _limiter(seeded).address_failures("127.0.0.1", clock()) == 1
    assert _limiter(seeded).address_failures("198.51.100.9", clock()) == 0


def test_export_downloads_are_not_stored(app: Flask, seeded: Seeded) -> None:
    client = app.test_client()
    login(client, "fiona")
    (export,) = client.get("/api/v1/exports").json["exports"][:1]
    for file in export["files"]:
        response = client.get(file["url"])
        assert response.status_code == 200 and response.headers["Cache-Control"] == "no-store", file["url"]
        assert response.headers["Content-Disposition"].startswith("attachment;")


EXPECTED_POLICY = {
    "default-src": ["'none'"],  # nothing that is not allowed below
    "script-src": ["'self'"],  # our own script file: no inline script, no eval, no other host
    "style-src": ["'self'"],
    "img-src": ["'self'"],
    "connect-src": ["'self'"],  # the dashboard's refresh calls our API only
    "form-action": ["'self'"],
    "frame-ancestors": ["'none'"],  # no framing (clickjacking)
    "base-uri": ["'none'"],
}


@pytest.mark.parametrize(
    "url, status",
    [
        ("/login", 200),
        ("/advertisers/adv-0000", 200),
        ("/api/v1/advertisers/adv-0000/dashboard", 200),
        ("/advertisers/adv-0001", 404),
        ("/api/v1/nothing", 404),
        ("/static/adbill.css", 200),
    ],
)
def test_security_headers_on_every_kind_of_response(app: Flask, url: str, status: int) -> None:
    client = app.test_client()
    login(client, "alice")
    response = client.get(url)
    assert response.status_code == status
    # The header the response carries, directive by directive, against the policy written out here.
    policy = response.headers["Content-Security-Policy"]
    assert {d.split()[0]: d.split()[1:] for d in policy.split(";") if d.strip()} == EXPECTED_POLICY
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["Referrer-Policy"] == "same-origin"
    assert not [name for name, _ in response.headers.items() if name.lower().startswith("access-control-")]
    if not url.startswith("/static/"):
        assert response.headers["Cache-Control"] == "no-store"


def test_pages_have_no_inline_script_or_style(app: Flask) -> None:
    client = app.test_client()
    login(client, "ada")
    for url in ("/login", "/advertisers/adv-0000", "/finance", "/health", "/advertisers/adv-0000/corrections"):
        html = client.get(url).text
        assert "<script>" not in html and "<script " not in html.replace('<script src="/static/adbill.js" defer>', "")
        assert " style=" not in html and "<style" not in html and "javascript:" not in html
        assert " on" + "click=" not in html and " on" + "load=" not in html


def test_what_a_person_typed_comes_back_escaped(app: Flask) -> None:
    client = app.test_client()
    typed = '"><script>alert(1)</script><img src=x onerror=alert(2)>'
    page = login(client, typed, password="a wrong guess")
    assert "Wrong username or password" in page.text
    assert "<script>alert" not in page.text and "<img src=x" not in page.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text


def test_the_secret_key_file_is_created_once_and_private(seeded: Seeded, clock: Clock) -> None:
    path = seeded.settings.web_secret_file
    assert not path.exists()
    create_app(seeded.settings, clock=clock)
    mode = stat.S_IMODE(path.stat().st_mode)
    assert mode == 0o600
    before = path.read_text()
    create_app(seeded.settings, clock=clock)
    assert path.read_text() == before


# Query arguments ---------------------------------------------------------------------------------------------------
def _numeric_query_arguments() -> dict[str, list[str]]:
    """URL -> its whole-number query arguments: every one the OpenAPI document declares, and the pages' own."""
    document = json.loads(OPENAPI_FILE.read_text())
    parameters = document["components"]["parameters"]
    found = {"/advertisers/adv-0000/corrections": ["offset", "limit"]}
    for path, item in document["paths"].items():
        declared = [parameters[p["$ref"].rsplit("/", 1)[1]] for p in item["get"].get("parameters", [])]
        names = [p["name"] for p in declared if p["in"] == "query" and p["schema"]["type"] == "integer"]
        if names:
            found["/api/v1" + path.replace("{advertiser_id}", "adv-0000")] = names
    return found


NOT_WHOLE_NUMBERS_IN_RANGE = [
    "-1",
    "9223372036854775807",  # 2^63 - 1
    "9223372036854775808",  # 2^63: reached Redis and answered 500
    "18446744073709551616",  # 2^64
    str(2**53),  # one past the largest an API reader holds exactly
    "9" * 30,
    "1" * 5000,  # past Python's limit of digits for int()
    "",
    " 5",
    "+5",
    "5_000",
    "1e3",
    "1.5",
    "0x10",
    "\u0663",  # an Arabic-Indic three: int() would take it
    "abc",
    "NaN",
]


def test_every_numeric_query_argument_refuses_what_is_not_a_whole_number_in_range(app: Flask) -> None:
    client = app.test_client()
    login(client, "alice")
    admin = app.test_client()  # for the routes that are not an advertiser's (the catalog's change log)
    login(admin, "ada")
    arguments = _numeric_query_arguments()
    assert "/api/v1/advertisers/adv-0000/corrections" in arguments, "the document declares the paging arguments"
    failures = []
    for url, names in arguments.items():
        asking = client if "/advertisers/" in url else admin
        for name in names:
            bad = [*NOT_WHOLE_NUMBERS_IN_RANGE, *(["0", "501"] if name == "limit" else [])]
            for value in bad:
                response = asking.get(url, query_string={name: value})
                said = response.json if url.startswith("/api/") else {"status": 400, "error": response.text}
                if response.status_code != 400 or said is None or said["status"] != 400 or name not in said["error"]:
                    failures.append(f"{url}?{name}={value[:30]!r}: {response.status_code} {response.text[:100]}")
            for value in {"offset": ["0", str(2**53 - 1)], "limit": ["1", "500"]}[name]:
                if asking.get(url, query_string={name: value}).status_code != 200:
                    failures.append(f"{url}?{name}={value}: refused, but it is within range")
    assert not failures, "\n".join(failures)


# The failed-login limit --------------------------------------------------------------------------------------------
def test_the_101st_login_in_an_hour_is_refused_even_with_the_right_password(app: Flask, clock: Clock) -> None:
    # From a browser that has never logged in to the account (no device cookie of it).
    for attempt in range(100):
        guesser = app.test_client()
        guesser.environ_base["REMOTE_ADDR"] = f"203.0.113.{attempt}"  # spread: no address is slowed down
        clock.now_ms += 1000
        response = login(guesser, "alice", password=f"wrong guess {attempt}")
        assert response.status_code == 200 and "Wrong username or password" in response.text
    clock.now_ms += 1000
    client = app.test_client()
    refused = login(client, "alice")
    assert refused.status_code == 429
    assert "Too many failed logins" in refused.text
    assert session_cookie(client) is None
    # Failures at +1 s ... +100 s, refused at +101 s: the first failure leaves the hour 3500 s from now.
    assert refused.headers["Retry-After"] == "3500"

    # Other accounts are not affected.
    assert login(app.test_client(), "bob").status_code == 302

    # One second early it is still refused; once the oldest failure is an hour old, one attempt more is allowed.
    clock.now_ms += 3499 * 1000
    assert login(client, "alice").status_code == 429
    clock.now_ms += 1000
    assert login(client, "alice").status_code == 302


def test_failures_for_unknown_names_are_counted_too(app: Flask, seeded: Seeded, clock: Clock) -> None:
    client = app.test_client()
    for _ in range(3):
        login(client, "nobody-here", password="guess guess guess")
    limiter = _limiter(seeded)
    assert limiter.failures("nobody-here", clock()) == 3
    assert limiter.failures("NOBODY-HERE", clock()) == 3, "names are counted case-insensitively"
    assert limiter.failures("alice", clock()) == 0


def test_the_limit_is_a_setting(seeded: Seeded, clock: Clock) -> None:
    app = create_app(replace(seeded.settings, web_login_limit=2), clock=clock)
    client = app.test_client()
    login(client, "ada", password="wrong one here")
    login(client, "ada", password="wrong two here")
    assert login(client, "ada").status_code == 429


def _limiter(seeded: Seeded, per_account: int = 100, per_address: int = 300) -> LoginLimiter:
    return LoginLimiter(
        seeded.client, seeded.settings.redis_prefix, LoginLimit(max_failures=per_account), LoginLimit(per_address)
    )


def test_failures_are_counted_per_client_address_across_account_names(seeded: Seeded, clock: Clock) -> None:
    app = create_app(replace(seeded.settings, web_address_login_limit=3), clock=clock)
    attacker, neighbour, elsewhere = app.test_client(), app.test_client(), app.test_client()
    attacker.environ_base["REMOTE_ADDR"] = neighbour.environ_base["REMOTE_ADDR"] = "203.0.113.7"
    elsewhere.environ_base["REMOTE_ADDR"] = "198.51.100.20"
    for name in ("alice", "bob", "fiona"):  # one guess each: no account's own limit comes near
        assert "Wrong username or password" in login(attacker, name, password="a wrong guess").text
    refused = login(neighbour, "ada")
    assert refused.status_code == 429 and "from your network address" in refused.text
    assert int(refused.headers["Retry-After"]) == 3600
    assert login(elsewhere, "ada").status_code == 302, "another address is not affected"
    assert _limiter(seeded).address_failures("203.0.113.7", clock()) == 3
    assert _limiter(seeded).failures("ada", clock()) == 0, "refused attempts are not counted against the account"


def test_an_ipv6_client_is_counted_by_its_64_bit_prefix(seeded: Seeded, clock: Clock) -> None:
    app = create_app(replace(seeded.settings, web_address_login_limit=2), clock=clock)
    first, second, other_net = app.test_client(), app.test_client(), app.test_client()
    first.environ_base["REMOTE_ADDR"] = "2001:db8:1:2::1"
    second.environ_base["REMOTE_ADDR"] = "2001:db8:1:2:ffff::9"  # the same /64
    other_net.environ_base["REMOTE_ADDR"] = "2001:db8:1:3::1"
    login(first, "alice", password="a wrong guess")
    login(second, "bob", password="a wrong guess")
    assert login(second, "fiona").status_code == 429
    assert login(other_net, "fiona").status_code == 302


def test_a_successful_login_is_not_counted_as_a_failure(app: Flask, seeded: Seeded, clock: Clock) -> None:
    for _ in range(3):
        assert login(app.test_client(), "alice").status_code == 302
    assert _limiter(seeded).failures("alice", clock()) == 0
    assert _limiter(seeded).address_failures("127.0.0.1", clock()) == 0


def test_the_check_and_the_count_are_one_step(seeded: Seeded, clock: Clock) -> None:
    """Attempts under way count: the limit admits exactly `max` of them, whether or not any has finished."""
    limiter = _limiter(seeded, per_account=3)
    admitted = [limiter.attempt("alice", "192.0.2.1", clock()) for _ in range(5)]
    assert [a.refused_by for a in admitted] == [None, None, None, "account", "account"]
    limiter.succeeded("alice", "192.0.2.1", admitted[0])  # one turned out to be the right password
    assert limiter.attempt("alice", "192.0.2.1", clock()).refused_by is None
    assert limiter.attempt("alice", "192.0.2.1", clock()).refused_by == "account"


def test_parallel_wrong_passwords_cannot_overshoot_the_limit(seeded: Seeded, clock: Clock) -> None:
    app = create_app(replace(seeded.settings, web_login_limit=3), clock=clock)
    clients = [app.test_client() for _ in range(8)]
    tokens = [form_token(c.get("/login").text) for c in clients]
    start = threading.Barrier(len(clients))

    def guess(i: int) -> int:
        start.wait()
        data = {"username": "alice", "password": f"wrong guess {i}", "csrf_token": tokens[i]}
        return clients[i].post("/login", data=data).status_code

    with ThreadPoolExecutor(len(clients)) as pool:
        statuses = list(pool.map(guess, range(len(clients))))
    assert sorted(statuses) == [200, 200, 200, 429, 429, 429, 429, 429]
    assert _limiter(seeded).failures("alice", clock()) == 3


# Idle and absolute session limits --------------------------------------------------------------------------------
def test_a_session_ends_when_idle_and_activity_keeps_it_open(app: Flask, seeded: Seeded, clock: Clock) -> None:
    idle_ms = seeded.settings.web_idle_minutes * 60_000
    client = app.test_client()
    login(client, "alice")
    for _ in range(3):  # each request within the idle time starts it again
        clock.now_ms += idle_ms - 1000
        assert client.get("/api/v1/me").status_code == 200
    clock.now_ms += idle_ms
    assert client.get("/api/v1/me").status_code == 401
    assert not list(seeded.client.scan_iter(RedisKeys(seeded.settings.redis_prefix).web_session("*"))), (
        "the record is gone"
    )
    clock.now_ms += 1000
    assert client.get("/api/v1/me").status_code == 401, "it does not come back"


def test_the_dashboards_refresh_does_not_keep_an_idle_session_open(app: Flask, seeded: Seeded, clock: Clock) -> None:
    idle_ms = seeded.settings.web_idle_minutes * 60_000
    client = app.test_client()
    login(client, "alice")
    refresh = {"X-Adbill-Background": "refresh"}
    clock.now_ms += idle_ms - 1000
    assert client.get("/api/v1/advertisers/adv-0000/dashboard", headers=refresh).status_code == 200
    clock.now_ms += 1000
    assert client.get("/api/v1/advertisers/adv-0000/dashboard", headers=refresh).status_code == 401


def test_a_session_ends_after_its_hours_however_active(app: Flask, seeded: Seeded, clock: Clock) -> None:
    hours_ms = seeded.settings.web_session_hours * 3_600_000
    step_ms = seeded.settings.web_idle_minutes * 60_000 // 2
    client = app.test_client()
    login(client, "alice")
    logged_in_at = clock.now_ms
    while clock.now_ms + step_ms < logged_in_at + hours_ms:
        clock.now_ms += step_ms
        assert client.get("/api/v1/me").status_code == 200
    clock.now_ms = logged_in_at + hours_ms
    assert client.get("/api/v1/me").status_code == 401


def test_the_idle_time_is_a_setting(seeded: Seeded, clock: Clock) -> None:
    app = create_app(replace(seeded.settings, web_idle_minutes=5), clock=clock)
    client = app.test_client()
    login(client, "alice")
    clock.now_ms += 5 * 60_000 - 1
    assert client.get("/api/v1/me").status_code == 200
    clock.now_ms += 5 * 60_000
    assert client.get("/api/v1/me").status_code == 401


def test_a_new_account_added_while_serving_can_log_in(app: Flask, seeded: Seeded) -> None:
    seeded.settings.accounts_store().add("carol", Role.ADVERTISER, PASSWORD, "adv-0002")
    client = app.test_client()
    assert login(client, "carol").headers["Location"] == "/advertisers/adv-0002"


def test_an_advertiser_lists_the_periods_of_its_own_activity_and_the_closed_ones(app: Flask, seeded: Seeded) -> None:
    from billing.store.redis_totals import TotalsRow
    from tests.web_support import OTHER, OWN

    # A period in which only another advertiser had activity, and nobody closed yet.
    ad = next(a for a in seeded.catalog if a.advertiser_id == OTHER)
    lone, lone_ms = "20260102T0000Z", 1_767_312_000_000
    seeded.writer.bill(99, [TotalsRow(lone, lone_ms, OTHER, ad.campaign_id, ad.ad_id, 1, ad.cpc_micros)])

    def listed(username: str) -> dict[str, bool]:
        client = app.test_client()
        assert login(client, username).status_code == 302
        return {p["period"]: p["closed"] for p in client.get("/api/v1/periods").json["periods"]}

    everyone = listed("fiona")
    assert lone in everyone
    assert listed("bob") == everyone
    own = listed("alice")
    assert lone not in own
    assert {p for p, closed in everyone.items() if closed} <= set(own)
    reader_keys = RedisKeys(seeded.settings.redis_prefix)
    for period in own:
        assert own[period] or seeded.client.sismember(reader_keys.period_advertisers(period), OWN)


def test_failures_spread_over_addresses_slow_the_attacker_and_do_not_lock_the_owner_out(
    app: Flask, clock: Clock
) -> None:
    # The owner has logged in from this browser before (it keeps a device cookie of the account).
    owner = app.test_client()
    assert login(owner, "alice").status_code == 302
    # An attacker spreads 100 wrong guesses over 20 addresses, 5 each, within the hour.
    for i in range(100):
        attacker = app.test_client()
        attacker.environ_base["REMOTE_ADDR"] = f"203.0.113.{i % 20}"
        clock.now_ms += 1000
        assert "Wrong username or password" in login(attacker, "alice", password=f"wrong guess {i}").text
    # ASVS 2.2.1: no more than 100 failed attempts an hour on the account; a browser it does not know is refused.
    stranger = app.test_client()
    stranger.environ_base["REMOTE_ADDR"] = "198.51.100.77"
    refused = login(stranger, "alice")
    assert refused.status_code == 429 and "for this account" in refused.text
    # The owner, from the browser the account has logged in from, is not locked out; nor is another account.
    assert login(owner, "alice").status_code == 302
    assert login(app.test_client(), "bob").status_code == 302

    # One address guessing one account: a few failures, then a delay that doubles with each failure.
    guesser = app.test_client()
    guesser.environ_base["REMOTE_ADDR"] = "192.0.2.50"
    for i in range(5):
        assert login(guesser, "bob", password=f"bob guess {i}").status_code == 200
    for wait_s in (1, 2, 4, 8):
        slowed = login(guesser, "bob", password="bob guess again")
        assert slowed.status_code == 429 and slowed.headers["Retry-After"] == str(wait_s), slowed.headers
        clock.now_ms += wait_s * 1000
        assert login(guesser, "bob", password="bob guess again").status_code == 200
    # Bob himself, from another address, is not slowed.
    assert login(app.test_client(), "bob").status_code == 302
