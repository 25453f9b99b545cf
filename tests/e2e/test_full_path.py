"""The whole path, once: simulated traffic through Kafka and the streaming job (its query and health listener,
as `adbill stream` starts them, in the tests' Spark), late traffic after it, a reconciliation that corrects the
late events and closes both periods, then the web UI (`adbill web`, gunicorn) in Debian's headless Chromium over
what the pipeline really wrote: the advertiser's totals, chart and corrections, finance's export download, the
admin's health page.

Every figure the pages show is held to a source the pipeline did not write: the DuckDB oracle (`tests/oracle.py`)
over the records read back from Kafka, the simulator's own account of what it sent (late and bad records), and
Kafka's end offsets. Only the provisional figures (what the stream billed) come from the job's ledger, and the
corrections shown must be exactly the difference between that ledger and the oracle. Screenshots are kept under
the test's folder and `var/test-output/screens/`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from attribution.job import start
from attribution.progress import HealthListener
from billing.catalog import Catalog
from billing.events import TOPIC_OF
from billing.periods import Periods
from billing.store.parquet_ledger import read_ledger
from ops.process import ManagedProcess, free_port, port_open
from ops.reconcile import reconcile, reconcile_config
from ops.settings import Settings
from ops.stack import ensure_schemas
from ops.streaming import stream_config
from producers.arrivals import ArrivalKind
from producers.publisher import simulate_to_kafka
from producers.simulator import SimulationConfig, Simulator
from tests import oracle
from tests.e2e.test_browser import (  # noqa: F401  (fixtures, used by name)
    _downloaded,
    browser,
    downloads,
    log_in,
    screens,
    wait,
)
from tests.integration.test_closing_follows_stream import drained
from tests.integration.test_reconcile import read_back
from tests.web_support import PASSWORD
from web import display
from web.access import Role

pytestmark = pytest.mark.e2e

T0 = 1_767_229_180_000  # 2026-01-01T00:59:40Z: 20 s of the first period, the rest in the second
P0, P1 = "20260101T0000Z", "20260101T0100Z"
PERIODS = Periods()

# On-time traffic first (out of order by at most 2 s, re-sent copies, bad records of every kind), read by the job;
# its watermark is then 30 s behind its newest event time, ~01:02:30. Then late traffic: events of 00:59:50 to
# ~01:01, every one of them behind that watermark, so every one is late by construction.
TRAFFIC = SimulationConfig(
    events=2_000,
    seed=19,
    users=150,
    impression_rate=10.0,
    start_ms=T0,
    late_fraction=0.0,
    out_of_order_fraction=0.05,
    duplicate_fraction=0.02,
    bad_fraction=0.01,
)
LATE_TRAFFIC = dataclasses.replace(
    TRAFFIC,
    events=300,
    start_ms=T0 + 10_000,
    id_prefix="late",
    out_of_order_fraction=0.0,
    duplicate_fraction=0.0,
    bad_fraction=0.0,
)
UNDECODED = {"undecodable", "unknown_schema"}
"""Quarantine reasons of records that never decode to an event (the oracle's read-back skips them)."""


@dataclasses.dataclass(frozen=True)
class Truth:
    """What the pipeline must show, from sources it did not write."""

    billable: list[dict]  # the oracle's rows
    billed: list[dict]  # the stream's ledger (provisional)
    late: dict[tuple[str, str, str], int]  # (period, type, advertiser) -> late events the simulator sent
    quarantined: dict[tuple[str, str], int]  # (reason, topic) -> bad records the simulator sent the stream
    dropped: list[int]  # rows the engine dropped behind the watermark, per batch that read the late traffic

    def late_of(self, period: str, event_type: str, advertiser: str | None = None) -> int:
        return sum(
            n for (p, t, adv), n in self.late.items() if (p, t) == (period, event_type) and advertiser in (None, adv)
        )

    def by_period(self, rows: list[dict], advertiser: str, period: str) -> tuple[int, int]:
        mine = [r for r in rows if r["advertiser_id"] == advertiser and PERIODS.key_of(r["click_time"]) == period]
        return len(mine), sum(r["amount_micros"] for r in mine)

    def corrections_of(self, advertiser: str) -> Counter[tuple[str, int]]:
        """(click id, signed micros) the reconciliation must book: the oracle minus the ledger, both ways."""
        final = {r["click_id"]: r["amount_micros"] for r in self.billable if r["advertiser_id"] == advertiser}
        stream = Counter(r["click_id"] for r in self.billed if r["advertiser_id"] == advertiser)
        amount = {r["click_id"]: r["amount_micros"] for r in self.billed}
        out: Counter[tuple[str, int]] = Counter()
        for click, micros in final.items():
            if click not in stream:
                out[(click, micros)] += 1
        for click, n in stream.items():
            for _ in range(n - (1 if click in final else 0)):
                out[(click, -amount[click])] += 1
        return out


def simulator_facts(
    settings: Settings, catalog: Catalog
) -> tuple[dict[tuple[str, str, str], int], dict[tuple[str, str], int]]:
    """Late events by (period, type, advertiser): every event of the late traffic; and bad records by (reason,
    topic), as the simulator sent them."""
    late: Counter[tuple[str, str, str]] = Counter()
    advertiser_of = {ad.ad_id: ad.advertiser_id for ad in catalog}
    for arrival in Simulator(LATE_TRAFFIC).arrivals():
        event = arrival.event
        assert event is not None and arrival.kind == ArrivalKind.EVENT
        late[(PERIODS.key_of(event.event_time), event.type, advertiser_of[event.ad_id])] += 1
    bad: Counter[tuple[str, str]] = Counter()
    topic_of = {TOPIC_OF[event_type]: topic for event_type, topic in settings.topics.items()}
    for arrival in Simulator(TRAFFIC).arrivals():
        if arrival.kind == ArrivalKind.BAD:
            logical = arrival.raw.topic if arrival.raw is not None else TOPIC_OF[arrival.item.type]  # type: ignore[union-attr]
            bad[(str(arrival.expected_reason), topic_of[logical])] += 1
    return dict(late), dict(bad)


@pytest.fixture
def web_server(settings: Settings, tmp_path: Path) -> Iterator[Callable[[], str]]:
    """`adbill web` (gunicorn, one worker) over the test's data folder and Redis prefix, started on demand."""
    started: list[ManagedProcess] = []

    def run() -> str:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("ADBILL_")}
        env.update(dataclasses.replace(settings, web_port=port).to_env())
        env["ADBILL_WEB_WORKERS"] = "1"
        server = ManagedProcess(
            name="web",
            command=[sys.executable, "-m", "ops.cli", "web"],
            run_dir=tmp_path / "web-run",
            log_dir=tmp_path / "web-logs",
            env=env,
        )
        started.append(server)
        server.start()
        server.wait_ready(lambda: port_open("127.0.0.1", port), 30, "the web UI listening")
        return f"http://127.0.0.1:{port}"

    yield run
    for server in started:
        server.stop()


def run_the_pipeline(spark: SparkSession, settings: Settings, tmp_path: Path) -> Truth:
    """The on-time traffic into Kafka and through the streaming job (its query and health listener, as
    `adbill stream` starts them), then the late traffic through it, then one reconciliation run."""
    began = time.monotonic()
    catalog = TRAFFIC.catalog()
    settings.catalog_store().start(catalog)
    ensure_schemas(settings)
    late, quarantined = simulator_facts(settings, catalog)
    listener = HealthListener(
        settings.redis_url,
        settings.redis_prefix,
        {"impressions": settings.impression_watermark_ms, "clicks": settings.click_watermark_ms},
    )
    spark.streams.addListener(listener)
    queries = start(spark, stream_config(settings))
    delivered = 0
    dropped: list[int] = []
    try:
        for n, traffic in enumerate((TRAFFIC, LATE_TRAFFIC)):
            before = queries[0].lastProgress["batchId"] if n else -1
            summary = simulate_to_kafka(
                traffic,
                settings.kafka_bootstrap,
                settings.registry_location,
                tmp_path / f"run-{n}",
                settings.topics,
                progress=False,
            )
            assert summary.delivery_failures == 0 and summary.delivered == traffic.events
            delivered += summary.delivered
            queries[0].processAllAvailable()
            assert queries[0].isActive, queries[0].exception()
        # The late traffic's batches (one, or more when a batch started while it was being sent), as the engine
        # reported them.
        dropped = [
            sum(op.get("numRowsDroppedByWatermark", 0) for op in progress["stateOperators"])
            for progress in queries[0].recentProgress
            if progress["batchId"] > before and progress["numInputRows"] > 0
        ]
        assert drained(settings), "the job has committed every record the topics hold"
    finally:
        for query in queries:
            query.stop()
        spark.streams.removeListener(listener)
    billed = read_ledger(settings.root / "ledger").to_pylist()
    print(f"\nfull path: traffic sent and billed by the job in {time.monotonic() - began:.0f} s")

    undecoded = sum(n for (reason, _), n in quarantined.items() if reason in UNDECODED)
    billable = oracle.billable(read_back(settings, delivered, undecodable=undecoded), catalog)
    assert {r["click_id"] for r in billed} != {r["click_id"] for r in billable}, "nothing for reconciliation to do"

    # The job stopped a moment ago, having read everything: both periods (long past their horizon) close.
    report = reconcile(spark, reconcile_config(settings), catalog)
    assert report.closed == [P0, P1], report.held
    assert report.additions > 0, "the late events must have made corrections"
    print(f"full path: reconciled at {time.monotonic() - began:.0f} s: {report.additions} addition(s)")
    return Truth(billable, billed, late, quarantined, dropped)


def cells(row: object) -> list[str]:
    return [td.text for td in row.find_elements(By.TAG_NAME, "td")]  # type: ignore[attr-defined]


def test_the_ui_shows_what_the_pipeline_billed_and_finance_downloads_what_the_oracle_bills(
    spark: SparkSession,
    settings: Settings,
    tmp_path: Path,
    web_server: Callable[[], str],
    browser: WebDriver,  # noqa: F811
    downloads: Path,  # noqa: F811
    screens: Callable[[WebDriver, str], Path],  # noqa: F811
) -> None:
    truth = run_the_pipeline(spark, settings, tmp_path)
    catalog = settings.catalog_store().current()
    # The advertiser with the most corrections logs in; finance and an admin too.
    own = max(catalog.advertiser_ids, key=lambda adv: (sum(truth.corrections_of(adv).values()), adv))
    expected_corrections = truth.corrections_of(own)
    assert expected_corrections
    accounts = settings.accounts_store()
    accounts.add("alice", Role.ADVERTISER, PASSWORD, own)
    accounts.add("fiona", Role.FINANCE, PASSWORD)
    accounts.add("ada", Role.ADMIN, PASSWORD)
    currency = next(ad.currency for ad in catalog if ad.advertiser_id == own)
    base_url = web_server()

    # The advertiser: the latest period's totals, the chart over both periods, every correction.
    log_in(browser, base_url, "alice", f"/advertisers/{own}")
    wait(browser, lambda d: int(d.find_element(By.ID, "dashboard").get_attribute("data-refreshes") or 0) >= 1)
    assert browser.find_element(By.ID, "period-key").text == display.period_label(P1)
    clicks, micros = truth.by_period(truth.billable, own, P1)
    stream_clicks, stream_micros = truth.by_period(truth.billed, own, P1)
    summary = {
        td.get_attribute("data-k"): td.text for td in browser.find_elements(By.CSS_SELECTOR, "#summary td[data-k]")
    }
    print(
        f"\nfull path, {own} in {P1}: oracle {clicks} clicks / {micros} micros; stream {stream_clicks} / "
        f"{stream_micros}; page {summary}"
    )
    assert summary == {
        "totals.provisional.clicks": display.count(stream_clicks),
        "totals.provisional.micros": display.money(stream_micros, currency),
        "totals.corrections.clicks": display.signed_count(clicks - stream_clicks),
        "totals.corrections.micros": display.signed_money(micros - stream_micros, currency),
        "totals.corrected.clicks": display.count(clicks),
        "totals.corrected.micros": display.money(micros, currency),
    }
    assert browser.find_element(By.ID, "late-clicks").text == display.count(truth.late_of(P1, "click", own))
    assert browser.find_element(By.ID, "late-impressions").text == display.count(truth.late_of(P1, "impression", own))
    bars = browser.find_elements(By.CSS_SELECTOR, "#spend-chart rect.bar")
    assert [int(b.get_attribute("data-micros") or "") for b in bars] == [
        truth.by_period(truth.billable, own, p)[1] for p in (P0, P1)
    ]
    assert max(b.size["height"] for b in bars) > 50, "the chart is drawn, with visible bars"
    screens(browser, "dashboard")

    # The day's total and the month's statement (both periods closed and exported): the oracle's sum.
    day_clicks = sum(truth.by_period(truth.billable, own, p)[0] for p in (P0, P1))
    day_micros = sum(truth.by_period(truth.billable, own, p)[1] for p in (P0, P1))
    browser.get(f"{base_url}/advertisers/{own}?from=2026-01-01&to=2026-01-01")
    # The live refresh rebuilds the tables: read them after it ran, not while it replaces a row being read.
    wait(browser, lambda d: int(d.find_element(By.ID, "dashboard").get_attribute("data-refreshes") or 0) >= 1)
    assert browser.find_element(By.ID, "range-spend").text == display.money(day_micros, currency)
    day_row = [c.text for c in browser.find_elements(By.CSS_SELECTOR, "#days tbody tr td")]
    assert day_row[0] == "2026-01-01" and day_row[6] == display.count(day_clicks) and "closed" in day_row[1]
    browser.get(f"{base_url}/advertisers/{own}/statements/2026-01")
    assert browser.find_element(By.ID, "statement-total").text == display.money(day_micros, currency)
    assert browser.find_element(By.ID, "provisional").text == display.money(0, currency)
    screens(browser, "statement")
    browser.get(f"{base_url}/advertisers/{own}")

    browser.find_element(By.ID, "all-corrections").click()
    wait(browser, lambda d: d.current_url.endswith(f"/advertisers/{own}/corrections"))
    shown = Counter(
        (c[3], c[2]) for c in (cells(r) for r in browser.find_elements(By.CSS_SELECTOR, "#corrections tbody tr"))
    )
    assert shown == Counter(
        {(click, display.signed_money(m, currency)): n for (click, m), n in expected_corrections.items()}
    )
    screens(browser, "corrections")
    browser.delete_all_cookies()

    # Finance: each closed period's export, downloaded and read back with pyarrow, bills what the oracle bills,
    # each click at its price and attributed to the latest qualifying impression.
    log_in(browser, base_url, "fiona", "/finance")
    rows = {
        r.get_attribute("data-period"): r for r in browser.find_elements(By.CSS_SELECTOR, "#exports tr[data-period]")
    }
    assert sorted(rows) == [P0, P1]
    screens(browser, "finance")
    for period, row in rows.items():
        want = {
            r["click_id"]: (r["impression_id"], r["amount_micros"])
            for r in truth.billable
            if PERIODS.key_of(r["click_time"]) == period
        }
        # The export's total, per currency: the advertisers bill in several, never added together.
        total: dict[str, int] = {}
        for r in truth.billable:
            if PERIODS.key_of(r["click_time"]) == period:
                total[r["currency"]] = total.get(r["currency"], 0) + r["amount_micros"]
        shown = [display.money(m, c) for c, m in sorted(total.items())]
        assert cells(row)[2].splitlines() == shown, period
        row.find_element(By.CSS_SELECTOR, f"a[href$='/{period}/billing.parquet']").click()
        path = _downloaded(downloads, f"adbill-{period}-billing.parquet")
        manifest = json.loads((settings.root / "exports" / period / "manifest.json").read_text())
        assert hashlib.sha256(path.read_bytes()).hexdigest() == manifest["files"]["billing.parquet"]["sha256"]
        table = pq.read_table(path).to_pylist()
        got = {
            r["click_id"]: (r["impression_id"], r["amount_micros"])
            for r in table
            if r["record_type"] == "click" and r["status"] != "retracted"
        }
        exported: dict[str, int] = {}
        for r in table:
            exported[r["currency"]] = exported.get(r["currency"], 0) + r["net_micros"]
        print(f"export {period}: {len(got)} clicks / {exported} micros; oracle {len(want)} / {total}")
        assert got == want, period
        assert {c: m for c, m in exported.items() if m} == total, period
    browser.delete_all_cookies()

    # The admin: no lag, the quarantined and late counts the simulator sent, the reconciliation's corrections.
    log_in(browser, base_url, "ada", "/health")
    lags = browser.find_elements(By.CSS_SELECTOR, "[id^='billing-lag-']")
    assert [lag.text for lag in lags] == ["0", "0"]
    # The engine dropped every record of the late traffic behind the watermark, over the batches that read it; the
    # page shows what it reported for the last of them.
    assert sum(truth.dropped) == LATE_TRAFFIC.events, truth.dropped
    assert browser.find_element(By.ID, "billing-dropped").text == display.count(truth.dropped[-1])
    quarantined = {
        (c[0], c[1]): c[2] for c in (cells(r) for r in browser.find_elements(By.CSS_SELECTOR, "#quarantined tbody tr"))
    }
    assert quarantined == {
        (reason.replace("_", " "), topic): display.count(n) for (reason, topic), n in truth.quarantined.items()
    }
    late_rows = {
        c[0]: (c[1], c[2]) for c in (cells(r) for r in browser.find_elements(By.CSS_SELECTOR, "#late tbody tr"))
    }
    assert late_rows == {
        display.period_label(p): (
            display.count(truth.late_of(p, "impression")),
            display.count(truth.late_of(p, "click")),
        )
        for p in (P0, P1)
    }
    all_expected: Counter[tuple[str, int]] = Counter()
    for adv in catalog.advertiser_ids:
        all_expected += truth.corrections_of(adv)
    reconciliation = browser.find_element(
        By.XPATH, "//table[@id='reconciliation']//tr[th='Additions / retractions']/td"
    )
    assert reconciliation.text == (
        f"{display.count(sum(n for (_, m), n in all_expected.items() if m > 0))} / "
        f"{display.count(sum(n for (_, m), n in all_expected.items() if m < 0))}"
    )
    screens(browser, "health")
