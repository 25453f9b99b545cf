"""Minor units come from ISO 4217's list as its maintenance agency (SIX) published it (`billing/iso4217.csv`): every
code of the list rounds on the invoice to the very unit the pages and the CSVs write it in; a code without a minor
unit is refused by the catalog and raises where money would be written in it, never a default of two decimals; the
table is the one `python -m billing.iso4217` writes from a `list-one.xml`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction
from importlib import resources
from pathlib import Path

import pytest

from billing.catalog import Ad, CatalogError
from billing.invoices import invoice_totals
from billing.iso4217 import main, parse_list_one, published_table, read_table, table_text
from billing.money import (
    ISO_4217,
    MINOR_UNIT_DIGITS,
    UnknownCurrency,
    format_amount,
    minor_digits,
    round_half_away,
    rounding_rule,
)
from web import display

EVERY_CODE = sorted(MINOR_UNIT_DIGITS)
"""Every code of the shipped list that has a minor unit."""

AMOUNT = Decimal("1234.5678901")
"""An amount finer than any minor unit (and than the micro): each currency rounds it its own way."""


def test_known_minor_units() -> None:
    assert {c: minor_digits(c) for c in ("JPY", "KWD", "IQD", "CLF", "EUR")} == {
        "JPY": 0,
        "KWD": 3,
        "IQD": 3,  # ISO 4217's three, where Babel's CLDR data writes none
        "CLF": 4,
        "EUR": 2,
    }
    assert ISO_4217.published >= "2026-01-01"
    assert len(EVERY_CODE) > 150 and "XAU" not in MINOR_UNIT_DIGITS


@pytest.mark.parametrize("code", EVERY_CODE)
def test_every_code_rounds_on_the_invoice_to_the_unit_the_page_writes(code: str) -> None:
    digits = minor_digits(code)
    unit = Decimal(1).scaleb(-digits)
    expected = AMOUNT.quantize(unit, rounding=ROUND_HALF_UP)  # half away from zero, as invoices round
    # The invoice path: the amount, as an exact fraction of micros, rounded once to the minor unit.
    rounded = round_half_away(Fraction(AMOUNT) * 1_000_000, code)
    assert display.decimal_amount(rounded) == expected
    totals = invoice_totals(1_234_567_890, code, "19")
    step = 10 ** (6 - digits)
    assert totals.amount_micros == round_half_away(1_234_567_890, code)
    assert totals.amount_micros % step == 0 and totals.tax_micros % step == 0 and totals.total_micros % step == 0
    words = "whole units (no minor unit)" if digits == 0 else f"{digits} decimal{'s' if digits > 1 else ''}"
    assert f"({code}: {words}, ISO 4217)" in rounding_rule(code)
    # The page path: a whole number of minor units is written with exactly the minor unit's decimals.
    assert display.currency_digits(code) == digits
    assert display.money(rounded, code) == f"{expected:,} {code}"
    for micros in (rounded, totals.total_micros, -totals.tax_micros, 0):
        number = display.money(micros, code).removesuffix(f" {code}")
        assert len(number.partition(".")[2]) == digits, (code, micros, number)
        assert len(format_amount(micros, code).partition(".")[2]) == digits
    # The files' decimal cell: the same digits, without grouping.
    assert format_amount(rounded, code) == str(expected)


def test_the_script_writes_every_code_with_the_pages_decimals() -> None:
    """adbill.js's `money`, given each code's `data-currency-digits`, writes a whole number of minor units as the
    server does (skipped where node is not installed)."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    amounts = {code: round_half_away(Fraction(AMOUNT) * 1_000_000, code) for code in EVERY_CODE}
    cases = [[str(micros), code, display.currency_digits(code)] for code, micros in amounts.items()]
    script = Path(display.__file__).parent / "static" / "adbill.js"
    program = (
        "globalThis.document = { addEventListener() {} };\n"
        + script.read_text()
        + f"\nconsole.log(JSON.stringify({json.dumps(cases)}.map(([m, c, d]) => money(m, c, d))));"
    )
    out = subprocess.run([node, "-e", program], capture_output=True, text=True, timeout=30, check=True).stdout
    assert json.loads(out) == [display.money(micros, code) for code, micros in amounts.items()]


@pytest.mark.parametrize(
    ("code", "words"),
    [
        ("XAU", "XAU (Gold) has no minor unit in ISO 4217"),  # N.A. in the list: gold, a fund, the test code
        ("XDR", "has no minor unit"),
        ("XTS", "has no minor unit"),
        ("ESP", "'ESP' is not a currency of ISO 4217's list"),  # withdrawn
        ("ABC", "'ABC' is not a currency of ISO 4217's list"),  # never a currency
        ("", "'' is not a currency"),
    ],
)
def test_a_code_without_a_minor_unit_raises_instead_of_guessing_two(code: str, words: str) -> None:
    for write in (minor_digits, lambda c: round_half_away(1_005_000, c), lambda c: format_amount(1_005_000, c or "X")):
        with pytest.raises(UnknownCurrency) as refused:
            write(code)
        assert isinstance(refused.value, ValueError)
    with pytest.raises(UnknownCurrency, match=re.escape(words)):
        minor_digits(code)
    if code:
        with pytest.raises(UnknownCurrency):
            display.money(1_000_000, code)
    assert display.money(1_000_000, "") == "1.00"  # no currency (unknown, or several): the amount alone, as before


def test_the_catalog_prices_in_no_code_without_a_minor_unit() -> None:
    for code, words in (("XAU", "has no minor unit"), ("ESP", "not a currency of ISO 4217"), ("eur", "ISO 4217")):
        with pytest.raises(CatalogError, match=words) as refused:
            Ad("ad-1", "cmp-1", "adv-1", 250_000, code)
        assert "ad-1" in str(refused.value) and "\n" not in str(refused.value)
    for code in EVERY_CODE:
        assert minor_digits(Ad("ad-1", "cmp-1", "adv-1", 250_000, code).currency) == MINOR_UNIT_DIGITS[code]


# The table and the command that writes it -------------------------------------------------------------------------
LIST_ONE = """<?xml version="1.0" encoding="UTF-8" standalone="yes"?>
<ISO_4217 Pblshd="{published}">
  <CcyTbl>
    <CcyNtry><CtryNm>ANTARCTICA</CtryNm><CcyNm>No universal currency</CcyNm></CcyNtry>
    <CcyNtry><CtryNm>AUSTRIA</CtryNm><CcyNm>Euro</CcyNm><Ccy>EUR</Ccy><CcyNbr>978</CcyNbr><CcyMnrUnts>2</CcyMnrUnts>
    </CcyNtry>
    <CcyNtry><CtryNm>JAPAN</CtryNm><CcyNm>Yen</CcyNm><Ccy>JPY</Ccy><CcyNbr>392</CcyNbr><CcyMnrUnts>0</CcyMnrUnts>
    </CcyNtry>
    <CcyNtry><CtryNm>FRANCE</CtryNm><CcyNm>Euro</CcyNm><Ccy>EUR</Ccy><CcyNbr>978</CcyNbr><CcyMnrUnts>2</CcyMnrUnts>
    </CcyNtry>
    <CcyNtry><CtryNm>ZZ08_Gold</CtryNm><CcyNm>Gold</CcyNm><Ccy>XAU</Ccy><CcyNbr>959</CcyNbr>
      <CcyMnrUnts>N.A.</CcyMnrUnts></CcyNtry>
    <CcyNtry><CtryNm>KUWAIT</CtryNm><CcyNm>Kuwaiti Dinar</CcyNm><Ccy>KWD</Ccy><CcyNbr>414</CcyNbr>
      <CcyMnrUnts>{kwd}</CcyMnrUnts></CcyNtry>
  </CcyTbl>
</ISO_4217>
"""


def test_the_command_writes_the_table_from_list_one_and_says_what_changed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    xml, table = tmp_path / "list-one.xml", tmp_path / "iso4217.csv"
    xml.write_text(LIST_ONE.format(published="2026-01-01", kwd=3))
    assert main([str(xml), str(table)]) == 0
    assert table.read_text().splitlines() == [
        "# ISO 4217 list one as SIX, its maintenance agency, published it on 2026-01-01 (list-one.xml)",
        "# To refresh it from a newer list-one.xml: python -m billing.iso4217 LIST_ONE_XML",
        "code,numeric,minor_units,name",
        "EUR,978,2,Euro",  # once, though two countries use it; Antarctica's entry names no currency
        "JPY,392,0,Yen",
        "KWD,414,3,Kuwaiti Dinar",
        "XAU,959,N.A.,Gold",
    ]
    read = read_table(table.read_text())
    assert read.published == "2026-01-01" and read.currencies["XAU"].minor_units is None
    capsys.readouterr()
    # A newer list (older lists wrote their date in words) that changes a minor unit: the command says so.
    xml.write_text(LIST_ONE.format(published="June 1, 2027", kwd=2))
    assert main([str(xml), str(table)]) == 0
    said = capsys.readouterr().out
    assert "of 2027-06-01 (was 2026-01-01)" in said and "KWD: minor units 3 -> 2" in said
    assert read_table(table.read_text()).currencies["KWD"].minor_units == 2


def test_the_command_refuses_what_is_not_list_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    xml, table = tmp_path / "list-one.xml", tmp_path / "iso4217.csv"
    xml.write_text("<ISO_4217_historic Pblshd='2026-01-01'/>")
    assert main([str(xml), str(table)]) == 1
    conflicting = LIST_ONE.format(published="2026-01-01", kwd=3).replace(
        "<CcyNbr>978</CcyNbr><CcyMnrUnts>2</CcyMnrUnts>", "<CcyNbr>978</CcyNbr><CcyMnrUnts>3</CcyMnrUnts>", 1
    )
    with pytest.raises(ValueError, match="EUR twice"):
        parse_list_one(conflicting.encode())
    assert not table.exists()
    assert main([]) == 2


def test_the_shipped_table_is_the_one_the_command_writes() -> None:
    """billing/iso4217.csv, byte for byte as `table_text` writes what it holds: written by the command, not by hand."""
    shipped = resources.files("billing").joinpath("iso4217.csv").read_text(encoding="utf-8")
    assert table_text(published_table()) == shipped
    assert published_table() is ISO_4217
