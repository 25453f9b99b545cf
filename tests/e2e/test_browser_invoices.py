"""Invoices and the pages a walk-through found wanting, in a real headless Chromium against `adbill web` (the
fixtures of `test_browser`), at 1360 px and 390 px: an advertiser's invoice beside its open month, finance's month
of invoices, an admin's billing profile, a bad date range kept beside its form, the chart's labels readable on a
phone, a price column on screen, whole click ids on a desktop. Screenshots under the test's folder and
`var/test-output/screens/`."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from billing.invoices import Issuer, month_of_ms
from billing.store.invoice_files import ExportInvoiceSource
from tests.e2e.test_browser import (  # noqa: F401
    WIDTHS,
    Served,
    at_width,
    browser,
    downloads,
    log_in,
    overflow_px,
    screens,
    served,
    set_heartbeat,
    shoot_whole_page,
    wait,
)
from tests.invoice_month import MONTH, write_closed_month
from tests.web_support import OTHER, OWN
from web import display

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def invoiced(served: Served) -> Served:  # noqa: F811
    """December closed on files and invoiced, beside the sample's January."""
    layout = served.seeded.settings.layout
    book = served.seeded.settings.invoice_store()
    if book.invoice(MONTH, OWN) is None:
        settings = served.seeded.settings
        write_closed_month(layout, served.seeded.catalog, OWN, OTHER, settings.database_url)
        profiles = settings.profile_store().current()
        Issuer(book, ExportInvoiceSource(layout), profiles, lambda: 1_767_250_000_000).issue_month(MONTH)
    return served


@pytest.mark.parametrize("width", WIDTHS)
def test_an_advertiser_reads_its_invoice_beside_the_open_month(
    invoiced: Served,
    browser: WebDriver,  # noqa: F811
    screens: Callable[[WebDriver, str], Path],  # noqa: F811
    width: int,
) -> None:
    set_heartbeat(invoiced.seeded, 2)
    at_width(browser, width)
    month_before = month_of_ms(time.time_ns() // 1_000_000)
    log_in(browser, invoiced.base_url, "alice", f"/advertisers/{OWN}/invoices")
    assert overflow_px(browser) <= 0, "the invoices page scrolls sideways"
    rows = browser.find_elements(By.CSS_SELECTOR, "#invoices tbody tr[data-month]")
    assert [r.get_attribute("data-month") for r in rows] == [MONTH]
    assert browser.find_element(By.ID, "open-month").is_displayed()
    shoot_whole_page(browser, screens, width, "invoices")
    rows[0].find_element(By.LINK_TEXT, "INV-000001").click()
    wait(browser, lambda d: d.current_url.endswith(f"/invoices/{MONTH}"))
    assert overflow_px(browser) <= 0, "the invoice scrolls sideways"
    assert browser.find_element(By.ID, "invoice-number").text == "INV-000001"
    assert browser.find_element(By.ID, "bill-to-name").text == "Acme SA"
    assert browser.find_element(By.ID, "net").text == display.money(1_234_560, "EUR")
    assert (browser.find_element(By.ID, "amount").text, browser.find_element(By.ID, "tax").text) == (
        "1.23 EUR",
        "0.25 EUR",
    )
    assert browser.find_element(By.ID, "total").text == "1.48 EUR"
    assert "half away from zero" in browser.find_element(By.ID, "rounding-rule").text
    assert "Payment due within 30 days" in browser.find_element(By.ID, "payment-terms").text
    adjustments = browser.find_element(By.ID, "lines-adjustment").text
    assert "Adjustment: invalid activity" in adjustments and "2025-11-30 10:00 UTC" in adjustments
    aside = browser.find_element(By.ID, "open-month")
    invoice = browser.find_element(By.ID, "invoice")
    if width > 900:  # beside the invoice on a desktop, under it on a phone
        assert aside.location["x"] > invoice.location["x"] + invoice.size["width"] - 5
    else:
        assert aside.location["y"] >= invoice.location["y"] + invoice.size["height"] - 5
    months = {month_before, month_of_ms(time.time_ns() // 1_000_000)}  # the server's: either, at a month's end
    assert any(f"{month} so far" in aside.text for month in months) and "provisional" in aside.text
    assert OTHER not in browser.page_source
    shoot_whole_page(browser, screens, width, "invoice")


@pytest.mark.parametrize("width", WIDTHS)
def test_finance_sees_a_months_invoices_and_an_admin_sets_a_billing_profile(
    invoiced: Served,
    browser: WebDriver,  # noqa: F811
    screens: Callable[[WebDriver, str], Path],  # noqa: F811
    width: int,
) -> None:
    at_width(browser, width)
    log_in(browser, invoiced.base_url, "fiona", f"/finance/invoices?month={MONTH}")
    assert overflow_px(browser) <= 0
    listed = browser.find_element(By.ID, "finance-invoices").text
    assert "INV-000001" in listed and "INV-000002" in listed and "Kabushiki Kaisha" in listed
    shoot_whole_page(browser, screens, width, "finance-invoices")
    browser.get(f"{invoiced.base_url}/finance?from=2026-01-01&to=2026-01-31")
    assert overflow_px(browser) <= 0
    assert browser.find_element(By.ID, "range-advertisers").is_displayed()
    shoot_whole_page(browser, screens, width, "finance-month")
    browser.delete_all_cookies()
    log_in(browser, invoiced.base_url, "ada", f"/billing-profiles/{OTHER}")
    assert overflow_px(browser) <= 0
    name = browser.find_element(By.ID, "profile-form-name")
    name.clear()
    name.send_keys(f"Kabushiki Kaisha {width}")
    rate = browser.find_element(By.ID, "profile-form-tax-rate")
    rate.clear()
    rate.send_keys("8")
    browser.find_element(By.ID, "profile-submit").click()
    wait(browser, lambda d: "made=" in d.current_url)
    assert browser.find_element(By.ID, "profile-name").text == f"Kabushiki Kaisha {width}"
    assert browser.find_element(By.ID, "profile-rate").text == "8 %"
    assert "ada" in browser.find_element(By.ID, "profile-history").text
    shoot_whole_page(browser, screens, width, "billing-profile")


@pytest.mark.parametrize("width", WIDTHS)
def test_a_bad_range_is_kept_beside_its_form_and_the_layout_holds(
    invoiced: Served,
    browser: WebDriver,  # noqa: F811
    screens: Callable[[WebDriver, str], Path],  # noqa: F811
    width: int,
) -> None:
    set_heartbeat(invoiced.seeded, 2)
    at_width(browser, width)
    log_in(browser, invoiced.base_url, "alice", f"/advertisers/{OWN}?from=2026-01-01&to=2026-01-31")
    wait(browser, lambda d: int(d.find_element(By.ID, "dashboard").get_attribute("data-refreshes") or 0) >= 1)
    # The chart's labels are as readable as the page's text, whatever the screen.
    label = browser.find_element(By.CSS_SELECTOR, "#spend-chart text.axis")
    assert label.size["height"] >= 9, f"the chart's labels are {label.size['height']} px high at {width} px"
    # Dates typed the wrong way round: the page stays, the dates stay in the form, the message beside it.
    browser.execute_script(
        "document.getElementById('range-from').value = '2026-01-31';"
        "document.getElementById('range-to').value = '2026-01-01';"
    )
    browser.find_element(By.CSS_SELECTOR, "#range-form button").click()
    wait(browser, lambda d: d.find_elements(By.ID, "range-error"))
    assert "to is before from" in browser.find_element(By.ID, "range-error").text
    assert browser.find_element(By.ID, "range-from").get_attribute("value") == "2026-01-31"
    assert browser.find_element(By.ID, "range-to").get_attribute("value") == "2026-01-01"
    assert browser.find_element(By.ID, "spend-chart").is_displayed(), "the rest of the page is there"
    assert overflow_px(browser) <= 0
    shoot_whole_page(browser, screens, width, "dashboard-bad-range")
    browser.find_element(By.CSS_SELECTOR, "a[data-preset='last-30-days']").click()
    wait(browser, lambda d: "Last 30 days" in d.find_element(By.ID, "range-label").text)

    # The ads and their prices: the price of each ad on screen without scrolling sideways.
    browser.get(f"{invoiced.base_url}/advertisers/{OWN}/ads")
    price = browser.find_element(By.CSS_SELECTOR, "#ads-prices tbody tr td.price")
    assert price.location["x"] + price.size["width"] <= width, "the price is off the screen"
    assert overflow_px(browser) <= 0
    shoot_whole_page(browser, screens, width, "ads-prices")

    # The corrections: whole click ids on a desktop.
    browser.get(f"{invoiced.base_url}/advertisers/{OWN}/corrections")
    if width > 900:
        for cell in browser.find_elements(By.CSS_SELECTOR, "#corrections tbody td.click-id")[:10]:
            inner = browser.execute_script(
                "const r = document.createRange(); r.selectNodeContents(arguments[0]);"
                " return r.getClientRects().length",
                cell,
            )
            assert inner == 1, f"{cell.text} is broken across {inner} lines"
        hidden = browser.execute_script(
            "const box = document.getElementById('corrections').parentElement; return box.scrollWidth - box.clientWidth"
        )
        assert hidden <= 0, f"the corrections' table hides {hidden} px to the right"
    assert overflow_px(browser) <= 0
    shoot_whole_page(browser, screens, width, "corrections")
