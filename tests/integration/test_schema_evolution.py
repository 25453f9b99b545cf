"""A producer deploys a new schema version while the job runs (docs/billing-rules.md, "Events"): on real Kafka,
Spark and Redis.

Version 2 of each event type is version 1 plus an optional string field with a null default (BACKWARD
compatible). Its records are billed by the stream from the first one, with no restart by hand; records of an id the
registry did not know when they arrived are held in quarantine and billed once it knows the id; a job killed while it
switches to a new version loses nothing and bills nothing twice; an incompatible version is refused; records of an
id that never exists stay quarantined and counted.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from pyspark.sql import SparkSession

from attribution.restore import restore_redis
from billing.compatibility import IncompatibleSchemaError
from billing.events import Click, Impression
from billing.periods import Periods
from billing.schemas import schema_text, subject_of
from billing.store.schema_registry import SchemaRegistry, open_registry
from ops.reconcile import reconcile, reconcile_config
from ops.settings import Settings
from producers.publisher import EventPublisher
from producers.wire import EventSerializer, encode_body, frame, parse_avro_schema
from tests import oracle
from tests.conftest import child_env
from tests.integration.test_reconcile import corrections, read_back
from tests.integration.test_stream_job import (
    CATALOG,
    job,  # noqa: F401 - the fixture
    ledger_ad_totals,
    ledger_rows,
    process,
    read_to_the_end,
    redis_ad_totals,
    wait_for,
)
from tests.redis_figures import RedisFigures

pytestmark = pytest.mark.integration

T0 = 1_767_225_600_000  # 2026-01-01T00:00Z
H = 3_600_000
P0, P1 = "20260101T0000Z", "20260101T0100Z"
ADS = [ad.ad_id for ad in CATALOG]
PRICE = {ad.ad_id: ad.cpc_micros for ad in CATALOG}
ADDED_FIELD = "placement"


def version_2(event_type: str) -> str:
    """Version 1 plus an optional string field with a null default: BACKWARD compatible."""
    schema = json.loads(schema_text(event_type))
    schema["fields"].append({"name": ADDED_FIELD, "type": ["null", "string"], "default": None})
    return json.dumps(schema)


def pair(n: int, tag: str, t: int | None = None) -> tuple[Impression, Click]:
    """A billable impression and click, the click 1 s after; times grow with `n` (or are `t`), so nothing is late."""
    ad = ADS[n % len(ADS)]
    t = T0 + n * 50 if t is None else t
    return Impression(f"i-{tag}-{n}", ad, f"u-{tag}-{n}", t), Click(f"c-{tag}-{n}", ad, f"u-{tag}-{n}", t + 1_000)


class Producer:
    """A producer team's client: writes events with the version it deployed, extra fields given or defaulted."""

    def __init__(self, settings: Settings) -> None:
        self.registry = open_registry(settings.registry_location)
        self.serializer = EventSerializer(self.registry)
        self.out = EventPublisher(settings.kafka_bootstrap, self.serializer, settings.topics)
        self.topics = settings.topics

    def deploy_version_2(self) -> dict[str, int]:
        return {t: self.serializer.use_version(self.registry, t, version_2(t)) for t in ("impression", "click")}

    def send(self, *events: Impression | Click, extra: dict | None = None) -> None:
        for event in events:
            value = self.serializer.serialize(event, extra)
            self.out.publish_raw(self.topics[event.type], event.ad_id.encode(), value)

    def flush(self) -> None:
        assert self.out.flush(30) == 0
        assert self.out.summary().delivery_failures == 0


def expected_bills(clicks: list[Click]) -> dict[str, int]:
    return {c.click_id: PRICE[c.ad_id] for c in clicks}


def quarantine_reasons(settings: Settings) -> Counter:
    folder = settings.root / "quarantine"
    if not folder.exists():
        return Counter()
    return Counter(ds.dataset(folder, format="parquet", partitioning="hive").to_table().column("reason").to_pylist())


class LockProbe:
    """Tries the job's lock as another process (`adbill restore-redis`) would, every 20 ms while the job runs, and
    keeps the moments it could have taken it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.free_at: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._probe, name="job-lock-probe", daemon=True)
        self._thread.start()

    def _probe(self) -> None:
        import fcntl

        while not self._stop.wait(0.02):
            with self.path.open("a+") as handle:  # another open file: flock treats it as another process's
                try:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
                self.free_at.append(time.monotonic())

    def stop(self) -> list[float]:
        self._stop.set()
        self._thread.join()
        return self.free_at


def test_versions_registered_under_traffic_are_billed_by_the_stream_from_their_first_record(
    settings: Settings,
    job,  # noqa: F811
) -> None:
    settings.catalog_store().start(CATALOG)
    queries = job()
    # The job holds its lock all along, across its switch to the new versions: a restore of Redis is refused.
    probe = LockProbe(settings.layout.job_lock("billing"))
    old, new = Producer(settings), Producer(settings)
    clicks: list[Click] = []
    stop = threading.Event()
    started = time.monotonic()

    def now() -> int:
        """Event times follow the wall clock from T0, for both producers, as live traffic's do."""
        return T0 + int((time.monotonic() - started) * 1000)

    def old_traffic() -> None:
        """A producer that stays on version 1 all along (about 100 pairs a second): the job is under traffic while
        it switches."""
        n = 0
        while not stop.is_set() or n < 400:
            impression, click = pair(n, "v1", now())
            old.send(impression, click)
            clicks.append(click)
            n += 1
            if n % 20 == 0:
                old.out.poll(0)
                time.sleep(0.2)
        old.flush()

    traffic = threading.Thread(target=old_traffic)
    traffic.start()
    try:
        wait_for(lambda: len(ledger_rows(settings)) >= 50, "the stream to bill version 1 traffic", 120)
        ids = new.deploy_version_2()
        first_impression, first_click = pair(0, "v2", now())
        sent_at = time.time()
        new.send(first_impression, first_click, extra={ADDED_FIELD: "feed"})
        new.flush()
        wait_for(lambda: any(r["click_id"] == first_click.click_id for r in ledger_rows(settings)), "the first v2 bill")
        latency_s = time.time() - sent_at
        print(f"\nnew schema version {ids}: first record sent -> first bill in the ledger: {latency_s:.2f} s")
        v2_clicks = [first_click]
        for n in range(1, 300):
            impression, click = pair(n, "v2", now())
            new.send(impression, click, extra={ADDED_FIELD: "feed"} if n % 2 else None)  # half take the default
            v2_clicks.append(click)
        new.flush()
    finally:
        stop.set()
        traffic.join()
    switched_ms = int(time.time() * 1000)
    process(queries)
    free_at = probe.stop()
    assert free_at == [], f"the job's lock was free {len(free_at)} time(s) while the job ran"
    # The heartbeat follows the run that started after the switch: it beats on.
    heartbeat = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
    wait_for(
        lambda: int(heartbeat.client.get(heartbeat.keys.heartbeat("billing")) or 0) >= switched_ms,
        "the heartbeat of the run after the switch",
        60,
    )

    rows = ledger_rows(settings)
    billed = Counter(r["click_id"] for r in rows)
    assert max(billed.values()) == 1, "one bill per click"
    assert {r["click_id"]: r["amount_micros"] for r in rows} == expected_bills(clicks + v2_clicks)
    assert quarantine_reasons(settings) == Counter(), "nothing quarantined"
    assert redis_ad_totals(settings) == ledger_ad_totals(rows)
    assert getattr(queries[0], "switches", 0) >= 1, "the query was started again for the new versions"


def renamed_version(event_type: str, extra_field: str | None = None) -> str:
    """Version 2 with the record renamed (`Tap`) and `user_id` renamed (`visitor_id`), each keeping the old name as
    its alias: BACKWARD compatible, as the registry checks; `extra_field` adds another optional field."""
    schema = json.loads(version_2(event_type))
    schema["name"], schema["aliases"] = "Tap", [schema["name"]]
    for f in schema["fields"]:
        if f["name"] == "user_id":
            f["name"], f["aliases"] = "visitor_id", ["user_id"]
    if extra_field is not None:
        schema["fields"].append({"name": extra_field, "type": ["null", "string"], "default": None})
    return json.dumps(schema)


def as_renamed(click: Click) -> dict:
    """The record of `click` as a producer on `renamed_version` writes it."""
    record = {**click.to_record(), ADDED_FIELD: "search"}
    record["visitor_id"] = record.pop("user_id")
    return record


def test_records_of_an_id_unknown_on_arrival_are_billed_once_it_is_registered(
    spark: SparkSession,
    settings: Settings,
    job,  # noqa: F811
) -> None:
    settings.catalog_store().start(CATALOG)
    queries = job()
    producer = Producer(settings)
    registry = producer.registry
    # A producer writes clicks with a version its registry has not given an id yet: the record and `user_id`
    # renamed through aliases (registered after the clicks arrive); and a few with an id no registry ever holds.
    next_id = 1 + max(registry.ids(subject_of("impression")) + registry.ids(subject_of("click")))
    never_id = 4_242
    body_renamed = parse_avro_schema(renamed_version("click"))
    body_v1 = parse_avro_schema(schema_text("click"))
    early, never = [pair(n, "early") for n in range(20)], [pair(n, "never") for n in range(20, 25)]
    for impression, click in early:
        producer.send(impression)
        value = frame(next_id, encode_body(body_renamed, as_renamed(click)))
        producer.out.publish_raw(settings.topic_clicks, click.ad_id.encode(), value)
    for impression, click in never:
        producer.send(impression)
        value = frame(never_id, encode_body(body_v1, click.to_record()))
        producer.out.publish_raw(settings.topic_clicks, click.ad_id.encode(), value)
    # One click id sent twice (docs/billing-rules.md, "The attribution rule"): copy R at the end of P0, written with
    # a third version the registry does not know yet (id next_id + 1), and copy B at the start of P1, re-sent with
    # the shipped version, both within 10 s of an impression. R arrives first: it stands, B is a conflict.
    both = Impression("i-both", ADS[0], "u-both", T0 + H - 5_000)
    copy_r, copy_b = Click("c-both", ADS[0], "u-both", T0 + H - 100), Click("c-both", ADS[0], "u-both", T0 + H + 100)
    third = parse_avro_schema(renamed_version("click", extra_field="campaign_hint"))
    producer.send(both)
    producer.out.publish_raw(
        settings.topic_clicks, copy_r.ad_id.encode(), frame(next_id + 1, encode_body(third, as_renamed(copy_r)))
    )
    producer.flush()
    producer.send(copy_b)  # received after R
    producer.flush()
    process(queries)
    assert quarantine_reasons(settings) == Counter({"unknown_schema": 26})
    assert [(r["click_id"], r["period"]) for r in ledger_rows(settings)] == [("c-both", P1)], "the stream bills B"

    assert registry.register(subject_of("click"), renamed_version("click")) == next_id
    # Ordinary traffic, some of it written with the renamed version: the next batch notices the new id, the query
    # starts again and its first batch releases the early clicks; the new version's records are billed as any.
    later = [pair(n, "later", T0 + H + 10_000 + n * 50) for n in range(25, 35)]
    renamed = [pair(n, "renamed", T0 + H + 10_000 + n * 50) for n in range(35, 45)]
    producer.send(*[e for p in later for e in p])
    new = Producer(settings)
    assert new.serializer.use_version(registry, "click", renamed_version("click")) == next_id
    for impression, click in renamed:
        new.send(impression)
        new.send(click, extra={"visitor_id": click.user_id, ADDED_FIELD: "feed"})
    producer.flush()
    new.flush()
    process(queries)
    released = ds.dataset(settings.root / "released", format="parquet", partitioning="hive").to_table()
    assert sorted(released.column("event_id").to_pylist()) == sorted(c.click_id for _, c in early)
    billed = Counter(r["click_id"] for r in ledger_rows(settings))
    assert billed == Counter(c.click_id for _, c in later + renamed) + Counter(["c-both"]), "one bill each"
    figures = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
    assert figures.quarantined() == {"unknown_schema": {settings.topic_clicks: 6}}, "the never-known ones and R stay"

    # P0 and P1 close while R is held; B is in P1's export.
    for query in queries:
        query.stop()
    until = T0 + 2 * H
    report = reconcile(spark, reconcile_config(settings), _catalog(settings), until_ms=until, force=True)
    assert report.closed == [P0, P1] and report.released == 0
    assert Counter(c.click_id for c in corrections(settings)) == Counter(c.click_id for _, c in early)

    # R's version is registered while the job is down: reconciliation releases R, and takes up again P0 (R's
    # period) and P1 (B's): R is billed in P0 and B retracted in P1, both adjustments of closed periods.
    assert registry.register(subject_of("click"), renamed_version("click", extra_field="campaign_hint")) == next_id + 1
    report = reconcile(spark, reconcile_config(settings), _catalog(settings), until_ms=until, force=True)
    assert (report.released, report.periods, report.additions, report.retractions) == (1, [P0, P1], 1, 1)
    adjustments = [(c.click_id, c.corrects_period, c.amount_micros, c.reason) for c in corrections(settings)]
    assert sorted(a for a in adjustments if a[0] == "c-both") == [
        ("c-both", P0, PRICE[ADS[0]], "late_click"),
        ("c-both", P1, -PRICE[ADS[0]], "id_conflict"),
    ]
    again = reconcile(spark, reconcile_config(settings), _catalog(settings), until_ms=until, force=True)
    assert (again.released, again.additions, again.retractions) == (0, 0, 0)
    # Per period, ledger + corrections = the DuckDB oracle over every record Kafka holds, to the click and micro.
    final: Counter[tuple[str, str]] = Counter()
    for row in ledger_rows(settings):
        final[row["period"], row["click_id"]] += row["amount_micros"]
    for c in corrections(settings):
        final[c.corrects_period, c.click_id] += c.amount_micros
    received = read_back(settings, 2 * 20 + 2 * 5 + 3 + 2 * 20, undecodable=5)
    expected = {
        (Periods().key_of(r["click_time"]), r["click_id"]): r["amount_micros"]
        for r in oracle.billable(received, _catalog(settings))
    }
    assert {key: micros for key, micros in final.items() if micros} == expected
    assert expected[P0, "c-both"] == PRICE[ADS[0]] and (P1, "c-both") not in expected
    # R left quarantine, once; B is an id conflict now.
    held = {"unknown_schema": {settings.topic_clicks: 5}, "id_conflict": {settings.topic_clicks: 1}}
    assert figures.quarantined() == held

    # Started again, the job releases nothing twice.
    queries = job()[-1:]
    producer.send(*pair(45, "again", T0 + 2 * H + 10_000))
    producer.flush()
    process(queries)
    released = ds.dataset(settings.root / "released", format="parquet", partitioning="hive").to_table()
    assert released.num_rows == 21
    assert quarantine_reasons(settings) == Counter({"unknown_schema": 26}), "the table keeps what arrived"

    # Redis restored from the data folder counts the same: the released records are quarantined no more.
    for query in queries:
        query.stop()
    late_before = figures.late(P0, "ad", ADS[0])
    figures.wipe_billing()
    restore_redis(settings.root, figures, _catalog(settings), Periods(), "billing")
    assert figures.quarantined() == held
    assert figures.late(P0, "ad", ADS[0]) == late_before
    assert reconcile(spark, reconcile_config(settings), _catalog(settings), until_ms=until, force=True).released == 0
    assert figures.quarantined() == held, "counted once after a restore"


def _catalog(settings: Settings):  # noqa: ANN202 - billing.catalog.Catalog
    return settings.catalog_store().current()


def test_the_job_killed_while_it_switches_to_a_new_version_loses_nothing_and_bills_nothing_twice(
    settings: Settings, tmp_path: Path
) -> None:
    settings.catalog_store().start(CATALOG)
    env = child_env(settings, ADBILL_METRICS_PORT="0", ADBILL_MAX_OFFSETS_PER_TRIGGER="2000", ADBILL_TRIGGER_MS="500")
    log_path = tmp_path / "job.log"
    log = log_path.open("ab")

    def start_job() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "ops.cli", "stream"], env=env, stdout=log, stderr=log)

    old, new = Producer(settings), Producer(settings)
    clicks: list[Click] = []
    for n in range(6_000):
        impression, click = pair(n, "v1")
        old.send(impression, click)
        clicks.append(click)
    old.flush()
    totals = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
    job_process = start_job()
    try:
        wait_for(lambda: (totals.last_applied("billing") or -1) >= 0, "a first billing batch", 180)
        new.deploy_version_2()
        for n in range(6_000, 9_000):
            impression, click = pair(n, "v2")
            new.send(impression, click, extra={ADDED_FIELD: "feed"})
            clicks.append(click)
        new.flush()
        for n in range(9_000, 12_000):  # more version 1 behind, so the switch has work in hand
            impression, click = pair(n, "v1")
            old.send(impression, click)
            clicks.append(click)
        old.flush()
        switching = "new schema versions in the registry"
        wait_for(lambda: switching in log_path.read_text(errors="replace"), "the job to switch versions", 180)
        job_process.send_signal(signal.SIGKILL)  # while it starts its query again
        assert job_process.wait(timeout=30) == -signal.SIGKILL
        assert not read_to_the_end(settings), "the kill left work for the restart, or the test proves nothing"
        job_process = start_job()
        wait_for(lambda: read_to_the_end(settings), "the job to commit up to the end of the topics", 240)
        rows = ledger_rows(settings)
    finally:
        job_process.send_signal(signal.SIGTERM)
        job_process.wait(timeout=60)
    assert len(rows) == len({r["click_id"] for r in rows}), "one bill per click across the kill"
    assert {r["click_id"]: r["amount_micros"] for r in rows} == expected_bills(clicks)
    assert quarantine_reasons(settings) == Counter()
    assert redis_ad_totals(settings) == ledger_ad_totals(rows)


@pytest.fixture
def registry(settings: Settings) -> Iterator[SchemaRegistry]:
    yield open_registry(settings.registry_location)


def test_an_incompatible_version_is_refused_with_a_clear_error(registry: SchemaRegistry) -> None:
    registry.register(subject_of("click"), schema_text("click"))
    schema = json.loads(schema_text("click"))
    schema["fields"].append({"name": "campaign_token", "type": "string"})  # required, no default: not BACKWARD
    with pytest.raises(IncompatibleSchemaError) as refused:
        registry.register(subject_of("click"), json.dumps(schema))
    message = str(refused.value)
    assert "clicks-value" in message and "campaign_token" in message, message
    assert registry.ids(subject_of("click")) == [1], "nothing registered"
