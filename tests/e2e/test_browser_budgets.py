"""The IP exclusion list and the budget figures in a real headless Chromium against `adbill web` (the fixtures of
`test_browser`): an admin excludes a range, plans its end and is refused a range with host bits; sets a campaign's
daily budget that today's charges have already reached and finds it among the campaigns capped today; the advertiser
sees its invalid clicks, its clicks over budget and the capped day on its dashboard (after a live refresh too) and on
its campaign page. Screenshots at 1360 px and 390 px under the test's folder and `var/test-output/screens/`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from billing.budgets import day_start, utc_day
from billing.money import format_micros
from billing.periods import DAY_MS, Periods
from billing.store.redis_totals import BudgetDayCount, NotChargedCount, RedisTotals, TotalsRow
from tests.catalog_rows import catalog_rows
from tests.e2e.test_browser import Served, browser, downloads, log_in, screens, served, wait  # noqa: F401
from tests.e2e.test_browser_catalog import NARROW, WIDE, fill, shoot_at
from tests.web_support import OTHER, OWN
from web import display

pytestmark = pytest.mark.e2e

HOUR_MS = 3_600_000
INVALID = {"known_bot": 13, "excluded_ip": 7, "click_flood": 21, "duplicate_click": 9}
OVER = 35
CHARGED = 400  # clicks the campaign's day has charged; the budget the admin sets is their price: capped


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def clear_of_midnight(margin_ms: int = 120_000) -> None:
    """Wait past the next UTC midnight when it is less than `margin_ms` away: the test seeds today's budget day and
    reads it back on the pages, and a new UTC day starts a campaign's budget afresh (as it should)."""
    now = now_ms()
    left = day_start(now) + DAY_MS - now
    if left < margin_ms:
        time.sleep(left / 1000 + 1)


def test_admin_keeps_the_ip_exclusion_list_and_a_budget_and_the_advertiser_sees_what_was_not_charged(
    served: Served,  # noqa: F811
    browser: WebDriver,  # noqa: F811
    screens: Callable[[WebDriver, str], Path],  # noqa: F811
) -> None:
    clear_of_midnight()
    seeded = served.seeded
    settings = seeded.settings
    ad = next(a for a in seeded.catalog if a.advertiser_id == OWN)
    price = ad.cpc_micros or 0
    # Today's open hour, as the stream writes it: invalid clicks and clicks over budget on one ad of adv-0000, and
    # its campaign's day so far.
    hours = Periods()
    start = hours.start_of(now_ms())
    period = hours.key(start)
    not_charged = [
        NotChargedCount(period, start, OWN, ad.campaign_id, ad.ad_id, reason, n, n * price)
        for reason, n in (*INVALID.items(), ("over_budget", OVER))
    ]
    day = BudgetDayCount(
        period, ad.campaign_id, utc_day(start), day_start(start), CHARGED, CHARGED * price, OVER, OVER * price
    )
    totals = RedisTotals(seeded.client, seeded.settings.redis_prefix)
    charged = [TotalsRow(period, start, OWN, ad.campaign_id, ad.ad_id, CHARGED, CHARGED * price)]
    assert totals.apply_batch("billing", 80_000, charged, not_charged=not_charged, budget_days=[day])

    # The IP exclusion list: empty, then a range excluded now and its end planned, an IPv6 range from later.
    log_in(browser, served.base_url, "ada", "/catalog/ip-exclusions")
    assert browser.find_element(By.ID, "none-excluded")
    shoot_at(browser, screens, WIDE, "exclusions-empty")
    browser.set_window_size(WIDE, 1100)
    fill(browser, "exclusion-cidr", "203.0.113.0/24")
    browser.find_element(By.ID, "exclusion-submit").click()
    wait(browser, lambda d: "made=" in d.current_url)
    assert "Change made" in browser.find_element(By.ID, "catalog-done").text
    later = (now_ms() + HOUR_MS) // 1000 * 1000
    fill(browser, "exclusion-cidr", "203.0.113.0/24")
    Select(browser.find_element(By.ID, "exclusion-action")).select_by_value("include")
    fill(browser, "exclusion-effective-from", datetime.fromtimestamp(later / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S"))
    browser.find_element(By.ID, "exclusion-submit").click()
    wait(browser, lambda d: "include again" in d.find_element(By.ID, "planned").text)
    fill(browser, "exclusion-cidr", "2001:db8::/32")
    browser.find_element(By.ID, "exclusion-submit").click()
    wait(browser, lambda d: "2001:db8::/32" in d.find_element(By.ID, "excluded-now").text)
    now_rows = browser.find_elements(By.CSS_SELECTOR, "#excluded-now tbody tr")
    assert [r.find_element(By.TAG_NAME, "td").text for r in now_rows] == ["2001:db8::/32", "203.0.113.0/24"]
    assert len(browser.find_elements(By.CSS_SELECTOR, "#exclusion-history tbody tr")) == 3
    exclusions = settings.catalog_store().current().exclusions
    assert exclusions.excluding("203.0.113.5", now_ms()) == "203.0.113.0/24"
    assert exclusions.excluding("203.0.113.5", later) is None
    assert {(c.made_by, c.door) for c in exclusions.changes} == {("ada", "page")}
    shoot_at(browser, screens, WIDE, "exclusions")
    shoot_at(browser, screens, NARROW, "exclusions")
    browser.set_window_size(WIDE, 1100)

    # A range with host bits is refused with the command's message; nothing changes.
    before = catalog_rows(settings.database_url)
    fill(browser, "exclusion-cidr", "203.0.113.7/24")
    Select(browser.find_element(By.ID, "exclusion-action")).select_by_value("exclude")
    browser.find_element(By.ID, "exclusion-submit").click()
    wait(browser, lambda d: d.find_elements(By.ID, "catalog-error"))
    assert browser.find_element(By.ID, "catalog-error").text == (
        "203.0.113.7/24 has host bits set: the range is 203.0.113.0/24"
    )
    assert catalog_rows(settings.database_url) == before
    shoot_at(browser, screens, NARROW, "exclusions-refused")
    browser.set_window_size(WIDE, 1100)

    # The campaign's daily budget: exactly what today has charged, so the campaign is capped.
    budget = CHARGED * price
    browser.get(f"{served.base_url}/catalog/campaigns/{ad.campaign_id}")
    fill(browser, "budget-amount", format_micros(budget))  # in euros, to the micro
    browser.find_element(By.ID, "budget-submit").click()
    wait(browser, lambda d: "made=" in d.current_url)
    assert browser.find_element(By.ID, "budget-now").text == display.money(budget, "EUR")
    assert "ada" in browser.find_element(By.ID, "budget-history").text
    shoot_at(browser, screens, WIDE, "campaign-budget")
    shoot_at(browser, screens, NARROW, "campaign-budget")
    browser.get(f"{served.base_url}/catalog/budgets")
    capped = browser.find_element(By.ID, f"capped-{ad.campaign_id}")
    assert display.money(budget, "EUR") in capped.text and display.count(OVER) in capped.text
    assert OTHER in browser.find_element(By.ID, "budgets").text  # every advertiser's campaigns, for the admin
    shoot_at(browser, screens, WIDE, "budgets-capped")
    shoot_at(browser, screens, NARROW, "budgets-capped")

    # The advertiser: what was not charged and the capped day, on the dashboard (refreshed live too) and the
    # campaign's page, and nothing of any other advertiser.
    browser.delete_all_cookies()
    browser.set_window_size(WIDE, 1100)
    log_in(browser, served.base_url, "alice", f"/advertisers/{OWN}")
    invalid = sum(INVALID.values())
    wait(browser, lambda d: int(d.find_element(By.ID, "dashboard").get_attribute("data-refreshes") or 0) >= 1)
    assert browser.find_element(By.ID, "invalid-clicks").text == display.count(invalid)
    assert browser.find_element(By.ID, "over-budget-clicks").text == display.count(OVER)
    assert browser.find_element(By.ID, "invalid-rate").text == "11.1 %"  # 50 / (400 + 50)
    row = browser.find_element(By.CSS_SELECTOR, "#budget-days tbody tr.capped")  # rebuilt by the live refresh
    assert ad.campaign_id in row.text and display.money(budget, "EUR") in row.text and "capped" in row.text
    assert "(changed)" in row.text  # unlimited when the day began
    assert OTHER not in browser.page_source
    shoot_at(browser, screens, WIDE, "dashboard-not-charged")
    shoot_at(browser, screens, NARROW, "dashboard-not-charged")
    for width in (WIDE, NARROW):
        browser.set_window_size(width, 1100)
        browser.execute_script("document.getElementById('budgets-heading').scrollIntoView()")
        shoot_at(browser, screens, width, "dashboard-budget-days")
    browser.set_window_size(WIDE, 1100)
    browser.get(f"{served.base_url}/advertisers/{OWN}/campaigns/{ad.campaign_id}")
    assert display.money(budget, "EUR") in browser.find_element(By.ID, "budget-now").text
    assert "capped" in browser.find_element(By.ID, "campaign-budget-days").text
    shoot_at(browser, screens, WIDE, "advertiser-campaign-budget")
    shoot_at(browser, screens, NARROW, "advertiser-campaign-budget")
