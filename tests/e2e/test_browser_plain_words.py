"""What the pages show, in a real headless Chromium against `adbill web` (the fixtures of `test_browser`), at 1360 px
and 390 px: the dashboard's tables on screen, who made a change, errors beside their field in the terms typed, and
the health page. Screenshots under the test's folder, `var/test-output/screens/` and /tmp."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from billing.catalog import MadeBy
from billing.store.part_status import RECONCILE_RUN_PART
from billing.store.redis_keys import RedisKeys
from producers.capture import parse_capture_line
from producers.publisher import apply_to_store
from tests.e2e.test_browser import Served, browser, downloads, log_in, screens, served, wait  # noqa: F401
from tests.e2e.test_browser_catalog import NARROW, WIDE, shoot_at
from tests.web_support import FIRST_PERIOD_MS, OWN, plant_not_charged_click
from web.sample_data import health_record

pytestmark = pytest.mark.e2e

DASHBOARD_TABLES = ("campaigns", "ads", "ads-not-charged", "series", "series-not-charged")


def to_tmp(shots: Callable[[WebDriver, str], Path]) -> Callable[[WebDriver, str], Path]:
    """`screens`, with a copy of each screenshot in /tmp for people to look at."""

    def shoot(driver: WebDriver, name: str) -> Path:
        path = shots(driver, name)
        shutil.copy(path, Path("/tmp") / path.name)
        return path

    return shoot


def overflowing(driver: WebDriver, table_ids: tuple[str, ...]) -> dict[str, list[int]]:
    """The tables wider than the box they are shown in (a scroll bar under them), with both widths."""
    found: dict[str, list[int]] = driver.execute_script(
        """const out = {};
        for (const id of arguments[0]) {
          const table = document.getElementById(id);
          const box = table.parentElement;
          if (table.scrollWidth > box.clientWidth + 1) out[id] = [table.scrollWidth, box.clientWidth];
        }
        return out;""",
        list(table_ids),
    )
    return found


def off_screen(driver: WebDriver, selector: str) -> list[str]:
    """The texts of the elements matching `selector` whose right edge lies past the window's."""
    texts: list[str] = driver.execute_script(
        """return Array.from(document.querySelectorAll(arguments[0]))
             .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1).map(e => e.textContent.trim());""",
        selector,
    )
    return texts


def test_the_dashboards_tables_fit_1360_px_and_read_as_cards_at_390(
    served: Served,  # noqa: F811
    browser: WebDriver,  # noqa: F811
    screens: Callable[[WebDriver, str], Path],  # noqa: F811
) -> None:
    shoot = to_tmp(screens)
    log_in(browser, served.base_url, "alice", f"/advertisers/{OWN}")
    browser.set_window_size(WIDE, 1100)
    wait(browser, lambda d: int(d.find_element(By.ID, "dashboard").get_attribute("data-refreshes") or 0) >= 1)
    # As rendered by the live refresh (rebuilt from the API) and as the server rendered them: the same columns.
    for moment in ("refreshed", "rendered"):
        assert overflowing(browser, DASHBOARD_TABLES) == {}, moment
        heads = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#dashboard table.data thead th")]
        for head in ("Invalid clicks (not charged)", "Invalid rate", "Not charged: over budget", "Name"):
            assert head in heads, head
        assert off_screen(browser, "#dashboard table.data thead th") == [], moment
        browser.execute_script("document.getElementById('ads').scrollIntoView()")
        shoot(browser, f"dashboard-tables-{moment}-{WIDE}")
        browser.execute_script("window.stop(); location.reload();")  # the page as the server sends it, then refreshed
        wait(browser, lambda d: d.find_elements(By.ID, "ads"))
    browser.execute_script("window.scrollTo(0, 0)")
    shoot_at(browser, shoot, WIDE, "dashboard")
    # The period's figures say they are provisional and when they become final.
    assert "Provisional." in browser.find_element(By.ID, "period-note").text

    browser.execute_script("window.scrollTo(0, 0)")
    shoot_at(browser, shoot, NARROW, "dashboard")
    wait(browser, lambda d: int(d.find_element(By.ID, "dashboard").get_attribute("data-refreshes") or 0) >= 1)
    assert overflowing(browser, DASHBOARD_TABLES) == {}
    assert off_screen(browser, "#ads tbody td, #series-not-charged tbody td") == []
    # Each row is a card whose values say what they are.
    card = browser.find_element(By.CSS_SELECTOR, "#ads-not-charged tbody tr")
    labels = [td.get_attribute("data-label") for td in card.find_elements(By.TAG_NAME, "td")]
    assert labels[1:4] == ["Invalid clicks (not charged)", "Invalid rate", "Not charged: over budget"]
    browser.execute_script("document.getElementById('ads').scrollIntoView()")
    shoot(browser, f"dashboard-ads-{NARROW}")


def test_the_budget_and_ip_exclusion_pages_say_who_made_a_change_and_through_which_door(
    served: Served,  # noqa: F811
    browser: WebDriver,  # noqa: F811
    screens: Callable[[WebDriver, str], Path],  # noqa: F811
) -> None:
    shoot = to_tmp(screens)
    campaign = next(a.campaign_id for a in served.seeded.catalog if a.advertiser_id == OWN)
    store = served.seeded.settings.catalog_store()
    now = int(time.time() * 1000)
    for line in (
        {"type": "budget", "campaign_id": campaign, "effective_from": now + 600_000, "daily_budget_micros": 7_000_000},
        {"type": "ip_exclusion", "cidr": "198.51.100.0/24", "effective_from": now + 600_000, "excluded": True},
    ):
        apply_to_store(store, parse_capture_line(json.dumps(line)), now, MadeBy("root", "simulator"))  # type: ignore[arg-type]
    log_in(browser, served.base_url, "ada", "/catalog/changes")
    change_row = browser.find_element(By.CSS_SELECTOR, "#changes tbody tr")
    assert "root" in change_row.text and "simulator" in change_row.text
    for url, table, name in (
        (f"/catalog/campaigns/{campaign}", "budget-history", "budget"),
        ("/catalog/ip-exclusions", "exclusion-history", "ip-exclusions"),
    ):
        browser.get(served.base_url + url)
        row = browser.find_element(By.CSS_SELECTOR, f"#{table} tbody tr")
        made = row.find_element(By.CSS_SELECTOR, "td.made-by").text, row.find_element(By.CSS_SELECTOR, "td.door").text
        assert made == ("root", "simulator"), name
        for width in (WIDE, NARROW):
            shoot_at(browser, shoot, width, name)
        browser.set_window_size(WIDE, 1100)


def test_a_refused_price_is_said_beside_its_field_in_the_currency_typed(
    served: Served,  # noqa: F811
    browser: WebDriver,  # noqa: F811
    screens: Callable[[WebDriver, str], Path],  # noqa: F811
) -> None:
    shoot = to_tmp(screens)
    ad = next(a for a in served.seeded.catalog if a.advertiser_id == OWN)
    log_in(browser, served.base_url, "ada", f"/catalog/ads/{ad.ad_id}")
    field = browser.find_element(By.ID, "set-price-amount")
    field.clear()
    field.send_keys("-1.00")
    browser.find_element(By.ID, "set-submit").click()
    wait(browser, lambda d: d.find_elements(By.ID, "catalog-error"))
    error = browser.find_element(By.ID, "catalog-error")
    assert error.text == "a price must not be negative: you typed -1.00 EUR"
    # Beside its field: inside the field's label, just under it, in the form that was sent.
    label = browser.find_element(By.CSS_SELECTOR, "#set-price label:has(#set-price-amount)")
    assert label.find_element(By.ID, "catalog-error") == error
    field = browser.find_element(By.ID, "set-price-amount")  # the page sent back, with what was typed
    assert field.get_attribute("value") == "-1.00"
    below = error.rect["y"] - (field.rect["y"] + field.rect["height"])
    assert 0 <= below < 60, below
    for width in (WIDE, NARROW):
        browser.execute_script("document.getElementById('set-price').scrollIntoView()")
        shoot_at(browser, shoot, width, "price-refused")
    browser.set_window_size(WIDE, 1100)


def test_a_jpy_budget_is_typed_in_whole_yen(
    served: Served,  # noqa: F811
    browser: WebDriver,  # noqa: F811
    screens: Callable[[WebDriver, str], Path],  # noqa: F811
) -> None:
    shoot = to_tmp(screens)
    campaign = next(a.campaign_id for a in served.seeded.catalog if a.currency == "JPY")
    log_in(browser, served.base_url, "ada", f"/catalog/campaigns/{campaign}")
    assert (
        "in whole JPY (it has no minor unit)"
        in browser.find_element(By.ID, "set-budget").find_element(By.XPATH, "preceding-sibling::p").text
    )
    field = browser.find_element(By.ID, "budget-amount")
    field.send_keys("1000.5")
    # The form says it before it is sent, and the page after.
    wait(browser, lambda d: d.find_element(By.ID, "budget-amount-micros").text == "not an amount in whole JPY")
    browser.find_element(By.CSS_SELECTOR, "#set-budget button[type=submit]").click()
    wait(browser, lambda d: d.find_elements(By.ID, "catalog-error"))
    assert browser.find_element(By.ID, "catalog-error").text == (
        "a daily budget is an amount in JPY such as 50, in whole JPY (it has no minor unit): you typed 1000.5 JPY"
    )
    for width in (WIDE, NARROW):
        browser.execute_script("document.getElementById('set-budget').scrollIntoView()")
        shoot_at(browser, shoot, width, "jpy-budget-refused")
    browser.set_window_size(WIDE, 1100)
    field = browser.find_element(By.ID, "budget-amount")
    field.clear()
    field.send_keys("1000")
    wait(browser, lambda d: d.find_element(By.ID, "budget-amount-micros").text == "= 1,000,000,000 micros stored")
    browser.find_element(By.CSS_SELECTOR, "#set-budget button[type=submit]").click()
    wait(browser, lambda d: d.find_elements(By.ID, "catalog-done"))
    assert "(1,000 JPY) a day" in browser.find_element(By.ID, "catalog-done").text


def test_a_not_charged_clicks_story_says_so_at_both_widths(
    served: Served,  # noqa: F811
    browser: WebDriver,  # noqa: F811
    screens: Callable[[WebDriver, str], Path],  # noqa: F811
) -> None:
    shoot = to_tmp(screens)
    seeded = served.seeded
    campaign = next(a.campaign_id for a in seeded.catalog if a.advertiser_id == OWN)
    budget = {
        "type": "budget",
        "campaign_id": campaign,
        "effective_from": FIRST_PERIOD_MS,
        "daily_budget_micros": 10_000,
    }
    apply_to_store(
        seeded.settings.catalog_store(),
        parse_capture_line(json.dumps(budget)),  # type: ignore[arg-type]
        FIRST_PERIOD_MS + 60_000,
        MadeBy("root", "simulator"),
    )
    click_id = plant_not_charged_click(seeded, FIRST_PERIOD_MS + 5 * 3_600_000)
    log_in(browser, served.base_url, "alice", f"/clicks/{click_id}")
    stands = browser.find_element(By.CSS_SELECTOR, "#copies tbody tr").text
    assert "the one billed" not in stands and "the one the rule judged; not charged (Over budget)" in stands
    why = browser.find_element(By.ID, "why").text
    assert "made by root through the simulator at 2026-01-01 00:01:00 UTC" in why and "Z;" not in why
    # The period in the pages' words, not its key; the reason in words first.
    assert "in the books of the period from 2026-01-01 05:00:00 UTC (open)" in why and "T0500Z" not in why
    assert "Not charged: the campaign's daily budget was spent (over_budget)" in why
    for width in (WIDE, NARROW):
        browser.execute_script("document.getElementById('why').scrollIntoView()")
        shoot_at(browser, shoot, width, "story-not-charged")
    browser.set_window_size(WIDE, 1100)


def test_finance_reads_the_health_page_with_a_frozen_job_and_a_run_under_way(
    served: Served,  # noqa: F811
    browser: WebDriver,  # noqa: F811
    screens: Callable[[WebDriver, str], Path],  # noqa: F811
) -> None:
    shoot = to_tmp(screens)
    seeded = served.seeded
    keys = RedisKeys(seeded.settings.redis_prefix)
    now = int(time.time() * 1000)
    seeded.client.set(keys.heartbeat("billing"), now - 20_000)  # frozen: nothing for 20 s
    seeded.writer.health({**health_record("billing", 95, now - 20_000), "watermark_ms": now - 31_000})
    seeded.client.hset(keys.health_status(RECONCILE_RUN_PART), mapping={"state": "running", "since_ms": now - 840_000})
    log_in(browser, served.base_url, "fiona", "/finance")
    browser.find_element(By.ID, "nav-health").click()
    wait(browser, lambda d: d.current_url.endswith("/health"))
    # Never "all good" (red here: this fixture runs no Kafka, which the page says too).
    assert browser.find_element(By.ID, "overall-status").get_attribute("data-level") in ("amber", "red")
    job = browser.find_element(By.ID, "status-streaming-job")
    assert job.get_attribute("data-level") == "amber" and "the job may be frozen" in job.text
    assert "behind the clock" in job.text
    run = browser.find_element(By.ID, "status-reconciliation").text
    assert "Running: a run under way since" in run and "(14 min)" in run
    for width in (WIDE, NARROW):
        browser.set_window_size(width, 1400 if width == NARROW else 1100)
        wait(browser, lambda d, w=width: d.execute_script("return window.innerWidth") <= w)  # type: ignore[misc]
        shoot(browser, f"health-finance-{width}")
        # The page never scrolls sideways, and the status lines fit their table (no scroll bar under it).
        assert not browser.execute_script("return document.documentElement.scrollWidth > window.innerWidth + 1;")
        assert overflowing(browser, ("status",)) == {}
    browser.set_window_size(WIDE, 1100)
    seeded.client.delete(keys.health_status(RECONCILE_RUN_PART))


def test_finances_periods_name_the_currency_of_each_count_at_both_widths(
    served: Served,  # noqa: F811
    browser: WebDriver,  # noqa: F811
    screens: Callable[[WebDriver, str], Path],  # noqa: F811
) -> None:
    shoot = to_tmp(screens)
    log_in(browser, served.base_url, "fiona", "/finance")
    latest = browser.find_element(By.CSS_SELECTOR, "#periods tbody")
    rows = latest.find_elements(By.TAG_NAME, "tr")
    assert sorted(r.find_element(By.CSS_SELECTOR, "td.currency").text for r in rows) == ["EUR", "JPY", "KWD"]
    for width in (WIDE, NARROW):
        browser.set_window_size(width, 1400 if width == NARROW else 1100)
        wait(browser, lambda d, w=width: d.execute_script("return window.innerWidth") <= w)  # type: ignore[misc]
        browser.execute_script("document.getElementById('periods').scrollIntoView()")
        shoot(browser, f"finance-periods-{width}")
        assert not browser.execute_script("return document.documentElement.scrollWidth > window.innerWidth + 1;")
        assert overflowing(browser, ("periods",)) == {}, width
        # The currency of each row is on screen, beside its counts.
        assert off_screen(browser, "#periods td.currency, #periods td.clicks") == [], width
        if width == NARROW:
            cell = browser.find_element(By.CSS_SELECTOR, "#periods tbody td.clicks")
            assert cell.get_attribute("data-label") == "Clicks (corrected)"
    browser.set_window_size(WIDE, 1100)
