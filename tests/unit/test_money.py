"""Money is integer micros: formatting and exact parsing."""

from __future__ import annotations

import pytest

from billing.money import format_amount, format_micros, parse_amount


@pytest.mark.parametrize(
    ("micros", "text"),
    [
        (1_230_000, "1.230000 EUR"),
        (0, "0.000000 EUR"),
        (1, "0.000001 EUR"),
        (-250_000, "-0.250000 EUR"),
        (-1_000_001, "-1.000001 EUR"),
        (123_456_789_012_345_678, "123456789012.345678 EUR"),
    ],
)
def test_format_micros(micros: int, text: str) -> None:
    assert format_micros(micros, "EUR") == text


@pytest.mark.parametrize("amount", [1.23, True, "1230000"])
def test_format_micros_refuses_anything_but_an_int(amount: object) -> None:
    with pytest.raises(TypeError):
        format_micros(amount, "EUR")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "micros"),
    [
        ("1.23", 1_230_000),
        ("0.000001", 1),
        ("-0.05", -50_000),
        ("+2", 2_000_000),
        (" 7.5 ", 7_500_000),
        # Far beyond float precision, still exact.
        ("98765432109876543210.123456", 98_765_432_109_876_543_210_123_456),
    ],
)
def test_parse_amount_is_exact(text: str, micros: int) -> None:
    assert parse_amount(text) == micros


def test_parse_amount_refuses_more_than_six_decimals() -> None:
    with pytest.raises(ValueError, match="more than 6 decimals"):
        parse_amount("0.0000001")


@pytest.mark.parametrize("text", ["", "1,23", "1.2.3", "abc", "1e3", "NaN", ".5", "1."])
def test_parse_amount_refuses_what_is_not_a_plain_decimal(text: str) -> None:
    with pytest.raises(ValueError, match="not a decimal amount"):
        parse_amount(text)


def test_parse_amount_refuses_floats() -> None:
    with pytest.raises(TypeError):
        parse_amount(1.23)  # type: ignore[arg-type]


def test_round_trip() -> None:
    for micros in (0, 1, -1, 999_999, 1_000_000, -123_456_789):
        assert parse_amount(format_micros(micros, "EUR").split()[0]) == micros


@pytest.mark.parametrize(
    ("micros", "currency", "text"),
    [
        (296_797_000_000, "JPY", "296797"),  # no minor unit: no decimals
        (3_614_986_000, "KWD", "3614.986"),  # three decimals
        (1_230_000, "EUR", "1.23"),
        (0, "EUR", "0.00"),
        (0, "JPY", "0"),
        (3_500, "EUR", "0.0035"),  # a price per click may be finer than the minor unit: every digit it needs
        (500_000, "JPY", "0.5"),
        (-1_230_000, "EUR", "-1.23"),
        (1_000_000_000, "IQD", "1000.000"),  # ISO 4217's three, where Babel's CLDR data has none
        (1_230_000, "", "1.230000"),  # no currency: all six, as format_micros
    ],
)
def test_a_files_amount_is_in_the_currencys_minor_unit_and_finer_only_where_needed(
    micros: int, currency: str, text: str
) -> None:
    assert format_amount(micros, currency) == text
    assert parse_amount(text) == micros
