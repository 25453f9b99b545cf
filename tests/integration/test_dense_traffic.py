"""Reconciliation's final books on dense, adversarial traffic (`tests.dense_traffic`), held to the DuckDB oracle.

The events are written straight into the event archive, as the stream's batches would have written them (copies of
one id in different batches, arrival order unrelated to event time, clocks behind and ahead), and Spark computes the
final charges of every period from there (`attribution.final_bills.final_charges`, what a reconciliation run
books): each click's outcome, each charged click's impression and amount, and the id conflicts must be the oracle's.
Kafka and the stream are not needed for that; `test_reconcile.py` and `test_invalid_traffic.py` hold the whole path
to the oracle on their traffic.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession

from attribution.batch_output import write_batch_files
from attribution.final_bills import final_charges
from attribution.release import ARCHIVE_SCHEMA
from billing.layout import DataLayout
from billing.periods import Periods
from tests import oracle
from tests.dense_traffic import arrivals, dense_catalog, dense_events

PERIODS = Periods()


def archive(layout: DataLayout, received: list[dict[str, Any]], rng: random.Random) -> list[str]:
    """The received events in the archive, each in one of three batches; the periods they fall in."""
    batches: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in received:
        batch_id = rng.randrange(1, 4)
        batches[batch_id].append(
            {
                "event_type": row["type"],
                "event_id": row["id"],
                **{name: row[name] for name in ("ad_id", "user_id", "event_time", "received_ms", "partition")},
                "topic": f"{row['type']}s",
                "offset": row["offset"],
                "value": b"",
                "user_agent": row["user_agent"],
                "ip": row["ip"],
                "late": False,
                "period_start_ms": PERIODS.start_of(row["event_time"]),
                "period": PERIODS.key_of(row["event_time"]),
                "batch_id": batch_id,
            }
        )
    for rows in batches.values():
        write_batch_files(
            pa.Table.from_pylist(rows, schema=ARCHIVE_SCHEMA), layout.archive, ("event_type", "period", "batch_id")
        )
    return sorted({PERIODS.key_of(row["event_time"]) for row in received})


def test_the_final_books_give_every_click_the_oracles_outcome_on_dense_traffic(
    spark: SparkSession, tmp_path: Path
) -> None:
    seen: Counter[str] = Counter()
    for seed in range(8):
        rng = random.Random(seed)
        catalog = dense_catalog(rng)
        impressions, clicks = dense_events(rng)
        received = arrivals(rng, [*impressions, *clicks])
        layout = DataLayout(tmp_path / str(seed))
        due = archive(layout, received, rng)

        charged, not_charged, quarantined, _ = final_charges(spark, layout, PERIODS.length_ms, due, catalog)

        outcomes = {row["click_id"]: "charged" for row in charged.to_pylist()}
        outcomes |= {row["click_id"]: row["reason"] for row in not_charged.to_pylist()}
        assert outcomes == {row["click_id"]: row["outcome"] for row in oracle.outcomes(received, catalog)}, seed
        bills = {(r["click_id"], r["impression_id"], r["amount_micros"]) for r in charged.to_pylist()}
        assert bills == {
            (r["click_id"], r["impression_id"], r["amount_micros"]) for r in oracle.billable(received, catalog)
        }
        conflicts = {(r["event_type"], r["event_id"]) for r in quarantined.to_pylist()}
        expected = oracle.conflicting_ids(received, catalog)
        assert conflicts == {(kind, event_id) for kind, ids in expected.items() for event_id in ids}, seed
        seen.update(outcomes.values())
        seen["conflict"] += len(conflicts)
    # The draws reach every outcome and some id conflicts.
    reasons = ("unknown_ad", "ad_paused", "known_bot", "excluded_ip", "click_flood", "duplicate_click", "over_budget")
    assert all(seen[name] > 0 for name in ("charged", *reasons, "conflict")), seen
