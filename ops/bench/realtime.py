"""Whether Spark's real-time mode can run the attribution join: a probe, run by hand with `make bench-realtime`.

Spark's real-time mode (`trigger(realTime=...)`, in pyspark from 4.1) processes records as they arrive instead of
in micro-batches: the engine's one way to a bill well under a second after its click, where a micro-batch of the
join alone costs about a second on two cores (docs/benchmarks.md). The probe runs the textbook join
(`ops.bench.baseline.textbook_join`: the attribution rule's join and nothing else) under it, on a real broker
started on free ports with a few thousand events, in the pyspark that `make bench-realtime` installs into its own
venv (`REALTIME_PYSPARK`), with the connector jars of the product's pyspark (`make deps`; Maven Central may have
none of the newer version), and prints each try's outcome as a JSON line:

1. `foreachBatch`, the sink billing needs (a batch id that makes Redis, the ledger and the archive idempotent),
   on the product's master;
2. `foreach`, a row sink, on the product's master;
3. `foreach` with Spark's allowlist check off (`spark.sql.streaming.realTimeMode.allowlistCheck=false`, "at your
   own risk" in Spark's words), on the product's master;
4. the same with enough task slots for the stages that real-time mode runs at once.

A try whose query starts is also sent `--rate` events a second for `--wait` seconds, their times the clock's; a
try that runs counts the distinct clicks its sink saw against the clicks the rule bills, of the backlog and of the
paced events, and times each paced click from its send to its sink. The lines also go to
`var/bench/realtime-<time>/report.jsonl`. Nothing of the product depends on this module: it answers whether the
engine offers the mode yet, and what it gives here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from billing.events import Click, Impression

T0_BEHIND_MS = 120_000
"""The events' times start this far behind the clock, so that every one is valid for intake's checks."""


@dataclass(frozen=True)
class Try:
    name: str
    sink: str
    allowlist_check: bool
    master: str


def tries(master: str, slots: int) -> list[Try]:
    return [
        Try("the sink billing needs", "foreachBatch", True, master),
        Try("a row sink", "foreach", True, master),
        Try("a row sink, allowlist check off", "foreach", False, master),
        Try("a row sink, allowlist check off, enough slots", "foreach", False, f"local[{slots}]"),
    ]


def events(count: int, start_ms: int) -> Iterator[Impression | Click]:
    """Impressions, and a click after every third, 0 to 14 s later, so that some clicks fall outside the 10 s
    window."""
    for n in range(count):
        ad, user, at = f"ad-{n % 50:03d}", f"u{n % 700:05d}", start_ms + n * 7
        yield Impression(f"i{n:07d}", ad, user, at)
        if n % 3 == 0:
            yield Click(f"c{n:07d}", ad, user, at + (n * 997) % 14_000)


def billable(sent: Iterable[Impression | Click]) -> set[str]:
    """The clicks the attribution rule bills among `sent` (`billing.rule.bill`; with an empty catalog, every one
    comes back not charged as `unknown_ad`, whatever else would stop it)."""
    from billing.catalog import Catalog
    from billing.rule import bill

    sent = list(sent)
    impressions = [e for e in sent if isinstance(e, Impression)]
    clicks = [e for e in sent if isinstance(e, Click)]
    billing = bill(impressions, clicks, Catalog([]))
    return {row.click_id for row in billing.charged} | {row.click_id for row in billing.not_charged}


def _send(producer: Any, serialize: Any, settings: Any, event: Impression | Click) -> None:
    producer.produce(settings.topics[event.type], key=event.ad_id.encode(), value=serialize(event))


def run_probe(args: argparse.Namespace) -> int:
    """Start a broker, send the events, run each try in `args.spark_python`, print the outcomes."""
    from confluent_kafka import Producer

    from billing.store.schema_registry import open_registry
    from ops.deps import ensure_kafka_jars, ensure_spark_connector_jars
    from ops.kafka_service import LocalKafka, ensure_topics
    from ops.process import free_ports
    from ops.settings import Settings
    from producers.wire import EventSerializer

    settings = Settings.from_env()
    report = (args.out / f"realtime-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}").resolve() / "report.jsonl"
    report.parent.mkdir(parents=True, exist_ok=True)

    def say(line: dict[str, Any]) -> None:
        print(json.dumps(line), flush=True)
        with report.open("a") as out:
            out.write(json.dumps(line) + "\n")

    connectors = ensure_spark_connector_jars(settings.deps_dir)
    ensure_kafka_jars(settings.deps_dir)
    with tempfile.TemporaryDirectory(prefix="adbill-realtime-") as folder:
        work = Path(folder)
        port, controller = free_ports(2)
        kafka = LocalKafka(
            data_dir=work / "kafka", port=port, controller_port=controller, deps_dir=settings.deps_dir, run_dir=work
        )
        if not kafka.start():
            say({"try": "broker", "outcome": "failed", "log": str(work / "kafka" / "logs")})
            return 1
        try:
            ensure_topics(kafka.bootstrap, list(settings.topics.values()), partitions=settings.topic_partitions)
            serialize = EventSerializer(open_registry(str(work / "registry.json"))).serialize
            sent = list(events(args.events, int(time.time() * 1000) - T0_BEHIND_MS))
            producer = Producer({"bootstrap.servers": kafka.bootstrap})
            for event in sent:
                _send(producer, serialize, settings, event)
            producer.flush()
            del producer
            expected = billable(sent)
            say({"sent": len(sent), "billable_clicks": len(expected), "spark_python": args.spark_python})
            env = dict(
                os.environ,
                ADBILL_KAFKA_BOOTSTRAP=kafka.bootstrap,
                PYTHONPATH=os.pathsep.join(
                    [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]
                ),
            )
            for attempt in tries(settings.spark_master, args.slots):
                side = [
                    args.spark_python, "-m", "ops.bench.realtime", "--spark-side",
                    "--sink", attempt.sink, "--master", attempt.master,
                    "--allowlist-check", str(attempt.allowlist_check).lower(),
                    "--wait", str(args.wait), "--work", str(work / attempt.sink / attempt.master),
                    "--jars", str(connectors[0].parent), "--rate", str(args.rate),
                    "--checkpoint-ms", str(args.checkpoint_ms),
                    "--registry", str(work / "registry.json"),
                ]  # fmt: skip
                done = subprocess.run(side, env=env, capture_output=True, text=True, timeout=args.wait + 300)
                result = _last_json(done.stdout) or {"outcome": "failed", "error": _last_line(done.stderr)}
                seen = set(result.pop("clicks", []))
                if result.get("outcome") == "ran":
                    result |= {"clicks_billed": len(seen & expected), "clicks_not_billable": len(seen - expected),
                               "clicks_missed": len(expected - seen)}  # fmt: skip
                say({"try": attempt.name, "sink": attempt.sink, "master": attempt.master,
                     "allowlist_check": attempt.allowlist_check, **result})  # fmt: skip
        finally:
            kafka.stop()
    print(f"report: {report}", flush=True)
    return 0


def _last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            return dict(json.loads(line))
    return None


def spark_side(args: argparse.Namespace) -> int:
    """One try in the pyspark under test; prints `{"outcome": ..., ...}` as its last line. A query that starts is
    also sent `args.rate` events a second for `args.wait` seconds, each click's bill timed from its send."""
    import pyspark
    from pyspark.sql import SparkSession

    from ops.bench.baseline import textbook_join
    from ops.deps import jars_pyspark_lacks
    from ops.settings import Settings

    settings = Settings.from_env()
    work = Path(args.work)
    (work / "rows").mkdir(parents=True, exist_ok=True)
    spark = (
        SparkSession.builder.master(args.master)
        .appName("adbill-realtime-probe")
        .config("spark.jars", ",".join(str(jar) for jar in jars_pyspark_lacks(Path(args.jars))))
        .config("spark.sql.shuffle.partitions", str(settings.shuffle_partitions))
        .config("spark.sql.streaming.realTimeMode.allowlistCheck", args.allowlist_check)
        .config("spark.sql.streaming.realTimeMode.minBatchDuration", f"{min(args.checkpoint_ms, 5000)}ms")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    outcome: dict[str, Any] = {"pyspark": pyspark.__version__}
    writer = (
        textbook_join(spark, settings, rate_limit=False)
        .select("click_id")
        .writeStream.outputMode("update")
        .option("checkpointLocation", str(work / "checkpoint"))
    )
    if args.sink == "foreachBatch":
        writer = writer.foreachBatch(lambda batch, batch_id: None)
    else:
        writer = writer.foreach(_ClickFile(str(work / "rows")))
    try:
        query = writer.trigger(realTime=f"{args.checkpoint_ms} milliseconds").start()
    except Exception as refused:  # noqa: BLE001 - the probe reports whatever the engine says
        print(json.dumps(outcome | {"outcome": "refused", "error": _first_line(refused)}), flush=True)
        return 0
    registry = Path(args.registry)
    sent_at, paced_events, paced_rate = _send_paced(settings, registry, args.rate, args.wait, lambda: query.isActive)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and query.isActive:
        time.sleep(1)
    error = query.exception()
    billed = _billed_at(work / "rows")
    if error is not None:
        outcome |= {"outcome": "failed", "error": _first_line(error)}
    else:
        query.stop()
        due = billable(paced_events)
        latency_ms = sorted(1000 * (billed[click] - sent_at[click]) for click in due & billed.keys())
        outcome |= {
            "outcome": "ran",
            "clicks": sorted(billed.keys() - sent_at.keys()),
            "paced_rate": args.rate,
            "paced_rate_sent": round(paced_rate),
            "paced_clicks_billable": len(due),
            "paced_clicks_missed": len(due - billed.keys()),
            "paced_clicks_not_billable": len(billed.keys() & sent_at.keys() - due),
            "latency_ms_p50_p99_max": [round(_percentile(latency_ms, q)) for q in (0.5, 0.99, 1.0)]
            if latency_ms
            else None,
        }
    spark.stop()
    print(json.dumps(outcome), flush=True)
    return 0


def _send_paced(
    settings: Any, registry: Path, rate: int, seconds: int, running: Any
) -> tuple[dict[str, float], list[Impression | Click], float]:
    """Send `rate` events a second for `seconds` (stopping early if `running()` turns false), their event times
    the clock's: impressions, and after every third a click on an impression 0 to 14 s old. Returns each click's
    send time, the events sent and the events a second it managed to send."""
    from confluent_kafka import Producer

    from billing.store.schema_registry import open_registry
    from producers.wire import EventSerializer

    serialize = EventSerializer(open_registry(str(registry))).serialize
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "linger.ms": 0})
    shown: list[tuple[str, str]] = []
    sent: list[Impression | Click] = []
    sent_at: dict[str, float] = {}
    started = time.monotonic()
    n = 0
    while len(sent) < rate * seconds and (n % 1000 or running()):
        if (ahead := len(sent) / rate - (time.monotonic() - started)) > 0:
            time.sleep(ahead)
        now = time.time()
        user = n % (20 * rate)  # twenty users per event a second, as `make bench` has
        ad, user_id = f"ad-{user % 50:03d}", f"p{user:07d}"
        shown.append((ad, user_id))
        events: list[Impression | Click] = [Impression(f"pi{n:07d}", ad, user_id, int(now * 1000))]
        if n % 3 == 0:
            old_ad, old_user = shown[max(0, n - (n * 997) % (14 * rate))]
            events.append(Click(f"pc{n:07d}", old_ad, old_user, int(now * 1000)))
        for event in events:
            _send(producer, serialize, settings, event)
            sent.append(event)
            if isinstance(event, Click):
                sent_at[event.click_id] = time.time()
        producer.poll(0)
        n += 1
    producer.flush()
    return sent_at, sent, len(sent) / (time.monotonic() - started)


def _billed_at(folder: Path) -> dict[str, float]:
    """Each click id the sink saw, with the first time it saw it."""
    billed: dict[str, float] = {}
    for path in folder.glob("*"):
        for line in path.read_text().splitlines():
            click, at = line.split()
            billed[click] = min(float(at), billed.get(click, float(at)))
    return billed


def _percentile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


class _ClickFile:
    """A `foreach` writer: each task's click ids into its own file."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.out: Any = None

    def open(self, partition_id: int, epoch_id: int) -> bool:
        self.out = open(os.path.join(self.folder, f"{partition_id}-{epoch_id}-{os.getpid()}"), "a")  # noqa: SIM115
        return True

    def process(self, row: Any) -> None:
        self.out.write(f"{row.click_id} {time.time()}\n")

    def close(self, error: BaseException | None) -> None:
        if self.out is not None:
            self.out.close()


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][:1000] if lines else "no output"


def _first_line(error: BaseException) -> str:
    text = str(getattr(error, "desc", None) or error)
    return text.strip().splitlines()[0][:1000] if text.strip() else type(error).__name__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.bench.realtime", description=__doc__.splitlines()[0])
    parser.add_argument("--spark-python", default=sys.executable, help="python of the pyspark to probe")
    parser.add_argument("--events", type=int, default=3000, help="impressions to send (a click after every third)")
    parser.add_argument("--wait", type=int, default=60, help="seconds each try may run")
    parser.add_argument("--slots", type=int, default=16, help="task slots of the last try's local master")
    parser.add_argument("--rate", type=int, default=10_000, help="events a second sent while a try runs")
    parser.add_argument("--checkpoint-ms", type=int, default=1000, help="real-time mode's batch (checkpoint) duration")
    parser.add_argument("--out", type=Path, default=Path("var/bench"), help="folder for the run's report")
    parser.add_argument("--spark-side", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sink", help=argparse.SUPPRESS)
    parser.add_argument("--master", help=argparse.SUPPRESS)
    parser.add_argument("--allowlist-check", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--jars", help=argparse.SUPPRESS)  # the connectors' folder
    parser.add_argument("--registry", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    return spark_side(args) if args.spark_side else run_probe(args)


if __name__ == "__main__":
    sys.exit(main())
