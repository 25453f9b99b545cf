"""Publishing events to Kafka with confluent_kafka: the simulator's runs and recorded captures.

The Kafka client is created on first use, never at import. Values are framed Avro (`producers.wire`), keys the
ad_id in UTF-8; the `murmur2_random` partitioner is the Java client's, so an ad's impressions and clicks land
in partitions of the same number when both topics have the same partition count.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from tqdm import tqdm

from billing.catalog import Catalog, CatalogChange, CatalogError, MadeBy
from billing.events import TOPIC_OF, Event
from billing.schemas import schema_text
from billing.store.catalog_db import CatalogDatabase
from billing.store.catalog_file import operating_system_user, save_catalog
from billing.store.durable import write_whole
from billing.store.schema_registry import SchemaRegistry, open_registry
from producers.arrivals import Arrival
from producers.capture import (
    BudgetLine,
    CaptureError,
    CatalogEdit,
    CatalogLine,
    ExclusionLine,
    SchemaLine,
    catalog_change_of,
    read_capture_with_extras,
)
from producers.ground_truth import GroundTruth
from producers.simulator import (
    CATALOG_LEAD_MS,
    CatalogFollower,
    Clock,
    LiveSchedule,
    RunEdits,
    SimulationConfig,
    Simulator,
    Sleep,
    system_clock_ms,
    with_catalog_lines,
    write_run,
)
from producers.wire import EventSerializer, RawRecord, with_optional_field

PRODUCER_DEFAULTS: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 10,
    "batch.size": 1_000_000,
    "batch.num.messages": 100_000,
    "compression.type": "lz4",
    "partitioner": "murmur2_random",
    "queue.buffering.max.messages": 500_000,
}
"""Producer settings; `extra_config` overrides any of them."""

KAFKA_CLIENT_LOGGER = "librdkafka"
"""The Python logger librdkafka's own log lines go to (the `logger` setting; `ops.reach` sends it to a file)."""

MAX_FAILURE_EXAMPLES = 20
MAX_REPORTED_LINES = 1_000


@dataclass
class PublishSummary:
    """What a publisher sent and what the broker acknowledged."""

    sent: dict[str, int] = field(default_factory=dict)
    """Events handed to the client, by event type."""
    raw: int = 0
    delivered: int = 0
    delivery_failures: int = 0
    failure_examples: list[str] = field(default_factory=list)
    undelivered: int = 0
    """Messages still queued when the final flush timed out."""
    elapsed_s: float = 0.0
    interrupted: bool = False
    live_offset_ms: int | None = None
    """Live runs: clock time minus simulated time (how far behind the clock in-order events were sent)."""
    live_max_behind_ms: int | None = None
    """Live runs: the most any record went out after its due time (a sender behind schedule)."""
    schema_deployed: dict[str, int] | None = None
    """Runs that deployed a schema version part-way (`deploy_schema_at_s`): its id per event type."""

    @property
    def not_delivered(self) -> int:
        """Records the broker did not acknowledge: failed, or still queued when the final flush timed out."""
        return self.delivery_failures + self.undelivered

    @property
    def total(self) -> int:
        """Events and raw records sent."""
        return sum(self.sent.values()) + self.raw

    @property
    def rate_per_s(self) -> float:
        """Records sent per second of the run."""
        return self.total / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict, with the total and rate."""
        return {
            "sent": dict(self.sent),
            "raw": self.raw,
            "total": self.total,
            "delivered": self.delivered,
            "delivery_failures": self.delivery_failures,
            "failure_examples": list(self.failure_examples),
            "undelivered": self.undelivered,
            "elapsed_s": round(self.elapsed_s, 3),
            "rate_per_s": round(self.rate_per_s, 1),
            "interrupted": self.interrupted,
            "schema_deployed": self.schema_deployed,
            "live": None
            if self.live_offset_ms is None
            else {"offset_ms": self.live_offset_ms, "max_behind_ms": self.live_max_behind_ms},
        }

    def line(self) -> str:
        """One human line, for the end of a run."""
        by_type = ", ".join(f"{count} {kind}s" for kind, count in sorted(self.sent.items()))
        text = (
            f"sent {self.total} records ({by_type or 'no events'}, {self.raw} raw) "
            f"in {self.elapsed_s:.1f} s, {self.rate_per_s:,.0f}/s; "
            f"delivered {self.delivered}, failed {self.delivery_failures}"
        )
        if self.undelivered:
            text += f", {self.undelivered} still queued at the flush timeout"
        if self.live_offset_ms is not None:
            text += f"; live, {self.live_offset_ms} ms behind the clock, worst record {self.live_max_behind_ms} ms late"
        if self.interrupted:
            text += " (interrupted)"
        return text


class EventPublisher:
    """Sends events and raw records to Kafka; delivery failures are counted and reported, never raised.

    `topics` maps event types to topic names (default `billing.events.TOPIC_OF`). Raw records name a topic; a
    contract topic name (`impressions`, `clicks`) goes to the topic configured for that event type, any other
    name is used as given.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        serializer: EventSerializer,
        topics: Mapping[str, str] | None = None,
        extra_config: Mapping[str, Any] | None = None,
        producer_factory: Callable[[dict[str, Any]], Any] | None = None,
    ) -> None:
        self.topics = dict(TOPIC_OF if topics is None else topics)
        missing = set(TOPIC_OF) - set(self.topics)
        if missing:
            raise ValueError(f"no topic given for event type(s) {sorted(missing)}")
        self.serializer = serializer
        self.config: dict[str, Any] = {
            "bootstrap.servers": bootstrap_servers,
            "logger": logging.getLogger(KAFKA_CLIENT_LOGGER),
            **PRODUCER_DEFAULTS,
            **(extra_config or {}),
        }
        self._factory = producer_factory
        self._producer: Any = None
        self._raw_topics = {TOPIC_OF[kind]: topic for kind, topic in self.topics.items() if kind in TOPIC_OF}
        self._sent: Counter[str] = Counter()
        self._raw = 0
        self._delivered = 0
        self._failures = 0
        self._examples: list[str] = []
        self._undelivered = 0
        self._unpolled = 0
        self._started = time.monotonic()

    @property
    def producer(self) -> Any:
        """The Kafka client, created on first use."""
        if self._producer is None:
            factory = self._factory or Producer
            self._producer = factory(dict(self.config, on_delivery=self._on_delivery))
            self._started = time.monotonic()
        return self._producer

    def publish(self, item: Arrival | Event | RawRecord, extra: Mapping[str, Any] | None = None) -> None:
        """Send one simulator arrival, event or raw record (`extra`: as `publish_event` takes it)."""
        if isinstance(item, Arrival):
            item = item.item
        if isinstance(item, RawRecord):
            self.publish_raw(item.topic, item.key, item.value)
        else:
            self.publish_event(item, extra)

    def publish_event(self, event: Event, extra: Mapping[str, Any] | None = None) -> None:
        """Send one event to its type's topic, keyed by its ad_id; `extra`: values of fields the schema version in
        use adds (`EventSerializer.serialize`)."""
        self._produce(self.topics[event.type], self.serializer.serialize(event, extra), event.ad_id.encode("utf-8"))
        self._sent[event.type] += 1

    def publish_raw(self, topic: str, key: bytes | None, value: bytes) -> None:
        """Send bytes as they are (bad input, to show the quarantine) to `topic`, mapped as the class says."""
        self._produce(self._raw_topics.get(topic, topic), value, key)
        self._raw += 1

    def poll(self, timeout_s: float = 0.0) -> None:
        """Serve delivery reports."""
        if self._producer is not None:
            self._producer.poll(timeout_s)

    def flush(self, timeout_s: float = 60.0) -> int:
        """Wait for every queued message to be delivered or failed; returns how many are still queued."""
        if self._producer is None:
            return 0
        self._undelivered = self._producer.flush(timeout_s)
        return self._undelivered

    def summary(self) -> PublishSummary:
        """The counts so far; call after `flush` for final delivery figures."""
        return PublishSummary(
            sent=dict(sorted(self._sent.items())),
            raw=self._raw,
            delivered=self._delivered,
            delivery_failures=self._failures,
            failure_examples=list(self._examples),
            undelivered=self._undelivered,
            elapsed_s=time.monotonic() - self._started,
        )

    def _produce(self, topic: str, value: bytes, key: bytes | None) -> None:
        producer = self.producer
        while True:
            try:
                producer.produce(topic, value=value, key=key)
                break
            except BufferError:
                # The local queue is full: let the client send and serve delivery reports, then try again.
                producer.poll(0.05)
            except KafkaException as exc:
                self._failed(topic, exc.args[0] if exc.args else exc)
                break
        self._unpolled += 1
        if self._unpolled >= 100:
            self._unpolled = 0
            producer.poll(0)

    def _on_delivery(self, error: KafkaError | None, message: Message) -> None:
        if error is None:
            self._delivered += 1
        else:
            self._failed(message.topic(), error)

    def _failed(self, topic: str | None, error: Any) -> None:
        self._failures += 1
        if len(self._examples) < MAX_FAILURE_EXAMPLES:
            self._examples.append(f"{topic}: {error}")


class Pacer:
    """Holds a fixed offered rate by sleeping in small batches; `Pacer(None)` never sleeps.

    Behind schedule (a slow broker), it catches up by at most `max_burst_s` worth of records, so a stall does
    not turn into an unbounded burst.
    """

    def __init__(
        self,
        rate_per_s: float | None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        max_burst_s: float = 1.0,
    ) -> None:
        if rate_per_s is not None and not rate_per_s > 0:
            raise ValueError("a rate is a positive number of records per second (or None: no pacing)")
        self.rate_per_s = rate_per_s
        self._clock, self._sleep = clock, sleep
        self._max_burst_s = max_burst_s
        # Check the clock about every 5 ms of schedule: cheap, and smooth enough for a broker.
        self._batch = 1 if rate_per_s is None else max(1, int(rate_per_s / 200))
        self._count = 0
        self._unchecked = 0
        self._base: float | None = None
        self._base_count = 0

    def pace(self, count: int = 1) -> None:
        """Account for `count` records just sent; sleep if they went out ahead of the schedule."""
        if self.rate_per_s is None:
            return
        if self._base is None:
            self._base = self._clock()
        self._count += count
        self._unchecked += count
        if self._unchecked < self._batch:
            return
        self._unchecked = 0
        due = self._base + (self._count - self._base_count) / self.rate_per_s
        now = self._clock()
        if now < due:
            self._sleep(due - now)
        elif now - due > self._max_burst_s:
            self._base, self._base_count = now - self._max_burst_s, self._count


class _Progress:
    """A tqdm bar on a terminal (or nothing when not a TTY or not wanted), updated in batches."""

    def __init__(self, enabled: bool, total: int | None, description: str) -> None:
        show = enabled and sys.stderr.isatty()
        self.bar = tqdm(total=total, desc=description, unit="rec", unit_scale=True, disable=not show)
        self._pending = 0

    def advance(self) -> None:
        self._pending += 1
        if self._pending >= 1000:
            self.bar.update(self._pending)
            self._pending = 0

    def close(self) -> None:
        self.bar.update(self._pending)
        self._pending = 0
        self.bar.close()


def _registry(registry: SchemaRegistry | str) -> SchemaRegistry:
    return open_registry(registry) if isinstance(registry, str) else registry


def apply_to_store(store: CatalogDatabase, line: CatalogEdit, now_ms: int, made_by: MadeBy | None = None) -> Catalog:
    """Make a capture's (or a run's) change of the catalog in the pipeline's catalog, as a back-fill with its own
    `effective_from`, under the store's lock (`CatalogDatabase.change` for prices; budgets and the IP exclusion list
    the same way), its entry in the change log made by `made_by`; CatalogError when the catalog refuses it. The new
    catalog."""
    return store.change(catalog_change_of(line), lambda: now_ms, backfill=True, made_by=made_by)


class LeftAlone(CatalogError):
    """A run's own change of the catalog that it does not make: someone else changed that part (`RunEdits`)."""


def apply_run_line(
    store: CatalogDatabase, line: CatalogEdit, now_ms: int, edits: RunEdits | None, made_by: MadeBy | None = None
) -> Catalog:
    """A run's own change of the catalog (`apply_to_store`); with `edits` (a run that follows the catalog), checked
    under the catalog's lock against the catalog as it is, so a change someone else made meanwhile is never undone
    (LeftAlone, a CatalogError, says why)."""
    if edits is None:
        return apply_to_store(store, line, now_ms, made_by)

    def check(catalog: Catalog) -> None:
        why = edits.leaves_alone(catalog, line)
        if why is not None:
            raise LeftAlone(why)

    change = catalog_change_of(line)

    def request(current: Catalog | None, now: int) -> CatalogChange:
        if current is not None:
            check(current)
        return change

    changed = store.change(request, lambda: now_ms, backfill=True, made_by=made_by)
    edits.made(changed)
    return changed


DEPLOYED_FIELD = "placement"
"""The field the schema version a run deploys part-way adds (`deploy_schema_at_s`)."""
DEPLOYED_VALUES = {DEPLOYED_FIELD: "feed"}


def deploy_schema_version(serializer: EventSerializer, registry: SchemaRegistry) -> dict[str, int]:
    """Register a new version of both event types' schemas (their shipped version plus `DEPLOYED_FIELD`) and write
    with it from now on, as producer teams deploying it do; its id per event type."""
    return {
        event_type: serializer.use_version(
            registry, event_type, with_optional_field(schema_text(event_type), DEPLOYED_FIELD)
        )
        for event_type in ("impression", "click")
    }


def simulate_to_kafka(
    config: SimulationConfig,
    bootstrap_servers: str,
    registry: SchemaRegistry | str,
    run_dir: str | os.PathLike[str],
    topics: Mapping[str, str] | None = None,
    rate: float | None = None,
    progress: bool = True,
    clock: Clock = system_clock_ms,
    extra_config: Mapping[str, Any] | None = None,
    flush_timeout_s: float = 120.0,
    live: bool = False,
    sleep: Sleep = time.sleep,
    catalog_store: CatalogDatabase | None = None,
    deploy_schema_at_s: float | None = None,
    follow_catalog: bool = False,
) -> PublishSummary:
    """Simulate a run, publish it, and write its folder (catalog, ground truth, summary, publish report).

    `follow_catalog` (with a `catalog_store`; the local stack's traffic): the traffic goes to the ads of the
    pipeline's catalog as it is, read again every second of event time (`CatalogFollower`), so an ad an admin
    creates gets traffic; and the run leaves alone what someone else changed (`RunEdits`): it makes none of its own
    changes to an ad, a campaign's budget or an IP range that was changed by anyone else since it started (or by a
    person, when the entry says who made it).

    `catalog_store`: the pipeline's catalog, which the run's changes of the catalog (`SimulationConfig.catalog_lines`:
    prices, budgets, the IP exclusion list) are made in as the run goes, each `CATALOG_LEAD_MS` of the run's time
    before it takes effect (so, live, before the clock reaches it; `apply_to_store`); one the catalog refuses (a
    range already excluded then, by an earlier run) is reported and left out. The ground truth is then billed by
    that store's history as it stands at the end, which holds every change anyone made meanwhile. Without a store
    the run's own history (`Simulator.catalog`) bills it.

    `live`: each record goes out when the clock reaches its arrival time (`LiveSchedule`), the line starting
    now, so the stream's event time tracks the clock; the rate is the config's own
    (`SimulationConfig.at_arrival_rate`), and `rate` must be None. Otherwise records go out at `rate` per second,
    or as fast as possible.

    `deploy_schema_at_s`: once the run's time is that many seconds past its start, the producers deploy a new
    schema version of both event types (one more optional field, `DEPLOYED_FIELD`: `with_optional_field`),
    registered then, and write every later event with it, the field set; the ground truth is the same.

    `catalog.json` is written before the first record, so the pipeline can load it. The ground truth assumes
    every record sent was received: check the summary's delivery failures. On Ctrl-C the run stops, what was
    sent is flushed and its ground truth written, with `"complete": false` in `summary.json`.
    """
    schema_registry = _registry(registry)
    serializer = EventSerializer(schema_registry)
    simulator = Simulator(config, clock, rate, live)
    folder = Path(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    save_catalog(simulator.catalog, folder / "catalog.json")
    spill = folder / ".ground-truth-work"
    truth = GroundTruth.for_arrivals(config.expected_arrivals(), simulator.catalog, str(spill))
    publisher = EventPublisher(bootstrap_servers, serializer, topics, extra_config)
    pacer = Pacer(rate)
    bar = _Progress(progress, config.expected_arrivals(), "simulate")

    def wait(seconds: float) -> None:
        # Serve delivery reports while waiting; short naps, so a long gap does not leave them unserved.
        publisher.poll(0)
        sleep(min(seconds, 0.5))

    schedule = LiveSchedule(clock, wait) if live else None
    follower = CatalogFollower(catalog_store.current) if follow_catalog and catalog_store is not None else None
    edits = RunEdits(catalog_store.current().version) if follower is not None and catalog_store is not None else None
    generated = simulator.arrivals(follower)
    arrivals = generated if schedule is None else schedule.run(generated)
    lines = simulator.catalog_lines if catalog_store is not None else []
    deploy_at_ms = None if deploy_schema_at_s is None else simulator.start_ms + int(deploy_schema_at_s * 1000)
    deployed: dict[str, int] | None = None
    interrupted = False
    try:
        try:
            for arrival in with_catalog_lines(arrivals, lines, CATALOG_LEAD_MS):
                if not isinstance(arrival, Arrival):
                    # The run's schedule, like a capture's catalog lines: made at its own effective time.
                    assert catalog_store is not None
                    try:
                        apply_run_line(catalog_store, arrival, clock(), edits, simulator_made_by())
                    except CatalogError as exc:
                        print(f"the run's change of the catalog was not made: {exc}", file=sys.stderr, flush=True)
                    continue
                if deploy_at_ms is not None and deployed is None and arrival.arrival_ms >= deploy_at_ms:
                    deployed = deploy_schema_version(serializer, schema_registry)
                    print(f"deployed a schema version: ids {deployed}", file=sys.stderr, flush=True)
                publisher.publish(arrival, DEPLOYED_VALUES if deployed else None)
                truth.observe(arrival)
                pacer.pace()
                bar.advance()
        except KeyboardInterrupt:
            interrupted = True
        publisher.flush(flush_timeout_s)
        summary = publisher.summary()
        summary.interrupted = interrupted
        summary.schema_deployed = deployed
        if schedule is not None and schedule.offset_ms is not None:
            summary.live_offset_ms, summary.live_max_behind_ms = schedule.offset_ms, schedule.max_behind_ms
        billed_by = catalog_store.current() if catalog_store is not None else simulator.catalog
        truth.catalog = billed_by
        write_run(folder, config, simulator.start_ms, truth, billed_by, complete=not interrupted)
        _write_json(folder / "publish.json", summary.to_dict())
    finally:
        truth.close()
        shutil.rmtree(spill, ignore_errors=True)
        bar.close()
    print(summary.line(), file=sys.stderr)
    return summary


@dataclass
class ReplaySummary:
    """What a replay read and sent; `errors` holds the first bad lines (all are counted in `bad_lines`)."""

    publish: PublishSummary
    lines: int = 0
    events: int = 0
    raw: int = 0
    bad_lines: int = 0
    catalog_changes: int = 0
    """Changes of the catalog made: `ad`, `budget` and `ip_exclusion` lines."""
    schemas: int = 0
    """Schema versions registered, and used from their line on."""
    errors: list[CaptureError] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the counts, the errors and the publisher's own (`PublishSummary.to_dict`)."""
        counts = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("publish", "errors")}
        return counts | {"errors": [asdict(e) for e in self.errors], "publish": self.publish.to_dict()}

    def line(self) -> str:
        """One human line, for the end of a replay."""
        text = f"replayed {self.lines} lines: {self.events} events, {self.raw} raw, {self.bad_lines} bad"
        text += f", {self.catalog_changes} catalog changes" if self.catalog_changes else ""
        text += f", {self.schemas} schema versions; " if self.schemas else "; "
        return text + self.publish.line()


def replay_to_kafka(
    path: str | os.PathLike[str],
    bootstrap_servers: str,
    registry: SchemaRegistry | str,
    topics: Mapping[str, str] | None = None,
    rate: float | None = None,
    progress: bool = True,
    extra_config: Mapping[str, Any] | None = None,
    flush_timeout_s: float = 120.0,
    apply_catalog: Callable[[CatalogEdit], None] | None = None,
) -> ReplaySummary:
    """Send a recorded capture in its order; raw lines go as given, bad lines are reported, not sent; `ad`, `budget`
    and `ip_exclusion` lines are handed to `apply_catalog` (the catalog's store, as a back-fill: `apply_to_store`)
    where they stand, before the lines after them are sent (a refused change is reported as a bad line). Without
    `apply_catalog` such a line is a bad line.

    A raw line's topic is mapped like `EventPublisher.publish_raw` does: `clicks` and `impressions` go to the
    topics configured for those event types.
    """
    schema_registry = _registry(registry)
    serializer = EventSerializer(schema_registry)
    publisher = EventPublisher(bootstrap_servers, serializer, topics, extra_config)
    pacer = Pacer(rate)
    bar = _Progress(progress, _count_lines(path), "replay")
    result = ReplaySummary(PublishSummary())
    interrupted = False
    try:
        for item, extra in read_capture_with_extras(path):
            bar.advance()
            if isinstance(item, CatalogLine | BudgetLine | ExclusionLine):
                refused = _apply(item, apply_catalog)
                if refused is None:
                    result.catalog_changes += 1
                    continue
                item = refused
            if isinstance(item, SchemaLine):
                deployed = deploy_schema(serializer, schema_registry, item)
                if not isinstance(deployed, CaptureError):
                    result.schemas += 1
                    continue
                item = deployed
            if isinstance(item, CaptureError):
                result.bad_lines += 1
                if len(result.errors) < MAX_REPORTED_LINES:
                    result.errors.append(item)
                continue
            if extra and not isinstance(item, RawRecord):
                publisher.publish_event(item, extra)
            else:
                publisher.publish(item)
            if isinstance(item, RawRecord):
                result.raw += 1
            else:
                result.events += 1
            pacer.pace()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        bar.close()
    publisher.flush(flush_timeout_s)
    result.publish = publisher.summary()
    result.publish.interrupted = interrupted
    result.lines = result.events + result.raw + result.bad_lines + result.catalog_changes + result.schemas
    print(result.line(), file=sys.stderr)
    for error in result.errors[:20]:
        print(f"  {error}", file=sys.stderr)
    return result


def deploy_schema(serializer: EventSerializer, registry: SchemaRegistry, line: SchemaLine) -> SchemaLine | CaptureError:
    """Register a capture's schema version and write its subject's events with it from now on, as the producer that
    deployed it did; a CaptureError (the version in use unchanged) when the registry refuses it."""
    from billing.compatibility import IncompatibleSchemaError, InvalidSchemaError
    from billing.schemas import event_type_of_subject
    from billing.store.schema_registry import SchemaRegistryError

    try:
        serializer.use_version(registry, event_type_of_subject(line.subject), line.schema_text)
    except (IncompatibleSchemaError, InvalidSchemaError, SchemaRegistryError, ValueError) as exc:
        return CaptureError(line.line_number, f"schema version refused: {exc}", line.schema_text[:2_000])
    return line


def _apply(line: CatalogEdit, apply_catalog: Callable[[CatalogEdit], None] | None) -> CaptureError | None:
    """Apply a capture's catalog change; the line as an error when there is no catalog to apply it to, or the
    catalog refuses it."""
    if apply_catalog is None:
        kind = {CatalogLine: "an ad", BudgetLine: "a budget", ExclusionLine: "an ip_exclusion"}[type(line)]
        return CaptureError(line.line_number, f"{kind} line needs the catalog (adbill replay applies it)", "")
    try:
        apply_catalog(line)
    except CatalogError as exc:
        return CaptureError(line.line_number, f"catalog change refused: {exc}", "")
    return None


def _count_lines(path: str | os.PathLike[str]) -> int | None:
    try:
        with open(path, "rb") as source:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: source.read(1 << 20), b""))
    except OSError:
        return None


def _write_json(path: Path, data: Any) -> None:
    write_whole(path, json.dumps(data, indent=1) + "\n")


def simulator_made_by() -> MadeBy:
    """The author of the simulator's own catalog changes, in the catalog's change log: whoever runs it, through the
    simulator's door (so that its changes are told apart from a person's)."""
    return MadeBy(operating_system_user(), "simulator")
