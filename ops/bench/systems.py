"""One streaming system under the benchmark's load: a backlog to catch up on, then offered rates up to the knee.

A system is a child process (`adbill stream`, the product's job, or `python -m ops.bench.baseline`, the
textbook join) with its own HOME, topics and Redis prefix on the benchmark's Kafka and Redis. Both report each
micro-batch through `attribution.progress.HealthListener`, which `HealthRecorder` collects, so both are measured
the same way:

1. catch-up: the job starts on topics that already hold the backlog; the rate is the backlog over the time from
   the start of the first batch that read records to the end of the batch that read the last one (a cold start:
   this also warms the JVM up for the steps);
2. steps: for each offered rate, the sender sends that step's pre-generated frames at the rate; the harness waits
   until the job has read every record (or gives up after `drain_timeout_s`), then works out the step's figures
   (`ops.bench.analysis.step_figures`) and stops after the first step that did not keep up;
3. burst: if the last step drained, a run sent as fast as possible; the rate it is read at, from its first send
   to the end of the batch that read its last record, is what the warm system does with a sudden backlog.

Latency per billable click, from its Kafka timestamp to the end of the micro-batch that billed it:
- pipeline: the ledger row carries the click's Kafka timestamp and its batch id; the batch's end comes from its
  health record;
- baseline (no sink): the batch that read the click, found from the batches' end offsets of the clicks topic,
  and the click's timestamp read back from Kafka; only the clicks the ground truth bills are counted, as for
  the pipeline.

The pipeline's ledger is compared with the ground truth of every run it read: the same click ids, each once,
with the same amounts.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ops.bench import analysis, profile
from ops.bench.ceiling import end_offsets, finish_sender, run_sender
from ops.bench.measure import HealthRecorder, Sampler, find_in_tree, thread_cores, thread_cpu, wait_for
from ops.bench.report import is_pipeline
from ops.bench.traffic import Dataset, TrafficPlan, cycle_span_ms, cycle_truth
from ops.postgres_service import DATABASE, database_beside, database_url
from ops.process import free_ports, stop_child
from ops.settings import Settings

if TYPE_CHECKING:
    from ops.stack import Stack


@dataclass(frozen=True)
class System:
    """How to start a system and where it reads and reports."""

    name: str
    settings: Settings
    command: list[str]
    query: str
    """The query name of its health records."""
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Settings of this system alone (a variant of the pipeline), on top of those of the run."""

    @property
    def topics(self) -> dict[str, str]:
        return self.settings.topics

    @property
    def ledger_dir(self) -> Path | None:
        return self.settings.layout.ledger if is_pipeline(self.name) else None

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ADBILL_")}
        return {**env, **self.settings.to_env(), "ADBILL_NO_PROGRESS": "1", "PYTHONUNBUFFERED": "1"}


def scratch_settings(services: Settings, home: Path, name: str) -> Settings:
    """Every setting of the run (`--set` included) with a HOME and topics `NAME-*` of its own."""
    return dataclasses.replace(
        services,
        home=home,
        topic_impressions=f"{name}-impressions",
        topic_clicks=f"{name}-clicks",
        topic_quarantine=f"{name}-quarantine",
    )


TEXTBOOK_SETTINGS: dict[str, Any] = {
    "state_store": "rocksdb",
    "driver_memory": "2g",
    "max_offsets_per_trigger": 200_000,
    "impression_watermark_ms": 30_000,
    "click_watermark_ms": 30_000,
}
"""The baseline's state store, memory, batch cap and watermark delays whatever the product's defaults: the textbook
join the targets were set against (RocksDB, a 2g driver, at most 200,000 records per topic per batch, 30 s delays),
so that a change of the product's defaults does not move the bar it is measured by."""


def make_system(name: str, services: Settings, folder: Path, registry: Path, catalog: Path, **overrides: Any) -> System:
    """The pipeline (or a variant of it, `pipeline-LABEL` with `overrides`) or the baseline, with topics and a
    Redis prefix of its own on the services of `services`."""
    settings = dataclasses.replace(
        scratch_settings(services, folder / name, name),
        redis_prefix=f"bench-{name}",
        schema_registry=str(registry),
        catalog_path=catalog,
        # A database of its own, into which its catalog file is taken when it first reads it.
        database_url=database_beside(services.database_url, f"bench_{name.replace('-', '_')}"),
        metrics_port=0,
        **overrides,
    )
    if is_pipeline(name):
        return System(name, settings, [sys.executable, "-m", "ops.cli", "stream"], "billing", dict(overrides))
    from ops.bench.baseline import QUERY

    settings = dataclasses.replace(settings, **TEXTBOOK_SETTINGS)
    return System(name, settings, [sys.executable, "-m", "ops.bench.baseline"], QUERY, dict(TEXTBOOK_SETTINGS))


def start_services(folder: Path, **overrides: Any) -> tuple[Settings, Stack, Sampler]:
    """Kafka and Redis on free ports with data in `folder/services`, and a sampler watching them; `overrides`
    are settings both systems then run with (state store, shuffle partitions...)."""
    from ops.stack import Stack

    kafka_port, controller_port, redis_port, postgres_port = free_ports(4)
    services = Settings.from_env(
        {},
        **{
            "home": folder / "services",
            "kafka_bootstrap": f"127.0.0.1:{kafka_port}",
            "kafka_controller_port": controller_port,
            "redis_url": f"redis://127.0.0.1:{redis_port}/0",
            "database_url": database_url(postgres_port, DATABASE),
            "metrics_port": 0,
            **overrides,
        },
    )
    stack = Stack(services)
    stack.start_services()
    sampler = Sampler()
    for process in stack.started:
        if process.popen is not None:
            sampler.watch(process.name, process.popen.pid)
    sampler.start()
    return services, stack, sampler


def prepare_system(
    name: str, services: Settings, folder: Path, plan: TrafficPlan, own_catalog: bool = False, **overrides: Any
) -> System:
    """A system on the services, its topics created, reading the plan's catalog and schemas (copied to `folder`).
    The plan's catalog is loaded into the system's own database here (unless `own_catalog`: the caller loads one of
    its own): the folder's catalog file is taken in (and set aside) by the first system that reads it, and a later
    one would otherwise start on a generated catalog."""
    from billing.store.catalog_db import CatalogDatabase
    from billing.store.catalog_file import load_catalog
    from ops.stack import ensure_stack_topics

    registry, catalog = folder / "schemas.json", folder / "catalog.json"
    if not registry.exists():
        shutil.copyfile(plan.registry_file, registry)
        shutil.copyfile(plan.catalog_file, catalog)
    system = make_system(name, services, folder, registry, catalog, **overrides)
    if system.settings.database_url and is_pipeline(name) and not own_catalog:
        store = CatalogDatabase(system.settings.database_url)
        if not store.exists():
            store.load(load_catalog(plan.catalog_file), [])
    ensure_stack_topics(system.settings)
    return system


@dataclass
class LoadOptions:
    """How hard to push and how long to wait."""

    drain_timeout_s: float = 120.0
    startup_timeout_s: float = 300.0
    profile: bool = True
    soak_cycles: int = 0
    """0: the plan's steps; N: its one template, sent N times (soak)."""


def run_system(system: System, plan: TrafficPlan, sampler: Sampler, options: LoadOptions) -> dict[str, Any]:
    """Catch up on the backlog (if the plan has one), then the offered rates up to the knee (module doc)."""
    folder = system.settings.root
    folder.mkdir(parents=True, exist_ok=True)
    log = (folder / "job.log").open("wb")
    launched = time.time()
    job = subprocess.Popen(
        system.command, env=system.environment(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    sampler.watch(system.name, job.pid)
    recorder = HealthRecorder(system.settings.redis_url, system.settings.redis_prefix, system.query)
    recorder.start()
    result: dict[str, Any] = {"system": system.name, "command": " ".join(system.command[1:]), "launched": launched}
    steps: list[dict[str, Any]] = []
    try:
        if not wait_for(lambda: bool(recorder.records), options.startup_timeout_s, "the first batch", job):
            raise RuntimeError(f"{system.name} did not finish a batch in {options.startup_timeout_s:.0f} s")
        jvm = find_in_tree(job.pid, "java")
        first = recorder.history()[0]
        result["startup_s"] = round(analysis.batch_end_ms(first) / 1000 - launched, 1)
        read_so_far = 0
        if plan.backlog is not None:
            read_so_far = plan.backlog.frames
            result["catch_up"] = _catch_up(system, plan.backlog, recorder, sampler, options, job)
        for number, dataset in enumerate(plan.steps, start=1):
            step = _step(system, plan, dataset, number, recorder, sampler, options, job, jvm, read_so_far)
            steps.append(step)
            read_so_far += step["events_sent"]
            print(_step_line(system.name, step), flush=True)
            if analysis.should_stop(steps) and not options.soak_cycles:
                break
        if plan.burst is not None and steps and steps[-1]["drained"]:
            result["burst"] = _burst(system, plan, plan.burst, recorder, sampler, options, job, read_so_far)
    except Exception as exc:  # the report still shows what was measured, and why the run ended there
        tail = (folder / "job.log").read_text(errors="replace").splitlines()[-15:]
        result["error"] = f"{exc}; the job's log ends with:\n" + "\n".join(tail)
        print(f"{system.name}: {exc} (see {folder / 'job.log'})", flush=True)
    finally:
        recorder.stop()
        stop_child(job, timeout_s=30)
        log.close()
    latency: dict[int, dict[str, int]] = {}
    for step in steps:
        latency.update(step.pop("latency_by_batch"))
    result["steps"] = steps
    result["knee"] = analysis.knee(steps)
    result["batches"] = _batch_series(recorder.history(), latency)
    result["memory"] = [(round(t - launched, 1), round(rss / 2**20)) for t, _, rss in sampler.series(system.name)]
    result["memory_by_process"] = {
        command: [(round(t - launched, 1), round(rss / 2**20)) for t, rss in points]
        for command, points in sampler.rss_by_command(system.name).items()
    }
    result["peak_rss_mb"] = round(sampler.peak_rss(system.name) / 2**20)
    return result


def _catch_up(
    system: System,
    dataset: Dataset,
    recorder: HealthRecorder,
    sampler: Sampler,
    options: LoadOptions,
    job: subprocess.Popen[bytes],
) -> dict[str, Any]:
    """The backlog the job starts on: read from a cold start (the JVM compiles as it goes), from the start of the
    first batch that read records."""
    records = dataset.frames
    done = wait_for(lambda: recorder.rows_read() >= records, options.startup_timeout_s + records / 1000, "backlog", job)
    history = recorder.history()
    busy = [r for r in history if r["input_rows"] > 0]
    since = analysis.batch_start_ms(busy[0]) if busy else int(time.time() * 1000)
    figures = _read_figures(system, sampler, history, records, since, done)
    print(f"{system.name}: caught up on the backlog at {figures['rate']:,}/s from a cold start", flush=True)
    return figures | {"ledger_check": _ledger(system, dataset)}


def _burst(
    system: System,
    plan: TrafficPlan,
    dataset: Dataset,
    recorder: HealthRecorder,
    sampler: Sampler,
    options: LoadOptions,
    job: subprocess.Popen[bytes],
    read_before: int,
) -> dict[str, Any]:
    """A run sent all at once after the steps, to a warm job: the rate it is read at is the system's capacity."""
    folder = system.settings.root / "burst"
    folder.mkdir(parents=True, exist_ok=True)
    report = folder / "sent.json"
    sender = run_sender(dataset.frames_file, plan.registry_file, system.settings.kafka_bootstrap, system.topics,
                        None, report)  # fmt: skip
    sent = finish_sender(sender, report, timeout_s=600)
    total = read_before + sent["records"]
    timeout = options.startup_timeout_s + sent["records"] / 1000
    done = wait_for(lambda: recorder.rows_read() >= total, timeout, "the burst", job)
    since = int(sent["first_send"] * 1000)
    figures = _read_figures(
        system, sampler, analysis.step_batches(recorder.history(), since), sent["records"], since, done
    )
    figures["send_s"] = round(sent["last_send"] - sent["first_send"], 1)
    print(f"{system.name}: read a burst of {sent['records']:,} at {figures['rate']:,}/s", flush=True)
    return figures | {"ledger_check": _ledger(system, dataset)}


def _read_figures(
    system: System, sampler: Sampler, history: list[Any], records: int, since_ms: int, done: bool
) -> dict[str, Any]:
    """How fast a system read `records` that were all there (or arriving at once) from `since_ms`."""
    drained = analysis.drained_at_ms(history, records)
    if drained is None or not done:
        rate = analysis.sustained_rate(history, since_ms, time.time() * 1000)
        return {"records": records, "drained": False, "rate": round(rate)}
    used = [r for r in history if r["input_rows"] > 0 and analysis.batch_end_ms(r) <= drained]
    start, end = since_ms / 1000, drained / 1000
    return {
        "records": records,
        "drained": True,
        "seconds": round(end - start, 1),
        "rate": round(records / (end - start)),
        "batches": len(used),
        "batch_rows_mean": round(sum(r["input_rows"] for r in used) / len(used)),
        "batch_duration_ms_mean": round(sum(r["batch_duration_ms"] for r in used) / len(used)),
        "cpu_cores": round(sampler.cores(system.name, start, end), 2),
        "machine_cpu_cores": round(sampler.machine_cores(start, end), 2),
        "peak_rss_mb": round(sampler.peak_rss(system.name, start, end) / 2**20),
        "state_rows_max": max(r.get("state_rows", 0) for r in used),
        "phase_ms_mean": analysis.phase_means(used),
    }


def _ledger(system: System, dataset: Dataset) -> dict[str, Any] | None:
    """The ledger check of one run (pipeline only)."""
    if system.ledger_dir is None:
        return None
    return ledger_check(
        ledger_rows(system.ledger_dir, dataset.name),
        dataset.truth(),
        dataset.refused(),
        stream_refused(system.settings.layout.not_charged, dataset.name),
    )


def _step(
    system: System,
    plan: TrafficPlan,
    dataset: Dataset,
    number: int,
    recorder: HealthRecorder,
    sampler: Sampler,
    options: LoadOptions,
    job: subprocess.Popen[bytes],
    jvm: int | None,
    read_before: int,
) -> dict[str, Any]:
    folder = system.settings.root / f"step{number}"
    folder.mkdir(parents=True, exist_ok=True)
    # The baseline has no ledger: its clicks are read back from this offset on, to find the batch of each.
    clicks_before = (
        end_offsets(system.settings.kafka_bootstrap, system.topics["click"]) if not system.ledger_dir else {}
    )
    threads_before = thread_cpu(jvm) if jvm else {}
    recording = folder / "profile.jfr"
    profiling = options.profile and jvm is not None and profile.start_recording(jvm, f"step{number}", recording)
    report = folder / "sent.json"
    if options.soak_cycles:
        sender = run_sender(
            None,
            plan.registry_file,
            system.settings.kafka_bootstrap,
            system.topics,
            dataset.rate,
            report,
            capture=dataset.capture_file,
            cycles=options.soak_cycles,
            cycle_span_ms=cycle_span_ms(dataset),
        )
        expected_s = options.soak_cycles * dataset.frames / dataset.rate
    else:
        sender = run_sender(dataset.frames_file, plan.registry_file, system.settings.kafka_bootstrap, system.topics,
                            dataset.rate, report)  # fmt: skip
        expected_s = dataset.frames / dataset.rate
    sent = finish_sender(sender, report, timeout_s=expected_s * 3 + 120)
    total = read_before + sent["records"]
    drained = wait_for(lambda: recorder.rows_read() >= total, options.drain_timeout_s, "the step's records", job)
    finished = time.time()
    if profiling and jvm is not None:
        profile.stop_recording(jvm, f"step{number}")
    threads_after = thread_cpu(jvm) if jvm else {}
    send_start_ms, send_end_ms = int(sent["first_send"] * 1000), int(sent["last_send"] * 1000)
    batches = analysis.step_batches(recorder.history(), send_start_ms)
    truth = cycle_truth(dataset.truth(), options.soak_cycles) if options.soak_cycles else dataset.truth()
    refused = cycle_truth(dataset.refused(), options.soak_cycles) if options.soak_cycles else dataset.refused()
    pairs, check = _latencies(system, dataset.name, truth, batches, clicks_before, refused)
    figures = analysis.step_figures(batches, sent["records"], send_start_ms, send_end_ms, [lat for _, lat in pairs])
    end = (analysis.drained_at_ms(batches, sent["records"]) or finished * 1000) / 1000
    start = sent["first_send"]
    figures.update(
        {
            "step": number,
            "dataset": dataset.name,
            "offered_rate": dataset.rate,
            "drained": figures["drained"] and drained,
            "job_cpu_cores": round(sampler.cores(system.name, start, end), 2),
            "cpu_us_per_event": cpu_us_per_event(sampler.cores(system.name, start, end), end - start, sent["records"]),
            "cpu_cores_by_tree": {name: round(sampler.cores(name, start, end), 2) for name in sorted(sampler.roots)},
            "cpu_window_s": round(end - start, 2),
            "job_cpu_by_process": sampler.command_cores(system.name, start, end),
            "job_peak_rss_mb": round(sampler.peak_rss(system.name, start, end) / 2**20),
            "kafka_cpu_cores": round(sampler.cores("kafka", start, end), 2),
            "redis_cpu_cores": round(sampler.cores("redis", start, end), 2),
            "machine_cpu_cores": round(sampler.machine_cores(start, end), 2),
            "sender_cpu_cores": round(sent["cpu_s"] / max(0.001, sent["last_send"] - start), 2),
            "sender": sent,
            "jvm_threads_cores": thread_cores(threads_before, threads_after, finished - start),
            "ledger_check": check,
            "profile": profile.summarize_recording(recording) if profiling else None,
            "latency_by_batch": _by_batch(pairs),
            "latency_by_minute": _by_minute(pairs, batches, start) if options.soak_cycles else None,
        }
    )
    return figures


def cpu_us_per_event(cores: float, seconds: float, events: int) -> float | None:
    """CPU microseconds per event of a process tree that used `cores` for `seconds` on `events` events."""
    return round(cores * seconds * 1e6 / events, 1) if events > 0 and seconds > 0 else None


def _step_line(name: str, step: dict[str, Any]) -> str:
    lat = step["latency_ms"]
    check = step["ledger_check"]
    verdict = "n/a" if check is None else ("exact" if check["equal"] else "DIFFERS")
    return (
        f"{name:<8} offered {step['offered_rate']:>7,}/s (sent at {step['offered_rate_achieved']:,}/s): "
        f"sustained {step['sustained_rate']:,}/s, p50 {lat['p50']:,} ms, p99 {lat['p99']:,} ms, "
        f"max {lat['max']:,} ms, job {step['job_cpu_cores']} cores ({step['cpu_us_per_event']} us/event), "
        f"{step['job_peak_rss_mb']} MB, "
        f"{'kept up' if analysis.keeps_up(step) else 'did NOT keep up'}; ledger {verdict}"
    )


def _latencies(
    system: System,
    prefix: str,
    truth: dict[str, int],
    batches: list[Any],
    clicks_before: dict[int, int],
    refused: dict[str, str] | None = None,
) -> tuple[list[tuple[int, int]], dict[str, Any] | None]:
    """(batch id, latency ms) of each billable click of the step, and the ledger check (pipeline only)."""
    ends = {r["batch_id"]: analysis.batch_end_ms(r) for r in batches}
    if system.ledger_dir is not None:
        rows = ledger_rows(system.ledger_dir, prefix)
        pairs = [(b, ends[b] - received) for _, _, received, b in rows if b in ends]
        return pairs, ledger_check(rows, truth, refused, stream_refused(system.settings.layout.not_charged, prefix))
    clicks = read_clicks(system.settings, clicks_before)
    topic = system.topics["click"]
    offsets: dict[int, list[tuple[int, int]]] = {}
    for record in batches:
        for source in record.get("sources") or []:
            for partition, end in ((source.get("end_offset") or {}).get(topic) or {}).items():
                offsets.setdefault(int(partition), []).append((end, record["batch_id"]))
    pairs = []
    for partition, offset, timestamp, click_id in clicks:
        if click_id not in truth:
            continue
        ends_of_partition = offsets.get(partition, [])
        at = bisect.bisect_right([end for end, _ in ends_of_partition], offset)
        if at < len(ends_of_partition):
            batch_id = ends_of_partition[at][1]
            pairs.append((batch_id, ends[batch_id] - timestamp))
    return pairs, None


def stream_refused(folder: Path, prefix: str) -> dict[str, str]:
    """click_id -> reason of the clicks of one run (its id prefix) the stream priced and did not charge."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    if not folder.is_dir() or not any(folder.glob("period=*")):
        return {}
    table = ds.dataset(folder, format="parquet", partitioning="hive").to_table(columns=["click_id", "reason"])
    table = table.filter(pc.starts_with(table["click_id"], f"{prefix}-"))
    return dict(zip(table["click_id"].to_pylist(), table["reason"].to_pylist(), strict=True))


def ledger_rows(ledger_dir: Path, prefix: str) -> list[tuple[str, int, int, int]]:
    """(click_id, amount_micros, click_received_ms, batch_id) of the ledger's rows of one run (its id prefix)."""
    import pyarrow.compute as pc

    from billing.store.parquet_ledger import read_ledger

    table = read_ledger(ledger_dir)
    table = table.filter(pc.starts_with(table["click_id"], f"{prefix}-"))
    return list(
        zip(
            table["click_id"].to_pylist(),
            table["amount_micros"].to_pylist(),
            table["click_received_ms"].to_pylist(),
            table["batch_id"].to_pylist(),
            strict=True,
        )
    )


ORDER_DEPENDENT = frozenset({"click_flood", "duplicate_click", "over_budget"})
"""Rules whose live decision depends on the order the stream reads clicks: a flood's first clicks billed before the
rest arrived, the later of two twins read first, a budget filled out of event-time order. Reconciliation applies
them to the complete data; the ledger check reports them apart."""


def ledger_check(
    rows: list[tuple[str, int, int, int]],
    truth: dict[str, int],
    refused: dict[str, str] | None = None,
    stream_refused: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Whether the ledger's rows of a run equal its ground truth: the same clicks, once each, same amounts. A click
    charged live that the truth refuses for an order-dependent rule (`ORDER_DEPENDENT`), or refused live for such a
    rule and charged by the truth, is counted in `order_dependent` (reconciliation corrects it), not as a
    difference."""
    refused = refused or {}
    stream_refused = stream_refused or {}
    billed: dict[str, int] = {}
    repeated = 0
    for click_id, amount, _, _ in rows:
        if click_id in billed:
            repeated += 1
        billed[click_id] = amount
    missing = [c for c in truth if c not in billed and stream_refused.get(c) not in ORDER_DEPENDENT]
    extra = [c for c in billed if c not in truth and refused.get(c) not in ORDER_DEPENDENT]
    ordered = sum(1 for c in truth if c not in billed and stream_refused.get(c) in ORDER_DEPENDENT) + sum(
        1 for c in billed if c not in truth and refused.get(c) in ORDER_DEPENDENT
    )
    wrong = [c for c in billed if c in truth and billed[c] != truth[c]]
    return {
        "equal": not (missing or extra or wrong or repeated),
        "order_dependent": ordered,
        "billed": len(billed),
        "expected": len(truth),
        "missing": len(missing),
        "extra": len(extra),
        "wrong_amount": len(wrong),
        "billed_twice": repeated,
        "examples": (missing[:3] + extra[:3] + wrong[:3]),
    }


def read_clicks(settings: Settings, start: dict[int, int]) -> list[tuple[int, int, int, str]]:
    """(partition, offset, Kafka timestamp ms, click_id) of the clicks topic's records from `start` to its end;
    records that do not decode are left out."""
    from confluent_kafka import Consumer, TopicPartition

    from billing.store.schema_registry import open_registry
    from producers.wire import EventDeserializer

    topic = settings.topic_clicks
    end = end_offsets(settings.kafka_bootstrap, topic)
    deserializer = EventDeserializer(open_registry(settings.registry_location))
    consumer = Consumer(
        {"bootstrap.servers": settings.kafka_bootstrap, "group.id": "bench-readback", "enable.auto.commit": False}
    )
    out = []
    try:
        wanted = {p: end[p] - start.get(p, 0) for p in end if end[p] > start.get(p, 0)}
        consumer.assign([TopicPartition(topic, p, start.get(p, 0)) for p in wanted])
        left = sum(wanted.values())
        deadline = time.monotonic() + 300
        while left > 0 and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=10_000, timeout=1.0):
                if message.error():
                    continue
                left -= 1
                try:
                    click_id = deserializer.deserialize("click", message.value() or b"").event_id
                except Exception:  # bad input of the simulator, never billable  # nosec B112
                    continue
                out.append((message.partition() or 0, message.offset() or 0, message.timestamp()[1], click_id))
    finally:
        consumer.close()
    return out


def _by_batch(pairs: list[tuple[int, int]]) -> dict[int, dict[str, int]]:
    grouped: dict[int, list[int]] = {}
    for batch_id, latency in pairs:
        grouped.setdefault(batch_id, []).append(latency)
    return {b: analysis.latency_summary(values) for b, values in grouped.items()}


def _by_minute(pairs: list[tuple[int, int]], batches: list[Any], start_s: float) -> list[dict[str, Any]]:
    """Latency percentiles of the clicks billed in each minute since `start_s` (by their batch's end)."""
    ends = {r["batch_id"]: analysis.batch_end_ms(r) / 1000 for r in batches}
    points = [(ends[b], float(latency)) for b, latency in pairs if b in ends]
    return [
        {"minute": round((t - start_s) / 60), **analysis.latency_summary([int(v) for v in values])}
        for t, values in analysis.per_interval(points, start_s, 60)
    ]


def _batch_series(history: list[dict[str, Any]], latency: dict[int, dict[str, int]]) -> list[dict[str, Any]]:
    return [
        {
            "batch_id": r["batch_id"],
            "start_ms": analysis.batch_start_ms(r),
            "end_ms": analysis.batch_end_ms(r),
            "input_rows": r["input_rows"],
            "duration_ms": r["batch_duration_ms"],
            "state_rows": r.get("state_rows", 0),
            "state_memory_bytes": r.get("state_memory_bytes", 0),
            "latency_ms": latency.get(r["batch_id"]),
        }
        for r in history
    ]
