"""A producer deploys a new schema version while the job runs (DOMAIN.md "Events"): on real Kafka, Spark and Redis.

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

from attribution.closing import run_closing
from attribution.restore import restore_redis
from billing.compatibility import IncompatibleSchemaError
from billing.events import Click, Impression
from billing.periods import Periods
from billing.schemas import schema_text, subject_of
from billing.store.catalog_file import save_catalog
from billing.store.schema_registry import SchemaRegistry, open_registry
from ops.reconciling import reconcile_config
from ops.settings import Settings
from producers.publisher import EventPublisher
from producers.wire import EventSerializer, encode_body, frame, parse_avro_schema
from tests.conftest import child_env
from tests.integration.test_reconcile import corrections
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
P0 = "20260101T0000Z"
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
    save_catalog(CATALOG, settings.catalog_file)
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


def test_records_of_an_id_unknown_on_arrival_are_billed_once_it_is_registered(
    spark: SparkSession,
    settings: Settings,
    job,  # noqa: F811
) -> None:
    save_catalog(CATALOG, settings.catalog_file)
    queries = job()
    producer = Producer(settings)
    registry = producer.registry
    # A producer writes clicks with an id its registry has not given out yet (version 2 of clicks is registered
    # after they arrive), and a few with an id no registry ever holds.
    next_id = 1 + max(registry.ids(subject_of("impression")) + registry.ids(subject_of("click")))
    never_id = 4_242
    body_v2 = parse_avro_schema(version_2("click"))
    body_v1 = parse_avro_schema(schema_text("click"))
    early, never = [pair(n, "early") for n in range(20)], [pair(n, "never") for n in range(20, 25)]
    for impression, click in early:
        producer.send(impression)
        record = {**click.to_record(), ADDED_FIELD: "search"}
        producer.out.publish_raw(
            settings.topic_clicks, click.ad_id.encode(), frame(next_id, encode_body(body_v2, record))
        )
    for impression, click in never:
        producer.send(impression)
        value = frame(never_id, encode_body(body_v1, click.to_record()))
        producer.out.publish_raw(settings.topic_clicks, click.ad_id.encode(), value)
    producer.flush()
    process(queries)
    assert quarantine_reasons(settings) == Counter({"unknown_schema": 25})
    assert ledger_rows(settings) == []

    assert registry.register(subject_of("click"), version_2("click")) == next_id
    later = [pair(n, "later") for n in range(25, 35)]  # ordinary traffic: the next batch notices the new id
    producer.send(*[e for p in later for e in p])
    producer.flush()
    process(queries)
    released = ds.dataset(settings.root / "released", format="parquet", partitioning="hive").to_table()
    assert sorted(released.column("event_id").to_pylist()) == sorted(c.click_id for _, c in early)
    figures = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
    assert figures.quarantined() == {"unknown_schema": {settings.topic_clicks: 5}}, "the never-known ones stay"

    # Started again, the job releases nothing twice.
    for query in queries:
        query.stop()
    queries = job()[-1:]
    producer.send(*pair(35, "again"))
    producer.flush()
    process(queries)
    released = ds.dataset(settings.root / "released", format="parquet", partitioning="hive").to_table()
    assert released.num_rows == 20

    # Reconciliation bills the released clicks, once: ledger + corrections = the rule over what was decodable.
    until = T0 + 3_600_000
    report = run_closing(spark, reconcile_config(settings), _catalog(settings), until_ms=until, force=True)
    assert report.closed == [P0]
    booked = corrections(settings)
    assert Counter(c.click_id for c in booked) == Counter(c.click_id for _, c in early)
    final = {r["click_id"]: r["amount_micros"] for r in ledger_rows(settings)}
    final.update({c.click_id: c.amount_micros for c in booked})
    assert final == expected_bills([c for _, c in early + later] + [pair(35, "again")[1]])
    again = run_closing(spark, reconcile_config(settings), _catalog(settings), until_ms=until, force=True)
    assert (again.additions, again.retractions) == (0, 0)
    assert quarantine_reasons(settings) == Counter({"unknown_schema": 25}), "the table keeps what arrived"

    # Redis restored from the data folder counts the same: the released records are quarantined no more.
    for query in queries:
        query.stop()
    figures.wipe_billing()
    restore_redis(settings.root, figures, _catalog(settings), Periods(), "billing")
    assert figures.quarantined() == {"unknown_schema": {settings.topic_clicks: 5}}


def _catalog(settings: Settings):  # noqa: ANN202 - billing.catalog.Catalog
    from billing.store.catalog_file import load_catalog

    return load_catalog(settings.catalog_file)


def test_the_job_killed_while_it_switches_to_a_new_version_loses_nothing_and_bills_nothing_twice(
    settings: Settings, tmp_path: Path
) -> None:
    save_catalog(CATALOG, settings.catalog_file)
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
