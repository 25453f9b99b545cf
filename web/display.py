"""Formatting for people, at the edge: money from integer micros (exact decimals, never a float), times, sizes.

Money goes through Babel's `format_currency`: grouped thousands, the currency's own decimals (two for EUR and USD,
none for JPY) where the amount is whole cents, every digit down to the micro where it is not, and the currency's
code always (`291.97 EUR`, `0.123456 EUR`). The static script `web/static/adbill.js` formats the figures it
refreshes in the same way; `tests/unit/test_web_display.py` runs it with node on the same cases when node is there.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from babel.numbers import format_currency, format_decimal

from billing.money import minor_digits
from billing.periods import format_elapsed, format_utc

LOCALE = "en_US"
"""Grouping with commas, a point before the decimals: the pages' one locale."""


def decimal_amount(micros: int) -> Decimal:
    """Integer micros as an exact `Decimal` of currency units (`1_230_000` -> `1.230000`)."""
    if isinstance(micros, bool) or not isinstance(micros, int):
        raise TypeError(f"an amount is an integer number of micros, got {type(micros).__name__} {micros!r}")
    return Decimal(micros).scaleb(-6)


def currency_digits(currency: str) -> int:
    """The decimals a currency is written with where the amount is whole (2 for EUR, 0 for JPY, 3 for KWD): its
    ISO 4217 minor unit, from `billing.money.minor_digits`, the one source the invoices round with too (Babel's
    CLDR data writes some currencies with fewer: IQD with none, where ISO 4217 has three). Two for an amount without
    a currency; `billing.money.UnknownCurrency` for a code that has no minor unit (the catalog prices in none)."""
    return minor_digits(currency) if currency else 2


def money(micros: int, currency: str = "") -> str:
    """`12_345_670_000, "EUR"` -> `"12,345.67 EUR"`; `1_234_567, "EUR"` -> `"1.234567 EUR"`: the currency's decimals,
    more where the micros need them, never rounded. Without a currency (unknown, or several) the amount alone."""
    amount = decimal_amount(micros)
    if not currency:
        return format_decimal(amount, format="#,##0.00", locale=LOCALE, decimal_quantization=False)
    digits = currency_digits(currency)
    pattern = "#,##0" + ("." + "0" * digits if digits else "") + " \xa4\xa4"  # the amount, a space, the ISO code
    return format_currency(
        amount, currency, format=pattern, locale=LOCALE, currency_digits=False, decimal_quantization=False
    )


def budget(micros: int | None, currency: str = "") -> str:
    """A daily budget: its amount as `money` writes it, or `unlimited` (None)."""
    return "unlimited" if micros is None else money(micros, currency)


def signed_money(micros: int, currency: str = "") -> str:
    """Like `money`, with a `+` on positive amounts: for corrections, where the sign is the point."""
    return ("+" if micros > 0 else "") + money(micros, currency)


def count(n: int) -> str:
    """`1234567` -> `"1,234,567"`."""
    return f"{n:,}"


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """`1, "period"` -> `"1 period"`, `3, "period"` -> `"3 periods"` (`nouns` when the plural is not `noun + s`)."""
    return f"{count(n)} {noun if n == 1 else (nouns or noun + 's')}"


def signed_count(n: int) -> str:
    return ("+" if n > 0 else "") + count(n)


def utc(ts_ms: int | None) -> str:
    """Epoch milliseconds as `2026-01-01 00:00:05 UTC`; an em dash when unknown."""
    if ts_ms is None:
        return "\u2014"
    return format_utc(ts_ms).replace("T", " ")[:19] + " UTC"


def iso_utc(text: str | None) -> str:
    """An ISO-8601 time (`2026-01-01T00:00:05.000Z`) in the pages' one format, `2026-01-01 00:00:05 UTC`."""
    if not text:
        return "\u2014"
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return text
    return parsed.strftime("%Y-%m-%d %H:%M:%S UTC")


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
