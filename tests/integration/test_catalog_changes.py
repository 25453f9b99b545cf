"""The catalog changed under the running streaming job, on real Kafka, Redis and Spark: ads created, prices raised,
ads paused and resumed, changes the stream had not seen yet, a closed period's export after its ad was re-priced,
paused or removed, and Redis restored from the data folder afterwards."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psycopg
import pyarrow.dataset as ds
import pytest
from pyspark.sql import SparkSession

from attribution.audit import audit
from attribution.job import BatchSink, start
from attribution.restore import restore_redis
from billing.catalog import Ad, AdChange, Catalog
from billing.catalog_changes import AdRequest
from billing.events import Click, Event, Impression
from billing.periods import Periods
from billing.store.export_files import export_folder
from billing.store.parquet_ledger import read_ledger
from billing.store.redis_totals import RedisTotals
from ops.reconcile import audit_table, reconcile, reconcile_config
from ops.settings import Settings
from ops.stack import ensure_schemas
from ops.streaming import stream_config
from tests import oracle
from tests.conftest import child_env
from tests.integration.test_reconcile import corrections, final_ledger, read_back, while_open
from tests.integration.test_stream_job import Feed
from tests.redis_figures import RedisFigures

pytestmark = pytest.mark.integration

T0 = 1_767_225_600_000  # 2026-01-01T00:00Z
S = 1_000
P0 = "20260101T0000Z"
UNTIL = T0 + 3 * 3_600_000

CATALOG = Catalog([Ad("ad-1", "cmp-1", "adv-1", 250_000, "EUR"), Ad("ad-2", "cmp-2", "adv-2", 1_500_000, "EUR")])


def pair(name: str, ad_id: str, click_ms: int) -> list[Event]:
    """An impression and its click 1 s later, on `ad_id`, for a user of their own."""
    return [Impression(f"i-{name}", ad_id, f"u-{name}", click_ms - S), Click(f"c-{name}", ad_id, f"u-{name}", click_ms)]


def ledger_prices(settings: Settings) -> dict[str, int]:
    return {row["click_id"]: row["amount_micros"] for row in read_ledger(settings.root / "ledger").to_pylist()}


def unbilled(settings: Settings) -> dict[str, str]:
    table = ds.dataset(settings.root / "unbilled", format="parquet", partitioning="hive").to_table()
    return {row["click_id"]: row["reason"] for row in table.to_pylist()}


def folder_digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def adjustments_of(settings: Settings, period: str) -> list[tuple[str, str, int, str]]:
    """The corrections of a closed `period` booked in later periods: (click, reason, micros, booked in)."""
    return sorted(
        (c.click_id, c.reason.value, c.amount_micros, c.booked_period)
        for c in corrections(settings)
        if c.corrects_period == period and c.booked_period != period
    )


def figures(settings: Settings) -> dict[str, object]:
    """Every billing figure Redis holds that the pages read: totals, corrections and the unbilled counts per ad."""
    read = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
    client = read.client
    keys = sorted(
        key
        for pattern in ("totals:*", "corrections:*", "unbilled:*", "late:*", "quarantined:*")
        for key in client.scan_iter(match=f"{settings.redis_prefix}:{pattern}")
        if not key.endswith(":applied")
    )
    out: dict[str, object] = {}
    for key in keys:
        kind = client.type(key)
        out[key] = client.hgetall(key) if kind == "hash" else sorted(client.smembers(key))
    return out


def remove_ad_by_hand(settings: Settings, ad_id: str) -> None:
    """Remove an ad as a person would (no command does it): its rows out of the tables, then a new generation, so
    that every reader reads the catalog whole again."""
    with psycopg.connect(settings.database_url) as connection, connection.transaction():
        connection.execute("DELETE FROM ad_prices WHERE ad_id = %s", (ad_id,))
        connection.execute("DELETE FROM ads WHERE ad_id = %s", (ad_id,))
        connection.execute("UPDATE catalog_head SET generation = generation + 1")


def test_a_catalog_changed_under_the_running_job_prices_every_click_by_its_history(
    spark: SparkSession, settings: Settings
) -> None:
    store = settings.catalog_store()
    store.start(CATALOG)
    ensure_schemas(settings)
    now_ms = int(time.time() * 1000)

    def backfill(action: str, ad_id: str, at_ms: int, **given: object) -> None:
        # Effective times in the past of the machine's clock: the traffic's times are 2026-01-01's.
        store.change(AdRequest(action, ad_id, **given).change(at_ms, store.current()), lambda: now_ms, backfill=True)

    queries = start(spark, stream_config(settings))
    stream = Feed(settings, queries)

    try:
        stream(pair("old", "ad-1", T0 + 10 * S))
        assert ledger_prices(settings) == {"c-old": 250_000}

        # Changed while the job runs, no restart: ad-1 raised, ad-9 created, ad-2 paused, all from T0 + 60 s.
        backfill("set-price", "ad-1", T0 + 60 * S, cpc_micros=1_250_000)
        backfill("create-ad", "ad-9", T0 + 60 * S, campaign_id="cmp-9", advertiser_id="adv-1", currency="EUR",
                 cpc_micros=70_000)  # fmt: skip
        backfill("pause", "ad-2", T0 + 60 * S)
        stream(
            pair("edge-before", "ad-1", T0 + 60 * S - 1)  # the last millisecond of the old price
            + pair("edge-at", "ad-1", T0 + 60 * S)  # the new price from its millisecond
            + pair("new-ad-early", "ad-9", T0 + 59 * S)  # before the ad existed: unknown_ad, not billed
            + pair("new-ad", "ad-9", T0 + 61 * S)
            + pair("paused", "ad-2", T0 + 61 * S)
        )
        backfill("resume", "ad-2", T0 + 120 * S)
        stream(pair("resumed", "ad-2", T0 + 121 * S))
        assert ledger_prices(settings) == {
            "c-old": 250_000,
            "c-edge-before": 250_000,
            "c-edge-at": 1_250_000,
            "c-new-ad": 70_000,
            "c-resumed": 1_500_000,
        }
        assert unbilled(settings) == {"c-new-ad-early": "unknown_ad", "c-paused": "ad_paused"}
        read = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
        assert read.client.hgetall(read.keys.unbilled(P0, "ad", "ad-2")) == {"ad_paused": "1"}
        assert read.client.hgetall(read.keys.unbilled(P0, "adv", "adv-1")) == {"unknown_ad": "1"}

        # Changes the stream had not seen when their clicks came: a click on an ad not yet in the catalog, and a
        # price that takes effect before a click the stream has already billed.
        stream(pair("unseen-ad", "ad-10", T0 + 130 * S) + pair("unseen-price", "ad-1", T0 + 140 * S))
        assert unbilled(settings)["c-unseen-ad"] == "unknown_ad"
        assert ledger_prices(settings)["c-unseen-price"] == 1_250_000
        backfill("create-ad", "ad-10", T0 + 125 * S, campaign_id="cmp-10", advertiser_id="adv-2", currency="EUR",
                 cpc_micros=30_000)  # fmt: skip
        backfill("set-price", "ad-1", T0 + 135 * S, cpc_micros=2_000_000)

        history = store.current()
        expected = {
            r["click_id"]: r["amount_micros"] for r in oracle.billable(read_back(settings, stream.sent), history)
        }
        assert expected["c-unseen-ad"] == 30_000 and expected["c-unseen-price"] == 2_000_000
        assert "c-paused" not in expected and "c-new-ad-early" not in expected

        rc = reconcile_config(settings)
        report = reconcile(spark, rc, history, until_ms=UNTIL, force=True)
        assert P0 in report.closed
        # Ledger + corrections = the rule priced by the history, click for click and micro for micro.
        assert final_ledger(settings) == expected
        fixes = sorted((c.click_id, c.kind.value, c.reason.value, c.amount_micros) for c in corrections(settings))
        assert fixes == [
            ("c-unseen-ad", "addition", "catalog_change", 30_000),
            ("c-unseen-price", "addition", "catalog_change", 2_000_000),
            ("c-unseen-price", "retraction", "catalog_change", -1_250_000),
        ]

        # A back-fill that re-prices the closed period, by the command, and no event for the period after it: the
        # next run books what finance was not given as adjustments in the open period; its export stays as it is.
        before = folder_digest(export_folder(settings.root, P0))
        backfilled = subprocess.run(
            [sys.executable, "-m", "ops.cli", "catalog", "set-price", "ad-2", "--cpc-micros", "1750000",
             "--at", str(T0 + 120_500), "--backfill"],
            env=child_env(settings), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert backfilled.returncode == 0, backfilled.stderr
        repriced, open_then = while_open(lambda: reconcile(spark, rc, store.current(), until_ms=UNTIL, force=True))
        assert (repriced.periods, repriced.closed) == ([P0], [])
        repricing = adjustments_of(settings, P0)
        assert [a[:3] for a in repricing] == [
            ("c-resumed", "catalog_change", -1_500_000),
            ("c-resumed", "catalog_change", 1_750_000),
        ]
        assert {a[3] for a in repricing} <= open_then and len({a[3] for a in repricing}) == 1, (repricing, open_then)
        assert folder_digest(export_folder(settings.root, P0)) == before
        audits = audit(spark, rc, store.current())
        assert audits and all(a.balanced for a in audits), audit_table(audits)
        assert reconcile(spark, rc, store.current(), until_ms=UNTIL, force=True).periods == []

        # The closed period's export never changes with the catalog: re-priced, paused and removed ads, then a
        # late event that re-opens the period's reconciliation.
        later = int(time.time() * 1000) + 1_000
        store.change(AdChange("ad-1", later, 9_999_999), lambda: later - 1_000)
        store.change(AdChange("ad-2", later, None), lambda: later - 1_000)
        remove_ad_by_hand(settings, "ad-9")
        assert "ad-9" not in store.current(), "a reader reads the catalog whole again after the removal"
        stream(pair("very-late", "ad-1", T0 + 200 * S))
        again, open_again = while_open(lambda: reconcile(spark, rc, store.current(), until_ms=UNTIL, force=True))
        assert P0 in again.periods and P0 not in again.closed
        assert folder_digest(export_folder(settings.root, P0)) == before
        # The click the stream billed after the close, at the price in force at its time; the removed ad's bill
        # retracted, with its reason.
        later_ones = [a for a in adjustments_of(settings, P0) if a[0] != "c-resumed"]
        assert [a[:3] for a in later_ones] == [
            ("c-new-ad", "catalog_change", -70_000),
            ("c-very-late", "billed_after_close", 2_000_000),
        ]
        assert {a[3] for a in later_ones} <= open_again and len({a[3] for a in later_ones}) == 1, (
            later_ones,
            open_again,
        )

        # Redis restored from the data folder, after the changes and the removed ad, gives back every figure.
        for query in queries:
            query.stop()
        kept = figures(settings)
        totals = RedisTotals.from_url(settings.redis_url, settings.redis_prefix)
        totals.wipe_billing()
        assert figures(settings) == {}
        restore_redis(settings.root, totals, store.current(), Periods(), "billing")
        assert figures(settings) == kept
    finally:
        for query in queries:
            query.stop()


def test_a_replayed_batch_is_priced_with_the_catalog_version_of_its_first_attempt(settings: Settings) -> None:
    store = settings.catalog_store()
    store.start(CATALOG)
    sink = BatchSink(stream_config(settings), store)
    first = sink.catalog_of(41)
    assert first.version == 0
    # A change lands between the first attempt at batch 41 and its replay after a crash.
    store.change(AdChange("ad-1", int(time.time() * 1000) + 60_000, 1))
    assert sink.catalog_of(41).to_json() == first.to_json(), "the replay prices as the first attempt did"
    assert sink.catalog_of(42).version == 1, "the next batch sees the change"
    assert json.loads((settings.root / "checkpoints" / "catalog-versions" / "42").read_text()) == 1
    assert Counter(p.name for p in (settings.root / "checkpoints" / "catalog-versions").iterdir()) == {
        "41": 1,
        "42": 1,
    }
