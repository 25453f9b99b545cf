"""A micro-benchmark of the producers' hot path, run by hand: `python -m ops.bench.wire [events]`.

Prints events per second for the serializer, the deserializer, the simulator alone, and the simulator with its
ground truth and serialization (what `simulate_to_kafka` does before handing bytes to the Kafka client).
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from billing.events import Click, Impression
from billing.store.schema_registry import open_registry
from producers.ground_truth import GroundTruth
from producers.simulator import SimulationConfig, Simulator
from producers.wire import EventDeserializer, EventSerializer

T0 = 1_767_225_600_000


def _rate(label: str, count: int, work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    rate = count / (time.perf_counter() - started)
    print(f"{label:<42} {rate:>12,.0f} events/s")
    return rate


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark with `events` events (default 200,000)."""
    args = sys.argv[1:] if argv is None else argv
    count = int(args[0]) if args else 200_000
    with tempfile.TemporaryDirectory() as folder:
        registry = open_registry(str(Path(folder) / "registry.json"))
        serializer, deserializer = EventSerializer(registry), EventDeserializer(registry)
        events = [
            Impression(f"s1-i{n:010d}", f"adv-0001-cmp-001-ad-{n % 40:03d}", f"u{n % 1000:07d}", T0 + n)
            if n % 10
            else Click(f"s1-c{n:010d}", f"adv-0001-cmp-001-ad-{n % 40:03d}", f"u{n % 1000:07d}", T0 + n)
            for n in range(count)
        ]
        serialize = serializer.serialize
        _rate("serialize (framed Avro)", count, lambda: [serialize(e) for e in events])
        values = [(e.type, serialize(e)) for e in events]
        deserialize = deserializer.deserialize
        _rate("deserialize", count, lambda: [deserialize(kind, value) for kind, value in values])

        config = SimulationConfig(events=count, seed=1, start_ms=T0)
        simulator = Simulator(config)
        _rate("simulate", count, lambda: sum(1 for _ in simulator.arrivals()))

        def simulate_truth_serialize() -> None:
            truth = GroundTruth.for_arrivals(config.expected_arrivals(), simulator.catalog)
            for arrival in simulator.arrivals():
                truth.observe(arrival)
                if arrival.raw is None:
                    serialize(arrival.item)  # type: ignore[arg-type]
            truth.finish(Path(folder) / "billable.jsonl")

        _rate("simulate + ground truth + serialize", count, simulate_truth_serialize)


if __name__ == "__main__":
    main()
