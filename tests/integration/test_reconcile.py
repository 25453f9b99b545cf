"""Reconciliation on the real stack: simulated traffic with late events of both kinds, out-of-order events,
duplicates and conflicts through Kafka and the streaming job, then `reconcile`, held to the DuckDB oracle over
the records read back from Kafka."""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Consumer, TopicPartition
from pyspark.sql import SparkSession

from attribution.job import start
from billing.budgets import day_start, utc_day
from billing.catalog import Ad, Catalog
from billing.events import Click, Impression
from billing.periods import Periods
from billing.reconcile_run import reconcile_periods
from billing.rule import charge
from billing.store import conflict_files
from billing.store.corrections_arrow import corrections_from_arrow
from billing.store.export_files import export_folder, read_export, verify_export
from billing.store.parquet_ledger import read_ledger
from billing.store.redis_totals import BudgetDayCount, RedisTotals, TotalsRow
from billing.store.schema_registry import open_registry
from ops.reconcile import reconcile, reconcile_config
from ops.settings import Settings
from ops.stack import ensure_schemas
from ops.streaming import stream_config
from producers.publisher import EventPublisher, simulate_to_kafka
from producers.simulator import SimulationConfig, Simulator
from producers.wire import EventDeserializer, EventSerializer, WireFormatError
from tests import oracle
from tests.redis_figures import RedisFigures
from tests.unit.test_reconcile_run import (
    BUDGETED,
    CLOSES_09,
    CLOSES_10,
    EUR,
    OFFSETS,
    P09,
    P10,
    START,
    Memory,
    click_at,
    late_click_in_a_full_day,
)

pytestmark = pytest.mark.integration

T0 = 1_767_229_170_000  # 2026-01-01T00:59:30Z: the traffic's event time crosses into the 01:00 period
UNTIL = 1_767_236_400_000  # 2026-01-01T03:00Z: reconcile and close everything before it
P0, P1 = "20260101T0000Z", "20260101T0100Z"
H_MS = 3_600_000


def read_back(settings: Settings, expected: int, undecodable: int = 0) -> list[dict]:
    """Every record of both topics as the oracle wants it: decoded events with their Kafka coordinates.

    Records that never decode to an event (not framed Avro, an unknown schema id, a body that does not decode)
    never reach the rule; exactly `undecodable` of them must be found, so that a decoding fault cannot shrink
    the oracle's input unnoticed."""
    deserializer = EventDeserializer(open_registry(settings.registry_location))
    consumer = Consumer(
        {"bootstrap.servers": settings.kafka_bootstrap, "group.id": "oracle", "enable.auto.commit": False}
    )
    topics = {settings.topic_impressions: "impression", settings.topic_clicks: "click"}
    consumer.assign([TopicPartition(t, p, 0) for t in topics for p in range(settings.topic_partitions)])
    rows, seen, skipped, deadline = [], 0, 0, time.monotonic() + 60
    try:
        while seen < expected and time.monotonic() < deadline:
            for message in consumer.consume(1000, timeout=0.5):
                if message.error() is not None:
                    continue
                seen += 1
                event_type = topics[message.topic()]
                try:
                    event = deserializer.deserialize(event_type, message.value())  # type: ignore[arg-type]
                except WireFormatError:
                    skipped += 1
                    continue
                rows.append(
                    {
                        "type": event_type,
                        "id": event.event_id,
                        "ad_id": event.ad_id,
                        "user_id": event.user_id,
                        "event_time": event.event_time,
                        "received_ms": message.timestamp()[1],
                        "partition": message.partition(),
                        "offset": message.offset(),
                        "user_agent": event.user_agent,
                        "ip": event.ip,
                    }
                )
    finally:
        consumer.close()
    assert seen == expected, f"read back {seen} of {expected} records"
    assert skipped == undecodable, f"{skipped} record(s) did not decode, {undecodable} expected"
    return rows


def read_whole(bootstrap: str, topic: str) -> list:
    """Every message `topic` holds now, from the start of each partition to its end."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "read-whole", "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        messages: list = []
        deadline = time.monotonic() + 30
        while len(messages) < sum(ends.values()) and time.monotonic() < deadline:
            messages += [m for m in consumer.consume(1000, timeout=0.5) if m.error() is None]
    finally:
        consumer.close()
    assert len(messages) == sum(ends.values())
    return messages


def final_ledger(settings: Settings) -> dict[str, int]:
    """Provisional ledger plus every correction: click id -> net micros, for clicks that net to one bill."""
    clicks: Counter[str] = Counter()
    micros: Counter[str] = Counter()
    for row in read_ledger(settings.root / "ledger").to_pylist():
        clicks[row["click_id"]] += 1
        micros[row["click_id"]] += row["amount_micros"]
    for c in corrections(settings):
        clicks[c.click_id] += c.clicks
        micros[c.click_id] += c.amount_micros
    assert set(clicks.values()) <= {0, 1}, "a click nets to one bill or none"
    return {click: micros[click] for click, n in clicks.items() if n == 1}


def corrections(settings: Settings) -> list:
    folder = settings.root / "corrections"
    if not folder.exists():
        return []
    return corrections_from_arrow(ds.dataset(folder, format="parquet", partitioning="hive").to_table())


def folder_digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


T = TypeVar("T")


def while_open(run: Callable[[], T]) -> tuple[T, set[str]]:
    """`run()`'s answer, and the periods open on the clock while it ran: a reconciliation books the adjustments of
    closed periods in the period open when it runs (`billing.reconcile_plan.open_period`), and the hour may turn
    while it runs."""
    periods = Periods()
    before = int(time.time() * 1000)
    answer = run()
    return answer, {periods.key_of(before), periods.key_of(int(time.time() * 1000))}


def test_provisional_plus_corrections_equals_the_oracle_and_closed_exports_never_change(
    spark: SparkSession, settings: Settings, tmp_path: Path
) -> None:
    # Small micro-batches, so that the watermark moves while the backlog is read and late arrivals miss the join.
    settings = dataclasses.replace(settings, max_offsets_per_trigger=2_000)
    config = SimulationConfig(
        events=16_000,
        seed=21,
        users=200,
        start_ms=T0,
        late_fraction=0.05,
        out_of_order_fraction=0.05,
        duplicate_fraction=0.02,
        bad_fraction=0.01,
    )
    catalog = config.catalog()
    settings.catalog_store().start(catalog)
    ensure_schemas(settings)
    summary = simulate_to_kafka(
        config, settings.kafka_bootstrap, settings.registry_location, tmp_path / "run", settings.topics, progress=False
    )
    raw = sum(1 for a in Simulator(config).arrivals() if a.raw is not None)  # bytes that never decode
    assert raw > 0
    queries = start(spark, stream_config(settings))
    try:
        queries[0].processAllAvailable()
        # An id conflict the stream bills wrongly: the first copy of a click arrives behind the watermark (not
        # billed, and no impression qualifies it), then a copy with other content arrives on time with an
        # impression. The stream cannot see the conflict; reconciliation must retract its bill.
        received = read_back(settings, summary.delivered, undecodable=raw)
        newest = max(r["event_time"] for r in received if T0 <= r["event_time"] < UNTIL)
        late_copy_ms, on_time_ms = newest - 45_000, newest + 1_000  # the watermark is newest - 30 s
        # Both copies in periods this run reconciles together, so that it sees the conflict.
        assert {Periods().key_of(late_copy_ms), Periods().key_of(on_time_ms)} <= {P0, P1}
        ad = next(iter(catalog))
        planted = EventPublisher(
            settings.kafka_bootstrap, EventSerializer(open_registry(settings.registry_location)), settings.topics
        )
        planted.publish_event(Click("conflict-c", ad.ad_id, "conflict-first-user", late_copy_ms))
        assert planted.flush(30) == 0  # the first copy is received first
        planted.publish_event(Impression("conflict-i", ad.ad_id, "conflict-user", on_time_ms - 1_000))
        planted.publish_event(Click("conflict-c", ad.ad_id, "conflict-user", on_time_ms))
        assert planted.flush(30) == 0
        queries[0].processAllAvailable()
        delivered = summary.delivered + 3

        expected = {
            row["click_id"]: row["amount_micros"]
            for row in oracle.billable(read_back(settings, delivered, undecodable=raw), catalog)
        }
        assert "conflict-c" not in expected
        ledger = {row["click_id"] for row in read_ledger(settings.root / "ledger").to_pylist()}
        assert ledger != set(expected), "the stream should have missed late clicks, or the test proves nothing"
        assert "conflict-c" in ledger, "the stream should have billed the conflicting copy"

        rc = reconcile_config(settings)
        report = reconcile(spark, rc, catalog, until_ms=UNTIL)
        assert report.closed == [P0, P1]
        # Every period of January that holds data is closed (the clock is past its end and horizon): the run that
        # closed the last one issued January's invoices, each adding up to its advertiser's exports to the micro.
        book = settings.invoice_store()
        assert report.invoices and report.invoices[0].startswith("invoices of 2026-01: "), report.invoices
        invoiced = {i.advertiser_id: i.totals.net_micros for i in book.invoices_in("2026-01")}
        exported_net: dict[str, int] = defaultdict(int)
        for period in (P0, P1):
            for row in read_export(export_folder(settings.root, period)).to_pylist():
                exported_net[row["advertiser_id"]] += row["net_micros"]
        assert invoiced == dict(exported_net) and sorted(book.numbers()) == list(range(1, len(invoiced) + 1))
        january = {i.advertiser_id: i.to_json() for i in book.invoices_in("2026-01")}
        every = corrections(settings)
        reasons = Counter(c.reason for c in every)
        assert reasons["late_click"] + reasons["late_impression"] > 0, reasons
        # Both kinds of correction: additions of late clicks, and the conflict's bill retracted.
        assert [(c.reason, c.amount_micros) for c in every if c.click_id == "conflict-c"] == [
            ("id_conflict", -ad.cpc_micros)
        ]
        assert report.retractions >= 1 and report.additions >= 1

        # Provisional ledger + corrections = final ledger = oracle: the same click ids and micros.
        assert final_ledger(settings) == expected
        # The exports say the same.
        exported: dict[str, int] = {}
        for period in (P0, P1):
            folder = export_folder(settings.root, period)
            assert verify_export(folder) == []
            for row in read_export(folder).to_pylist():
                if row["record_type"] == "click" and row["status"] != "retracted":
                    exported[row["click_id"]] = row["amount_micros"]
        assert exported == expected
        # Redis: provisional + corrections per ad = the final ledger per ad.
        totals = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
        by_ad: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for (period, ad), t in totals.all_ad_totals().items():
            fix = totals.corrections_of(period, "ad", ad)
            by_ad[ad][0] += t.clicks + fix.clicks
            by_ad[ad][1] += t.micros + fix.micros
        want: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        ad_of = {
            row["click_id"]: row["ad_id"]
            for row in oracle.billable(read_back(settings, delivered, undecodable=raw), catalog)
        }
        for click, amount in expected.items():
            want[ad_of[click]][0] += 1
            want[ad_of[click]][1] += amount
        assert {ad: v for ad, v in by_ad.items() if v != [0, 0]} == dict(want)
        assert totals.closed_periods() == [P0, P1]

        # A second run writes nothing new.
        files = sorted(p.name for p in (settings.root / "corrections").rglob("*.parquet"))
        again = reconcile(spark, rc, catalog, until_ms=UNTIL)
        assert again.periods == [] and again.additions == again.retractions == 0
        assert sorted(p.name for p in (settings.root / "corrections").rglob("*.parquet")) == files

        # Late data for a closed period: its export is byte-for-byte unchanged; an adjustment is booked in the
        # open period, pointing at the period it corrects.
        before = folder_digest(export_folder(settings.root, P0))
        ad = next(iter(catalog))
        publisher = EventPublisher(
            settings.kafka_bootstrap, EventSerializer(open_registry(settings.registry_location)), settings.topics
        )
        publisher.publish_event(Impression("very-late-i", ad.ad_id, "very-late-user", T0 + 5_000))
        publisher.publish_event(Click("very-late-c", ad.ad_id, "very-late-user", T0 + 6_000))
        assert publisher.flush(30) == 0
        queries[0].processAllAvailable()
        late, open_periods = while_open(lambda: reconcile(spark, rc, catalog, until_ms=UNTIL))
        # P1 is checked again too (an impression of P0 may qualify a click of P1), and gets nothing.
        assert late.periods == [P0, P1] and late.closed == [] and (late.additions, late.retractions) == (1, 0)
        assert folder_digest(export_folder(settings.root, P0)) == before
        adjustment = [c for c in corrections(settings) if c.click_id == "very-late-c"]
        # Booked in the period open while the run ran (UNTIL is long past).
        assert len(adjustment) == 1 and adjustment[0].booked_period in open_periods
        open_period = adjustment[0].booked_period
        assert [(c.corrects_period, c.booked_period, c.amount_micros, c.reason) for c in adjustment] == [
            (P0, open_period, ad.cpc_micros, "late_click")
        ]
        assert totals.corrections_of(open_period, "adv", ad.advertiser_id).micros == ad.cpc_micros
        # January is invoiced: its invoices do not change; the adjustment is booked in the open month, for its invoice.
        assert {i.advertiser_id: i.to_json() for i in book.invoices_in("2026-01")} == january
    finally:
        for query in queries:
            query.stop()


def test_id_conflicts_reach_the_quarantine_topic_once_whatever_the_runs(
    spark: SparkSession, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog = Catalog([Ad("ad-1", "cmp-1", "adv-1", 250_000, "EUR")])
    settings.catalog_store().start(catalog)
    ensure_schemas(settings)
    start_ms = 1_767_225_600_000  # P0
    publisher = EventPublisher(
        settings.kafka_bootstrap, EventSerializer(open_registry(settings.registry_location)), settings.topics
    )

    def publish(events: list) -> None:
        for event in events:
            publisher.publish_event(event)
        assert publisher.flush(30) == 0

    def on_topic() -> list:
        return read_whole(settings.kafka_bootstrap, settings.topic_quarantine)

    queries = start(spark, stream_config(settings))
    try:
        publish([Impression("i-1", "ad-1", "u-1", start_ms + 1_000), Click("c-1", "ad-1", "u-1", start_ms + 2_000)])
        queries[0].processAllAvailable()
        # The same ids again with other content: two conflicts, quarantined by reconciliation.
        publish([Impression("i-1", "ad-1", "u-1", start_ms + 1_500), Click("c-1", "ad-1", "u-x", start_ms + 2_000)])
        queries[0].processAllAvailable()
        rc = reconcile_config(settings)

        # Kafka out of reach: the run closes its periods all the same, and says what it could not send.
        monkeypatch.setattr(conflict_files, "CONFLICTS_SEND_TIMEOUT_S", 2.0)
        down = reconcile(spark, dataclasses.replace(rc, kafka_bootstrap="127.0.0.1:1"), catalog, UNTIL, force=True)
        assert (down.closed, down.conflicts, down.conflicts_sent, down.conflicts_unsent) == ([P0], 2, 0, 2)
        assert on_topic() == []

        # The next run, with nothing to reconcile, sends them; the one after sends nothing.
        first = reconcile(spark, rc, catalog, UNTIL, force=True)
        assert (first.periods, first.conflicts_sent, first.conflicts_unsent) == ([], 2, 0)
        again = reconcile(spark, rc, catalog, UNTIL, force=True)
        assert (again.conflicts_sent, again.conflicts_unsent) == (0, 0)
        letters = on_topic()
        assert len(letters) == 2

        # A third copy of the click reopens P0 for reconciliation: only the new conflict goes.
        publish([Click("c-1", "ad-1", "u-y", start_ms + 2_000)])
        queries[0].processAllAvailable()
        late = reconcile(spark, rc, catalog, UNTIL, force=True)
        assert (late.periods[:1], late.conflicts, late.conflicts_sent) == ([P0], 1, 1)
        letters = on_topic()
        assert len(letters) == 3
        table = pq.read_table(settings.root / "conflicts" / f"period={P0}.parquet").to_pylist()
        by_key = {f"{r['topic']}/{r['partition']}/{r['offset']}".encode(): r for r in table}
        assert sorted(m.key() for m in letters) == sorted(by_key), "each conflict once, keyed by its coordinates"
        for message in letters:
            row = by_key[message.key()]
            headers = dict(message.headers())
            assert (headers["reason"], message.value()) == (b"id_conflict", row["value"])
            assert headers["value_sha256"] == hashlib.sha256(row["value"]).hexdigest().encode()
    finally:
        for query in queries:
            query.stop()


def test_an_id_conflict_across_a_period_boundary_is_billed_once_when_the_periods_close_in_separate_runs(
    spark: SparkSession, settings: Settings
) -> None:
    # The first copy stands, whichever periods the copies' times fall in: here the first copy is just after the
    # boundary (P1) and the conflicting later copy just before it (P0), and P0 closes one run before P1.
    ad = Ad("ad-1", "cmp-1", "adv-1", 250_000, "EUR")
    catalog = Catalog([ad])
    settings.catalog_store().start(catalog)
    ensure_schemas(settings)
    boundary = 1_767_229_200_000  # 01:00Z, P0 | P1
    publisher = EventPublisher(
        settings.kafka_bootstrap, EventSerializer(open_registry(settings.registry_location)), settings.topics
    )

    def publish(events: list) -> None:
        for event in events:
            publisher.publish_event(event)
        assert publisher.flush(30) == 0  # each list is received before the next

    # Clicks: the first copy of x-c in P1 (billable with x-i1), the second, other content, in P0 (would be
    # billable with x-i0). Impressions: the first copy of y-i in P1, the second in P0, where y-c would match it.
    publish([Impression("x-i1", ad.ad_id, "u1", boundary + 1_000), Click("x-c", ad.ad_id, "u1", boundary + 2_000)])
    publish([Impression("y-i", ad.ad_id, "u3", boundary + 10_000)])
    publish([Impression("x-i0", ad.ad_id, "u2", boundary - 5_000), Click("x-c", ad.ad_id, "u2", boundary - 3_000)])
    publish([Impression("y-i", ad.ad_id, "u3", boundary - 4_000), Click("y-c", ad.ad_id, "u3", boundary - 2_000)])
    delivered = 7
    queries = start(spark, stream_config(settings))
    try:
        queries[0].processAllAvailable()
        expected = {r["click_id"]: r["amount_micros"] for r in oracle.billable(read_back(settings, delivered), catalog)}
        assert expected == {"x-c": ad.cpc_micros}
        rc = reconcile_config(settings)
        # Each period closes when its horizon has passed, one run each (the clock of each run says when).
        first = reconcile(spark, rc, catalog, clock=lambda: boundary + rc.horizon_ms + 1)
        assert first.closed == [P0]
        second = reconcile(spark, rc, catalog, clock=lambda: boundary + 3_600_000 + rc.horizon_ms + 1)
        assert second.closed == [P1]
    finally:
        for query in queries:
            query.stop()
    given: Counter[str] = Counter()
    exported: dict[str, int] = {}
    for period in (P0, P1):
        folder = export_folder(settings.root, period)
        assert verify_export(folder) == []
        for row in read_export(folder).to_pylist():
            if row["record_type"] == "click" and row["status"] != "retracted":
                given[row["click_id"]] += 1
                exported[row["click_id"]] = row["amount_micros"]
    assert exported == expected and max(given.values()) == 1, (exported, given)
    assert final_ledger(settings) == expected
    conflicts = pq.read_table(settings.root / "conflicts" / f"period={P0}.parquet").to_pylist()
    assert sorted((r["event_id"], r["event_time"]) for r in conflicts) == [
        ("x-c", boundary - 3_000),
        ("y-i", boundary - 4_000),
    ]


def test_a_late_click_inside_a_full_budget_never_takes_the_redis_day_total_past_the_budget(
    redis_settings: Settings,
) -> None:
    """The stream charged 3.00 of a 3.00 day at 10:05 (10:00 open); a late 09:50 click is added when 09:00 closes.
    On a real Redis, read after every write the run makes: the day's charged total never passes 3.00, because the
    retraction that makes the room reaches Redis in the same call as the addition, ahead of it."""
    start_10 = Periods().parse_key(P10)
    day = utc_day(start_10)
    seen: list[int] = []

    class Watched(RedisTotals):
        """The run's totals, with the day's charged micros read back after each of its writes."""

        def read_day(self) -> int:
            seen.append(self.budget_day(day, "cmp-b")["charged_micros"])
            return seen[-1]

        def apply_corrections(self, corrections, period_start_ms, days_read=None):  # type: ignore[no-untyped-def]
            given = list(corrections)
            assert len(given) < 2000, "one script call: nothing between the retraction and the addition"
            applied = super().apply_corrections(given, period_start_ms, days_read)
            self.read_day()
            return applied

        def close_period(self, period, period_start_ms, exported):  # type: ignore[no-untyped-def]
            super().close_period(period, period_start_ms, exported)
            self.read_day()

    totals = Watched.from_url(redis_settings.redis_url, redis_settings.redis_prefix)
    assert isinstance(totals, Watched)
    # What the stream's batch put in Redis: three 1.00 clicks of 10:00, the day at its budget.
    totals.apply_batch(
        "billing",
        0,
        [TotalsRow(P10, start_10, "adv-1", "cmp-b", "ad-e", 3, 3 * EUR)],
        budget_days=[BudgetDayCount(P10, "cmp-b", day, day_start(start_10), 3, 3 * EUR)],
    )
    assert totals.read_day() == 3 * EUR
    memory = late_click_in_a_full_day()
    for now in (CLOSES_09, CLOSES_10):  # 09:00 closes with the late click; then 10:00 closes
        ports = dataclasses.replace(memory.ports(now), totals=lambda: totals)
        reconcile_periods(ports, Periods(), 15 * 60_000)
    assert max(seen) == 3 * EUR and seen[-1] == 3 * EUR, seen
    assert totals.budget_day(day, "cmp-b") == {
        "charged_clicks": 3,
        "charged_micros": 3 * EUR,
        "over_clicks": 1,
        "over_micros": EUR,
    }


@pytest.mark.parametrize(
    "moment",
    [
        # The stream's batch lands after the run's read point and before the run reads Redis's day.
        "reconciling",
        # It lands after the run read Redis's day and wrote its corrections, just before they reach Redis.
        f"period {P09}: 1 new correction(s) written",
    ],
)
def test_a_bill_the_stream_charges_while_a_run_books_a_late_click_never_takes_the_day_past_the_budget(
    redis_settings: Settings, moment: str
) -> None:
    """3.00 EUR a day; the stream charged 2.00 at 10:05 (batch 0, 10:00 open); a 09:50 click arrived late, and the
    run that closes 09:00 plans from batch 0: 09:50 + 2.00 = 3.00, no room needed. While it runs, the stream charges
    a 1.00 click of 10:06 (batch 1: the day read 2.00, it fits). The run must count that bill before its addition
    reaches Redis: the 10:06 click, last in event time, no longer fits and is taken back (`over_budget`) in the same
    call. Read after every write to a real Redis, the day's charged total never passes 3.00, and the books closed
    later equal the rule."""
    start_10 = Periods().parse_key(P10)
    day = utc_day(start_10)
    budget = 3 * EUR
    seen: list[tuple[str, int]] = []

    class Watched(RedisTotals):
        """Redis, with the day's charged micros read back after each write, the stream's and the run's."""

        def read_day(self, after: str) -> int:
            seen.append((after, self.budget_day(day, "cmp-b")["charged_micros"]))
            return seen[-1][1]

        def apply_batch(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            applied = super().apply_batch(*args, **kwargs)
            self.read_day(f"batch {args[1]}")
            return applied

        def apply_corrections(self, corrections, period_start_ms, days_read=None):  # type: ignore[no-untyped-def]
            try:
                return super().apply_corrections(corrections, period_start_ms, days_read)
            finally:
                self.read_day("corrections")

        def close_period(self, period, period_start_ms, exported):  # type: ignore[no-untyped-def]
            super().close_period(period, period_start_ms, exported)
            self.read_day(f"close {period}")

    totals = Watched.from_url(redis_settings.redis_url, redis_settings.redis_prefix)
    assert isinstance(totals, Watched)
    at_1005 = START + 10 * H_MS + 5 * 60_000
    stream = [click_at(c, at_1005) for c in ("c-10a", "c-10b")]
    late = click_at("c-0950", START + 9 * H_MS + 50 * 60_000)
    newer = click_at("c-1006", at_1005 + 60_000)

    def stream_batch(batch_id: int, bills: list) -> None:
        """What the streaming job does with a batch: read the day, charge what fits, apply on the day it read."""
        read = totals.batch_day_charged("billing", batch_id, batch_id - 1, [("cmp-b", day)]).day_charged
        assert read[("cmp-b", day)] + sum(b.amount_micros for b in bills) <= budget, "the stream charges what fits"
        totals.apply_batch(
            "billing",
            batch_id,
            [TotalsRow(P10, start_10, "adv-1", "cmp-b", "ad-e", len(bills), sum(b.amount_micros for b in bills))],
            applied_through=batch_id - 1,
            budget_days=[
                BudgetDayCount(P10, "cmp-b", day, day_start(start_10), len(bills), sum(b.amount_micros for b in bills))
            ],
            day_totals_read=read,
        )

    stream_batch(0, stream)
    memory = Memory(
        final=[late, *stream],
        ledger=list(stream),
        committed=OFFSETS,
        catalog=BUDGETED,
        late=frozenset({"c-0950"}),
        read_through=0,
        later={1: [newer]},
    )
    charged_meanwhile: list[str] = []
    said: list[str] = []

    def progress(message: str) -> None:
        said.append(message)
        if message.startswith(moment) and not charged_meanwhile:
            stream_batch(1, [newer])
            charged_meanwhile.append(message)

    ports = dataclasses.replace(memory.ports(CLOSES_09), totals=lambda: totals)
    report = reconcile_periods(ports, Periods(), 15 * 60_000, progress=progress)
    assert charged_meanwhile and report.closed == [P09]
    # Counted before the first apply, or found when the apply refused a day that had moved, and counted then.
    assert any("moved" in line for line in said) == (moment != "reconciling"), said
    assert max(micros for _, micros in seen) <= budget, seen
    assert sorted((c.click_id, c.kind, c.reason, c.corrects_period) for c in memory.corrections) == [
        ("c-0950", "addition", "late_click", P09),
        ("c-1006", "retraction", "over_budget", P10),
    ]
    # The stream's batch 1 is read by the next run (it received the click by then); 10:00 closes.
    memory.ledger.append(newer)
    memory.final.append(newer)
    memory.read_through, memory.later = 1, {}
    ports = dataclasses.replace(memory.ports(CLOSES_10), totals=lambda: totals)
    assert reconcile_periods(ports, Periods(), 15 * 60_000).closed == [P10]
    assert max(micros for _, micros in seen) <= budget, seen
    # The books: ledger + corrections = the rule over every click received, and Redis's day holds them.
    net: Counter[str] = Counter()
    for row in memory.ledger:
        net[row.click_id] += row.amount_micros
    for correction in memory.corrections:
        net[correction.click_id] += correction.amount_micros
    charged, refused = charge(memory.final, {}, BUDGETED)
    assert {c for c, micros in net.items() if micros} == {r.click_id for r in charged} == {"c-0950", "c-10a", "c-10b"}
    assert [r.click_id for r in refused] == ["c-1006"]
    assert len(memory.corrections) == 2, "the close finds the early retraction booked and writes nothing twice"
    assert totals.budget_day(day, "cmp-b") == {
        "charged_clicks": 3,
        "charged_micros": budget,
        "over_clicks": 1,
        "over_micros": EUR,
    }
