"""Server-side sessions and the failed-login count, in Redis (adapters; the arithmetic is `web.access.LoginLimit`).

| key | type | holds |
| --- | --- | --- |
| `PREFIX:web:session:HMAC` | hash | `username`, `generation`, `csrf`, `created_at_ms`; expires with the session |
| `PREFIX:web:login-failures:SHA256` | sorted set | one member per failed login of an account, scored by its time |

The cookie carries only a random session id (256 bits). Redis keys hold an HMAC of it under the app's secret key,
so a copy of Redis gives no usable cookie. Logout deletes the record: the old cookie then opens nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import uuid
from dataclasses import dataclass

import redis

from web.access import LoginLimit

_SESSION_ID = re.compile(r"[A-Za-z0-9_-]{43}", re.ASCII)


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """What the server remembers of one login."""

    username: str
    generation: int
    csrf: str
    created_at_ms: int


class SessionStore:
    """Sessions under one key prefix, each living `ttl_s` seconds from login."""

    def __init__(self, client: redis.Redis, prefix: str, secret: bytes, ttl_s: int) -> None:
        self.client = client
        self.prefix = prefix
        self.secret = secret
        self.ttl_s = ttl_s

    def open(self, username: str, generation: int, now_ms: int) -> tuple[str, SessionRecord]:
        """A new session with a fresh id and CSRF token; returns (id for the cookie, record)."""
        session_id = secrets.token_urlsafe(32)
        record = SessionRecord(username, generation, secrets.token_urlsafe(32), now_ms)
        key = self._key(session_id)
        pipe = self.client.pipeline()
        pipe.hset(
            key,
            mapping={
                "username": username,
                "generation": generation,
                "csrf": record.csrf,
                "created_at_ms": now_ms,
            },
        )
        pipe.expire(key, self.ttl_s)
        pipe.execute()
        return session_id, record

    def get(self, session_id: str) -> SessionRecord | None:
        """The live session of this id, or None (unknown, expired, logged out or malformed)."""
        if not _SESSION_ID.fullmatch(session_id):
            return None
        data = self.client.hgetall(self._key(session_id))
        if not data:
            return None
        values = {_text(k): _text(v) for k, v in data.items()}  # type: ignore[union-attr]
        try:
            return SessionRecord(
                values["username"], int(values["generation"]), values["csrf"], int(values["created_at_ms"])
            )
        except (KeyError, ValueError):
            return None

    def close(self, session_id: str) -> None:
        """Forget the session: its cookie no longer opens anything."""
        if _SESSION_ID.fullmatch(session_id):
            self.client.delete(self._key(session_id))

    def _key(self, session_id: str) -> str:
        digest = hmac.new(self.secret, session_id.encode(), hashlib.sha256).hexdigest()
        return f"{self.prefix}:web:session:{digest}"


class LoginLimiter:
    """Failed logins per account over a sliding window, as `LoginLimit` says."""

    def __init__(self, client: redis.Redis, prefix: str, limit: LoginLimit) -> None:
        self.client = client
        self.prefix = prefix
        self.limit = limit

    def refusal(self, username: str, now_ms: int) -> int | None:
        """Seconds to wait when the account's logins are refused now, else None."""
        key = self._key(username)
        pipe = self.client.pipeline()
        pipe.zremrangebyscore(key, "-inf", self.limit.window_start(now_ms))
        pipe.zrange(key, 0, -1, withscores=True)
        _, failures = pipe.execute()
        if not self.limit.refused(len(failures)):
            return None
        # The attempt becomes possible when enough failures have left the window to go below the limit.
        unlocking = failures[len(failures) - self.limit.max_failures][1]
        return self.limit.retry_after_s(int(unlocking), now_ms)

    def record_failure(self, username: str, now_ms: int) -> None:
        key = self._key(username)
        pipe = self.client.pipeline()
        pipe.zadd(key, {uuid.uuid4().hex: now_ms})
        pipe.pexpire(key, self.limit.window_ms)
        pipe.execute()

    def failures(self, username: str, now_ms: int) -> int:
        """Failed logins of the account within the window ending now."""
        return int(self.client.zcount(self._key(username), f"({self.limit.window_start(now_ms)}", "+inf"))  # type: ignore[arg-type]

    def _key(self, username: str) -> str:
        # Hashed: the name typed may be anything, of any length.
        digest = hashlib.sha256(username.strip().lower().encode()).hexdigest()
        return f"{self.prefix}:web:login-failures:{digest}"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
