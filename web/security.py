"""The web UI's defences that are not about who sees what: the secret key, CSRF tokens, cookies and headers.

- The secret key is generated once into a file under the data folder (mode 0600) and never leaves it.
- CSRF: a logged-in session has its own random token (`web.sessions`); the login form, before any session exists,
  uses a double-submit token: a random nonce in a cookie and its HMAC under the secret key in the form. Every POST,
  PUT, PATCH and DELETE must carry the token in the `csrf_token` field or the `X-CSRF-Token` header, else 400.
- Every response carries a strict Content-Security-Policy (no inline script, nothing from another origin), nosniff,
  no framing and a same-origin referrer policy; pages are not cached.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import tempfile
from pathlib import Path

from flask import Request, Response

SESSION_COOKIE = "adbill_session"
LOGIN_COOKIE = "adbill_login"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "X-CSRF-Token"
BACKGROUND_HEADER = "X-Adbill-Background"
"""Sent by the dashboard's automatic refresh: such a request does not count as activity for the idle timeout."""
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
    ]
)

SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=()",
}


def load_or_create_secret(path: Path) -> bytes:
    """The secret key in `path`, created (256 random bits, mode 0600) when missing.

    Several workers may start at once: the file appears complete or not at all (written aside, then linked).
    """
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".secret-")  # mode 0600
        try:
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_hex(32) + "\n")
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)  # fails if another worker won the race: its key stands
        finally:
            os.unlink(tmp)
    if path.stat().st_mode & 0o077:
        raise PermissionError(f"{path} is readable by others; chmod 600 it")
    key = path.read_text().strip()
    if len(key) < 32:
        raise ValueError(f"{path} does not hold a secret key of at least 32 characters")
    return key.encode()


def login_form_token(secret: bytes, nonce: str) -> str:
    """The CSRF token of the login form, bound to the nonce of the browser's login cookie."""
    return hmac.new(secret, b"login:" + nonce.encode(), hashlib.sha256).hexdigest()


def tokens_match(expected: str | None, given: str | None) -> bool:
    """Constant-time comparison; a missing token never matches."""
    return bool(expected) and bool(given) and hmac.compare_digest(str(expected), str(given))


def submitted_token(request: Request) -> str | None:
    """The CSRF token a request carries, in its form or its header."""
    return request.headers.get(CSRF_HEADER) or request.form.get(CSRF_FIELD)


def wants_secure_cookies(request: Request, always: bool) -> bool:
    """Secure cookies on HTTPS requests, or always when the deployment says it sits behind HTTPS."""
    return always or request.is_secure


def cookie_names(secure: bool) -> tuple[str, str]:
    """(session cookie, login-form cookie). Secure ones carry the `__Host-` and `__Secure-` prefixes: a browser then
    takes them only over HTTPS, the session's only from this very host, so neither a plain-HTTP page nor a
    subdomain can plant one; a cookie of the plain name opens nothing on such requests."""
    if secure:
        return "__Host-" + SESSION_COOKIE, "__Secure-" + LOGIN_COOKIE
    return SESSION_COOKIE, LOGIN_COOKIE


DEVICE_COOKIE = "adbill_device"
"""Set on a successful login: the browser has logged in to that account (OWASP's device cookies). A browser that
holds it is not refused by the account's failed-login limit, only slowed by its address's delay (`web.sessions`)."""
DEVICE_COOKIE_DAYS = 365


def device_cookie_name(secure: bool) -> str:
    """The device cookie's name: with the `__Secure-` prefix when cookies are Secure (it lives on `/login`)."""
    return "__Secure-" + DEVICE_COOKIE if secure else DEVICE_COOKIE


def device_token(secret: bytes, username: str, nonce: str | None = None) -> str:
    """A device cookie's value for the account `username`: a nonce and its HMAC, bound to the account's name."""
    nonce = nonce or secrets.token_urlsafe(16)
    return f"{nonce}.{_device_mac(secret, username, nonce)}"


def device_knows(secret: bytes, username: str, token: str | None) -> bool:
    """The browser's device cookie says it has logged in to the account `username` before."""
    if not token or token.count(".") != 1:
        return False
    nonce, mac = token.split(".")
    return tokens_match(_device_mac(secret, username, nonce), mac)


def _device_mac(secret: bytes, username: str, nonce: str) -> str:
    name = username.strip().lower().encode()
    return hmac.new(secret, b"device:" + name + b":" + nonce.encode(), hashlib.sha256).hexdigest()


def add_security_headers(response: Response, secure: bool) -> Response:
    """The headers every response carries; pages and API answers are not stored by caches."""
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    if secure:
        response.headers.setdefault("Strict-Transport-Security", "max-age=31536000")
    if not response.headers.get("Cache-Control"):
        response.headers["Cache-Control"] = "no-store"
    return response
