"""Who sees what, and the failed-login arithmetic: the web UI's pure rules."""

from __future__ import annotations

import pytest

from web.access import (
    LoginLimit,
    Principal,
    Role,
    may_see_advertiser,
    may_see_finance,
    may_see_health,
    visible_advertisers,
)

ALICE = Principal("alice", Role.ADVERTISER, "adv-0000")
FIONA = Principal("fiona", Role.FINANCE)
ADA = Principal("ada", Role.ADMIN)
KNOWN = ["adv-0001", "adv-0000", "adv-0002"]


@pytest.mark.parametrize(
    "principal, advertiser, finance, health",
    [
        (ALICE, {"adv-0000": True, "adv-0001": False, "adv-00000": False, "": False}, False, False),
        (FIONA, {"adv-0000": True, "adv-0001": True}, True, True),  # finance reads the health page too
        (ADA, {"adv-0000": True, "adv-0001": True}, True, True),
    ],
)
def test_who_sees_what(principal: Principal, advertiser: dict[str, bool], finance: bool, health: bool) -> None:
    for advertiser_id, allowed in advertiser.items():
        assert may_see_advertiser(principal, advertiser_id) is allowed, advertiser_id
    assert may_see_finance(principal) is finance
    assert may_see_health(principal) is health


def test_visible_advertisers() -> None:
    assert visible_advertisers(ALICE, KNOWN) == ["adv-0000"]
    assert visible_advertisers(ALICE, []) == ["adv-0000"], "an advertiser sees itself even before any bill"
    assert visible_advertisers(FIONA, KNOWN) == ["adv-0000", "adv-0001", "adv-0002"]
    assert visible_advertisers(ADA, [*KNOWN, "adv-0000"]) == ["adv-0000", "adv-0001", "adv-0002"]


def test_an_advertiser_account_is_bound_to_exactly_one_advertiser() -> None:
    with pytest.raises(ValueError):
        Principal("x", Role.ADVERTISER)
    with pytest.raises(ValueError):
        Principal("x", Role.FINANCE, "adv-0000")
    with pytest.raises(ValueError):
        Principal("x", Role.ADMIN, "adv-0000")


HOUR = 3_600_000


@pytest.mark.parametrize(
    "failures, refused",
    [
        (0, False),
        (99, False),  # the 100th failure may still be attempted
        (100, True),  # 100 failures in the hour: the next attempt is refused, whatever the password
        (101, True),
    ],
)
def test_login_limit_refuses_after_100_failures(failures: int, refused: bool) -> None:
    assert LoginLimit().refused(failures) is refused


def test_login_limit_window_and_wait() -> None:
    limit = LoginLimit(max_failures=100, window_ms=HOUR)
    now = 10 * HOUR
    assert limit.window_start(now) == 9 * HOUR  # failures at or before this no longer count
    # The oldest failure 10 minutes ago: it leaves the window in 50 minutes.
    assert limit.retry_after_s(now - 600_000, now) == 3000
    # Rounded up to whole seconds, never 0.
    assert limit.retry_after_s(now - HOUR + 1, now) == 1
    assert limit.retry_after_s(now - HOUR, now) == 1
    assert limit.retry_after_s(now - HOUR + 1500, now) == 2


def test_login_limit_must_make_sense() -> None:
    with pytest.raises(ValueError):
        LoginLimit(max_failures=0)
    with pytest.raises(ValueError):
        LoginLimit(window_ms=0)
