"""Formatting for people, at the edge: money from integer micros (integer arithmetic only), times, sizes.

The static script `web/static/adbill.js` formats the figures it refreshes in the same way; a unit test keeps the two
in step on the cases listed there.
"""

from __future__ import annotations

from billing.money import format_micros
from billing.periods import format_elapsed, format_utc


def money(micros: int, currency: str = "") -> str:
    """`12_345_678_900, "EUR"` -> `"12,345.678900 EUR"`: `billing.money.format_micros` with grouped units."""
    return format_micros(micros, currency, grouped=True)


def signed_money(micros: int, currency: str = "") -> str:
    """Like `money`, with a `+` on positive amounts: for corrections, where the sign is the point."""
    return ("+" if micros > 0 else "") + money(micros, currency)


def count(n: int) -> str:
    """`1234567` -> `"1,234,567"`."""
    return f"{n:,}"


def signed_count(n: int) -> str:
    return ("+" if n > 0 else "") + count(n)


def utc(ts_ms: int | None) -> str:
    """Epoch milliseconds as `2026-01-01 00:00:05 UTC`; an em dash when unknown."""
    if ts_ms is None:
        return "\u2014"
    return format_utc(ts_ms).replace("T", " ")[:19] + " UTC"


def period_label(key: str) -> str:
    """`20260101T1500Z` -> `2026-01-01 15:00 UTC`."""
    if len(key) != 14:
        return key
    return f"{key[0:4]}-{key[4:6]}-{key[6:8]} {key[9:11]}:{key[11:13]} UTC"


def age(ts_ms: int | None, now_ms: int) -> str:
    """How long ago: `42 s`, `7 min`, `3 h`; an em dash when unknown."""
    if ts_ms is None:
        return "\u2014"
    return format_elapsed(now_ms - ts_ms)


def size(n_bytes: int) -> str:
    """Bytes in binary units: `1536` -> `1.5 KiB` (one decimal, for reading only)."""
    value = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n_bytes} B"  # not reached


def duration_ms(ms: int | None) -> str:
    if ms is None:
        return "\u2014"
    return f"{ms:,} ms" if ms < 10_000 else f"{ms / 1000:.1f} s"
