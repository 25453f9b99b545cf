"""A click's story in a real headless Chromium against `adbill web` (the fixtures of `test_browser`): an advertiser
searches a click id from its dashboard and reads why it was charged, at 1360 px and 390 px; another advertiser's
click answers as one never received; finance reads the catalog's change log. Screenshots under the test's folder
and `var/test-output/screens/`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from billing.catalog import AdChange, MadeBy
from tests.e2e.test_browser import Served, browser, downloads, log_in, screens, served, wait  # noqa: F401
from tests.e2e.test_browser_catalog import NARROW, WIDE, shoot_at
from tests.web_support import OTHER, OWN, plant_exported_click

pytestmark = pytest.mark.e2e


def test_an_advertiser_searches_a_click_and_reads_its_story(
    served: Served,  # noqa: F811
    browser: WebDriver,  # noqa: F811
    screens: Callable[[WebDriver, str], Path],  # noqa: F811
) -> None:
    root = served.seeded.settings.root
    exported = sorted(p.name for p in (root / "exports").iterdir() if not p.name.startswith("."))[-1]
    mine = plant_exported_click(root, exported, OWN, duplicate=True)
    theirs = plant_exported_click(root, exported, OTHER)
    log_in(browser, served.base_url, "alice", f"/advertisers/{OWN}")
    browser.find_element(By.ID, "dashboard-click-id").send_keys(mine)
    browser.find_element(By.ID, "dashboard-click-submit").click()
    wait(browser, lambda d: d.current_url.endswith(f"/clicks/{mine}"))
    assert browser.find_element(By.ID, "outcome").text.startswith("Charged")
    copies = browser.find_elements(By.CSS_SELECTOR, "#copies tbody tr")
    assert [r.find_elements(By.TAG_NAME, "td")[0].text for r in copies] == ["stands", "duplicate"]
    why = browser.find_element(By.ID, "why").text
    assert "Attributed to impression" in why and "Price in force at its time" in why
    assert "billing.parquet" in browser.find_element(By.ID, "exports").text
    assert [r.text.split(" ")[0] for r in browser.find_elements(By.CSS_SELECTOR, "#stream tbody tr")]
    shoot_at(browser, screens, WIDE, "click")
    shoot_at(browser, screens, NARROW, "click")
    browser.set_window_size(WIDE, 2400)  # the whole story, for people to look at
    screens(browser, "click-whole-1360")

    # Another advertiser's click, searched from the page's own form, answers as a click never received would.
    browser.set_window_size(WIDE, 1100)
    browser.find_element(By.ID, "click-id").send_keys(theirs)
    browser.find_element(By.ID, "click-search-submit").click()
    wait(browser, lambda d: d.current_url.endswith(f"/clicks/{theirs}"))
    assert "404" in browser.title or "Not Found" in browser.page_source
    assert OTHER not in browser.page_source

    # Finance reads who changed the catalog, and each price entry says it.
    store = served.seeded.settings.catalog_store()
    ad_id = next(ad.ad_id for ad in served.seeded.catalog if ad.advertiser_id == OWN)
    store.change(AdChange(ad_id, 4_102_444_800_000, 777_000), made_by=MadeBy("ada", "page"))
    browser.delete_all_cookies()
    log_in(browser, served.base_url, "fiona", "/catalog/changes?who=ada")
    rows = browser.find_elements(By.CSS_SELECTOR, "#changes tbody tr")
    assert len(rows) == 1 and "ada" in rows[0].text and "set-price" in rows[0].text and "page" in rows[0].text
    shoot_at(browser, screens, WIDE, "changes")
    shoot_at(browser, screens, NARROW, "changes")
