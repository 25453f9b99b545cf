"""Benchmark traffic, made before the timed window: simulated runs, pre-serialized, with their ground truth.

On a 2-core machine the Python simulator would take CPU from the system under test while it produces (it
simulates, keeps the ground truth and serializes about 80,000 events/s on one core). So the benchmark
generates every run first (`plan_traffic`) into a folder per run (`Dataset`):

- `frames.bin`: the Kafka records in send order, each `<topic index, key length, value length>` then the key
  and the Confluent-framed Avro value, exactly as `producers.publisher` would send them;
- `billable.jsonl`, `summary.json`, `catalog.json`: the simulator's ground truth (`producers.simulator`);

and the paced sender (`python -m ops.bench.traffic`, a child process so its CPU is measured apart) only reads
frames and calls `produce()`, through `producers.publisher.EventPublisher` and `Pacer`.

Runs are placed on one event-time line, each starting a minute after the last event of the one before, so
that no click of a run can be attributed to an impression of another (the window is 10 s) and each run's
ground truth holds on its own; the line starts at a fixed instant in the past, so the plan is the same every
time and is cached under `CACHE/<key>/` (the key covers the plan and the code that makes it). Event ids carry
the run's name (`step2-c0000000041`), so the ledger's rows can be told apart by run.

The soak sends one template run over and over (`--cycles`): cycle N renames every event id and user id with
the suffix `.N` and moves event times N cycle spans later, so cycles never share a user (no click of one can
match an impression of another) and the ground truth of cycle N is the template's, renamed (`cycle_truth`).
Each template event is serialized once and cut where a cycle changes it (`CycleFrames`): a cycle's record is its
pieces joined with the renamed id, user and time encoded in between, the bytes `cycle_event` serialized would give,
at a third of the sender's CPU.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import struct
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from billing.store.catalog_file import save_catalog

BASE_START_MS = 1_735_689_600_000
"""2025-01-01T00:00Z: the event time of the first run's first impression."""
GAP_MS = 60_000
"""Event time between the last event of a run and the first of the next."""
SIMULATOR_SHAPE = {"advertisers": 5, "campaigns_per_advertiser": 3, "ads_per_campaign": 4}
"""The catalog's shape, as the local stack's (`ops.stack.ensure_catalog`): 60 ads."""
V = TypeVar("V")

USERS = 1_000
USERS_PER_EVENT_PER_S = 20
"""A run has `max(USERS, USERS_PER_EVENT_PER_S x rate)` users: each then clicks about once in four minutes at any
rate (a tenth of the arrivals are clicks), as people do. With a thousand users at 10,000 events/s each clicked
every second: nearly every click was a flood or a double click by the rules, and the stream refused most of the
clicks it read."""

INVALID_TRAFFIC: dict[str, Any] = {"crawler_fraction": 0.01, "double_click_fraction": 0.01, "flood_fraction": 0.01}
"""Invalid traffic the benchmark's runs carry (per ordinary click), so the stream's rules have clicks to judge:
crawlers, double clicks and floods. Excluded ranges and budgets are in the plan's catalog instead (`BENCH_BUDGETS`,
`BENCH_EXCLUSIONS`): every run shares it, and the simulator's own ranges and budgets change within a run."""

BENCH_BUDGETS = 3
"""Campaigns of the plan's catalog with a daily budget (large enough that no run exhausts it: a run's budget
decisions would otherwise depend on the order the stream reads its clicks, which reconciliation corrects), so the
stream's budget check runs on their clicks."""
BENCH_EXCLUSIONS = ("198.51.100.0/24", "2001:db8::/32")
"""IP ranges the plan's catalog excludes (no simulated user's address is in them), so the exclusion check runs."""

FRAME_HEADER = struct.Struct("<BHI")
TOPICS = ("impressions", "clicks")
"""Topic index in a frame to the contract's topic name."""
NO_KEY = 0xFFFF

_CODE = (
    "producers/simulator.py",
    "producers/wire.py",
    "billing/rule.py",
    "billing/intake.py",
    "billing/catalog.py",
    "ops/bench/traffic.py",
)
"""The files whose change makes a cached plan stale."""


@dataclass(frozen=True)
class Dataset:
    """One generated run: its frames and ground truth in `folder`."""

    folder: Path
    name: str
    rate: int
    """The offered rate it is made for: its event-time density."""
    events: int
    start_ms: int
    last_event_ms: int
    frames: int = 0
    """Records in `frames.bin`."""

    @property
    def frames_file(self) -> Path:
        return self.folder / "frames.bin"

    @property
    def capture_file(self) -> Path:
        return self.folder / "capture.jsonl"

    @property
    def billable_file(self) -> Path:
        return self.folder / "billable.jsonl"

    def truth(self) -> dict[str, int]:
        """click_id -> amount in micros of every click the run must bill."""
        out = {}
        with self.billable_file.open(encoding="utf-8") as lines:
            for line in lines:
                row = json.loads(line)
                out[row["click_id"]] = row["amount_micros"]
        return out

    def refused(self) -> dict[str, str]:
        """click_id -> why the run must not charge it, of every billable click it does not charge."""
        path = self.folder / "not_charged.jsonl"
        if not path.exists():
            return {}
        with path.open(encoding="utf-8") as lines:
            return {row["click_id"]: row["reason"] for row in map(json.loads, lines)}

    def summary(self) -> dict[str, Any]:
        """The simulator's counts of the run (`summary.json`)."""
        return dict(json.loads((self.folder / "summary.json").read_text(encoding="utf-8")))

    def to_dict(self) -> dict[str, Any]:
        return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Dataset:
        return cls(**{**data, "folder": Path(data["folder"])})


@dataclass(frozen=True)
class TrafficPlan:
    """Every run a benchmark sends, with the schema registry their frames were framed with: a backlog the
    systems start on, the steps at offered rates, and a burst sent at once after the steps."""

    folder: Path
    backlog: Dataset | None
    steps: list[Dataset]
    burst: Dataset | None = None

    @property
    def registry_file(self) -> Path:
        return self.folder / "schemas.json"

    @property
    def catalog_file(self) -> Path:
        return self.folder / "catalog.json"

    def datasets(self) -> list[Dataset]:
        return [d for d in (self.backlog, *self.steps, self.burst) if d is not None]


def arrivals_per_impression() -> float:
    """Arrivals the simulator sends per impression with the benchmark's fractions (clicks, duplicates, bad)."""
    from producers.simulator import SimulationConfig

    return SimulationConfig(impression_rate=1.0, events=0, late_fraction=0.0, **INVALID_TRAFFIC).expected_arrival_rate()


def simulation_config(name: str, rate: int, events: int, start_ms: int, seed: int) -> Any:
    """The simulator's configuration of one run: the simulator's defaults (disorder, duplicates, bad input), no
    late events (the stream would miss their clicks by design and reconciliation book them, so the ledger would
    not equal the ground truth), and an impression rate that makes `rate` arrivals per second of event time."""
    from producers.simulator import SimulationConfig

    return SimulationConfig(
        **SIMULATOR_SHAPE,
        users=max(USERS, USERS_PER_EVENT_PER_S * rate),
        impression_rate=rate / arrivals_per_impression(),
        late_fraction=0.0,
        seed=seed,
        start_ms=start_ms,
        events=events,
        id_prefix=name,
        **INVALID_TRAFFIC,
    )


def generate(folder: Path, name: str, rate: int, events: int, start_ms: int, seed: int, registry: Any) -> Dataset:
    """Simulate one run into `folder`: frames, ground truth and a `dataset.json` that describes it."""
    from billing.events import TOPIC_OF
    from producers.ground_truth import GroundTruth
    from producers.simulator import Simulator, write_run
    from producers.wire import EventSerializer, RawRecord

    config = simulation_config(name, rate, events, start_ms, seed)
    simulator = Simulator(config)
    serializer = EventSerializer(registry)
    folder.mkdir(parents=True, exist_ok=True)
    truth = GroundTruth.for_arrivals(config.expected_arrivals(), simulator.catalog, str(folder / ".truth-work"))
    frames = 0
    try:
        with (folder / "frames.bin").open("wb") as out:
            for arrival in simulator.arrivals():
                truth.observe(arrival)
                item = arrival.item
                if isinstance(item, RawRecord):
                    write_frame(out, item.topic, item.key, item.value)
                else:
                    write_frame(out, TOPIC_OF[item.type], item.ad_id.encode("utf-8"), serializer.serialize(item))
                frames += 1
        last_event_ms = truth.last_event_ms or start_ms
        write_run(folder, config, simulator.start_ms, truth, simulator.catalog)
    finally:
        truth.close()
        shutil.rmtree(folder / ".truth-work", ignore_errors=True)
    dataset = Dataset(folder, name, rate, events, start_ms, last_event_ms + 1, frames)
    (folder / "dataset.json").write_text(json.dumps(dataset.to_dict(), indent=1))
    return dataset


def write_frame(out: Any, topic: str, key: bytes | None, value: bytes) -> None:
    out.write(FRAME_HEADER.pack(TOPICS.index(topic), NO_KEY if key is None else len(key), len(value)))
    if key:
        out.write(key)
    out.write(value)


def read_frames(path: Path) -> Iterator[tuple[str, bytes | None, bytes]]:
    """(contract topic, key, value) of each record of a frames file, in send order."""
    data = path.read_bytes()
    position, size, header = 0, len(data), FRAME_HEADER.size
    while position < size:
        topic, key_size, value_size = FRAME_HEADER.unpack_from(data, position)
        position += header
        key = None
        if key_size != NO_KEY:
            key = data[position : position + key_size]
            position += key_size
        yield TOPICS[topic], key, data[position : position + value_size]
        position += value_size


def plan_traffic(
    cache_dir: Path,
    rates: list[int],
    duration_s: int,
    backlog_events: int,
    seed: int,
    template_s: int = 0,
    burst_events: int = 0,
) -> TrafficPlan:
    """The runs of a benchmark, generated once and cached, in event-time order: a backlog of `backlog_events`,
    one run per offered rate of `duration_s` seconds, a burst of `burst_events` (backlog and burst at the highest
    rate's density; none when 0); or, with `template_s`, one soak template of that many seconds at `rates[0]`
    with its capture for cycling."""
    key = _plan_key([rates, duration_s, backlog_events, seed, template_s, burst_events])
    folder = cache_dir / key
    plan_file = folder / "plan.json"
    if plan_file.exists():
        data = json.loads(plan_file.read_text())

        def load(entry: dict[str, Any] | None) -> Dataset | None:
            return Dataset.from_dict(entry) if entry else None

        return TrafficPlan(
            folder, load(data["backlog"]), [Dataset.from_dict(d) for d in data["steps"]], load(data.get("burst"))
        )
    from billing.store.schema_registry import open_registry
    from producers.simulator import Simulator, write_capture

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    registry = open_registry(str(folder / "schemas.json"))
    started = time.monotonic()
    start_ms = BASE_START_MS

    def run(name: str, rate: int, events: int) -> Dataset:
        nonlocal start_ms
        dataset = generate(folder / name, name, rate, events, start_ms, seed, registry)
        start_ms = dataset.last_event_ms + GAP_MS
        return dataset

    backlog = burst = None
    steps = []
    if template_s:
        rate = rates[0]
        steps.append(run("soak", rate, rate * template_s))
        config = simulation_config("soak", rate, rate * template_s, steps[0].start_ms, seed)
        write_capture(Simulator(config).arrivals(), steps[0].capture_file)
    else:
        if backlog_events:
            backlog = run("backlog", max(rates), backlog_events)
        steps = [run(f"step{number}", rate, rate * duration_s) for number, rate in enumerate(rates, start=1)]
        if burst_events:
            burst = run("burst", max(rates), burst_events)
    catalog = simulation_config("catalog", rates[0], 0, BASE_START_MS, seed).catalog()
    for campaign in catalog.campaign_ids[:BENCH_BUDGETS]:
        catalog = catalog.with_budget(campaign, 0, 10**15, 0, backfill=True)
    for cidr in BENCH_EXCLUSIONS:
        catalog = catalog.with_exclusion(cidr, 0, True, 0, backfill=True)
    save_catalog(catalog, folder / "catalog.json")
    plan = TrafficPlan(folder, backlog, steps, burst)
    plan_file.write_text(
        json.dumps(
            {
                "backlog": backlog.to_dict() if backlog else None,
                "steps": [s.to_dict() for s in steps],
                "burst": burst.to_dict() if burst else None,
                "generated_in_s": round(time.monotonic() - started, 1),
            },
            indent=1,
        )
    )
    return plan


def _plan_key(parameters: list[Any]) -> str:
    from ops.settings import PROJECT_ROOT

    digest = hashlib.sha256(json.dumps(parameters).encode())
    for name in _CODE:
        digest.update((PROJECT_ROOT / name).read_bytes())
    return digest.hexdigest()[:16]


def cycle_event(item: Any, cycle: int, span_ms: int) -> Any:
    """The template's event (or raw record, unchanged) as cycle `cycle` sends it (module doc): the definition
    that `cycle_truth` relies on and that `CycleFrames`, which the sender uses, is tested against."""
    from billing.events import Impression
    from billing.intake import MIN_EVENT_TIME_MS

    if not hasattr(item, "event_time"):
        return item
    suffix = f".{cycle}"
    # An out-of-range time stays out of range: only valid times move.
    shift = cycle * span_ms if item.event_time >= MIN_EVENT_TIME_MS else 0
    if isinstance(item, Impression):
        return replace(
            item,
            impression_id=item.impression_id + suffix,
            user_id=item.user_id + suffix,
            event_time=item.event_time + shift,
        )
    return replace(
        item, click_id=item.click_id + suffix, user_id=item.user_id + suffix, event_time=item.event_time + shift
    )


def cycle_truth(template: dict[str, V], cycles: int) -> dict[str, V]:
    """The ground truth of `cycles` cycles of a template run: its billable clicks (or those not charged, with their
    reasons), renamed per cycle."""
    return {f"{click_id}.{cycle}": amount for cycle in range(cycles) for click_id, amount in template.items()}


class CycleFrames:
    """A template's records as each cycle sends them: for an event, the Kafka key and value of `cycle_event`'s
    renamed event, serialized; raw records as they are.

    Each event is serialized once, here, and cut into the pieces a cycle keeps (the header, the ad id, the fields
    after the time, as encoded) and those it changes (id, user id, time). The Avro body of a record is its fields'
    encodings one after the other in the schema's order, so a cycle's record is the kept pieces joined with the
    changed fields encoded again: a string as its zig-zag varint length and UTF-8 bytes, a long as its zig-zag
    varint. A schema whose first fields are not the id, ad id, user id and time is refused here.
    """

    def __init__(self, template: list[Any], serializer: Any) -> None:
        self._items = [self._cut(item, serializer) for item in template]

    @staticmethod
    def _cut(item: Any, serializer: Any) -> tuple[Any, ...]:
        from billing.events import TOPIC_OF
        from billing.intake import MIN_EVENT_TIME_MS
        from producers.wire import HEADER_SIZE

        if not hasattr(item, "event_time"):
            return (item.topic, item.key, item.value)
        value = serializer.serialize(item)
        event_id, user_id = item.event_id.encode(), item.user_id.encode()
        kept_ad = _avro_string(item.ad_id.encode())
        header = value[:HEADER_SIZE]
        head = (header, _avro_string(event_id), kept_ad, _avro_string(user_id), _avro_long(item.event_time))
        cut = sum(len(piece) for piece in head)
        if b"".join(head) != value[:cut]:
            raise ValueError(
                f"the {item.type} schema in use does not begin with the event id, ad_id, user_id and event_time: "
                "its records cannot be renamed per cycle"
            )
        moves = item.event_time >= MIN_EVENT_TIME_MS  # an out-of-range time stays out of range (`cycle_event`)
        return (TOPIC_OF[item.type], item.ad_id.encode(), header, event_id, kept_ad, user_id, item.event_time, moves,
                value[cut:])  # fmt: skip

    def cycle(self, cycle: int, span_ms: int) -> Iterator[tuple[str, bytes | None, bytes]]:
        """Topic, key and value of each record of cycle `cycle` (`cycle_event`), in the template's order."""
        suffix, shift = f".{cycle}".encode(), cycle * span_ms
        for item in self._items:
            if len(item) == 3:
                yield item
                continue
            topic, key, header, event_id, kept_ad, user_id, event_time, moves, rest = item
            time_moved = event_time + shift if moves else event_time
            renamed = (_avro_string(event_id + suffix), kept_ad, _avro_string(user_id + suffix), _avro_long(time_moved))
            yield topic, key, b"".join((header, *renamed, rest))


def _avro_long(value: int) -> bytes:
    """Avro's encoding of a long: zig-zag, then a varint of 7 bits a byte, the low bits first."""
    n = (value << 1) ^ (value >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _avro_string(data: bytes) -> bytes:
    """Avro's encoding of a string given as UTF-8: its length as a long, then the bytes."""
    return _avro_long(len(data)) + data


def cycle_span_ms(dataset: Dataset) -> int:
    """How far apart in event time two cycles of a template are: its span and a millisecond."""
    return dataset.last_event_ms - dataset.start_ms + 1


def send(args: argparse.Namespace) -> dict[str, Any]:
    """Send frames (or cycles of a capture) at a rate, or as fast as possible; returns the report."""
    from billing.store.schema_registry import open_registry
    from producers.publisher import EventPublisher, Pacer
    from producers.wire import EventSerializer

    serializer = EventSerializer(open_registry(str(args.registry)))
    publisher = EventPublisher(
        args.bootstrap, serializer, topics={"impression": args.impressions, "click": args.clicks}
    )
    pacer = Pacer(args.rate)
    frames = None
    if args.capture:
        from producers.capture import CaptureError, read_capture

        # Made before the clock starts: serializing the template takes about 15 us an event.
        template = (item for item in read_capture(args.capture) if not isinstance(item, CaptureError))
        frames = CycleFrames(list(template), serializer)
    cpu_before = time.process_time()
    first = time.time()
    if args.frames:
        for topic, key, value in read_frames(args.frames):
            publisher.publish_raw(topic, key, value)
            pacer.pace()
    elif frames is not None:
        for cycle in range(args.cycles):
            for topic, key, value in frames.cycle(cycle, args.cycle_span_ms):
                publisher.publish_raw(topic, key, value)
                pacer.pace()
    last = time.time()
    publisher.flush(120)
    acked = time.time()
    summary = publisher.summary()
    return {
        "records": summary.total,
        "delivered": summary.delivered,
        "delivery_failures": summary.delivery_failures,
        "undelivered": summary.undelivered,
        "first_send": first,
        "last_send": last,
        "all_acked": acked,
        "rate": round(summary.total / (last - first)) if last > first else 0,
        "rate_acked": round(summary.total / (acked - first)) if acked > first else 0,
        "cpu_s": round(time.process_time() - cpu_before, 2),
        "target_rate": args.rate,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Send pre-generated benchmark traffic to Kafka.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--frames", type=Path, help="a frames file (sent as it is)")
    source.add_argument("--capture", type=Path, help="a template capture (sent --cycles times, renamed)")
    parser.add_argument("--cycles", type=int, default=1)
    parser.add_argument("--cycle-span-ms", type=int, default=0)
    parser.add_argument("--registry", type=Path, required=True, help="the schema registry file of the frames")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--impressions", required=True, help="topic of impressions")
    parser.add_argument("--clicks", required=True, help="topic of clicks")
    parser.add_argument("--rate", type=float, default=None, help="records per second (default: as fast as possible)")
    parser.add_argument("--report", type=Path, required=True, help="where the JSON report goes")
    args = parser.parse_args(argv)
    report = send(args)
    args.report.write_text(json.dumps(report, indent=1))
    return 1 if report["delivery_failures"] or report["undelivered"] else 0


if __name__ == "__main__":
    sys.exit(main())
