"""The catalog's pages in a real headless Chromium against `adbill web` (the fixtures of `test_browser`): an admin
creates an ad and plans a new price with the forms, sees a refusal that leaves every row as it was, and the
catalog's database holds the changes as every part of the product reads it; the advertiser sees its new ad with its
status and history. Screenshots at 1360 px and 390 px under the test's folder and `var/test-output/screens/`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.catalog_rows import catalog_rows
from tests.e2e.test_browser import Served, browser, downloads, log_in, screens, served, wait  # noqa: F401
from tests.web_support import OTHER, OWN
from web import display

pytestmark = pytest.mark.e2e

WIDE, NARROW = 1360, 390
HOUR_MS = 3_600_000
PRICE, RAISED = display.money(250_000, "EUR"), display.money(1_250_000, "EUR")  # 0.25 and 1.25 EUR


def fill(driver: WebDriver, element_id: str, value: str) -> None:
    field = driver.find_element(By.ID, element_id)
    if field.get_attribute("type") == "datetime-local":
        # A datetime-local field takes typed digits in the browser's locale order; its value is set as a form would.
        driver.execute_script("arguments[0].value = arguments[1];", field, value)
    else:
        field.clear()
        field.send_keys(value)


def past_the_edge(driver: WebDriver) -> list[str]:
    """Elements that reach past the window's right edge, outside any box that scrolls (none, on a page that fits)."""
    found: list[str] = driver.execute_script(
        """
        const inScroll = (e) => e.closest('.scroll') !== null;
        return [...document.querySelectorAll('body *')]
          .filter((e) => !inScroll(e) && e.getBoundingClientRect().right > window.innerWidth + 1)
          .map((e) => e.tagName + (e.id ? '#' + e.id : ''));
        """
    )
    return found


def shoot_at(driver: WebDriver, shoot: Callable[[WebDriver, str], Path], width: int, name: str) -> None:
    """A screenshot at `width` px; the page does not scroll sideways (wide tables scroll inside their own box)."""
    driver.set_window_size(width, 1400 if width == NARROW else 1100)
    wait(driver, lambda d: d.execute_script("return window.innerWidth") <= width)
    shoot(driver, f"{name}-{width}")
    wide = driver.execute_script("return document.documentElement.scrollWidth > window.innerWidth + 1;")
    assert not wide and not past_the_edge(driver), f"{name} at {width} px: {past_the_edge(driver)}"


def test_admin_creates_an_ad_and_plans_a_new_price_and_the_advertiser_sees_it(
    served: Served,  # noqa: F811
    browser: WebDriver,  # noqa: F811
    screens: Callable[[WebDriver, str], Path],  # noqa: F811
) -> None:
    settings = served.seeded.settings
    campaign = next(ad.campaign_id for ad in served.seeded.catalog if ad.advertiser_id == OWN)
    log_in(browser, served.base_url, "ada", "/catalog")
    assert browser.current_url.endswith("/catalog")
    shoot_at(browser, screens, WIDE, "catalog")
    shoot_at(browser, screens, NARROW, "catalog")
    browser.set_window_size(WIDE, 1100)

    for field, value in [
        ("new-ad-id", "spring-sale-1"),
        ("new-campaign-id", campaign),
        ("new-advertiser-id", OWN),
        ("new-currency", "EUR"),
        ("new-price", "0.25"),  # typed in euros, as people write prices
    ]:
        fill(browser, field, value)
    # The form says what will be stored, exactly, before it is sent.
    wait(browser, lambda d: d.find_element(By.ID, "new-price-micros").text == "= 250,000 micros stored")
    browser.find_element(By.ID, "create-submit").click()
    wait(browser, lambda d: "/catalog/ads/spring-sale-1" in d.current_url)
    assert "Change made" in browser.find_element(By.ID, "catalog-done").text
    assert browser.find_element(By.ID, "stored-micros").text == "250,000 micros"
    assert browser.find_element(By.ID, "price-now").text == PRICE
    ad = settings.catalog_store().current()["spring-sale-1"]
    assert (ad.advertiser_id, ad.campaign_id, ad.price_at(time.time_ns() // 1_000_000)) == (OWN, campaign, 250_000)

    # A price an hour from now, typed as the form's UTC time.
    planned = (time.time_ns() // 1_000_000 + HOUR_MS) // 1000 * 1000
    fill(browser, "set-price-amount", "1.25")
    fill(browser, "set-effective-from", datetime.fromtimestamp(planned / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S"))
    browser.find_element(By.ID, "set-submit").click()
    wait(browser, lambda d: "made=" in d.current_url and RAISED in d.find_element(By.ID, "next-change").text)
    rows = browser.find_elements(By.CSS_SELECTOR, "#price-history tbody tr")
    assert [r.find_elements(By.TAG_NAME, "td")[1].text for r in rows] == [RAISED, PRICE]
    assert "planned" in rows[0].text and "in force" in rows[1].text
    ad = settings.catalog_store().current()["spring-sale-1"]
    assert [(p.effective_from, p.cpc_micros) for p in ad.prices][1:] == [(planned, 1_250_000)]
    shoot_at(browser, screens, WIDE, "ad-changed")
    shoot_at(browser, screens, NARROW, "ad-changed")
    browser.set_window_size(WIDE, 1100)

    # A negative price is refused with the command line's message; the catalog does not change.
    before = catalog_rows(settings.database_url)
    fill(browser, "set-price-amount", "-0.50")
    browser.find_element(By.ID, "set-submit").click()
    wait(browser, lambda d: d.find_elements(By.ID, "catalog-error"))
    assert browser.find_element(By.ID, "catalog-error").text == "a price must not be negative: you typed -0.50 EUR"
    # And one finer than the micro: never rounded, refused.
    fill(browser, "set-price-amount", "0.1234567")
    assert browser.find_element(By.ID, "set-price-micros").text == "not an amount with at most 6 decimals"
    browser.find_element(By.ID, "set-submit").click()
    wait(browser, lambda d: "0.1234567" in d.find_element(By.ID, "catalog-error").text)
    assert catalog_rows(settings.database_url) == before
    shoot_at(browser, screens, WIDE, "refused")

    # The advertiser sees its new ad, live at the first price with the new one planned, and nobody else's ads.
    browser.delete_all_cookies()
    log_in(browser, served.base_url, "alice", f"/advertisers/{OWN}/ads")
    row = browser.find_element(By.ID, "ad-spring-sale-1")
    assert "live" in row.text and PRICE in row.text and RAISED in row.text
    assert OTHER not in browser.page_source
    browser.find_element(By.CSS_SELECTOR, "#history-spring-sale-1 summary").click()
    assert browser.find_element(By.ID, "history-spring-sale-1").get_attribute("open") is not None
    shoot_at(browser, screens, WIDE, "advertiser-ads")
    shoot_at(browser, screens, NARROW, "advertiser-ads")
