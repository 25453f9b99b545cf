"""Money as integer micros (millionths of the currency unit): formatting and exact parsing, never a float."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping
from fractions import Fraction

from billing.iso4217 import published_table

MICROS_PER_UNIT = 1_000_000

_AMOUNT_PATTERN = re.compile(r"([+-]?)(\d+)(?:\.(\d+))?", re.ASCII)


def format_micros(micros: int, currency: str = "", *, grouped: bool = False) -> str:
    """`1_230_000, "EUR"` -> `"1.230000 EUR"`: all six decimals, never through a float; a negative amount gets a
    leading minus. `grouped` puts commas between thousands of units (`"12,345.678900 EUR"`), for people; without a
    currency the amount stands alone."""
    if isinstance(micros, bool) or not isinstance(micros, int):
        raise TypeError(f"an amount is an integer number of micros, got {type(micros).__name__} {micros!r}")
    units, fraction = divmod(abs(micros), MICROS_PER_UNIT)
    sign = "-" if micros < 0 else ""
    text = f"{sign}{units:,}.{fraction:06d}" if grouped else f"{sign}{units}.{fraction:06d}"
    return f"{text} {currency}" if currency else text


def parse_amount(text: str) -> int:
    """A decimal string such as `"1.23"` or `"-0.05"` to micros, exactly; ValueError past 6 decimals."""
    if not isinstance(text, str):
        raise TypeError(f"parse_amount takes a decimal string, got {type(text).__name__} {text!r}")
    match = _AMOUNT_PATTERN.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a decimal amount such as 1.23")
    decimals = match.group(3) or ""
    if len(decimals) > 6:
        raise ValueError(f"{text!r} has more than 6 decimals: it is not a whole number of micros")
    # Units and zero-padded decimals, concatenated: exact at any size, with no float or rounding context.
    sign, units = match.group(1), match.group(2)
    return int(f"{sign}{units}{decimals:0<6}")


ISO_4217 = published_table()
"""ISO 4217's list one as the `billing` package ships it (`billing/iso4217.csv`, from SIX's `list-one.xml`; refreshed
with `python -m billing.iso4217`)."""

MINOR_UNIT_DIGITS: Mapping[str, int] = {
    c.code: c.minor_units for c in ISO_4217.currencies.values() if c.minor_units is not None
}
"""The decimals of the minor unit of every code of ISO 4217's list that has one: none for JPY, two for EUR, three for
KWD, four for CLF. The codes the list gives no minor unit (N.A.: gold XAU, the SDR XDR, the test code XTS) are not
here: no price, total or invoice is in them."""


class UnknownCurrency(ValueError):
    """A code that is no currency money can be in: not in ISO 4217's list, or without a minor unit there."""


def currency_problem(currency: str) -> str | None:
    """Why `currency` is no currency to price, bill or show money in, in words (None when it is one): it must be a code
    of ISO 4217's list with a minor unit (EUR, JPY, KWD), not an unknown or withdrawn code, nor XAU or XDR."""
    if currency in MINOR_UNIT_DIGITS:
        return None
    listed = ISO_4217.currencies.get(currency)
    if listed is not None:
        return (
            f"{currency} ({listed.name}) has no minor unit in ISO 4217 (N.A.): money is priced and billed in a "
            "currency such as EUR"
        )
    return (
        f"{currency!r} is not a currency of ISO 4217's list (published {ISO_4217.published}): give a code such as EUR"
    )


def minor_digits(currency: str) -> int:
    """The decimals of the currency's minor unit (ISO 4217's list, `MINOR_UNIT_DIGITS`): 2 for EUR and USD, 0 for JPY,
    3 for KWD. UnknownCurrency for any other code (an unknown or withdrawn one, XAU, the empty code): rounding or
    writing money in a currency that has no minor unit would be a guess, never a default of two decimals. The
    catalog refuses an ad in such a code (`billing.catalog.Ad`), so every priced amount has one."""
    digits = MINOR_UNIT_DIGITS.get(currency.upper())
    if digits is None:
        raise UnknownCurrency(currency_problem(currency))
    return digits


def format_amount(micros: int, currency: str) -> str:
    """An exact decimal for a file's amount cell, written in the currency's minor unit and with more digits only where
    the micros need them (a price per click may be finer than the minor unit): `296_797_000_000, "JPY"` ->
    `"296797"`, `3_614_986_000, "KWD"` -> `"3614.986"`, `1_230_000, "EUR"` -> `"1.23"`, `1_234_567, "EUR"` ->
    `"1.234567"`. No grouping and no code. Without a currency (unknown) all six decimals, as `format_micros`."""
    text = format_micros(micros)
    if not currency:
        return text
    units, fraction = text.split(".")
    fraction = fraction.rstrip("0").ljust(minor_digits(currency), "0")
    return f"{units}.{fraction}" if fraction else units


def round_half_away(value: int | Fraction, currency: str) -> int:
    """An amount in micros (an integer, or an exact fraction of micros) rounded once to the currency's minor unit,
    half away from zero: `1.005 EUR` -> `1.01 EUR`, `-1.005 EUR` -> `-1.01 EUR`, `0.5 JPY` -> `1 JPY`. The result is
    micros again (a whole number of minor units). Exact at any size: integers and fractions only."""
    if isinstance(value, bool) or not isinstance(value, int | Fraction):
        raise TypeError(f"an amount is an integer or a Fraction of micros, got {type(value).__name__} {value!r}")
    step = 10 ** (6 - minor_digits(currency))
    magnitude: Fraction = Fraction(-value if value < 0 else value)
    units = magnitude / step
    rounded = math.floor(units + Fraction(1, 2))  # half away from zero, on the magnitude
    return (-rounded if value < 0 else rounded) * step


def rounding_rule(currency: str) -> str:
    """The rounding rule, in words, as an invoice prints it."""
    digits = minor_digits(currency)
    unit = "whole units (no minor unit)" if digits == 0 else f"{digits} decimal{'s' if digits > 1 else ''}"
    return (
        f"Lines are exact to the micro (millionth of a {currency or 'unit'}); the net is rounded once, half away "
        f"from zero, to the currency's minor unit ({currency}: {unit}, ISO 4217); the tax is the rounded net times "
        "the rate, rounded the same way."
    )


class Amounts(Mapping[str, int]):
    """Money in one or several currencies: integer micros added up within each currency, never across two. Every
    total the product shows or writes goes through it (a period's, an export's, the audit's, a page's). Immutable,
    in currency order; a currency whose amounts net to zero is kept (`nonzero` drops it)."""

    __slots__ = ("_micros",)

    def __init__(self, micros: Mapping[str, int] | None = None) -> None:
        for currency, amount in (micros or {}).items():
            _check_amount(currency, amount)
        self._micros: dict[str, int] = dict(sorted((micros or {}).items()))

    @classmethod
    def of(cls, amounts: Iterable[tuple[str, int]]) -> Amounts:
        """(currency, micros) pairs added up per currency."""
        out: dict[str, int] = {}
        for currency, amount in amounts:
            _check_amount(currency, amount)
            out[currency] = out.get(currency, 0) + amount
        return cls(out)

    @classmethod
    def of_columns(cls, currencies: Iterable[str], micros: Iterable[int]) -> Amounts:
        """Two columns of a table (a currency and an amount per row) added up per currency."""
        return cls.of(zip(currencies, micros, strict=True))

    def __getitem__(self, currency: str) -> int:
        return self._micros[currency]

    def __iter__(self) -> Iterator[str]:
        return iter(self._micros)

    def __len__(self) -> int:
        return len(self._micros)

    def __repr__(self) -> str:
        return f"Amounts({self._micros!r})"

    def __add__(self, other: Mapping[str, int]) -> Amounts:
        return Amounts.of([*self.items(), *other.items()])

    def __neg__(self) -> Amounts:
        return Amounts({currency: -amount for currency, amount in self.items()})

    def __sub__(self, other: Mapping[str, int]) -> Amounts:
        return self + -Amounts(other)

    def nonzero(self) -> Amounts:
        """Without the currencies that net to zero."""
        return Amounts({currency: amount for currency, amount in self.items() if amount})

    def single(self) -> int | None:
        """The one total of amounts in at most one currency (0 for none); None for several: never added together."""
        if len(self._micros) > 1:
            return None
        return sum(self._micros.values())

    def as_dict(self) -> dict[str, int]:
        """A plain dict (currency order), for JSON."""
        return dict(self._micros)


def _check_amount(currency: str, amount: int) -> None:
    if not isinstance(currency, str):
        raise TypeError(f"a currency is a code, got {type(currency).__name__} {currency!r}")
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise TypeError(f"an amount is an integer number of micros, got {type(amount).__name__} {amount!r}")
