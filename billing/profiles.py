"""Billing profiles: who an invoice is addressed to and what tax it carries, per advertiser, kept with history.

A profile (name, address, tax id, tax rate) is in force from its `effective_from` on, until the next one of its
advertiser; an invoice takes the one in force at its month's end (docs/billing-rules.md, "Invoices"). A change takes
effect now or later, never in the past: an invoice already issued keeps the profile it was issued with (a copy), and an
issued month is never re-read. Each entry keeps who made it, through which door and when.

The tax rate is a percentage written as an exact decimal (`19`, `7.7`, `0`), kept as that text and read as a
`Fraction`, never a float.

Pure: the store is `billing.store.profiles_db`.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

from billing.catalog import MadeBy, format_time

MAX_TAX_DECIMALS = 6
_RATE = re.compile(r"(\d{1,3})(?:\.(\d{1,6}))?", re.ASCII)
MAX_TEXT = 500
"""The longest name, address or tax id kept."""


class ProfileError(ValueError):
    """A profile change that is refused; the message says why, in one line."""


def parse_tax_rate(text: str) -> str:
    """A tax rate typed in percent (`19`, `7.70`, `0`) as its exact, normalized decimal text (`19`, `7.7`, `0`);
    ProfileError unless it is a number from 0 to 100 with at most six decimals (no sign, no exponent, no `%`)."""
    cleaned = text.strip().removesuffix("%").strip() if isinstance(text, str) else ""
    match = _RATE.fullmatch(cleaned)
    if match is None:
        raise ProfileError(
            f"a tax rate is a percentage from 0 to 100 with at most {MAX_TAX_DECIMALS} decimals, such as 19 or "
            f"7.7; got {text!r}"
        )
    units, decimals = int(match.group(1)), (match.group(2) or "").rstrip("0")
    if units > 100 or (units == 100 and decimals):
        raise ProfileError(f"a tax rate is at most 100 %; got {text!r}")
    return f"{units}.{decimals}" if decimals else str(units)


def tax_fraction(rate: str) -> Fraction:
    """The rate as an exact fraction of one (`"19"` -> 19/100)."""
    units, _, decimals = parse_tax_rate(rate).partition(".")
    return Fraction(int(units + decimals), 100 * 10 ** len(decimals))


@dataclass(frozen=True, slots=True)
class BillingProfile:
    """An advertiser's billing profile from `effective_from` (epoch ms UTC) on."""

    advertiser_id: str
    name: str
    address: str
    tax_id: str
    tax_rate: str
    """Percent, as an exact decimal text (`parse_tax_rate`)."""
    effective_from: int
    version: int = 0
    made_by: str | None = None
    door: str | None = None
    made_at: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BillingProfile:
        return cls(
            advertiser_id=str(data["advertiser_id"]),
            name=str(data["name"]),
            address=str(data["address"]),
            tax_id=str(data.get("tax_id") or ""),
            tax_rate=parse_tax_rate(str(data["tax_rate"])),
            effective_from=int(data["effective_from"]),
            version=int(data.get("version") or 0),
            made_by=data.get("made_by"),
            door=data.get("door"),
            made_at=None if data.get("made_at") is None else int(data["made_at"]),
        )

    @property
    def address_lines(self) -> list[str]:
        return [line.strip() for line in self.address.splitlines() if line.strip()]


def profile_change(
    advertiser_id: str,
    name: str | None,
    address: str | None,
    tax_id: str | None,
    tax_rate: str | None,
    at_ms: int,
    made_by: MadeBy | None = None,
) -> BillingProfile:
    """A person's request (the command's options, the admin page's form) read into a profile entry; ProfileError
    when a field is missing or not readable. `BillingProfiles.with_profile` sets its version and when it was made."""
    fields = {"name": name, "address": address}
    for label, value in fields.items():
        if value is None or not value.strip():
            raise ProfileError(f"a billing profile needs a {label}")
    for label, value in (*fields.items(), ("tax id", tax_id or "")):
        if len(value or "") > MAX_TEXT:
            raise ProfileError(f"the {label} is longer than {MAX_TEXT} characters")
    if tax_rate is None or not tax_rate.strip():
        raise ProfileError("a billing profile needs a tax rate, in percent (0 when no tax is charged)")
    return BillingProfile(
        advertiser_id=advertiser_id,
        name=(name or "").strip(),
        address="\n".join(line.strip() for line in (address or "").strip().splitlines() if line.strip()),
        tax_id=(tax_id or "").strip(),
        tax_rate=parse_tax_rate(tax_rate),
        effective_from=at_ms,
        made_by=made_by.who if made_by else None,
        door=made_by.door if made_by else None,
    )


class BillingProfiles:
    """Every advertiser's profile history, oldest first per advertiser; immutable (`with_profile` makes a new one)."""

    def __init__(self, entries: Iterable[BillingProfile] = (), version: int = 0) -> None:
        history: dict[str, list[BillingProfile]] = {}
        for entry in entries:
            history.setdefault(entry.advertiser_id, []).append(entry)
        self._history = {a: tuple(sorted(e, key=lambda p: (p.effective_from, p.version))) for a, e in history.items()}
        self.version = version

    @property
    def advertiser_ids(self) -> list[str]:
        return sorted(self._history)

    def history(self, advertiser_id: str) -> tuple[BillingProfile, ...]:
        return self._history.get(advertiser_id, ())

    def in_force(self, advertiser_id: str, at_ms: int) -> BillingProfile | None:
        """The profile in force at `at_ms` (the latest entry from at or before it); None when there is none."""
        entries = self.history(advertiser_id)
        index = bisect_right([e.effective_from for e in entries], at_ms) - 1
        return entries[index] if index >= 0 else None

    def next_change(self, advertiser_id: str, at_ms: int) -> BillingProfile | None:
        """The first entry that takes effect after `at_ms` (a change planned), or None."""
        return next((e for e in self.history(advertiser_id) if e.effective_from > at_ms), None)

    def with_profile(self, entry: BillingProfile, now_ms: int) -> BillingProfiles:
        """The profiles with `entry` added as version `version + 1`, made at `now_ms`; ProfileError when it would take
        effect in the past (an invoice may already have used the profile then) or at the time of another entry."""
        if entry.effective_from < now_ms:
            raise ProfileError(
                f"the profile of {entry.advertiser_id} would take effect at {format_time(entry.effective_from)}, "
                f"before now ({format_time(now_ms)}): a billing profile changes from now on"
            )
        if any(e.effective_from == entry.effective_from for e in self.history(entry.advertiser_id)):
            raise ProfileError(
                f"{entry.advertiser_id} already has a profile from {format_time(entry.effective_from)}; "
                "choose another time"
            )
        made = BillingProfile(**{**entry.to_dict(), "version": self.version + 1, "made_at": now_ms})
        every = [e for a in self._history.values() for e in a]
        return BillingProfiles([*every, made], self.version + 1)

    def to_json(self) -> str:
        entries = [e.to_dict() for a in self.advertiser_ids for e in self.history(a)]
        return json.dumps({"version": self.version, "profiles": entries}, indent=1, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> BillingProfiles:
        data = json.loads(text)
        return cls((BillingProfile.from_dict(e) for e in data.get("profiles", [])), int(data.get("version", 0)))


def describe_profile(entry: BillingProfile) -> str:
    """One line for the command: from when, name, tax id, rate, who made it."""
    who = f", by {entry.made_by} ({entry.door})" if entry.made_by else ""
    address = "; ".join(entry.address_lines)
    return (
        f"from {format_time(entry.effective_from)}\t{entry.name}\t{address}\ttax id {entry.tax_id or '-'}\t"
        f"tax {entry.tax_rate} %{who}"
    )
