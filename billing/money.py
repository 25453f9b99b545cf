"""Money as integer micros (millionths of the currency unit): formatting and exact parsing, never a float."""

from __future__ import annotations

import re

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
