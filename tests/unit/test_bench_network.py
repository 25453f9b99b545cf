"""The network benchmark's pure parts: the N-ad catalog the stream phase prices the traffic with, and the summary
tables of a report whose phases ran in part, a slow door placed against the disk's syncs (no services, no timing
assertions)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from billing.catalog import generate_catalog
from ops.bench.network import DiskProbe, _across_rounds, slow_doors, summary, traffic_catalog

EUR_CAMPAIGN = "adv-0000-cmp-000"


STREAM: dict[str, Any] = {
    "batch_ms_mean": 600,
    "batch_ms_mean_steady": 500,
    "start_to_first_batch_s": 20.0,
    "driver_python_mb": {"at_first_batch": 300, "peak": 400},
    "jvm_mb_peak": 1000,
    "job_cpu_cores": 1.2,
    "machine_cpu_cores": 1.5,
    "sustained_rate": 10_000,
    "latency_ms": {"p99": 4_000},
    "ledger_equal": True,
}


def test_the_traffic_clicks_on_ads_of_the_big_catalog_at_the_prices_its_ground_truth_bills() -> None:
    plan = generate_catalog(5, 3, 4, seed=3).with_budget(EUR_CAMPAIGN, 0, 10**15, 0, backfill=True)
    plan = plan.with_exclusion("198.51.100.0/24", 0, True, 0, backfill=True)
    catalog = traffic_catalog(plan, 1_000)
    assert len(catalog) == 1_000 and len(catalog.advertiser_ids) == 25
    for ad in plan:
        assert catalog[ad.ad_id] == ad, "the traffic's ad as the traffic's catalog has it"
    assert catalog.budgets == plan.budgets and catalog.exclusions == plan.exclusions
    assert catalog.version == plan.version
    other = next(ad for ad in catalog if ad.ad_id not in plan and ad.advertiser_id == "adv-0001")
    assert other.currency == plan["adv-0001-cmp-000-ad-000"].currency, "an advertiser bills in one currency"


def test_a_catalog_smaller_than_the_traffics_shape_gets_the_traffics_ads_on_top() -> None:
    plan = generate_catalog(5, 3, 4, seed=3)
    catalog = traffic_catalog(plan, 40)
    assert set(plan.ad_ids) <= set(catalog.ad_ids) and len(catalog) == 60 + 40 - 12


def _spread(p50: float, p95: float, p99: float) -> dict[str, float]:
    return {"n": 10, "p50": p50, "p95": p95, "p99": p99, "max": p99}


def test_the_summary_shows_the_phases_that_ran_and_a_dash_for_the_others() -> None:
    stream = dict(STREAM)
    report = {
        "sizes": [
            {
                "ads": 10_000,
                "load_s": 0.4,
                "door_ms": _spread(2, 5, 8),
                "web": {"pages_ms": {"advertiser's dashboard": _spread(20, 40, 60)}},
                "stream": {
                    **stream,
                    "driver_python_mb": {"at_first_batch": 330, "peak": 430},
                    "batch_vs_baseline": 1.05,
                    "steady_batch_vs_baseline": 1.02,
                    "catalog_share_of_driver_mb": 30,
                    "writers": {"confirmed": 600, "lost": 0, "twice": 0, "door_ms": _spread(3, 6, 9)},
                },
            }
        ],
        "stream": {"rate": 10_000, "seconds": 120, "baseline": {"ads": 60, **stream}},
    }
    lines = summary(report)
    doors = next(line for line in lines if line.startswith("| 10,000 |") and "0.4 s" in line)
    assert "2.0 / 8.0 ms" in doors and "20.0 / 40.0 ms" in doors and "| - |" in doors
    baseline = next(line for line in lines if line.startswith("| 60 (baseline) |"))
    assert "600 ms |" in baseline and "| 1.2 / 1.5 |" in baseline and "yes" in baseline
    size = next(line for line in lines if line.startswith("| 10,000 |") and "x1.05" in line)
    assert "500 ms (x1.02)" in size and "330 / 430 MB; 30 MB" in size and "600, 0, 0; 3.0 / 9.0 ms" in size


def test_rounds_give_each_sizes_ratios_against_its_own_rounds_baseline_and_their_medians() -> None:
    def run(batch: float, fixed: float) -> dict[str, Any]:
        return {
            "batch_vs_baseline": batch,
            "steady_batch_vs_baseline": batch,
            "fixed_cost_vs_baseline": fixed,
            "cpu_per_event_vs_baseline": 1.0,
            "batch_ms_mean": batch * 1000,
            "error": None,  # as `stream_figures` gives it for a run that went through
        }

    rounds = [
        {"baseline": {}, "sizes": {1_000_000: run(1.71, 1.4), 10_000: {"error": "the job died"}}},
        {"baseline": {}, "sizes": {1_000_000: run(0.79, 0.9), 10_000: run(1.0, 1.0)}},
        {"baseline": {}, "sizes": {1_000_000: run(1.05, 1.1), 10_000: run(1.2, 1.3)}},
    ]
    sizes = _across_rounds(rounds)
    big = sizes[1_000_000]
    assert big["rounds_batch_vs_baseline"] == [1.71, 0.79, 1.05] and big["median_batch_vs_baseline"] == 1.05
    assert big["median_fixed_cost_vs_baseline"] == 1.1 and big["batch_ms_mean"] == 1050  # the last round's own
    assert sizes[10_000]["rounds_batch_vs_baseline"] == [1.0, 1.2]  # the round that failed has no ratio
    assert sizes[10_000]["median_batch_vs_baseline"] == 1.1
    baseline = {"ads": 60, **STREAM}
    lines = summary(
        {
            "sizes": [{"ads": 1_000_000, "stream": {**STREAM, **big}}],
            "stream": {"rate": 10_000, "seconds": 120, "baseline": baseline},
        }
    )
    assert any("over 3 rounds" in line and "mean batch x1.05 (x1.71, x0.79, x1.05)" in line for line in lines)


def test_a_slow_door_is_placed_against_the_disks_slow_syncs_on_the_one_monotonic_clock(tmp_path: Path) -> None:
    ran = {
        "started_monotonic": 100.0,
        "confirmed": [
            {"at_s": 1.0, "latency_ms": 5.0},  # fast: not counted
            {"at_s": 2.0, "latency_ms": 300.0},  # 101.7 to 102.0: the sync at 101.8 took 120 ms
            {"at_s": 5.0, "latency_ms": 150.0},  # 104.85 to 105.0: no slow sync then
        ],
    }
    syncs = [(101.8, 120.0), (104.9, 20.0), (107.0, 500.0)]
    assert slow_doors(ran, syncs) == {"count": 2, "during_a_slow_sync": 1}
    assert slow_doors({"confirmed": ran["confirmed"]}, syncs) == {"count": 2, "during_a_slow_sync": None}

    probe = DiskProbe(tmp_path, rate=200)
    probe.start()
    deadline = time.monotonic() + 10
    while len(probe.syncs) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    probe.stop()
    assert probe.syncs and all(ms >= 0 for _, ms in probe.syncs)
    assert not probe.path.exists()
