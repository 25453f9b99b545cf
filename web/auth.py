"""Logging in and out, and the two checks every request goes through: who is it, and does an unsafe request carry
its CSRF token.

Login: the form's CSRF token, then the failed-login limits of the account name and of the client address and the
growing delay of the account from that address (refused with 429, even with the right password; the attempt is
counted in the same step), then the password. The account's limit does not refuse a browser that has logged in to
the account before (its device cookie), so an attacker cannot lock the owner out. A successful
login always opens a new session (a new random id, a new CSRF token) and closes the one the browser had; logout
closes it on the server, so its cookie opens nothing afterwards. A session ends after a time of no activity, and a
while after login however active (`web.sessions`).
"""

from __future__ import annotations

import re
import secrets
from urllib.parse import unquote

from flask import Blueprint, abort, g, make_response, redirect, render_template, request, url_for
from werkzeug.wrappers import Response

from web.access import Principal, Role
from web.security import (
    BACKGROUND_HEADER,
    DEVICE_COOKIE,
    DEVICE_COOKIE_DAYS,
    LOGIN_COOKIE,
    SESSION_COOKIE,
    UNSAFE_METHODS,
    cookie_names,
    device_cookie_name,
    device_knows,
    device_token,
    login_form_token,
    submitted_token,
    tokens_match,
    wants_secure_cookies,
)
from web.services import current_session, services
from web.tokens import bearer_token, token_id_of

bp = Blueprint("auth", __name__)

OPEN_ENDPOINTS = frozenset({"probes.healthz", "probes.readyz", "probes.metrics"})
"""Endpoints that never read a session: probes and scrapers, which must answer while Redis is down."""

_MAX_USERNAME = 128
_MAX_NEXT = 2048
_MAX_DECODING = 4
# A local path and query: one `/`, then URL characters only (no blank, control, backslash or non-ASCII character).
_LOCAL_TARGET = re.compile(r"/(?![/\\])[A-Za-z0-9._~!$&'()*+,;=:@%/?-]*", re.ASCII)


def load_principal() -> None:
    """Find the session of the request's cookie and its account; a stale session is closed on the way. Under
    `/api/`, an `Authorization` header is the only credential looked at: a valid API token's account, or nobody."""
    g.principal = None
    g.session = None
    g.bad_token = False
    if request.endpoint == "static" or request.endpoint in OPEN_ENDPOINTS:
        return
    if request.path.startswith("/api/") and "Authorization" in request.headers:
        token = bearer_token(request.headers.get("Authorization"))
        account = services().tokens.authenticate(token) if token else None
        if account is None:
            g.bad_token = True
        else:
            g.principal = account.principal
            g.token_id = token_id_of(token or "")  # the door a change names (`web.ad_catalog.maker`)
        return
    session_id = request.cookies.get(_cookie_names()[0])
    if not session_id:
        return
    svc = services()
    # The dashboard's own refresh is not the person doing something: it does not keep an idle session open.
    record = svc.sessions.get(session_id, svc.clock(), activity=BACKGROUND_HEADER not in request.headers)
    if record is None:
        return
    account = svc.accounts.get(record.username)
    if account is None or account.disabled or account.generation != record.generation:
        svc.sessions.close(session_id)  # the account was removed, disabled or its password reset
        return
    g.principal = account.principal
    g.session = (session_id, record)


def check_csrf() -> None:
    """Refuse (400) an unsafe request without the token of its session, or of the login form. A request under
    `/api/` without a session carries an API token or nothing, no credential a browser adds by itself: it needs none."""
    if request.method not in UNSAFE_METHODS:
        return
    if request.path.startswith("/api/") and current_session() is None:
        return  # no cookie is looked at here: an API token (which a browser never sends by itself), or 401
    given = submitted_token(request)
    if request.endpoint == "auth.login":
        nonce = request.cookies.get(_cookie_names()[1], "")
        expected = login_form_token(services().secret, nonce) if nonce else None
    else:
        session = current_session()
        expected = session[1].csrf if session else None
    if not tokens_match(expected, given):
        abort(400, description="This form has expired or did not come from this site. Reload the page and try again.")


def csrf_token() -> str:
    """The session's token, for the forms of the page being rendered (empty when not logged in)."""
    session = current_session()
    return session[1].csrf if session else ""


def login_csrf_token() -> str:
    """The login form's token, bound to the nonce in this browser's login cookie."""
    return str(g.get("login_token", ""))


def home_for(principal: Principal) -> str:
    """Where a person lands after login: their advertiser, finance's overview, or the pipeline's health."""
    if principal.role is Role.ADVERTISER:
        return url_for("pages.advertiser", advertiser_id=principal.advertiser_id)
    if principal.role is Role.FINANCE:
        return url_for("pages.finance")
    return url_for("pages.health")


def safe_next(target: str | None) -> str | None:
    """A path of this site to go back to after login, or None: never another site, never a header it would break.

    Only printable ASCII that a URL path and query may hold, starting with one `/`; and the same once
    percent-decoded (as often as decoding changes it), so that neither a browser that strips a tab or a newline
    (`/`, tab, `/evil.example` becomes `//evil.example`) nor one that decodes `%2F` or `%5C` finds another host.
    """
    if not target or len(target) > _MAX_NEXT:
        return None
    decoded = target
    for _ in range(_MAX_DECODING):
        if not _LOCAL_TARGET.fullmatch(decoded):
            return None
        decoded, previous = unquote(decoded, errors="replace"), decoded
        if decoded == previous:
            return target
    return None  # encoded more times than any link of ours would be


@bp.get("/login")
def login_form() -> Response:
    """The form, also when logged in already: logging in again replaces the session (another account, say)."""
    return _login_page("", 200)


@bp.post("/login")
def login() -> Response:
    svc = services()
    username = request.form.get("username", "").strip()[:_MAX_USERNAME]
    password = request.form.get("password", "")
    now = svc.clock()
    address = request.remote_addr
    device_cookie = device_cookie_name(wants_secure_cookies(request, svc.secure_cookies))
    known_browser = device_knows(svc.secret, username, request.cookies.get(device_cookie))
    attempt = svc.limiter.attempt(username, address, now, trusted=known_browser)
    if attempt.refused_by == "client":
        response = _login_page(
            f"Too many failed logins for this account from your network address. Wait {attempt.wait_s} "
            "second(s) before trying again; each failure makes the wait longer.",
            429,
        )
        response.headers["Retry-After"] = str(attempt.wait_s)
        return response
    if attempt.refused_by is not None:
        whose = "for this account" if attempt.refused_by == "account" else "from your network address"
        response = _login_page(
            f"Too many failed logins {whose} in the last hour. Logins are refused for about "
            f"{-(-attempt.wait_s // 60)} minute(s); ask an administrator if you need access sooner.",
            429,
        )
        response.headers["Retry-After"] = str(attempt.wait_s)
        return response
    account = svc.accounts.authenticate(username, password)
    if account is None:
        return _login_page("Wrong username or password.", 200)  # the attempt stays counted as a failure
    svc.limiter.succeeded(username, address, attempt)

    session_cookie, login_cookie = _cookie_names()
    old = request.cookies.get(session_cookie)
    if old:
        svc.sessions.close(old)
    session_id, _ = svc.sessions.open(account.username, account.generation, now)
    target = safe_next(request.args.get("next")) or home_for(account.principal)
    response = redirect(target)
    response.set_cookie(
        session_cookie,
        session_id,
        max_age=svc.session_ttl_s,
        httponly=True,
        samesite="Lax",
        secure=session_cookie != SESSION_COOKIE,
        path="/",
    )
    response.delete_cookie(login_cookie, path="/login", secure=login_cookie != LOGIN_COOKIE)
    # This browser has logged in to the account: the account's failed-login limit no longer refuses it.
    response.set_cookie(
        device_cookie,
        device_token(svc.secret, account.username),
        max_age=DEVICE_COOKIE_DAYS * 86_400,
        httponly=True,
        samesite="Strict",
        secure=device_cookie != DEVICE_COOKIE,
        path="/login",
    )
    return response


@bp.post("/logout")
def logout() -> Response:
    session = current_session()
    if session:
        services().sessions.close(session[0])
    response = redirect(url_for("auth.login_form"))
    session_cookie = _cookie_names()[0]
    response.delete_cookie(
        session_cookie, path="/", secure=session_cookie != SESSION_COOKIE, httponly=True, samesite="Lax"
    )
    return response


def _login_page(error: str, status: int) -> Response:
    """The login form, with a fresh double-submit CSRF pair (the nonce in a cookie, its HMAC in the form)."""
    svc = services()
    nonce = secrets.token_urlsafe(32)
    g.login_token = login_form_token(svc.secret, nonce)
    body = render_template(
        "login.html",
        error=error,
        username=request.form.get("username", "")[:_MAX_USERNAME],
        next_target=safe_next(request.args.get("next")),
    )
    response = make_response(body, status)
    login_cookie = _cookie_names()[1]
    response.set_cookie(
        login_cookie,
        nonce,
        max_age=3600,
        httponly=True,
        samesite="Strict",
        secure=login_cookie != LOGIN_COOKIE,
        path="/login",
    )
    return response


def _cookie_names() -> tuple[str, str]:
    """This request's (session, login-form) cookie names: prefixed when cookies are Secure."""
    return cookie_names(wants_secure_cookies(request, services().secure_cookies))
