"""Who may see what, and when a login is refused: the web UI's rules, pure (no Flask, no Redis).

docs/billing-rules.md, "Who sees what": an advertiser sees its own totals, clicks and corrections and nothing of any
other advertiser; finance sees every advertiser's totals and the exports, and the pipeline's health (reading it, not
changing anything: its closing of the books waits on the stream and reconciliation); an admin sees everything. Whatever
a principal may not see does not exist for it: the views answer 404, the same answer as for an id that exists nowhere,
so that ids of other advertisers cannot even be probed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum


class Role(StrEnum):
    """The three kinds of account."""

    ADVERTISER = "advertiser"
    """Bound to one advertiser; sees that advertiser only."""
    FINANCE = "finance"
    """Every advertiser's totals, the periods, the finance exports and the pipeline's health."""
    ADMIN = "admin"
    """Everything finance sees, and the catalog's changes and the IP exclusion list."""


@dataclass(frozen=True, slots=True)
class Principal:
    """The person behind a request, once logged in."""

    username: str
    role: Role
    advertiser_id: str | None = None

    def __post_init__(self) -> None:
        if (self.role is Role.ADVERTISER) != bool(self.advertiser_id):
            raise ValueError("an advertiser account is bound to exactly one advertiser; other roles to none")


def may_see_advertiser(principal: Principal, advertiser_id: str) -> bool:
    """An advertiser sees its own advertiser only; finance and admin see all."""
    if principal.role is Role.ADVERTISER:
        return principal.advertiser_id == advertiser_id
    return True


def may_see_finance(principal: Principal) -> bool:
    """Every advertiser's totals, the periods and the exports."""
    return principal.role in (Role.FINANCE, Role.ADMIN)


def may_see_health(principal: Principal) -> bool:
    """The pipeline's health: lag, watermarks, batch durations, late and quarantined counts, reconciliation's runs:
    an admin's, and finance's, whose closing of the books waits on the stream and on reconciliation."""
    return principal.role in (Role.FINANCE, Role.ADMIN)


def may_change_catalog(principal: Principal) -> bool:
    """Create ads, set, pause and resume their prices: an admin only (finance and advertisers read the catalog)."""
    return principal.role is Role.ADMIN


def visible_advertisers(principal: Principal, known: Iterable[str]) -> list[str]:
    """The advertisers of `known` the principal may see, sorted; an advertiser always sees its own."""
    if principal.role is Role.ADVERTISER:
        return [principal.advertiser_id] if principal.advertiser_id else []
    return sorted(set(known))


@dataclass(frozen=True, slots=True)
class LoginLimit:
    """At most `max_failures` failed logins per account in any window of `window_ms`; then logins are refused,
    even with the right password, until the oldest failure of the window is older than the window."""

    max_failures: int = 100
    window_ms: int = 3_600_000

    def __post_init__(self) -> None:
        if self.max_failures < 1 or self.window_ms < 1:
            raise ValueError("a login limit needs at least one failure and a window of at least 1 ms")

    def window_start(self, now_ms: int) -> int:
        """Failures at or before this instant no longer count."""
        return now_ms - self.window_ms

    def refused(self, failures_in_window: int) -> bool:
        """True when the account has used up its failures: the next attempt is refused without checking it."""
        return failures_in_window >= self.max_failures

    def retry_after_s(self, oldest_failure_ms: int, now_ms: int) -> int:
        """Whole seconds until the oldest failure leaves the window (at least 1)."""
        return max(1, -(-(oldest_failure_ms + self.window_ms - now_ms) // 1000))


@dataclass(frozen=True, slots=True)
class LoginDelay:
    """Failed logins of one account from one client address: the first `free_failures` in `window_ms` cost
    nothing, each one after them makes the next attempt from that address wait twice as long as the one before
    (from `first_delay_ms` up to `max_delay_ms`). It slows a guesser without locking the account's owner out."""

    free_failures: int = 5
    first_delay_ms: int = 1_000
    max_delay_ms: int = 900_000
    window_ms: int = 3_600_000

    def delay_ms(self, failures_in_window: int) -> int:
        """How long after the newest failure the next attempt waits (0: none)."""
        if failures_in_window < self.free_failures:
            return 0
        doublings = min(failures_in_window - self.free_failures, 40)
        return min(self.first_delay_ms * 2**doublings, self.max_delay_ms)
