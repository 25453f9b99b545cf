"""The ceiling: how fast this machine writes the events to Kafka and reads them back, with no job running.

- write, pre-serialized: the benchmark's sender (`ops.bench.traffic`) sending a backlog's frames as fast as it
  can (one Python process, librdkafka, the product's producer settings: idempotent, acks=all, lz4);
- write, simulated: `adbill produce` without `--rate`, the simulator, its ground truth and serialization included
  (its `publish.json`);
- read: Kafka's own consumer performance tool (`kafka.tools.ConsumerPerformance`, `adbill kafka consumer-perf`)
  over each topic of the backlog, and a plain confluent-kafka consumer in Python over both.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ops.bench.traffic import Dataset


def run_sender(
    frames: Path | None,
    registry: Path,
    bootstrap: str,
    topics: dict[str, str],
    rate: float | None,
    report: Path,
    capture: Path | None = None,
    cycles: int = 1,
    cycle_span_ms: int = 0,
) -> subprocess.Popen[bytes]:
    """Start the sender (`python -m ops.bench.traffic`) as a child; its report goes to `report` when it ends."""
    command = [
        sys.executable,
        "-m",
        "ops.bench.traffic",
        *(["--frames", str(frames)] if frames else ["--capture", str(capture)]),
        "--cycles",
        str(cycles),
        "--cycle-span-ms",
        str(cycle_span_ms),
        "--registry",
        str(registry),
        "--bootstrap",
        bootstrap,
        "--impressions",
        topics["impression"],
        "--clicks",
        topics["click"],
        "--report",
        str(report),
        *(["--rate", str(rate)] if rate else []),
    ]
    log = report.with_suffix(".log").open("wb")
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=_env())


def finish_sender(sender: subprocess.Popen[bytes], report: Path, timeout_s: float) -> dict[str, Any]:
    """Wait for a sender and return its report; raise with its log when it failed. A wait that ends otherwise (the
    run interrupted, the timeout passed) stops the sender first, so that no sender outlives its run."""
    try:
        code = sender.wait(timeout=timeout_s)
    except BaseException:
        sender.kill()
        sender.wait()
        raise
    if code != 0 or not report.exists():
        log = report.with_suffix(".log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"the sender failed with code {code}:\n{log}")
    return dict(json.loads(report.read_text()))


def send_unpaced(
    dataset: Dataset, registry: Path, bootstrap: str, topics: dict[str, str], folder: Path
) -> dict[str, Any]:
    """Send a run's frames as fast as possible (the pre-serialized write ceiling); returns the sender's report."""
    folder.mkdir(parents=True, exist_ok=True)
    report = folder / f"load-{topics['impression']}.json"
    sender = run_sender(dataset.frames_file, registry, bootstrap, topics, None, report)
    return finish_sender(sender, report, timeout_s=600)


def kafka_consumer_perf(tool_command: Any, bootstrap: str, topic_counts: dict[str, int]) -> dict[str, Any]:
    """Kafka's ConsumerPerformance over each topic; `tool_command(tool, *args)` builds the java command line.

    Returns the records, the seconds the tool measured (from its first fetch; the group join is reported apart)
    and the rates, summed over the topics."""
    records, fetch_ms, total_ms, per_topic = 0, 0.0, 0.0, {}
    for topic, count in topic_counts.items():
        command = tool_command(
            "consumer-perf",
            "--bootstrap-server",
            bootstrap,
            "--topic",
            topic,
            "--messages",
            str(count),
            "--timeout",
            "60000",
            "--group",
            f"bench-perf-{topic}-{time.time_ns()}",
        )
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"ConsumerPerformance failed on {topic}:\n{done.stderr[-2000:]}")
        row = parse_consumer_perf(done.stdout)
        per_topic[topic] = row
        records += int(row["data.consumed.in.nMsg"])
        fetch_ms += float(row["fetch.time.ms"])
        total_ms += float(row["fetch.time.ms"]) + float(row["rebalance.time.ms"])
    return {
        "tool": "org.apache.kafka.tools.ConsumerPerformance",
        "records": records,
        "fetch_s": round(fetch_ms / 1000, 2),
        "rate": round(records * 1000 / fetch_ms) if fetch_ms else 0,
        "rate_with_group_join": round(records * 1000 / total_ms) if total_ms else 0,
        "per_topic": per_topic,
    }


def parse_consumer_perf(stdout: str) -> dict[str, str]:
    """The result row of ConsumerPerformance's output, by its header's column names."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    header_at = next(i for i, line in enumerate(lines) if line.startswith("start.time"))
    names = [name.strip() for name in lines[header_at].split(",")]
    values = [value.strip() for value in lines[header_at + 1].split(",")]
    return dict(zip(names, values, strict=True))


def python_consumer(bootstrap: str, topics: list[str], expected: int, timeout_s: float = 300) -> dict[str, Any]:
    """A plain confluent-kafka consumer reading `expected` records of `topics` from their start (partitions
    assigned, no group join; values not decoded); its rate from the assignment to the last record."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-python", "enable.auto.commit": False})
    partitions = [
        TopicPartition(topic, partition, OFFSET_BEGINNING)
        for topic in topics
        for partition in consumer.list_topics(topic, timeout=10).topics[topic].partitions
    ]
    cpu_before = time.process_time()
    count = 0
    first = last = time.time()
    consumer.assign(partitions)
    deadline = time.monotonic() + timeout_s
    try:
        while count < expected and time.monotonic() < deadline:
            count += sum(1 for message in consumer.consume(num_messages=10_000, timeout=1.0) if not message.error())
            last = time.time()
    finally:
        consumer.close()
    return {
        "client": "confluent-kafka (librdkafka), one Python process",
        "records": count,
        "seconds": round(last - first, 2),
        "rate": round(count / (last - first)) if last > first else 0,
        "cpu_s": round(time.process_time() - cpu_before, 2),
    }


def simulator_producer(settings_env: dict[str, str], events: int, run_dir: Path) -> dict[str, Any]:
    """`adbill produce --events N` without `--rate` (simulating, keeping the ground truth, serializing and
    producing in one process): its `publish.json`."""
    command = [
        sys.executable,
        "-m",
        "ops.cli",
        "produce",
        "--events",
        str(events),
        "--late",
        "0",
        "--run-dir",
        str(run_dir),
        "--no-progress",
    ]
    done = subprocess.run(command, env={**_env(), **settings_env}, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"adbill produce failed:\n{done.stderr[-2000:]}")
    publish = json.loads((run_dir / "publish.json").read_text())
    return {
        "command": "adbill produce --events N (no --rate)",
        "records": publish["total"],
        "seconds": publish["elapsed_s"],
        "rate": round(publish["rate_per_s"]),
    }


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """The end offset of each partition of a topic."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-offsets", "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
    finally:
        consumer.close()


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADBILL_")}
    env["ADBILL_NO_PROGRESS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env
