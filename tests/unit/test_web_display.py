"""Formatting for people: money from integer micros, exactly, never through a float; the script formats alike."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from web import display

MONEY_CASES = [
    (0, "EUR", "0.00 EUR"),
    (1, "EUR", "0.000001 EUR"),  # not whole cents: every digit
    (1_230_000, "EUR", "1.23 EUR"),  # whole cents: two decimals
    (291_970_000, "EUR", "291.97 EUR"),
    (1_234_567, "EUR", "1.234567 EUR"),
    (-50_000, "USD", "-0.05 USD"),
    (12_345_678_900, "EUR", "12,345.6789 EUR"),
    (5_000_000, "JPY", "5 JPY"),  # a currency without decimals
    (5_500_000, "JPY", "5.5 JPY"),
    (-1_000_000_000_000_001, "", "-1,000,000,000.000001"),
    # Past 2**53 a float would already be wrong in the last digit; integers are exact.
    (9_007_199_254_740_993, "EUR", "9,007,199,254.740993 EUR"),
    (2**63 - 1, "EUR", "9,223,372,036,854.775807 EUR"),
]


@pytest.mark.parametrize("micros, currency, text", MONEY_CASES)
def test_money(micros: int, currency: str, text: str) -> None:
    assert display.money(micros, currency) == text


def test_the_script_formats_money_as_the_server_does() -> None:
    """adbill.js's `money` on the same cases, run by node (skipped where node is not installed)."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    script = Path(display.__file__).parent / "static" / "adbill.js"
    cases = [[str(m), c, display.currency_digits(c)] for m, c, _ in MONEY_CASES]
    program = (
        "globalThis.document = { addEventListener() {} };\n"
        + script.read_text()
        + f"\nconsole.log(JSON.stringify({json.dumps(cases)}.map(([m, c, d]) => money(m, c, d))));"
    )
    out = subprocess.run([node, "-e", program], capture_output=True, text=True, timeout=30, check=True).stdout
    assert json.loads(out) == [text for _, _, text in MONEY_CASES]


def test_money_refuses_anything_but_integers() -> None:
    for bad in (1.5, True, "1", None):
        with pytest.raises(TypeError):
            display.money(bad)  # type: ignore[arg-type]


def test_signed_figures_for_corrections() -> None:
    assert display.signed_money(250_000, "EUR") == "+0.25 EUR"
    assert display.signed_money(-250_000, "EUR") == "-0.25 EUR"
    assert display.signed_money(0, "EUR") == "0.00 EUR"
    assert display.signed_count(3) == "+3"
    assert display.signed_count(-1200) == "-1,200"
    assert display.count(1234567) == "1,234,567"


def test_times_and_periods() -> None:
    assert display.utc(1_767_225_605_123) == "2026-01-01 00:00:05 UTC"
    assert display.utc(None) == "\u2014"
    assert display.period_label("20260101T1500Z") == "2026-01-01 15:00 UTC"
    assert display.period_label("odd") == "odd"
    now = 1_767_225_600_000
    assert display.age(now - 42_000, now) == "42 s"
    assert display.age(now - 7 * 60_000, now) == "7 min"
    assert display.age(now - 3 * 3_600_000, now) == "3 h"
    assert display.age(now + 5000, now) == "0 s"


def test_sizes_and_durations() -> None:
    assert display.size(512) == "512 B"
    assert display.size(1536) == "1.5 KiB"
    assert display.size(48_000_000) == "45.8 MiB"
    assert display.duration_ms(4400) == "4,400 ms"
    assert display.duration_ms(12_500) == "12.5 s"
    assert display.duration_ms(None) == "\u2014"


CHART_DOM = """
globalThis.document = {
  addEventListener() {},
  createElementNS(_ns, name) {
    return { name, attrs: {}, children: [], textContent: "",
      setAttribute(k, v) { this.attrs[k] = v; }, appendChild(c) { this.children.push(c); } };
  },
};
function svg() {
  return { children: [], get firstChild() { return this.children[0]; },
    removeChild(c) { this.children.splice(this.children.indexOf(c), 1); },
    appendChild(c) { this.children.push(c); }, setAttribute() {} };
}
"""
"""A stand-in for the DOM that adbill.js's chart draws in: the document, and `svg()` for a chart's element."""


def in_node(program: str, dom: str = CHART_DOM) -> Any:
    """What `program` logs as JSON, run in node after the page's script (adbill.js) over `dom`; the test is skipped
    when node is not installed."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    script = Path(display.__file__).parent / "static" / "adbill.js"
    code = dom + script.read_text() + "\n" + program
    return json.loads(subprocess.run([node, "-e", code], capture_output=True, text=True, timeout=30, check=True).stdout)


def test_the_chart_of_one_period_labels_its_axis_once() -> None:
    """adbill.js's chart, in node with a stand-in for the DOM: one period, one label on the time axis; two, two."""
    program = """
const bill = (p) => ({ period: p, closed: true, corrected: { micros: "5" }, provisional: { micros: "4" } });
const labels = (series) => { const s = svg(); drawChart(s, series, "EUR");
  return s.children.filter((c) => c.name === "text" && c.attrs.y === "250").map((c) => c.textContent); };
console.log(JSON.stringify([labels([bill('20260101T0000Z')]),
  labels([bill('20260101T0000Z'), bill('20260101T0100Z')])]));
"""
    assert in_node(program) == [["2026-01-01 00:00 UTC"], ["2026-01-01 00:00 UTC", "2026-01-01 01:00 UTC"]]


def test_the_chart_reads_micros_as_strings_and_keeps_every_digit_past_2_to_the_53() -> None:
    """The API sends micros as JSON strings; the chart keeps them exact (its bar's `data-micros`, its tooltip) and
    scales its bars with BigInt, a tall one and a small one alike."""
    program = """
const s = svg();
drawChart(s, [
  { period: "20260101T0000Z", closed: true, corrected: { micros: "9007199254740993" }, provisional: { micros: "0" } },
  { period: "20260101T0100Z", closed: false, corrected: { micros: "4503599627370497" }, provisional: { micros: "1" } },
], "EUR");
const bars = s.children.find((c) => c.name === "g").children;
console.log(JSON.stringify(bars.map((b) => [b.attrs["data-micros"], b.attrs.height, b.children[0].textContent])));
"""
    assert in_node(program) == [
        ["9007199254740993", "214.00", "2026-01-01 00:00 UTC: 9,007,199,254.740993 EUR"],
        ["4503599627370497", "107.00", "2026-01-01 01:00 UTC: 4,503,599,627.370497 EUR"],
    ]


def test_a_budget_is_its_amount_or_unlimited_on_the_server_and_in_the_script() -> None:
    """A daily budget (`budget_micros`, null for unlimited) as the dashboard's budget table writes it, and as its
    live refresh rebuilds it (adbill.js `render(value, "budget")`), past 2^53 too."""
    cases = [("50000000", "EUR"), ("9007199254740993", "JPY"), (None, "EUR")]
    expected = [display.budget(None if m is None else int(m), c) for m, c in cases]
    assert expected == ["50.00 EUR", "9,007,199,254.740993 JPY", "unlimited"]
    program = (
        f"console.log(JSON.stringify({json.dumps(cases)}.map(([m, c]) => "
        + "{ currencyDigits = c === 'JPY' ? 0 : 2; return render(m, 'budget', c); })));"
    )
    assert in_node(program, "globalThis.document = { addEventListener() {} };\n") == expected
