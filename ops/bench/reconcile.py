"""`make bench-reconcile`: reconcile a day of heavy traffic (10 million events by default) and print the time.

Writes a synthetic day straight into the archive and ledger layouts the streaming job writes (one batch per
period and event type), so the figure is reconciliation's alone: 24 hourly periods of impressions and clicks on
the generated catalog. Every click is built either with an impression of the same ad and user 0-10 s before it
(billable) or for a user who has no impression (not billable); the ledger holds the billable ones except a
share that the "stream missed", plus a few billed twice, so the run has corrections to write. Then one
`reconcile(--until end of day)` closes all 24 periods and writes their exports, with Redis on a free port;
the result is checked: provisional ledger + corrections = every billable click, exactly.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from billing.catalog import generate_catalog
from billing.layout import DataLayout
from billing.periods import Periods
from billing.store.catalog_file import load_catalog, save_catalog

DAY_START_MS = 1_767_225_600_000  # 2026-01-01T00:00Z
HOUR_MS = 3_600_000


def write_day(root: Path, events: int, seed: int, missed: float = 0.01, doubled: float = 0.001) -> dict[str, int]:
    """The archive and ledger of one synthetic day under `root`; returns what was written."""
    catalog = generate_catalog(advertisers=5, campaigns_per_advertiser=3, ads_per_campaign=4, seed=seed)
    ads = list(catalog)
    ad_ids = np.array([ad.ad_id for ad in ads])
    periods = Periods(HOUR_MS)
    rng = np.random.default_rng(seed)
    per_period = events // 24
    clicks_per_period = per_period // 11  # about one click per ten impressions
    impressions_per_period = per_period - clicks_per_period
    figures = {"impressions": 0, "clicks": 0, "billable": 0, "ledger_rows": 0}
    for hour in range(24):
        start = DAY_START_MS + hour * HOUR_MS
        period = periods.key(start)
        n_imp, n_clk = impressions_per_period, clicks_per_period
        imp_time = start + rng.integers(0, HOUR_MS, n_imp)
        imp_ad = rng.integers(0, len(ads), n_imp)
        imp_user = rng.integers(0, 200_000, n_imp)
        billable = rng.random(n_clk) < 0.9
        source = rng.integers(0, n_imp, n_clk)
        delay = rng.integers(0, 10_001, n_clk)
        clk_time = np.where(billable, imp_time[source] + delay, start + rng.integers(0, HOUR_MS, n_clk))
        clk_time = np.minimum(clk_time, start + HOUR_MS - 1)  # keep each click in its period
        billable &= clk_time - imp_time[source] <= 10_000
        clk_ad = np.where(billable, imp_ad[source], rng.integers(0, len(ads), n_clk))
        clk_user_ids = np.where(
            billable,
            np.char.add("u", imp_user[source].astype(str)),
            np.char.add(f"nomatch-{hour}-", np.arange(n_clk).astype(str)),
        )
        imp_ids = np.char.add(f"i{hour}-", np.arange(n_imp).astype(str))
        clk_ids = np.char.add(f"c{hour}-", np.arange(n_clk).astype(str))
        _archive(
            root, "impression", period, start, imp_ids, ad_ids[imp_ad], np.char.add("u", imp_user.astype(str)), imp_time
        )  # noqa: E501
        _archive(root, "click", period, start, clk_ids, ad_ids[clk_ad], clk_user_ids, clk_time)
        in_ledger = billable & (rng.random(n_clk) >= missed)
        twice = in_ledger & (rng.random(n_clk) < doubled)
        rows = np.concatenate([np.flatnonzero(in_ledger), np.flatnonzero(twice)])
        price = {ad.ad_id: ad for ad in ads}
        ledger_ads = ad_ids[clk_ad[rows]]
        table = pa.table(
            {
                "click_id": clk_ids[rows],
                "impression_id": imp_ids[source[rows]],
                "ad_id": ledger_ads,
                "campaign_id": [price[a].campaign_id for a in ledger_ads],
                "advertiser_id": [price[a].advertiser_id for a in ledger_ads],
                "user_id": clk_user_ids[rows],
                "click_time": clk_time[rows],
                "impression_time": imp_time[source[rows]],
                "amount_micros": np.array([price[a].cpc_micros for a in ledger_ads], dtype=np.int64),
                "currency": [price[a].currency for a in ledger_ads],
                "click_received_ms": clk_time[rows],
                "billed_at_ms": clk_time[rows] + 1_000,
                "period_start_ms": np.full(len(rows), start, dtype=np.int64),
            }
        )
        folder = DataLayout(root).ledger / f"period={period}" / "batch_id=0"
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, folder / "part-0.parquet")
        figures["impressions"] += n_imp
        figures["clicks"] += n_clk
        figures["billable"] += int(billable.sum())
        figures["ledger_rows"] += len(rows)
        print(f"  wrote {period}: {n_imp:,} impressions, {n_clk:,} clicks", end="\r", flush=True)
    save_catalog(catalog, DataLayout(root).catalog_file)
    print()
    return figures


def _archive(root: Path, event_type: str, period: str, start: int, ids, ad, user, event_time) -> None:  # type: ignore[no-untyped-def]
    n = len(ids)
    received = event_time + 500
    table = pa.table(
        {
            "event_id": ids,
            "ad_id": ad,
            "user_id": user,
            "event_time": event_time.astype(np.int64),
            "received_ms": received.astype(np.int64),
            "topic": np.full(n, f"{event_type}s"),
            "partition": np.zeros(n, dtype=np.int32),
            "offset": np.arange(n, dtype=np.int64),
            "value": pa.array([b""] * n, type=pa.binary()),
            "late": np.zeros(n, dtype=bool),
            "period_start_ms": np.full(n, start, dtype=np.int64),
        }
    )
    folder = DataLayout(root).archive_of(event_type) / f"period={period}" / "batch_id=0"
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / "part-0.parquet")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=10_000_000, help="events in the day (default 10 million)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("var/bench"), help="folder for the run")
    args = parser.parse_args(argv)

    from billing.store.corrections_arrow import corrections_from_arrow
    from ops.process import free_port
    from ops.reconcile import ReconcileConfig, reconcile
    from ops.redis_service import LocalRedis
    from ops.settings import Settings
    from ops.spark import spark_session

    home = (args.out / f"reconcile-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}").resolve()
    home.mkdir(parents=True)
    print(f"writing a synthetic day of {args.events:,} events to {home} ...", flush=True)
    figures = write_day(home, args.events, args.seed)
    settings = Settings()
    redis = LocalRedis(data_dir=home / "redis", port=free_port(), run_dir=home / "run", appendonly=False)
    redis.start()
    spark = spark_session(settings, "adbill-bench-reconcile", DataLayout(home).spark_scratch(), stateful=False)
    try:
        config = ReconcileConfig(data_dir=home, redis_url=redis.url, redis_prefix="bench", period_ms=HOUR_MS)
        started = time.monotonic()
        report = reconcile(
            spark,
            config,
            load_catalog(DataLayout(home).catalog_file),
            until_ms=DAY_START_MS + 24 * HOUR_MS,
            progress=lambda message: print(f"  {message}", flush=True),
            force=True,  # no streaming job here: the day is written straight into the archive and ledger
        )
        elapsed = time.monotonic() - started
    finally:
        spark.stop()
        redis.stop()
    import pyarrow.dataset as ds

    written = corrections_from_arrow(
        ds.dataset(DataLayout(home).corrections, format="parquet", partitioning="hive").to_table()
    )
    ledger_rows = figures["ledger_rows"]
    exact = ledger_rows + sum(c.clicks for c in written) == figures["billable"] == report.final_clicks
    print(
        f"reconciled {args.events:,} events ({figures['impressions']:,} impressions, {figures['clicks']:,} clicks) "
        f"in 24 periods in {elapsed:.1f} s ({args.events / elapsed:,.0f} events/s); "
        f"{report.final_clicks:,} billable clicks, {report.additions:,} additions, {report.retractions:,} retractions; "
        f"24 periods closed and exported: {len(report.closed) == 24}; ledger + corrections = final: {exact}"
    )
    print(f"target: under 120 s -> {'met' if elapsed < 120 else 'NOT met'}")
    shutil.rmtree(DataLayout(home).spark_scratch(), ignore_errors=True)
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
