"""Invalid traffic: the four rules of docs/billing-rules.md ("Invalid traffic"), in plain Python.

A click that the attribution rule bills and the catalog prices is charged unless it is invalid. The rules are judged
on every click received (billable or not, after duplicates and id conflicts are set aside), in this order, the first
that applies giving the reason:

1. `known_bot`: its `user_agent` matches a pattern of the crawler list (`billing.store.crawler_list`), searched
   anywhere in the text, case-sensitively;
2. `excluded_ip`: its `ip` lies in a range of the operator's IP exclusion list in force at its `event_time`
   (`IpExclusions`, a history kept with the catalog);
3. `click_flood`: its user made more than `flood_clicks` (20) clicks, on any ads, within `flood_window_ms` (60 s):
   every click of a run of 21 or more clicks of one user whose event times span at most 60 s is invalid;
4. `duplicate_click`: its predecessor among the user's clicks on the same ad (ordered by `event_time`, then
   `click_id`) is at most `duplicate_window_ms` (30 s) before it.

A rule that needs a field does not apply to a click without it; an `ip` that is not an address is judged as none.
`judge_clicks` is the reference: the simulator's ground truth and the tests use it, reconciliation's Spark job and
the streaming job's sink apply the same rules (`attribution.invalid`) and the tests hold them to it.
"""

from __future__ import annotations

import ipaddress
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import Any

from billing.budgets import change_record
from billing.events import Click

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class InvalidReason(StrEnum):
    """Why a click is invalid: the first rule that applies, in this order."""

    KNOWN_BOT = "known_bot"
    EXCLUDED_IP = "excluded_ip"
    CLICK_FLOOD = "click_flood"
    DUPLICATE_CLICK = "duplicate_click"


INVALID_REASONS: tuple[str, ...] = tuple(reason.value for reason in InvalidReason)
"""The rules' names, in their order."""


@dataclass(frozen=True)
class IvtRules:
    """The thresholds of the flood and duplicate rules (settings: `ADBILL_IVT_*`)."""

    flood_clicks: int = 20
    """A user's clicks within `flood_window_ms` beyond this many make a flood: 21 or more are invalid."""
    flood_window_ms: int = 60_000
    duplicate_window_ms: int = 30_000

    def __post_init__(self) -> None:
        for name in ("flood_clicks", "flood_window_ms", "duplicate_window_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} is a non-negative whole number, got {value!r}")

    def as_dict(self) -> dict[str, int]:
        return {
            "flood_clicks": self.flood_clicks,
            "flood_window_ms": self.flood_window_ms,
            "duplicate_window_ms": self.duplicate_window_ms,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> IvtRules:
        return cls(**{name: int(data[name]) for name in ("flood_clicks", "flood_window_ms", "duplicate_window_ms")})

    def or_judged_with(self, judged: Mapping[str, Any]) -> IvtRules:
        """The thresholds a closed period's export says it was judged with (its manifest's `judged_with`), or these
        when it names none (an export written before the thresholds were recorded, or not readable)."""
        try:
            return IvtRules.from_dict(judged) if judged.get("flood_clicks") is not None else self
        except (KeyError, TypeError, ValueError):
            return self


DEFAULT_RULES = IvtRules()
"""The contract's thresholds: more than 20 clicks within 60 s, a repeat within 30 s."""


# --- The IP exclusion list -------------------------------------------------------------------------------------


class ExclusionError(ValueError):
    """A change of the exclusion list that is refused; one line, for a person."""


def parse_cidr(text: object) -> IpNetwork:
    """An IPv4 or IPv6 range (`203.0.113.0/24`, `2001:db8::/32`, or one address); ExclusionError otherwise."""
    if not isinstance(text, str) or not text.strip():
        raise ExclusionError(f"an IP range is CIDR text such as 203.0.113.0/24 or 2001:db8::/32, got {text!r}")
    try:
        return ipaddress.ip_network(text.strip(), strict=True)
    except ValueError as exc:
        try:
            loose = ipaddress.ip_network(text.strip(), strict=False)
        except ValueError:
            raise ExclusionError(f"{text.strip()!r} is not an IP range ({exc})") from None
        raise ExclusionError(f"{text.strip()} has host bits set: the range is {loose}") from None


@lru_cache(maxsize=65_536)
def parse_ip(text: str | None) -> IpAddress | None:
    """The address in `text`, or None when it is not one (the click is judged as if it had none). The text is the
    address and nothing else: surrounding spaces, a port or a list of addresses make it not one. An IPv4-mapped IPv6
    address (`::ffff:203.0.113.5`, as dual-stack servers log IPv4 clients) is its IPv4 address."""
    if text is None:
        return None
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def matching_network(network: IpNetwork) -> IpNetwork:
    """The range as addresses are compared with it: a range of IPv4-mapped IPv6 addresses
    (`::ffff:203.0.113.0/120`) is its IPv4 range, as each of its addresses is its IPv4 address (`parse_ip`)."""
    if isinstance(network, ipaddress.IPv6Network) and network.prefixlen >= 96:
        mapped = network.network_address.ipv4_mapped
        if mapped is not None:
            return ipaddress.IPv4Network((mapped, network.prefixlen - 96))
    return network


@dataclass(frozen=True, slots=True)
class ExclusionChange:
    """From `effective_from` on, the range `cidr` is excluded (or, `excluded` False, no longer excluded)."""

    cidr: str
    effective_from: int
    excluded: bool
    version: int = 0
    made_by: str | None = None
    """Who made the change, through which `door` and when (`made_at`, epoch ms), as `billing.budgets.BudgetChange`
    says them; None for an entry recorded before changes said so."""
    door: str | None = None
    made_at: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return change_record(self)


class IpExclusions:
    """The IP exclusion list's history: per range, its entries (oldest first); `excluding(ip, t)` is the range that
    excludes `ip` at `t`, if any."""

    def __init__(self, changes: Iterable[ExclusionChange] = ()) -> None:
        by_range: dict[str, list[ExclusionChange]] = defaultdict(list)
        for change in changes:
            by_range[str(parse_cidr(change.cidr))].append(change)
        self.changes: tuple[ExclusionChange, ...] = tuple(
            sorted(
                (c for entries in by_range.values() for c in entries),
                key=lambda c: (c.cidr, c.effective_from, c.version),
            )
        )
        self._ranges: list[tuple[IpNetwork, str, list[int], list[bool]]] = []
        for cidr, entries in sorted(by_range.items()):
            entries.sort(key=lambda c: (c.effective_from, c.version))
            self._ranges.append(
                (
                    matching_network(parse_cidr(cidr)),
                    cidr,
                    [c.effective_from for c in entries],
                    [c.excluded for c in entries],
                )
            )

    def __bool__(self) -> bool:
        return bool(self.changes)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IpExclusions) and self.changes == other.changes

    def __hash__(self) -> int:
        return hash(self.changes)

    @property
    def version(self) -> int:
        return max((c.version for c in self.changes), default=0)

    def in_force(self, cidr: str, at_ms: int) -> bool:
        """Whether the range `cidr` is excluded at `at_ms`."""
        key = str(parse_cidr(cidr))
        for _network, name, starts, flags in self._ranges:
            if name == key:
                index = bisect_right(starts, at_ms) - 1
                return index >= 0 and flags[index]
        return False

    def ranges_at(self, at_ms: int) -> list[str]:
        """The ranges excluded at `at_ms`."""
        return [name for _n, name, starts, flags in self._ranges if _flag_at(starts, flags, at_ms)]

    def excluding(self, ip: str | None, at_ms: int) -> str | None:
        """The range that excludes the address `ip` at `at_ms` (the first listed), or None."""
        if not self._ranges:
            return None
        address = parse_ip(ip)
        if address is None:
            return None
        for network, name, starts, flags in self._ranges:
            if address.version == network.version and address in network and _flag_at(starts, flags, at_ms):
                return name
        return None

    def as_of(self, version: int) -> IpExclusions:
        return IpExclusions(c for c in self.changes if c.version <= version)

    def with_change(self, change: ExclusionChange) -> IpExclusions:
        return IpExclusions((*self.changes, change))

    def to_list(self) -> list[dict[str, Any]]:
        return [c.to_dict() for c in self.changes]

    @classmethod
    def from_list(cls, rows: Iterable[Mapping[str, Any]]) -> IpExclusions:
        return cls(
            ExclusionChange(
                str(r["cidr"]),
                int(r["effective_from"]),
                bool(r["excluded"]),
                int(r.get("version", 0)),
                _text_or_none(r.get("made_by")),
                _text_or_none(r.get("door")),
                None if r.get("made_at") is None else int(r["made_at"]),
            )
            for r in rows
        )

    def history(self, cidr: str) -> list[ExclusionChange]:
        """The entries of one range, oldest first."""
        key = str(parse_cidr(cidr))
        return sorted(
            (c for c in self.changes if str(parse_cidr(c.cidr)) == key), key=lambda c: (c.effective_from, c.version)
        )


def _text_or_none(value: object) -> str | None:
    return None if value is None else str(value)


def _flag_at(starts: Sequence[int], flags: Sequence[bool], at_ms: int) -> bool:
    index = bisect_right(starts, at_ms) - 1
    return index >= 0 and flags[index]


# --- Judging clicks --------------------------------------------------------------------------------------------


def flood_clicks(times: Sequence[tuple[int, str]], rules: IvtRules) -> set[str]:
    """The click ids of one user's clicks (`(event_time, click_id)`, any order) that belong to a run of more than
    `rules.flood_clicks` clicks spanning at most `rules.flood_window_ms` (both ends inclusive)."""
    ordered = sorted(times)
    need = rules.flood_clicks + 1
    if len(ordered) < need:
        return set()
    flagged: set[str] = set()
    end = 0
    marked = 0  # ordered[:marked] are in `flagged` or before every run found so far
    for start, (start_time, _) in enumerate(ordered):
        end = max(end, start)
        while end + 1 < len(ordered) and ordered[end + 1][0] <= start_time + rules.flood_window_ms:
            end += 1
        if end - start + 1 >= need:
            flagged.update(click_id for _, click_id in ordered[max(start, marked) : end + 1])
            marked = end + 1
    return flagged


def duplicate_clicks(times: Sequence[tuple[int, str]], rules: IvtRules) -> set[str]:
    """The click ids of one user's clicks on one ad (`(event_time, click_id)`) whose predecessor, by event time then
    click id, is at most `rules.duplicate_window_ms` before them."""
    ordered = sorted(times)
    return {
        click_id
        for (before, _), (at, click_id) in zip(ordered, ordered[1:], strict=False)
        if at - before <= rules.duplicate_window_ms
    }


def judge_clicks(
    clicks: Iterable[Click | Any],
    *,
    is_bot: Callable[[str], bool],
    exclusions: IpExclusions,
    rules: IvtRules = DEFAULT_RULES,
) -> dict[str, InvalidReason]:
    """The invalid clicks among `clicks` (every click received, one copy per id), with the first rule that applies.

    `is_bot` is the crawler list's match (`billing.store.crawler_list.CrawlerList.matches`)."""
    listed = list(clicks)
    by_user: dict[str, list[tuple[int, str]]] = defaultdict(list)
    by_user_ad: dict[tuple[str, str], list[tuple[int, str]]] = defaultdict(list)
    for click in listed:
        by_user[click.user_id].append((click.event_time, click.click_id))
        by_user_ad[(click.user_id, click.ad_id)].append((click.event_time, click.click_id))
    flooded: set[str] = set()
    for times in by_user.values():
        flooded |= flood_clicks(times, rules)
    duplicated: set[str] = set()
    for times in by_user_ad.values():
        duplicated |= duplicate_clicks(times, rules)
    verdicts: dict[str, InvalidReason] = {}
    for click in listed:
        reason = first_reason(
            bot=click.user_agent is not None and is_bot(click.user_agent),
            excluded=exclusions.excluding(click.ip, click.event_time) is not None,
            flood=click.click_id in flooded,
            duplicate=click.click_id in duplicated,
        )
        if reason is not None:
            verdicts[click.click_id] = reason
    return verdicts


def first_reason(*, bot: bool, excluded: bool, flood: bool, duplicate: bool) -> InvalidReason | None:
    """The reason of the first rule that applies, in the contract's order."""
    if bot:
        return InvalidReason.KNOWN_BOT
    if excluded:
        return InvalidReason.EXCLUDED_IP
    if flood:
        return InvalidReason.CLICK_FLOOD
    if duplicate:
        return InvalidReason.DUPLICATE_CLICK
    return None


def invalid_click_rate(invalid: int, charged: int) -> tuple[int, int]:
    """The invalid click rate as a fraction (numerator, denominator): invalid / (charged + invalid)."""
    return invalid, charged + invalid


def format_rate(invalid: int, charged: int) -> str:
    """The invalid click rate for people, such as `4.2 %` (one decimal, rounded half up, exact); `-` with no clicks."""
    total = charged + invalid
    if total <= 0:
        return "-"
    tenths = (invalid * 2000 + total) // (2 * total)
    return f"{tenths // 10}.{tenths % 10} %"
