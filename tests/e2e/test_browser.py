"""The web UI in a real headless Chromium (Debian's `chromium` and `chromium-driver`, driven by Selenium), served by
`adbill web` (gunicorn) as a child process, over real Redis and real export files.

An advertiser logs in, sees totals equal to Redis, the chart drawn, the figures refreshing live when a new batch is
billed, and its corrections; finance downloads a closed period's export and reads it back with pyarrow; an admin
sees the pipeline's health. Every page is kept as a screenshot under the test's folder and `var/test-output/screens/`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from billing.store.database import connection_pool
from billing.store.redis_totals import TotalsRow
from ops import deps
from ops.postgres_service import LocalPostgres
from ops.process import ManagedProcess, free_port, port_open
from ops.redis_service import LocalRedis
from tests.conftest import isolated_settings, new_database
from tests.redis_figures import RedisFigures
from tests.web_support import OTHER, OWN, PASSWORD, Seeded, seed, web_screens_dir
from web import display

pytestmark = pytest.mark.e2e


@dataclass(frozen=True)
class Served:
    base_url: str
    seeded: Seeded


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, redis_server: LocalRedis, postgres_server: LocalPostgres
) -> Iterator[Served]:
    """Seeded data (the catalog in a database of the module's own) and `adbill web` on a free port, for the module."""
    home = tmp_path_factory.mktemp("web-e2e")
    settings = isolated_settings(
        home=home / "data",
        database_url=new_database(postgres_server),
        redis_url=redis_server.url,
        redis_prefix=f"t{uuid.uuid4().hex[:10]}",
        web_port=free_port(),
        kafka_bootstrap=f"127.0.0.1:{free_port()}",  # no Kafka: the health page says so
    )
    seeded = seed(settings)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADBILL_")}
    env.update(settings.to_env())
    env["ADBILL_WEB_WORKERS"] = "1"
    server = ManagedProcess(
        name="web",
        command=[sys.executable, "-m", "ops.cli", "web"],
        run_dir=home / "run",
        log_dir=home / "logs",
        env=env,
    )
    server.start()
    try:
        server.wait_ready(lambda: port_open("127.0.0.1", settings.web_port), 30, "the web UI listening")
        yield Served(f"http://127.0.0.1:{settings.web_port}", seeded)
    finally:
        server.stop()
        seeded.client.close()
        connection_pool(settings.database_url).close()


@pytest.fixture
def downloads(tmp_path: Path) -> Path:
    folder = tmp_path / "downloads"
    folder.mkdir()
    return folder


@pytest.fixture
def browser(downloads: Path) -> Iterator[WebDriver]:
    """Debian's Chromium, headless, through Debian's chromedriver named explicitly (Selenium Manager never runs)."""
    chromium, chromedriver = deps.ensure_browser()
    options = Options()
    options.binary_location = str(chromium)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1360,1800"):
        options.add_argument(argument)
    options.add_experimental_option(
        "prefs", {"download.default_directory": str(downloads), "download.prompt_for_download": False}
    )
    driver = webdriver.Chrome(service=Service(executable_path=str(chromedriver)), options=options)
    driver.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    driver.set_page_load_timeout(20)
    yield driver
    driver.quit()


@pytest.fixture
def screens(tmp_path: Path, request: pytest.FixtureRequest) -> Callable[[WebDriver, str], Path]:
    """Save a screenshot under the test's folder and copy it to var/test-output/screens/."""
    folder = tmp_path / "screens"
    folder.mkdir()
    test_name = request.node.name.removeprefix("test_")

    def shoot(driver: WebDriver, name: str) -> Path:
        path = folder / f"{test_name}--{name}.png"
        driver.save_screenshot(str(path))
        assert path.stat().st_size > 10_000, "a screenshot of a page with content"
        shutil.copy(path, web_screens_dir() / path.name)
        return path

    return shoot


def log_in(
    driver: WebDriver, base_url: str, username: str, start: str, shoot: Callable[[WebDriver, str], Path] | None = None
) -> None:
    """Go to `start`, land on the login form, log in there and wait to be sent back."""
    driver.get(base_url + start)
    wait(driver, lambda d: "/login" in d.current_url)
    if shoot:
        shoot(driver, "login")
    driver.find_element(By.ID, "username").send_keys(username)
    driver.find_element(By.ID, "password").send_keys(PASSWORD)
    driver.find_element(By.ID, "login-submit").click()
    wait(driver, lambda d: "/login" not in d.current_url)


def wait(driver: WebDriver, until: Callable[[WebDriver], object], timeout_s: float = 15) -> None:
    """Poll `until`; an element of the page being replaced (a form just sent) is read again on the next poll.
    Chromium reports an element read while its page is replaced either as stale or, from 156 on at times, as an
    inspector error ("Node with given id does not belong to the document"): both are the same race."""
    passing = (NoSuchElementException, StaleElementReferenceException)

    def polled(d: WebDriver) -> object:
        try:
            return until(d)
        except WebDriverException as error:
            if "does not belong to the document" in str(error):
                return False
            raise

    WebDriverWait(driver, timeout_s, poll_frequency=0.1, ignored_exceptions=passing).until(polled)


def corrected(seeded: Seeded, period: str, level: str, ident: str) -> tuple[int, int]:
    """(clicks, micros) as Redis holds them: the stream's totals plus the corrections of that period."""
    totals = RedisFigures(seeded.client, seeded.settings.redis_prefix)
    provisional = {"adv": totals.advertiser, "cmp": totals.campaign, "ad": totals.ad}[level](period, ident)
    fixes = seeded.client.hmget(totals.keys.corrections(period, level, ident), "clicks", "micros")
    return provisional.clicks + int(fixes[0] or 0), provisional.micros + int(fixes[1] or 0)  # type: ignore[index]


def test_advertiser_sees_its_totals_the_chart_live_updates_and_corrections(
    served: Served, browser: WebDriver, screens: Callable[[WebDriver, str], Path]
) -> None:
    seeded = served.seeded
    log_in(browser, served.base_url, "alice", f"/advertisers/{OWN}", screens)
    assert browser.current_url.endswith(f"/advertisers/{OWN}")
    wait(browser, lambda d: int(d.find_element(By.ID, "dashboard").get_attribute("data-refreshes") or 0) >= 1)

    totals = RedisFigures(seeded.client, seeded.settings.redis_prefix)
    periods = totals.periods()
    latest = periods[-1]
    clicks, micros = corrected(seeded, latest, "adv", OWN)
    assert browser.find_element(By.ID, "corrected-spend").text == display.money(micros, "EUR")
    assert browser.find_element(By.ID, "corrected-clicks").text == display.count(clicks)
    rows = browser.find_elements(By.CSS_SELECTOR, "#campaigns tbody tr")
    assert len(rows) == len(totals.campaigns(latest, OWN)) == 2
    for row in rows:
        cells = [td.text for td in row.find_elements(By.TAG_NAME, "td")]
        campaign_clicks, campaign_micros = corrected(seeded, latest, "cmp", cells[0])
        assert cells[6] == display.money(campaign_micros, "EUR") and cells[5] == display.count(campaign_clicks)
    assert OTHER not in browser.page_source

    chart = browser.find_element(By.ID, "spend-chart")
    bars = chart.find_elements(By.CSS_SELECTOR, "rect.bar")
    assert chart.get_attribute("data-points") == str(len(periods)) and len(bars) == len(periods)
    assert chart.find_element(By.CSS_SELECTOR, "polyline.provisional-line").get_attribute("points")
    assert [int(b.get_attribute("data-micros") or "") for b in bars] == [
        corrected(seeded, p, "adv", OWN)[1] for p in periods
    ]
    assert max(b.size["height"] for b in bars) > 50, "the chart is drawn, with visible bars"
    screens(browser, "dashboard")

    # The stream bills a new micro-batch: the open page shows it within a refresh or two, without reloading.
    ad = next(a for a in seeded.catalog if a.advertiser_id == OWN)
    start_ms = int(seeded.client.zscore(totals.keys.periods(), latest) or 0)
    totals.apply_batch(
        "billing", 1_000, [TotalsRow(latest, start_ms, OWN, ad.campaign_id, ad.ad_id, 7, 7 * ad.cpc_micros)]
    )
    expected = display.money(micros + 7 * ad.cpc_micros, "EUR")
    wait(browser, lambda d: d.find_element(By.ID, "corrected-spend").text == expected, timeout_s=12)
    assert browser.find_element(By.ID, "corrected-clicks").text == display.count(clicks + 7)
    screens(browser, "dashboard-after-new-batch")

    browser.find_element(By.ID, "all-corrections").click()
    wait(browser, lambda d: d.current_url.endswith(f"/advertisers/{OWN}/corrections"))
    newest = json.loads(seeded.client.lindex(totals.keys.correction_list(OWN), 0) or "{}")
    listed = seeded.client.llen(totals.keys.correction_list(OWN))
    rows = browser.find_elements(By.CSS_SELECTOR, "#corrections tbody tr")
    assert len(rows) == min(50, int(listed)) > 0  # type: ignore[arg-type]
    first = [td.text for td in rows[0].find_elements(By.TAG_NAME, "td")]
    assert first[0] == newest["correction_id"]
    assert first[2] == display.signed_money(newest["amount_micros"], "EUR")
    assert first[3] == newest["click_id"]
    screens(browser, "corrections")

    rows[0].find_element(By.TAG_NAME, "a").click()
    wait(browser, lambda d: d.current_url.endswith(f"/corrections/{newest['correction_id']}"))
    assert browser.find_element(By.ID, "amount").text == display.signed_money(newest["amount_micros"], "EUR")
    screens(browser, "correction")

    browser.get(f"{served.base_url}/advertisers/{OTHER}")
    assert "404" in browser.find_element(By.TAG_NAME, "h1").text
    assert OTHER not in browser.find_element(By.TAG_NAME, "main").text
    screens(browser, "another-advertiser-404")


def _downloaded(folder: Path, name: str) -> Path:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        done = [p for p in folder.iterdir() if p.name == name]
        if done and not list(folder.glob("*.crdownload")):
            return done[0]
        time.sleep(0.1)
    raise AssertionError(f"{name} was not downloaded; the folder holds {sorted(p.name for p in folder.iterdir())}")


def test_finance_downloads_a_closed_periods_export_that_reads_back_with_pyarrow(
    served: Served, browser: WebDriver, downloads: Path, screens: Callable[[WebDriver, str], Path]
) -> None:
    log_in(browser, served.base_url, "fiona", "/finance")
    assert browser.current_url.endswith("/finance")
    rows = browser.find_elements(By.CSS_SELECTOR, "#exports tbody tr[data-period]")
    assert len(rows) == 2
    period = rows[0].get_attribute("data-period")
    manifest = json.loads((served.seeded.settings.root / "exports" / str(period) / "manifest.json").read_text())
    assert rows[0].find_elements(By.TAG_NAME, "td")[1].text == display.count(manifest["rows"])
    lines = browser.find_elements(By.CSS_SELECTOR, "#advertisers tbody tr:not(.total)")
    advertisers = [r.find_element(By.TAG_NAME, "a").text for r in lines]
    assert advertisers == ["adv-0000", "adv-0001", "adv-0002"]
    # A total row per currency adds that currency's advertisers up, to the micro, as Redis holds them: never two
    # currencies together.
    seeded = served.seeded
    latest = RedisFigures(seeded.client, seeded.settings.redis_prefix).periods()[-1]
    want: dict[str, int] = {}
    for a in advertisers:
        currency = seeded.catalog.currency_of(a) or ""
        want[currency] = want.get(currency, 0) + corrected(seeded, latest, "adv", a)[1]
    total_rows = browser.find_elements(By.CSS_SELECTOR, "#advertisers tr.total")
    assert [r.get_attribute("data-currency") for r in total_rows] == sorted(want) and len(want) > 1
    for row in total_rows:
        currency = row.get_attribute("data-currency") or ""
        assert row.find_element(By.CSS_SELECTOR, "td.strong").text == display.money(want[currency], currency)
    screens(browser, "finance")

    for name in ("billing.parquet", "billing.csv"):
        rows[0].find_element(By.CSS_SELECTOR, f"a[href$='/{period}/{name}']").click()
        path = _downloaded(downloads, f"adbill-{period}-{name}")
        assert hashlib.sha256(path.read_bytes()).hexdigest() == manifest["files"][name]["sha256"]
        table = pq.read_table(path) if name.endswith(".parquet") else pacsv.read_csv(path)
        assert table.num_rows == manifest["rows"]
        by_currency: dict[str, int] = {}
        pairs = zip(table.column("currency").to_pylist(), table.column("net_micros").to_pylist(), strict=True)
        for currency, net in pairs:
            by_currency[currency] = by_currency.get(currency, 0) + net
        assert by_currency == manifest["total_micros_by_currency"]
        assert set(table.column("status").to_pylist()) <= {"billed", "added", "retracted"}


def test_admin_sees_the_pipelines_health(
    served: Served, browser: WebDriver, screens: Callable[[WebDriver, str], Path]
) -> None:
    log_in(browser, served.base_url, "ada", "/health")
    assert browser.current_url.endswith("/health")
    # Kafka does not answer here: the page says so, and shows the job's last report as what it is (the sample's
    # progress record: 120 impressions and 80 clicks behind the latest offsets).
    assert "does not answer" in browser.find_element(By.ID, "billing-lag-error").text
    assert browser.find_element(By.ID, "billing-reported-lag-impressions").text == "120"
    assert browser.find_element(By.ID, "billing-reported-lag-clicks").text == "80"
    assert browser.find_element(By.ID, "billing-state-rows").text == "52,000"
    assert "UTC" in browser.find_element(By.ID, "billing-watermark-clicks").text
    assert browser.find_element(By.ID, "reconcile-finished").text
    screens(browser, "health")


WIDTHS = (1360, 390)


def at_width(driver: WebDriver, width: int, height: int = 900) -> None:
    """The viewport of a desktop (1360 px) or a phone (390 px), exactly, through Chromium's device metrics."""
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600},
    )


OVERFLOW_SCRIPT = """
const width = window.innerWidth;
let worst = document.documentElement.scrollWidth - width;
const clipped = (el) => {
  for (let a = el.parentElement; a && a !== document.body; a = a.parentElement) {
    if (getComputedStyle(a).overflowX !== "visible") return true;
  }
  return false;
};
for (const el of document.querySelectorAll("body *")) {
  const r = el.getBoundingClientRect();
  if (r.width && r.right - width > worst && !clipped(el)) worst = r.right - width;
}
return Math.ceil(worst);
"""


def overflow_px(driver: WebDriver) -> int:
    """How far the page or anything on it reaches past the viewport's right edge (0 or less: nothing is cut off and
    nothing scrolls sideways); wide tables scroll inside their own box, which is allowed."""
    return int(driver.execute_script(OVERFLOW_SCRIPT))


def shoot_whole_page(driver: WebDriver, shoot: Callable[[WebDriver, str], Path], width: int, name: str) -> None:
    """A screenshot of the whole page at this width (the viewport made as tall as the page, up to 5,000 px)."""
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    at_width(driver, width, min(max(height, 600), 5000))
    shoot(driver, f"{name}-{width}")
    at_width(driver, width)


def set_heartbeat(seeded: Seeded, age_s: float) -> None:
    from billing.store.redis_keys import RedisKeys

    seeded.client.set(
        RedisKeys(seeded.settings.redis_prefix).heartbeat("billing"), str(int(time.time() * 1000 - age_s * 1000))
    )


@pytest.mark.parametrize("width", WIDTHS)
def test_advertiser_pages_fit_the_screen_and_show_ranges_prices_and_statements(
    served: Served, browser: WebDriver, screens: Callable[[WebDriver, str], Path], width: int
) -> None:
    seeded = served.seeded
    set_heartbeat(seeded, 2)
    at_width(browser, width)
    log_in(browser, served.base_url, "alice", f"/advertisers/{OWN}?from=2026-01-01&to=2026-01-31")
    wait(browser, lambda d: int(d.find_element(By.ID, "dashboard").get_attribute("data-refreshes") or 0) >= 1)
    assert overflow_px(browser) <= 0, "the dashboard scrolls sideways"
    assert browser.find_element(By.ID, "freshness").get_attribute("data-level") == "ok"
    totals = RedisFigures(seeded.client, seeded.settings.redis_prefix)
    month = sum(corrected(seeded, p, "adv", OWN)[1] for p in totals.periods())
    assert browser.find_element(By.ID, "range-spend").text == display.money(month, "EUR")
    days = browser.find_elements(By.CSS_SELECTOR, "#days tbody tr")
    assert [r.find_elements(By.TAG_NAME, "td")[0].text for r in days] == ["2026-01-01"]
    assert "provisional" in days[0].text
    shoot_whole_page(browser, screens, width, "dashboard")

    ad = next(a for a in seeded.catalog if a.advertiser_id == OWN)
    pages = {
        "campaign": f"/advertisers/{OWN}/campaigns/{ad.campaign_id}?from=2026-01-01&to=2026-01-31",
        "ad": f"/advertisers/{OWN}/ads/{ad.ad_id}?from=2026-01-01&to=2026-01-31",
        "corrections": f"/advertisers/{OWN}/corrections",
        "statement": f"/advertisers/{OWN}/statements/2026-01",
    }
    for name, url in pages.items():
        browser.get(served.base_url + url)
        assert overflow_px(browser) <= 0, f"{name} scrolls sideways at {width} px"
        if name == "ad":
            assert display.money(ad.cpc_micros, "EUR") in browser.find_element(By.ID, "price").text
        if name == "corrections":
            browser.find_element(By.CSS_SELECTOR, "#reasons summary").click()
        shoot_whole_page(browser, screens, width, name)


@pytest.mark.parametrize("width", WIDTHS)
def test_finance_and_health_pages_fit_the_screen(
    served: Served, browser: WebDriver, screens: Callable[[WebDriver, str], Path], width: int
) -> None:
    set_heartbeat(served.seeded, 2)
    at_width(browser, width)
    log_in(browser, served.base_url, "fiona", "/finance")
    assert overflow_px(browser) <= 0
    assert browser.find_elements(By.CSS_SELECTOR, "#advertisers tr.total")
    shoot_whole_page(browser, screens, width, "finance")
    browser.delete_all_cookies()
    log_in(browser, served.base_url, "ada", "/health")
    assert overflow_px(browser) <= 0
    assert browser.find_element(By.ID, "overall-status").get_attribute("data-level") in ("ok", "amber", "red")
    shoot_whole_page(browser, screens, width, "health")


def test_a_stalled_job_turns_the_live_dashboard_red_and_back(
    served: Served, browser: WebDriver, screens: Callable[[WebDriver, str], Path]
) -> None:
    """The job stops beating (a paused JVM): the open dashboard's banner says the data is stale, though the page
    itself keeps refreshing; when the job beats again, the banner says so at the next refresh."""
    seeded = served.seeded
    set_heartbeat(seeded, 2)
    log_in(browser, served.base_url, "alice", f"/advertisers/{OWN}")
    wait(browser, lambda d: d.find_element(By.ID, "freshness").get_attribute("data-level") == "ok")
    set_heartbeat(seeded, 400)  # more than 5 x 60 s ago
    wait(browser, lambda d: d.find_element(By.ID, "freshness").get_attribute("data-level") == "red", timeout_s=12)
    assert "Stale" in browser.find_element(By.ID, "freshness").text
    screens(browser, "dashboard-job-stalled")
    set_heartbeat(seeded, 90)
    wait(browser, lambda d: d.find_element(By.ID, "freshness").get_attribute("data-level") == "amber", timeout_s=12)
    set_heartbeat(seeded, 1)
    wait(browser, lambda d: d.find_element(By.ID, "freshness").get_attribute("data-level") == "ok", timeout_s=12)
    browser.delete_all_cookies()
    set_heartbeat(seeded, 400)
    log_in(browser, served.base_url, "ada", "/health")
    assert browser.find_element(By.ID, "overall-status").get_attribute("data-level") == "red"
    screens(browser, "health-job-stalled")


PAST_2_TO_THE_53 = 9_007_199_254_740_993  # 2^53 + 1: as a JSON number, a browser reads 9,007,199,254,740,992


def test_the_live_refresh_keeps_every_digit_of_a_total_past_2_to_the_53_micros(
    served: Served, browser: WebDriver, screens: Callable[[WebDriver, str], Path]
) -> None:
    """A large JPY advertiser: its total passes 2^53 micros (9 billion yen). The API sends micros as strings, the
    script reads them into BigInt: the refreshed dashboard and its chart show the total to the micro."""
    seeded = served.seeded
    currency = seeded.catalog.currency_of(OTHER)
    assert currency == "JPY"
    log_in(browser, served.base_url, "bob", f"/advertisers/{OTHER}")
    wait(browser, lambda d: int(d.find_element(By.ID, "dashboard").get_attribute("data-refreshes") or 0) >= 1)

    totals = RedisFigures(seeded.client, seeded.settings.redis_prefix)
    latest = totals.periods()[-1]
    clicks, micros = corrected(seeded, latest, "adv", OTHER)
    ad = next(a for a in seeded.catalog if a.advertiser_id == OTHER)
    start_ms = int(seeded.client.zscore(totals.keys.periods(), latest) or 0)
    batch = (totals.last_applied("billing") or 0) + 1
    totals.apply_batch(
        "billing", batch, [TotalsRow(latest, start_ms, OTHER, ad.campaign_id, ad.ad_id, 1, PAST_2_TO_THE_53)]
    )
    exact = micros + PAST_2_TO_THE_53
    assert exact > 2**53 and float(exact) != exact, "a double cannot hold it"
    expected = display.money(exact, "JPY")  # every digit: 9,007,199,xxx.740993 JPY
    refreshed = int(browser.find_element(By.ID, "dashboard").get_attribute("data-refreshes") or 0)
    # Two refreshes later the page shows what the API said after the batch, whatever it said.
    wait(
        browser, lambda d: int(d.find_element(By.ID, "dashboard").get_attribute("data-refreshes") or 0) >= refreshed + 2
    )
    shown = browser.find_element(By.ID, "corrected-spend").text
    screens(browser, "dashboard-past-2-to-the-53")
    assert shown == expected, f"the live refresh shows {shown}, the total is {expected}"
    assert browser.find_element(By.ID, "corrected-clicks").text == display.count(clicks + 1)
    bar = browser.find_element(By.CSS_SELECTOR, f"#spend-chart rect.bar[data-period='{latest}']")
    assert bar.get_attribute("data-micros") == str(exact)
    # The page the server renders agrees, to the micro.
    browser.get(f"{served.base_url}/advertisers/{OTHER}")
    assert browser.find_element(By.ID, "corrected-spend").text == expected
