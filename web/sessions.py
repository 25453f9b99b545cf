"""Server-side sessions and the failed-login counts, in Redis (adapters; the arithmetic is `web.access.LoginLimit`).

Keys (named by `billing.store.redis_keys.RedisKeys`):

| key | type | holds |
| --- | --- | --- |
| `PREFIX:web:session:HMAC` | hash | `username`, `generation`, `csrf`, `created_at_ms`, `seen_at_ms` (last activity) |
| `PREFIX:web:login-failures:account:SHA256` | sorted set | one member per login attempt on an account name, by time |
| `PREFIX:web:login-failures:address:ADDRESS` | sorted set | the same per client address (an IPv6 address's /64) |

The cookie carries only a random session id (256 bits). Redis keys hold an HMAC of it under the app's secret key,
so a copy of Redis gives no usable cookie. Logout deletes the record: the old cookie then opens nothing. A session
ends `ttl_s` after login however busy it is, and `idle_s` after its last request that counted as activity; both
are checked against the app's clock in the same script that reads the record, and Redis expires what is left.

A login attempt is checked against both limits and counted in one script, before its password is: parallel
attempts cannot all pass a check that none of them has counted in yet. A successful login takes its count back.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import secrets
import uuid
from dataclasses import dataclass

import redis

from billing.store.redis_keys import RedisKeys
from web.access import LoginDelay, LoginLimit

_SESSION_ID = re.compile(r"[A-Za-z0-9_-]{43}", re.ASCII)


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """What the server remembers of one login."""

    username: str
    generation: int
    csrf: str
    created_at_ms: int
    seen_at_ms: int


_READ_SESSION = """
local data = redis.call('HGETALL', KEYS[1])
if #data == 0 then return data end
local fields = {}
for i = 1, #data, 2 do fields[data[i]] = data[i + 1] end
local now, ttl_ms, idle_ms = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local created = tonumber(fields['created_at_ms'])
local seen = tonumber(fields['seen_at_ms'] or fields['created_at_ms'])
if created == nil or seen == nil or now >= created + ttl_ms or now >= seen + idle_ms then
  redis.call('DEL', KEYS[1])
  return {}
end
if ARGV[4] == '1' and now > seen then
  redis.call('HSET', KEYS[1], 'seen_at_ms', ARGV[1])
  redis.call('PEXPIRE', KEYS[1], math.min(idle_ms, created + ttl_ms - now))
  for i = 1, #data, 2 do if data[i] == 'seen_at_ms' then data[i + 1] = ARGV[1] end end
end
return data
"""
"""The live record of a session, or nothing (and the record gone) when it has outlived either limit; with ARGV[4]
`1` the request counts as activity."""


class SessionStore:
    """Sessions under one key prefix, each living `ttl_s` seconds from login and `idle_s` from its last activity."""

    def __init__(self, client: redis.Redis, prefix: str, secret: bytes, ttl_s: int, idle_s: int) -> None:
        if ttl_s < 1 or idle_s < 1:
            raise ValueError("a session lasts at least a second, and so does its idle time")
        self.client = client
        self.prefix = prefix
        self.keys = RedisKeys(prefix)
        self.secret = secret
        self.ttl_s = ttl_s
        self.idle_s = idle_s
        self._read = client.register_script(_READ_SESSION)

    def open(self, username: str, generation: int, now_ms: int) -> tuple[str, SessionRecord]:
        """A new session with a fresh id and CSRF token; returns (id for the cookie, record)."""
        session_id = secrets.token_urlsafe(32)
        record = SessionRecord(username, generation, secrets.token_urlsafe(32), now_ms, now_ms)
        key = self._key(session_id)
        pipe = self.client.pipeline()
        pipe.hset(
            key,
            mapping={
                "username": username,
                "generation": generation,
                "csrf": record.csrf,
                "created_at_ms": now_ms,
                "seen_at_ms": now_ms,
            },
        )
        pipe.pexpire(key, 1000 * min(self.ttl_s, self.idle_s))
        pipe.execute()
        return session_id, record

    def get(self, session_id: str, now_ms: int, activity: bool = True) -> SessionRecord | None:
        """The live session of this id at `now_ms`, or None (unknown, expired, idle too long, logged out or
        malformed). With `activity` the request counts: the idle time starts again from `now_ms`."""
        if not _SESSION_ID.fullmatch(session_id):
            return None
        ttl_ms, idle_ms = 1000 * self.ttl_s, 1000 * self.idle_s
        data = self._read(keys=[self._key(session_id)], args=[now_ms, ttl_ms, idle_ms, int(activity)])
        values = {_text(k): _text(v) for k, v in zip(data[0::2], data[1::2], strict=True)}
        try:
            return SessionRecord(
                values["username"],
                int(values["generation"]),
                values["csrf"],
                int(values["created_at_ms"]),
                int(values.get("seen_at_ms", values["created_at_ms"])),
            )
        except (KeyError, ValueError):
            return None

    def close(self, session_id: str) -> None:
        """Forget the session: its cookie no longer opens anything."""
        if _SESSION_ID.fullmatch(session_id):
            self.client.delete(self._key(session_id))

    def _key(self, session_id: str) -> str:
        digest = hmac.new(self.secret, session_id.encode(), hashlib.sha256).hexdigest()
        return self.keys.web_session(digest)


_ATTEMPT = """
local now = tonumber(ARGV[1])
local function oldest_over(key, max, window_ms)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window_ms)
  local n = redis.call('ZCARD', key)
  if n >= max then return redis.call('ZRANGE', key, n - max, n - max, 'WITHSCORES')[2] end
  return nil
end
if ARGV[7] ~= '1' then
  local unlocking = oldest_over(KEYS[1], tonumber(ARGV[3]), tonumber(ARGV[4]))
  if unlocking then return {1, unlocking, 0} end
end
local unlocking = oldest_over(KEYS[2], tonumber(ARGV[5]), tonumber(ARGV[6]))
if unlocking then return {2, unlocking, 0} end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - tonumber(ARGV[9]))
local n = redis.call('ZCARD', KEYS[3])
if n >= tonumber(ARGV[8]) then
  local newest = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')[2]
  local waits = ARGV[10 + n - tonumber(ARGV[8])] or ARGV[#ARGV]
  if now < tonumber(newest) + tonumber(waits) then return {3, newest, n} end
end
local windows = {ARGV[4], ARGV[6], ARGV[9]}
for i, key in ipairs(KEYS) do
  redis.call('ZADD', key, ARGV[1], ARGV[2])
  redis.call('PEXPIRE', key, windows[i])
end
return {0, '', 0}
"""
"""One login attempt, checked and counted in one step. KEYS: the account's failures, the client address's, the
account's from that address. Refused (1) when the account has ARGV[3] failures in ARGV[4] ms, unless the browser is
one the account has logged in from (ARGV[7] = 1); (2) when the address has ARGV[5] in ARGV[6] ms; (3) when the
account's failures from the address in ARGV[9] ms are ARGV[8] or more and the newest is more recent than the delay
the count calls for (ARGV[10], ARGV[11], ...: the delays after ARGV[8], ARGV[8] + 1, ... failures). Else the attempt
is counted (member ARGV[2] at time ARGV[1]) under every key. Returns {0} or {the limit, the failure's time that
decides when it unlocks, the count}."""


@dataclass(frozen=True, slots=True)
class LoginAttempt:
    """The answer to a login attempt: admitted (and counted, as `member`) or refused for `wait_s` seconds."""

    member: str | None = None
    refused_by: str | None = None
    """`account`, `address` or `client` (this account from this address, slowed down) when refused."""
    wait_s: int = 0


class LoginLimiter:
    """Failed logins per account name and per client address over a sliding window, as each `LoginLimit` says,
    and a growing delay per account name and client address (`LoginDelay`).

    The account's limit (ASVS 2.2.1: at most 100 failures an hour) refuses every browser the account has not
    logged in from (`trusted` False); a browser it has logged in from (a device cookie, `web.security`) is slowed
    by the delay of its address only, so an attacker who spreads guesses over addresses cannot lock the owner out."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        per_account: LoginLimit,
        per_address: LoginLimit,
        per_client: LoginDelay | None = None,
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.keys = RedisKeys(prefix)
        self.limits = {"account": per_account, "address": per_address}
        self.delay = per_client or LoginDelay()
        self._attempt = client.register_script(_ATTEMPT)

    def attempt(self, username: str, address: str | None, now_ms: int, trusted: bool = False) -> LoginAttempt:
        """Check the limits and count this attempt as a failure, in one step; `succeeded` takes it back. `trusted`:
        the browser is one the account has logged in from."""
        keys = [self._account_key(username), self._address_key(address), self._client_key(username, address)]
        member = uuid.uuid4().hex
        account, per_address, delay = self.limits["account"], self.limits["address"], self.delay
        doublings = max(0, (delay.max_delay_ms // max(1, delay.first_delay_ms)).bit_length()) + 1
        waits = [delay.delay_ms(delay.free_failures + i) for i in range(doublings)]
        args: list[str | int] = [
            now_ms,
            member,
            account.max_failures,
            account.window_ms,
            per_address.max_failures,
            per_address.window_ms,
            int(trusted),
            delay.free_failures,
            delay.window_ms,
            *waits,
        ]
        refused, unlocking, failures = self._attempt(keys=keys, args=args)
        if not int(refused):
            return LoginAttempt(member=member)
        if int(refused) == 3:
            newest = int(float(unlocking))
            wait_ms = newest + delay.delay_ms(int(failures)) - now_ms
            return LoginAttempt(refused_by="client", wait_s=max(1, -(-wait_ms // 1000)))
        kind = ["account", "address"][int(refused) - 1]
        return LoginAttempt(refused_by=kind, wait_s=self.limits[kind].retry_after_s(int(float(unlocking)), now_ms))

    def succeeded(self, username: str, address: str | None, attempt: LoginAttempt) -> None:
        """The attempt was the right password: it is not a failure after all."""
        if attempt.member is None:
            return
        pipe = self.client.pipeline()
        pipe.zrem(self._account_key(username), attempt.member)
        pipe.zrem(self._address_key(address), attempt.member)
        pipe.zrem(self._client_key(username, address), attempt.member)
        pipe.execute()

    def failures(self, username: str, now_ms: int) -> int:
        """Failed logins (and attempts under way) on the account name within the window ending now."""
        return self._count(self._account_key(username), self.limits["account"], now_ms)

    def address_failures(self, address: str | None, now_ms: int) -> int:
        """Failed logins (and attempts under way) from the client address within the window ending now."""
        return self._count(self._address_key(address), self.limits["address"], now_ms)

    def _count(self, key: str, limit: LoginLimit, now_ms: int) -> int:
        return int(self.client.zcount(key, f"({limit.window_start(now_ms)}", "+inf"))  # type: ignore[arg-type]

    def _account_key(self, username: str) -> str:
        return self.keys.login_failures_of_account(_name_digest(username))

    def _address_key(self, address: str | None) -> str:
        return self.keys.login_failures_of_address(client_network(address))

    def _client_key(self, username: str, address: str | None) -> str:
        return self.keys.login_failures_of_client(_name_digest(username), client_network(address))


def _name_digest(username: str) -> str:
    # Hashed: the name typed may be anything, of any length.
    return hashlib.sha256(username.strip().lower().encode()).hexdigest()


def client_network(address: str | None) -> str:
    """What one client's failures are counted under: its IPv4 address, or the /64 of its IPv6 address (one
    subscriber's usual share, which it could otherwise walk through); `unknown` when there is none."""
    try:
        ip = ipaddress.ip_address(address or "")
    except ValueError:
        return "unknown"
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
