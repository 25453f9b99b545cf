"""The invalid traffic rules (docs/billing-rules.md), case by case at explicit timestamps: the plain rule
(`billing.rule.bill`) and the DuckDB oracle (`tests.oracle.outcomes`) must both give each click its outcome."""

from __future__ import annotations

from pathlib import Path

import pytest

from billing.catalog import Ad, Catalog
from billing.events import Click, Impression
from billing.invalid import ExclusionChange, IpExclusions, IvtRules, duplicate_clicks, flood_clicks, format_rate
from billing.rule import bill
from billing.store.crawler_list import CrawlerList, crawler_list, keep_list, kept_list
from tests.dense_traffic import outcomes_each_billable

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
S = 1_000
BOT = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"
BROWSER = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0 Safari/537.36"
ADS = [Ad(f"ad-{n:02d}", "cmp-1", "adv-1", 100_000 + n, "EUR") for n in range(25)]


def catalog(*exclusions: ExclusionChange) -> Catalog:
    return Catalog(ADS, exclusions=IpExclusions(exclusions))


def c(click_id: str, at: int, ad: int = 0, user: str = "u1", ua: str | None = None, ip: str | None = None) -> Click:
    return Click(click_id, f"ad-{ad:02d}", user, at, ua, ip)


NET = ExclusionChange("203.0.113.0/24", 0, True)
NET6 = ExclusionChange("2001:db8::/32", 0, True)

CASES = [
    # A second click of the user on the ad exactly 30 s after the first is a duplicate (the bound is inclusive).
    pytest.param([c("c1", T0), c("c2", T0 + 30_000)], (), {"c1": "charged", "c2": "duplicate_click"}, id="dup-30000"),
    # One millisecond later it is not.
    pytest.param([c("c1", T0), c("c2", T0 + 30_001)], (), {"c1": "charged", "c2": "charged"}, id="dup-30001"),
    # A run of three clicks 20 s apart: each is within 30 s of the one before, so only the first is charged, though
    # the third is 40 s after the first.
    pytest.param(
        [c("c1", T0), c("c2", T0 + 20 * S), c("c3", T0 + 40 * S)],
        (),
        {"c1": "charged", "c2": "duplicate_click", "c3": "duplicate_click"},
        id="run-of-three-20s-apart",
    ),
    # Two clicks at the same millisecond: ordered by click id, the smaller one stands.
    pytest.param([c("c9", T0), c("c2", T0)], (), {"c2": "charged", "c9": "duplicate_click"}, id="same-ms"),
    # The same user on another ad is no duplicate.
    pytest.param([c("c1", T0), c("c2", T0 + S, ad=1)], (), {"c1": "charged", "c2": "charged"}, id="other-ad"),
    # Another user on the same ad is no duplicate.
    pytest.param([c("c1", T0), c("c2", T0 + S, user="u2")], (), {"c1": "charged", "c2": "charged"}, id="other-user"),
    # 20 clicks of one user within 60 s (on 20 ads, so none is a duplicate) are no flood.
    pytest.param(
        [c(f"c{n:02d}", T0 + n * 3 * S, ad=n) for n in range(20)],
        (),
        {f"c{n:02d}": "charged" for n in range(20)},
        id="20-in-60s",
    ),
    # 21 clicks within 60 s: every one of them is a flood, the first too.
    pytest.param(
        [c(f"c{n:02d}", T0 + n * 2 * S, ad=n) for n in range(21)],
        (),
        {f"c{n:02d}": "click_flood" for n in range(21)},
        id="21-in-60s",
    ),
    # 21 clicks spanning exactly 60 000 ms (both ends inclusive) are a flood ...
    pytest.param(
        [c(f"c{n:02d}", T0 + n * 3 * S, ad=n) for n in range(21)],
        (),
        {f"c{n:02d}": "click_flood" for n in range(21)},
        id="21-span-60000",
    ),
    # ... spanning 60 001 ms they are not: no 60 s holds more than 20 of them.
    pytest.param(
        [c(f"c{n:02d}", T0 + n * 3 * S + (1 if n == 20 else 0), ad=n) for n in range(21)],
        (),
        {f"c{n:02d}": "charged" for n in range(21)},
        id="21-span-60001",
    ),
    # A flood across a few ads: the flood comes before the duplicates it also holds.
    pytest.param(
        [c(f"c{n:02d}", T0 + n * 2 * S, ad=n % 3) for n in range(25)],
        (),
        {f"c{n:02d}": "click_flood" for n in range(25)},
        id="flood-across-ads",
    ),
    # A run of 21 in 60 s among a user's slower clicks: only the clicks of the run are floods.
    pytest.param(
        [c("early", T0 - 120 * S, ad=24)] + [c(f"c{n:02d}", T0 + n * S, ad=n) for n in range(21)],
        (),
        {"early": "charged", **{f"c{n:02d}": "click_flood" for n in range(21)}},
        id="flood-run-only",
    ),
    # A known crawler's user agent is a bot.
    pytest.param([c("c1", T0, ua=BOT)], (), {"c1": "known_bot"}, id="bot"),
    # The list matches case-sensitively, as the package's own is_crawler does: other letter case is no match.
    pytest.param([c("c1", T0, ua=BOT.replace("Googlebot", "googlebot"))], (), {"c1": "charged"}, id="bot-case"),
    # A browser's user agent is not a bot.
    pytest.param([c("c1", T0, ua=BROWSER)], (), {"c1": "charged"}, id="browser"),
    # An address in an excluded IPv4 range.
    pytest.param([c("c1", T0, ip="203.0.113.77")], (NET,), {"c1": "excluded_ip"}, id="ipv4-excluded"),
    # Just outside it.
    pytest.param([c("c1", T0, ip="203.0.114.1")], (NET,), {"c1": "charged"}, id="ipv4-outside"),
    # An IPv6 range, an address in it and one outside it.
    pytest.param(
        [c("c1", T0, ip="2001:db8::1"), c("c2", T0, user="u2", ip="2001:db9::1")],
        (NET6,),
        {"c1": "excluded_ip", "c2": "charged"},
        id="ipv6",
    ),
    # An IPv4 address is never in an IPv6 range (nor the reverse).
    pytest.param([c("c1", T0, ip="203.0.113.1")], (NET6,), {"c1": "charged"}, id="ipv4-vs-ipv6-range"),
    # An IPv4-mapped IPv6 address (how dual-stack servers log IPv4 clients) is its IPv4 address: in an excluded
    # IPv4 range, in either letter case and spelling, and outside it when its IPv4 address is.
    pytest.param(
        [
            c("c1", T0, ip="::ffff:203.0.113.5"),
            c("c2", T0, user="u2", ip="::FFFF:cb00:7105"),
            c("c3", T0, user="u3", ip="0:0:0:0:0:ffff:203.0.113.9"),
            c("c4", T0, user="u4", ip="::ffff:203.0.114.5"),
        ],
        (NET,),
        {"c1": "excluded_ip", "c2": "excluded_ip", "c3": "excluded_ip", "c4": "charged"},
        id="ipv4-mapped-ipv6-in-ipv4-range",
    ),
    # A range written as IPv4-mapped IPv6 excludes the IPv4 addresses it maps, however the click writes them.
    pytest.param(
        [c("c1", T0, ip="203.0.113.5"), c("c2", T0, user="u2", ip="::ffff:203.0.113.6")],
        (ExclusionChange("::ffff:203.0.113.0/120", 0, True),),
        {"c1": "excluded_ip", "c2": "excluded_ip"},
        id="ipv4-mapped-range",
    ),
    # An IPv6 address that only looks alike (IPv4-compatible, not mapped) is not the IPv4 address.
    pytest.param([c("c1", T0, ip="::203.0.113.5")], (NET,), {"c1": "charged"}, id="ipv4-compatible-not-mapped"),
    # An `ip` that is not an address is judged as none: not bad input, not excluded.
    pytest.param([c("c1", T0, ip="not-an-ip")], (NET,), {"c1": "charged"}, id="ip-not-an-address"),
    # Nor is an address with anything around it: spaces, a port, a second address.
    pytest.param(
        [
            c("c1", T0, ip=" 203.0.113.7"),
            c("c2", T0, user="u2", ip="203.0.113.7:443"),
            c("c3", T0, user="u3", ip="203.0.113.7, 192.0.2.1"),
        ],
        (NET,),
        {"c1": "charged", "c2": "charged", "c3": "charged"},
        id="ip-with-more-than-an-address",
    ),
    # A range added after the click's time does not apply to it; it does to a click after.
    pytest.param(
        [c("c1", T0 + 10 * S - 1, ip="203.0.113.7"), c("c2", T0 + 10 * S, user="u2", ip="203.0.113.7")],
        (ExclusionChange("203.0.113.0/24", T0 + 10 * S, True, 1),),
        {"c1": "charged", "c2": "excluded_ip"},
        id="range-added-later",
    ),
    # A range removed from a time on no longer applies from then.
    pytest.param(
        [c("c1", T0 - 1, ip="203.0.113.7"), c("c2", T0, user="u2", ip="203.0.113.7")],
        (ExclusionChange("203.0.113.0/24", 0, True, 1), ExclusionChange("203.0.113.0/24", T0, False, 2)),
        {"c1": "excluded_ip", "c2": "charged"},
        id="range-removed",
    ),
    # A click that is a bot, from an excluded range and a duplicate takes the first rule's name.
    pytest.param(
        [c("c1", T0), c("c2", T0 + S, ua=BOT, ip="203.0.113.7")],
        (NET,),
        {"c1": "charged", "c2": "known_bot"},
        id="bot-and-duplicate",
    ),
    # A click without the optional fields (version 1): the first two rules do not apply to it.
    pytest.param([c("c1", T0)], (NET,), {"c1": "charged"}, id="version-1"),
]


@pytest.mark.parametrize(("clicks", "exclusions", "expected"), CASES)
def test_invalid_traffic_cases(
    clicks: list[Click], exclusions: tuple[ExclusionChange, ...], expected: dict[str, str]
) -> None:
    plain, independent = outcomes_each_billable(clicks, catalog(*exclusions))
    assert plain == expected
    assert independent == expected


def test_the_thresholds_are_settings() -> None:
    times = [(T0 + n * S, f"c{n}") for n in range(5)]
    assert flood_clicks(times, IvtRules(flood_clicks=4)) == {f"c{n}" for n in range(5)}
    assert flood_clicks(times, IvtRules(flood_clicks=5)) == set()
    assert flood_clicks(times, IvtRules(flood_clicks=4, flood_window_ms=3 * S)) == set()
    assert duplicate_clicks(times, IvtRules(duplicate_window_ms=999)) == set()
    assert duplicate_clicks(times, IvtRules(duplicate_window_ms=1000)) == {"c1", "c2", "c3", "c4"}


def test_a_click_not_billable_is_judged_but_not_counted_invalid() -> None:
    # A click without an impression is not billable: its outcome is that, and it still counts for the flood of
    # the others (every click received is judged).
    clicks = [c(f"c{n:02d}", T0 + n * S, ad=n) for n in range(21)]
    impressions = [Impression(f"i{n}", f"ad-{n:02d}", "u1", T0 + n * S - S) for n in range(1, 21)]
    result = bill(impressions, clicks, catalog(), is_bot=crawler_list().matches)
    assert result.charged == []
    assert result.reasons() == {f"c{n:02d}": "click_flood" for n in range(1, 21)}


def test_the_invalid_click_rate_is_exact() -> None:
    assert format_rate(0, 0) == "-"
    assert format_rate(1, 2) == "33.3 %"
    assert format_rate(2, 1) == "66.7 %"
    assert format_rate(1, 999) == "0.1 %"
    assert format_rate(1, 1999) == "0.1 %"  # 0.05 % rounds half up
    assert format_rate(5, 0) == "100.0 %"


def test_a_closed_period_keeps_the_thresholds_its_export_was_judged_with() -> None:
    now = IvtRules(flood_clicks=30, duplicate_window_ms=500)
    recorded = {
        "crawler_list_version": "1.0",
        "flood_clicks": 20,
        "flood_window_ms": 60_000,
        "duplicate_window_ms": 30_000,
    }
    assert now.or_judged_with(recorded) == IvtRules()
    # An export that names no thresholds (written before they were recorded), or names them badly: today's.
    assert now.or_judged_with({"crawler_list_version": "1.0"}) is now
    assert now.or_judged_with({"flood_clicks": 20}) is now
    assert now.or_judged_with({"flood_clicks": "many", "flood_window_ms": 1, "duplicate_window_ms": 1}) is now


def test_the_crawler_list_a_closed_period_was_judged_with_is_kept_once_and_read_back(tmp_path: Path) -> None:
    folder = tmp_path / "crawler-lists"
    older = CrawlerList("0.9.1", ("Googlebot", r"bingbot\/"))
    path = keep_list(folder, older)
    assert path == folder / "0.9.1.json"
    written = path.stat().st_mtime_ns
    assert keep_list(folder, CrawlerList("0.9.1", ("changed",))) == path  # a version is written once
    assert path.stat().st_mtime_ns == written
    back = kept_list(folder, "0.9.1")
    assert back is not None and back.patterns == older.patterns and back.matches("x Googlebot/2.1")
    # The installed version needs no file; one never kept is None (an export from before the lists were kept).
    assert kept_list(folder, crawler_list().version) is crawler_list()
    assert kept_list(folder, "0.0.1") is None
    assert [p.name for p in folder.iterdir()] == ["0.9.1.json"], "no staging file left"
    with pytest.raises(ValueError, match="not a version"):
        kept_list(folder, "../../etc/passwd")
    (folder / "0.9.2.json").write_text('{"version": "0.9.3", "patterns": []}')
    with pytest.raises(ValueError, match="does not hold version 0.9.2"):
        kept_list(folder, "0.9.2")
