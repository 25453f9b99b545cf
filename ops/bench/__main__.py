"""`python -m ops.bench` (`make bench`, `make bench-soak`): the side-by-side benchmark and the soak test.

Benchmark, in one run on one machine: start Kafka and Redis on free ports; generate (or take from the cache)
the traffic; measure the ceiling (write and read rates of the raw events); run the textbook baseline and then
the full pipeline, each catching up on the same backlog and then at the same increasing offered rates until it
no longer keeps up; write `report.md`, `report.json` and the plots to `OUT/<timestamp>/`.

Soak: the full pipeline at one offered rate for `--soak-minutes`, with memory, state and latency over time and
whether they stay flat; `OUT/soak-<timestamp>/`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from billing.layout import DataLayout
from ops.bench import ceiling, report
from ops.bench.measure import Sampler
from ops.bench.report import BASELINE, PIPELINE
from ops.bench.systems import (
    LoadOptions,
    System,
    prepare_system,
    run_system,
    scratch_settings,
    start_services,
)
from ops.bench.traffic import TrafficPlan, plan_traffic
from ops.process import interrupt_on_sigterm
from ops.settings import Settings

DEFAULT_RATES = "5000,10000,20000,40000,60000"
SIMULATOR_CEILING_EVENTS = 300_000
CACHED_PLANS = 3


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ops.bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rates", default=DEFAULT_RATES, help="offered events/s of the steps, comma-separated")
    parser.add_argument("--duration", type=int, default=30, help="seconds each step offers traffic")
    parser.add_argument("--backlog", type=int, default=100_000, help="events the jobs start on (0: none)")
    parser.add_argument("--burst", type=int, default=400_000, help="events sent at once after the steps (0: none)")
    parser.add_argument("--systems", default=f"{BASELINE},{PIPELINE}", help="which systems run, in order")
    parser.add_argument("--no-profile", action="store_true", help="no flight recording of the job JVM")
    parser.add_argument("--no-ceiling", action="store_true", help="skip the write and read ceilings")
    parser.add_argument("--drain-timeout", type=float, default=120.0, help="seconds to wait for a step's backlog")
    parser.add_argument("--seed", type=int, default=7, help="simulator seed")
    parser.add_argument("--soak-minutes", type=float, default=0.0, help="soak mode: minutes at --rate")
    parser.add_argument("--rate", type=int, default=10_000, help="soak mode: offered events/s")
    parser.add_argument("--out", type=Path, default=Path("var/bench"), help="parent folder of the report")
    parser.add_argument(
        "--keep-data", action="store_true", help="keep Kafka's data, the checkpoints and the archive afterwards"
    )
    parser.add_argument("--render", type=Path, help="only write report.md and the plots again from FOLDER/report.json")
    parser.add_argument(
        "--cluster-workers",
        default="",
        help="cluster mode: the pipeline on a local Spark standalone cluster of each of these worker counts "
        "(comma-separated, such as 1,2): throughput and the driver's CPU per event",
    )
    parser.add_argument("--worker-cores", type=int, default=1, help="cluster mode: cores of each worker")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting both systems run with, as in `adbill settings` without ADBILL_ (such as "
        "shuffle_partitions=2 or trigger_ms=500); repeat for more",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="LABEL:NAME=VALUE[;NAME=VALUE]",
        help="one more system, after the others: the pipeline with these settings on top of --set, named "
        "pipeline-LABEL (such as 'v4:join_state_format=4;state_store=rocksdb'); repeat for more. Each lever "
        "measured in the same run. "
        "Quote one with two settings, the ; is the shell's too: make bench BENCH_ARGS=\"--variant 'x:a=1;b=2'\"",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    interrupt_on_sigterm()  # a stopped run stops its Kafka, Redis and jobs (the `finally` blocks below)
    command = "python -m ops.bench " + shlex.join(sys.argv[1:] if argv is None else argv)
    if args.render:
        return render_again(args.render)
    if args.variant and (args.soak_minutes > 0 or args.cluster_workers):
        raise SystemExit("--variant is for the side-by-side benchmark; the soak and cluster modes take --set")
    if args.soak_minutes > 0:
        return soak(args, command)
    if args.cluster_workers:
        return cluster(args, command)
    return bench(args, command)


def overrides(pairs: list[str]) -> dict[str, Any]:
    """`--set NAME=VALUE` pairs as typed settings, parsed as the same ADBILL_NAME variables would be."""
    environ = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise SystemExit(f"--set {pair!r}: write NAME=VALUE, such as shuffle_partitions=2")
        environ[f"ADBILL_{name.strip().upper()}"] = value.strip()
    try:
        parsed = Settings.from_env(environ)
    except ValueError as exc:
        raise SystemExit(f"--set: {exc}") from exc
    names = [name.removeprefix("ADBILL_").lower() for name in environ]
    return {name: getattr(parsed, name) for name in names}


def variant(text: str) -> tuple[str, dict[str, Any]]:
    """`--variant LABEL:NAME=VALUE[;NAME=VALUE]` as its label and typed settings."""
    label, sep, pairs = text.partition(":")
    if not sep or not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,30}", label) or not pairs.strip():
        raise SystemExit(
            f"--variant {text!r}: write LABEL:NAME=VALUE[;NAME=VALUE], the label in lower-case letters, digits "
            "and dashes (such as 'v4:join_state_format=4;state_store=rocksdb')"
        )
    return label, overrides([p for p in pairs.split(";") if p.strip()])


def bench(args: argparse.Namespace, command: str) -> int:
    """The side-by-side benchmark (module doc)."""
    rates = [int(r) for r in str(args.rates).split(",") if r.strip()]
    names = [n.strip() for n in str(args.systems).split(",") if n.strip()]
    if not rates or any(r <= 0 for r in rates) or set(names) - {BASELINE, PIPELINE}:
        raise SystemExit("--rates are positive numbers; --systems names baseline and/or pipeline")
    variants = [variant(text) for text in args.variant]
    out = _folder(args.out, "")
    started = time.time()
    print(f"benchmark in {out}", flush=True)
    plan, generation = _plan(args.out / "traffic-cache", rates, args.duration, args.backlog, args.seed, 0, args.burst)
    services, stack, sampler = start_services(out, **overrides(args.set))
    systems = [prepare_system(name, services, out, plan) for name in names]
    systems += [prepare_system(f"{PIPELINE}-{label}", services, out, plan, **extra) for label, extra in variants]
    options = LoadOptions(drain_timeout_s=args.drain_timeout, profile=not args.no_profile)
    results: dict[str, Any] = {}
    ceiling_figures: dict[str, Any] = {}
    try:
        if not args.no_ceiling:
            ceiling_figures = _ceiling(plan, services, out)
        if plan.backlog is not None:
            ceiling_figures["backlog_loads"] = _load_backlog(plan, systems, services, out)
        for system in systems:
            print(f"{system.name}: starting ({system.command[-1]}) ...", flush=True)
            results[system.name] = run_system(system, plan, sampler, options)
            if system.overrides:
                results[system.name]["overrides"] = {k: str(v) for k, v in system.overrides.items()}
    finally:
        sampler.stop()
        stack.stop()
    traffic = {
        "rates": rates,
        "duration_s": args.duration,
        "backlog_events": args.backlog,
        "burst_events": args.burst,
        **generation,
    }
    data = _report(
        "bench", command, started, services, sampler, traffic=traffic, ceiling=ceiling_figures, systems=results
    )
    return _write(out, data, args.keep_data)


def soak(args: argparse.Namespace, command: str) -> int:
    """The soak test (module doc)."""
    out = _folder(args.out, "soak-")
    started = time.time()
    print(f"soak in {out}", flush=True)
    plan, generation = _plan(args.out / "traffic-cache", [args.rate], 0, 0, args.seed, 60)
    template = plan.steps[0]
    cycles = max(1, round(args.soak_minutes * 60 * args.rate / template.frames))
    services, stack, sampler = start_services(out, **overrides(args.set))
    system = prepare_system(PIPELINE, services, out, plan)
    options = LoadOptions(drain_timeout_s=args.drain_timeout, profile=False, soak_cycles=cycles)
    try:
        print(f"pipeline: {cycles} cycles of {template.frames:,} events at {args.rate:,}/s ...", flush=True)
        result = run_system(system, plan, sampler, options)
    finally:
        sampler.stop()
        stack.stop()
    traffic = {"rates": [args.rate], "minutes": args.soak_minutes, "cycles": cycles, **generation}
    data = _report("soak", command, started, services, sampler, traffic=traffic, ceiling={}, systems={PIPELINE: result})
    return _write(out, data, args.keep_data)


def cluster(args: argparse.Namespace, command: str) -> int:
    """The pipeline on a local Spark standalone cluster of 1, 2... workers (a master and the workers from
    pyspark's own jars, as `adbill up --cluster` starts them), each on the same traffic: how the throughput
    follows the executors' cores, and what the driver does per event (the job's own process tree is the driver:
    the executors run under the workers). `OUT/cluster-<timestamp>/`."""
    from ops.process import free_ports

    counts = [int(n) for n in str(args.cluster_workers).split(",") if n.strip()]
    rates = [int(r) for r in str(args.rates).split(",") if r.strip()]
    if not counts or min(counts) < 1 or not rates or args.worker_cores < 1:
        raise SystemExit("--cluster-workers and --rates are positive numbers, such as --cluster-workers 1,2")
    out = _folder(args.out, "cluster-")
    started = time.time()
    print(f"cluster benchmark in {out}", flush=True)
    plan, generation = _plan(args.out / "traffic-cache", rates, args.duration, args.backlog, args.seed, 0, args.burst)
    options = LoadOptions(drain_timeout_s=args.drain_timeout, profile=False)
    results: dict[str, Any] = {}
    settings: dict[str, Any] = {}
    for workers in counts:
        folder = out / f"workers-{workers}"
        master_port, ui_port = free_ports(2)
        services, stack, sampler = start_services(
            folder,
            spark_master=f"spark://127.0.0.1:{master_port}",
            spark_master_ui_port=ui_port,
            spark_workers=workers,
            spark_worker_cores=args.worker_cores,
            stream_cores=workers * args.worker_cores,
            **overrides(args.set),
        )
        try:
            system = prepare_system(PIPELINE, services, folder, plan)
            if plan.backlog is not None:
                _load_backlog(plan, [system], services, folder)
            print(f"pipeline on {workers} worker(s) of {args.worker_cores} core(s): starting ...", flush=True)
            results[str(workers)] = run_system(system, plan, sampler, options)
        finally:
            sampler.stop()
            stack.stop()
        settings = _settings_summary(services)
    data = {
        "kind": "cluster",
        "command": command,
        "started": started,
        "finished": time.time(),
        "settings": settings | {"worker_cores": args.worker_cores},
        "traffic": {"rates": rates, "duration_s": args.duration, "burst_events": args.burst, **generation},
        "workers": results,
        "machine": {"cores": os.cpu_count(), "load_average_at_end": [round(x, 2) for x in os.getloadavg()]},
    }
    scaling = report.cluster_rows(data)
    data["scaling"] = scaling
    (out / "report.json").write_text(json.dumps(data, indent=1, default=str))
    (out / "report.md").write_text(report.render_cluster(data))
    print(report.render_cluster(data), flush=True)
    print(f"report: {out / 'report.md'}", flush=True)
    if not args.keep_data:
        for count in counts:
            for part in ("services/kafka/data", "pipeline/archive", "pipeline/checkpoints", "pipeline/spark-tmp"):
                shutil.rmtree(out / f"workers-{count}" / part, ignore_errors=True)
    failed = [n for n, result in results.items() if result.get("error")]
    exact = all(row["ledger_exact"] is not False for row in scaling)
    return 0 if exact and not failed else 1


def render_again(folder: Path) -> int:
    """report.md and the plots of a finished run, from its report.json (after a change to the report's code)."""
    from ops.bench import plots

    data = report.derive(json.loads((folder / "report.json").read_text()))
    if data["kind"] == "bench":
        data["batch_time"] = _batch_time(folder, data) or data.get("batch_time") or {}
    (folder / "report.json").write_text(json.dumps(data, indent=1, default=str))
    (folder / "report.md").write_text(report.render(data, plots.draw(data, folder)))
    print(report.console_summary(data), flush=True)
    return 0


def _batch_time(out: Path, data: Mapping[str, Any]) -> dict[str, Any]:
    """Where each system's batches spent their time, from Spark's event logs (`ops.bench.eventlog`); none, with
    the reason printed, when a log cannot be read: the rest of the report does not depend on it."""
    from ops.bench import eventlog

    try:
        return eventlog.breakdowns(out, data["systems"])
    except (OSError, ValueError, KeyError) as exc:
        print(f"no batch time breakdown: Spark's event log in {out} could not be read: {exc!r}", flush=True)
        return {}


def _folder(parent: Path, prefix: str) -> Path:
    out = (parent / f"{prefix}{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}").resolve()
    out.mkdir(parents=True)
    return out


def _plan(
    cache: Path, rates: list[int], duration_s: int, backlog: int, seed: int, template_s: int, burst: int = 0
) -> tuple[TrafficPlan, dict[str, Any]]:
    began = time.monotonic()
    print("traffic: generating (or reusing) the runs ...", flush=True)
    plan = plan_traffic(cache.resolve(), rates, duration_s, backlog, seed, template_s, burst)
    seconds = round(time.monotonic() - began, 1)
    # Keep the few plans used last; each takes tens to hundreds of MB.
    others = sorted((f for f in cache.resolve().iterdir() if f != plan.folder), key=lambda f: f.stat().st_mtime)
    for stale in others[:-CACHED_PLANS]:
        shutil.rmtree(stale, ignore_errors=True)
    os.utime(plan.folder)
    summary = plan.steps[-1].summary()
    mix = {k: summary.get(k) for k in ("sent", "duplicates", "bad", "billable") if k in summary}
    print(f"traffic: {len(plan.datasets())} runs ready in {seconds} s ({plan.folder})", flush=True)
    return plan, {"prepared_in_s": seconds, "cache": str(plan.folder), "mix_of_last_run": mix}


def _ceiling(plan: TrafficPlan, services: Settings, out: Path) -> dict[str, Any]:
    """Write the largest run to topics of its own as fast as possible (the write ceiling), read it back with
    Kafka's tool and a Python consumer (the read ceiling), and time the simulator producing (`ops.bench.ceiling`)."""
    from ops.stack import ensure_stack_topics, local_kafka

    folder = out / "ceiling"
    written = scratch_settings(services, folder / "write", "ceiling")
    ensure_stack_topics(written)
    largest = max(plan.datasets(), key=lambda d: d.frames)
    write = ceiling.send_unpaced(largest, plan.registry_file, services.kafka_bootstrap, written.topics, folder)
    print(f"ceiling: wrote {write['records']:,} pre-serialized events at {write['rate']:,}/s", flush=True)
    counts = {t: sum(ceiling.end_offsets(services.kafka_bootstrap, t).values()) for t in written.topics.values()}
    read_tool = ceiling.kafka_consumer_perf(local_kafka(services).tool_command, services.kafka_bootstrap, counts)
    print(f"ceiling: Kafka's ConsumerPerformance read {read_tool['records']:,} at {read_tool['rate']:,}/s", flush=True)
    read_python = ceiling.python_consumer(services.kafka_bootstrap, list(counts), sum(counts.values()))
    print(f"ceiling: a Python consumer read {read_python['records']:,} at {read_python['rate']:,}/s", flush=True)
    simulating = scratch_settings(services, folder / "simulator", "simulator")
    ensure_stack_topics(simulating)
    events = min(largest.frames, SIMULATOR_CEILING_EVENTS)
    simulated = ceiling.simulator_producer(simulating.to_env(), events, folder / "simulator" / "run")
    print(f"ceiling: adbill produce (simulating) wrote {simulated['records']:,} at {simulated['rate']:,}/s", flush=True)
    return {
        "write_preserialized": write,
        "write_simulator": simulated,
        "read_kafka_tool": read_tool,
        "read_python": read_python,
    }


def _load_backlog(plan: TrafficPlan, systems: list[System], services: Settings, out: Path) -> list[dict[str, Any]]:
    """The backlog into every system's topics, before its job starts."""
    assert plan.backlog is not None
    loads = []
    for system in systems:
        load = ceiling.send_unpaced(
            plan.backlog, plan.registry_file, services.kafka_bootstrap, system.topics, out / system.name
        )
        loads.append({"system": system.name, "records": load["records"], "rate": load["rate"]})
        print(f"backlog: {load['records']:,} events in {system.name}'s topics ({load['rate']:,}/s)", flush=True)
    return loads


def _settings_summary(settings: Settings) -> dict[str, Any]:
    """The settings both systems run with, for the report."""
    names = [
        *("spark_master", "shuffle_partitions", "trigger_ms", "max_offsets_per_trigger", "state_store"),
        "join_state_format",
        *("driver_memory", "impression_watermark_ms", "click_watermark_ms", "topic_partitions"),
    ]
    return {name: getattr(settings, name) for name in names} | {"state_store": settings.new_state_store}


def _report(
    kind: str, command: str, started: float, services: Settings, sampler: Sampler, **parts: Mapping[str, Any]
) -> dict[str, Any]:
    """The report of a run that finishes now (`report.build`; `parts`: its traffic, ceiling and systems), with the
    settings of `services` and the machine's figures since `started` from `sampler`."""
    finished = time.time()
    settings = _settings_summary(services)
    machine = _machine(sampler, started)
    return report.build(
        kind=kind, command=command, started=started, finished=finished, settings=settings, machine=machine, **parts
    )


def _machine(sampler: Sampler, started: float) -> dict[str, Any]:
    return {
        "cores": os.cpu_count(),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "busy_cores_mean": round(sampler.machine_cores(started, time.time()), 2),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    }


def _write(out: Path, data: dict[str, Any], keep_data: bool) -> int:
    from ops.bench import plots

    if data["kind"] == "bench":
        data["batch_time"] = _batch_time(out, data)
    (out / "report.json").write_text(json.dumps(data, indent=1, default=str))
    images = plots.draw(data, out)
    (out / "report.md").write_text(report.render(data, images))
    if not keep_data:
        homes = [DataLayout(out / name) for name in {PIPELINE, BASELINE, *(data.get("systems") or {})}]
        heavy = [out / "services" / "kafka" / "data", *(home.archive for home in homes)]
        heavy += [folder for home in homes for folder in (home.checkpoints, home.spark_scratch())]
        for folder in heavy:
            shutil.rmtree(folder, ignore_errors=True)
    print(report.console_summary(data), flush=True)
    print(f"report: {out / 'report.md'}", flush=True)
    failed = [name for name, result in (data.get("systems") or {}).items() if result.get("error")]
    return 0 if report.ledgers_exact(data) and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
