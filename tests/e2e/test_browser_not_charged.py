"""The clicks not charged, in a real headless Chromium against `adbill web` (the fixtures of `test_browser`): an
advertiser follows the dashboard's link to the period's list, then reads a date range's, at 1360 px and 390 px,
and downloads the CSV. Screenshots under the test's folder, `var/test-output/screens/` and /tmp."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.e2e.test_browser import Served, browser, downloads, log_in, screens, served, wait  # noqa: F401
from tests.e2e.test_browser_catalog import NARROW, WIDE, shoot_at
from tests.integration.test_web_not_charged_clicks import DAYS, OPEN, plant
from tests.web_support import OWN

pytestmark = pytest.mark.e2e


def test_an_advertiser_reads_its_clicks_not_charged_at_both_widths(
    served: Served,  # noqa: F811
    browser: WebDriver,  # noqa: F811
    screens: Callable[[WebDriver, str], Path],  # noqa: F811
    downloads: Path,  # noqa: F811
) -> None:
    mine = plant(served.seeded)
    log_in(browser, served.base_url, "alice", f"/advertisers/{OWN}?period={OPEN}")
    browser.find_element(By.ID, "not-charged-list").click()
    wait(browser, lambda d: "/not-charged?period=" in d.current_url)
    rows = browser.find_elements(By.CSS_SELECTOR, "#not-charged-clicks tbody tr")
    assert [r.get_attribute("data-click") for r in rows] == ["nc-adv-0000-5", "nc-adv-0000-4", "nc-adv-0000-3"]
    browser.get(f"{served.base_url}/advertisers/{OWN}/not-charged?{DAYS}")
    rows = browser.find_elements(By.CSS_SELECTOR, "#not-charged-clicks tbody tr")
    assert len(rows) == len(mine) and "Provisional" in rows[0].text.title()
    assert browser.find_element(By.ID, "not-charged-total").text == str(len(mine))

    def shoot(driver: WebDriver, name: str) -> Path:
        path = screens(driver, name)
        shutil.copy(path, Path("/tmp") / path.name)  # for people to look at
        return path

    for width in (WIDE, NARROW):
        shoot_at(browser, shoot, width, "not-charged")
    browser.set_window_size(WIDE, 1100)
    browser.find_element(By.ID, "not-charged-csv").click()
    wait(browser, lambda d: any(p.suffix == ".csv" for p in downloads.iterdir()))
    text = next(p for p in downloads.iterdir() if p.suffix == ".csv").read_text()
    assert text.startswith("click_id,click_time,period,ad_id") and text.count("\n") == len(mine) + 1
