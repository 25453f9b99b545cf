"""A realistic sample of what the pipeline writes and the web UI reads, for the benchmark, the tests and demos.

The provisional totals, late, clock-ahead, unbilled and quarantined counts go through the streaming job's own adapter
(`RedisTotals.apply_batch`); corrections, closed periods and the last reconciliation through reconciliation's
(`RedisTotals.apply_corrections`, `close_period`, `record_reconciliation`); the exports through the finance
export's writer (`billing.store.export_files.write_export`). Only the job's health records are written here, under
`RedisKeys` and in the shape of `attribution.progress.summarize` (see `web.job_health`). This module writes what the
real writers write; it decides nothing they decide.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import redis

from billing.budgets import day_start, utc_day
from billing.catalog import Ad, Catalog
from billing.corrections import ADDITION_REASONS, RETRACTION_REASONS, Correction, CorrectionKind
from billing.layout import DataLayout
from billing.periods import Periods, format_utc
from billing.store.export_files import export_table, write_export
from billing.store.redis_totals import (
    BudgetDayCount,
    ClockAheadCount,
    LateCount,
    NotChargedCount,
    QuarantineCount,
    RedisTotals,
    TotalsRow,
    UnbilledCount,
)

ADDITIONS = sorted(ADDITION_REASONS - RETRACTION_REASONS)
RETRACTIONS = sorted(RETRACTION_REASONS - ADDITION_REASONS)


class SampleWriter:
    """Writes under one prefix through the stream's own adapter where one exists, and the contract's keys elsewhere;
    exports through `billing.store.export_files.write_export`."""

    def __init__(self, client: redis.Redis, prefix: str, exports_dir: Path) -> None:
        self.client = client
        self.prefix = prefix
        self.layout = DataLayout(exports_dir.parent)
        if self.layout.exports != exports_dir:
            raise ValueError(f"exports live in {DataLayout(Path('ROOT')).exports}, not in {exports_dir}")
        self.exports_dir = exports_dir
        self.totals = RedisTotals(client, prefix)
        self.keys = self.totals.keys

    def bill(
        self,
        batch_id: int,
        rows: Iterable[TotalsRow],
        late: Iterable[LateCount] = (),
        quarantined: Iterable[QuarantineCount] = (),
        clock_ahead: Iterable[ClockAheadCount] = (),
        unbilled: Iterable[UnbilledCount] = (),
        not_charged: Iterable[NotChargedCount] = (),
        budget_days: Iterable[BudgetDayCount] = (),
    ) -> bool:
        """Provisional totals, late, quarantine, clock-ahead, unbilled and not-charged counts and the campaigns'
        days, exactly as the streaming job applies a micro-batch."""
        return self.totals.apply_batch(
            "billing",
            batch_id,
            rows,
            late,
            quarantined,
            clock_ahead,
            unbilled=unbilled,
            not_charged=not_charged,
            budget_days=budget_days,
        )

    def corrections(self, items: Sequence[Correction]) -> None:
        """Corrections as reconciliation applies them, oldest first (so each advertiser's list is newest first)."""
        ordered = sorted(items, key=lambda c: c.created_at_ms)
        starts = {c.booked_period: Periods().parse_key(c.booked_period) for c in ordered}
        self.totals.apply_corrections(ordered, starts)

    def close(self, period: str, start_ms: int) -> None:
        """Close a period as reconciliation does, its export being what Redis holds (provisional + corrections)."""
        keys, client = self.keys, self.client
        exported: dict[tuple[str, str], tuple[int, int, str]] = {}
        for adv in _texts(client.smembers(keys.period_advertisers(period))):
            items = [("adv", adv)] + [("cmp", c) for c in _texts(client.smembers(keys.period_campaigns(period, adv)))]
            items += [("ad", a) for a in _texts(client.smembers(keys.period_ads(period, adv)))]
            for level, item in items:
                base: Any = client.hmget(keys.totals(period, level, item), "clicks", "micros")
                fix: Any = client.hmget(keys.corrections(period, level, item), "clicks", "micros")
                clicks = int(base[0] or 0) + int(fix[0] or 0)
                exported[(level, item)] = (clicks, int(base[1] or 0) + int(fix[1] or 0), adv)
        self.totals.close_period(period, start_ms, exported)

    def reconciliation(self, record: dict[str, Any]) -> None:
        self.totals.record_reconciliation(record)

    def health(self, record: dict[str, Any], history: Sequence[dict[str, Any]] = ()) -> None:
        """A query's latest progress record after the earlier ones of `history` (newest first), kept as the job's
        listener keeps them: the record in a hash, every record pushed on the history list."""
        name = record["query"]
        pipe = self.client.pipeline()
        for item in [*reversed(history), record]:
            pipe.lpush(self.keys.health_history(name), json.dumps(item))
        pipe.hset(
            self.keys.health_query(name),
            mapping={k: json.dumps(v) if isinstance(v, dict | list) else str(v) for k, v in record.items()},
        )
        pipe.execute()

    def export(self, period: str, start_ms: int, end_ms: int, closed_at_ms: int, rows: list[dict[str, Any]]) -> Path:
        """A closed period's export folder (Parquet, CSV, manifest), written by the finance export's own writer."""
        write_export(
            self.layout.root,
            period,
            export_table(rows),
            start_ms,
            end_ms,
            closed_at_ms,
        )
        return self.layout.export(period)


def seed_sample(
    writer: SampleWriter,
    catalog: Catalog,
    first_period_ms: int,
    periods: int,
    seed: int = 1,
    closed: int | None = None,
    exports: int = 2,
) -> dict[str, Any]:
    """Fill Redis and the export folder with `periods` hours of billing of every ad of `catalog`.

    The oldest periods up to `closed` (default: all but the last two) are closed and corrected, and the newest
    `exports` of the closed ones get an export folder whose total is the period's corrected total. Returns what was
    written, for a caller to print.
    """
    rng = random.Random(f"sample-{seed}")
    hours = Periods()
    closed = max(0, periods - 2) if closed is None else closed
    starts = [hours.start_of(first_period_ms) + i * hours.length_ms for i in range(periods)]
    ads = list(catalog)
    n_corrections = 0
    for index, start in enumerate(starts):
        period = hours.key(start)
        clicks = {ad.ad_id: rng.randint(0, 40) for ad in ads}
        rows = [
            TotalsRow(period, start, ad.advertiser_id, ad.campaign_id, ad.ad_id, clicks[ad.ad_id],
                      clicks[ad.ad_id] * _price(ad))
            for ad in ads
            if clicks[ad.ad_id]
        ]  # fmt: skip
        touched = rng.sample(ads, k=min(len(ads), 6))
        late = [
            LateCount(period, start, ad.advertiser_id, ad.ad_id, event_type, rng.randint(0, 3))
            for ad in touched
            for event_type in ("impression", "click")
        ]
        quarantined = [
            QuarantineCount(reason, topic, advertiser_id, rng.randint(0, 2))
            for advertiser_id in catalog.advertiser_ids
            for reason, topic in (("id_conflict", "clicks"), ("time_out_of_range", "impressions"))
        ]
        # Every fifth period a phone with a wrong clock on the first ad (no random draw: other figures stay the same).
        wrong_clock = ads[0]
        clock_ahead = [
            ClockAheadCount(period, start, wrong_clock.advertiser_id, wrong_clock.ad_id, event_type, n)
            for event_type, n in (("impression", 3), ("click", 1))
            if index % 5 == 4
        ]
        # Every third period, clicks on the second ad while it was paused, and on an ad the catalog never knew.
        unbilled = [
            UnbilledCount(period, start, owner, ad_id, reason, n)
            for owner, ad_id, reason, n in (
                (ads[1 % len(ads)].advertiser_id, ads[1 % len(ads)].ad_id, "ad_paused", 2),
                ("", "retired-ad-7", "unknown_ad", 1),
            )
            if index % 3 == 2
        ]
        # Invalid clicks every period (a crawler on the first ad, a double click on the third) and, every fourth,
        # clicks over the first campaign's budget: not charged, counted (no random draw either).
        not_charged = [
            NotChargedCount(period, start, ad.advertiser_id, ad.campaign_id, ad.ad_id, reason, n, n * _price(ad))
            for ad, reason, n in (
                (ads[0], "known_bot", 2),
                (ads[2 % len(ads)], "duplicate_click", 1),
                (ads[0], "over_budget", 3 if index % 4 == 3 else 0),
            )
            if n
        ]
        # Each campaign's UTC day: what the period charged, and its clicks over budget, as the stream keeps them.
        days: dict[str, list[int]] = {}
        for row in rows:
            figures = days.setdefault(row.campaign_id, [0, 0, 0, 0])
            figures[0] += row.clicks
            figures[1] += row.micros
        for n in not_charged:
            if n.reason == "over_budget":
                figures = days.setdefault(n.campaign_id, [0, 0, 0, 0])
                figures[2] += n.clicks
                figures[3] += n.micros
        budget_days = [
            BudgetDayCount(period, campaign, utc_day(start), day_start(start), *figures)
            for campaign, figures in sorted(days.items())
        ]
        writer.bill(
            index,
            rows,
            [c for c in late if c.events],
            [q for q in quarantined if q.records],
            clock_ahead,
            unbilled,
            not_charged,
            budget_days,
        )
        corrections = [_sample_correction(rng, ad, period, start, clicks[ad.ad_id]) for ad in touched]
        corrections = corrections if index < closed else []
        writer.corrections(corrections)
        n_corrections += len(corrections)
        if index < closed:
            writer.close(period, start)
            if index >= closed - exports:
                export_rows = _export_rows(catalog, period, clicks, corrections)
                writer.export(period, start, start + hours.length_ms, start + 2 * hours.length_ms, export_rows)
    last = starts[-1]
    writer.health(
        health_record("billing", batch_id=len(starts) * 10, now_ms=last + 1_800_000, lag=(120, 80)),
        [
            health_record("billing", batch_id=len(starts) * 10 - i, now_ms=last + 1_800_000 - i * 5000, lag=(0, 0))
            for i in range(1, 30)
        ],
    )
    if closed:
        writer.reconciliation(
            {
                "run_id": f"reconcile-{hours.key(starts[closed - 1])}",
                "started_at_ms": last + 1_700_000,
                "finished_at_ms": last + 1_760_000,
                "duration_ms": 60_000,
                "periods": [hours.key(s) for s in starts[:closed]][-3:],
                "closed": [hours.key(starts[closed - 1])],
                "additions": 4,
                "retractions": 2,
                "net_micros_by_currency": {ads[0].currency: 1_230_000},
            }
        )
    return {"periods": len(starts), "closed": closed, "ads": len(ads), "corrections": n_corrections}


def _sample_correction(rng: random.Random, ad: Ad, period: str, start: int, billed: int) -> Correction:
    """An addition of a click the stream missed, or the retraction of one the stream billed (when it billed any)."""
    retract = billed > 0 and rng.random() < 0.5
    reason = rng.choice(RETRACTIONS if retract else ADDITIONS)
    click_id = f"click-{period}-{ad.ad_id}-0" if retract else f"click-{period}-{ad.ad_id}-late"
    return Correction(
        correction_id=f"corr-{period}-{ad.ad_id}",
        kind=CorrectionKind.RETRACTION if retract else CorrectionKind.ADDITION,
        click_id=click_id,
        impression_id=None if reason == "not_billable" else f"imp-{click_id}",
        ad_id=ad.ad_id,
        campaign_id=ad.campaign_id,
        advertiser_id=ad.advertiser_id,
        amount_micros=(-1 if retract else 1) * _price(ad),
        currency=ad.currency,
        reason=reason,
        corrects_period=period,
        booked_period=period,
        created_at_ms=start + 3_600_000 + 600_000,
    )


def _export_rows(
    catalog: Catalog, period: str, clicks: dict[str, int], corrections: list[Correction]
) -> list[dict[str, Any]]:
    """The export's click rows: every billed click, retracted ones at net 0, added ones at their amount."""
    by_click = {c.click_id: c for c in corrections}
    rows = []
    for ad in catalog:
        ids = [f"click-{period}-{ad.ad_id}-{k}" for k in range(clicks[ad.ad_id])]
        ids += [c.click_id for c in corrections if c.ad_id == ad.ad_id and c.amount_micros > 0]
        for click_id in ids:
            correction = by_click.get(click_id)
            status = "billed" if correction is None else ("added" if correction.amount_micros > 0 else "retracted")
            rows.append(
                {
                    "record_type": "click",
                    "click_id": click_id,
                    "impression_id": f"imp-{click_id}",
                    "ad_id": ad.ad_id,
                    "campaign_id": ad.campaign_id,
                    "advertiser_id": ad.advertiser_id,
                    "user_id": f"user-{click_id}",
                    "click_time": None,
                    "impression_time": None,
                    "amount_micros": _price(ad),
                    "net_micros": 0 if status == "retracted" else _price(ad),
                    "currency": ad.currency,
                    "status": status,
                    "reason": None if correction is None else correction.reason,
                    "correction_id": None if correction is None else correction.correction_id,
                    "corrects_period": period,
                    "booked_period": period,
                }
            )
    return sorted(rows, key=lambda r: r["click_id"])


def health_record(query: str, batch_id: int, now_ms: int, lag: tuple[int, int] = (0, 0)) -> dict[str, Any]:
    """A progress record in the shape of `attribution.progress.summarize`, with the latest offsets of each source."""
    end = {"impressions": {"0": 1000, "1": 1200}, "clicks": {"0": 100, "1": 130}}
    latest = {
        "impressions": {"0": 1000 + lag[0], "1": 1200},
        "clicks": {"0": 100 + lag[1], "1": 130},
    }
    return {
        "query": query,
        "batch_id": batch_id,
        "timestamp": format_utc(now_ms),
        "input_rows": 2300,
        "input_rows_per_second": 460.0,
        "processed_rows_per_second": 520.5,
        "batch_duration_ms": 4400 + batch_id % 7 * 100,
        "durations_ms": {"triggerExecution": 4400, "addBatch": 3900, "walCommit": 120},
        "watermark_ms": now_ms - 30_000,
        "stream_watermarks_ms": {"impressions": now_ms - 30_000, "clicks": now_ms - 31_000},
        "state_rows": 52_000,
        "state_memory_bytes": 48_000_000,
        "rows_dropped_by_watermark": 3,
        "sources": [
            {
                "description": f"KafkaV2[Subscribe[{topic}]]",
                "end_offset": json.dumps({topic: end[topic]}),
                "latest_offset": json.dumps({topic: latest[topic]}),
                "input_rows": 1000,
            }
            for topic in ("impressions", "clicks")
        ],
    }


def _texts(values: Any) -> list[str]:
    return sorted(v.decode() if isinstance(v, bytes) else v for v in values)


def _price(ad: Ad) -> int:
    """The sample's ads keep the price they were generated with."""
    return ad.cpc_micros or 0
