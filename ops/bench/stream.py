"""`make bench-stream`: simulated traffic at one offered rate through Kafka and the streaming job.

One step of `make bench` (`ops.bench`), for a quick look at one rate: starts its own Kafka and Redis on free ports
in a fresh folder, generates the traffic beforehand (`ops.bench.traffic`: pre-serialized, with its ground truth),
starts the job (`adbill stream`), sends the traffic at the offered rate from a separate process, samples the
job's CPU and memory from /proc, and prints:

- sustained throughput (the rate the job kept up with over the send window) and the end-to-end rate (events
  over the time from the first event sent to the batch that read the last one);
- latency from a click's arrival in Kafka (its record timestamp) to its bill in Redis (the end of the micro-batch
  that applied it), p50 / p99 / max over every billed click;
- CPU (of the job's process tree, in cores) and peak resident memory;
- whether the ledger equals the simulator's ground truth exactly (the run has no late events).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from ops.bench.report import PIPELINE
from ops.bench.systems import LoadOptions, prepare_system, run_system, start_services
from ops.bench.traffic import plan_traffic
from ops.settings import Settings


def run(rate: int, duration_s: int, home: Path, state_store: str, shuffle_partitions: int) -> dict[str, Any]:
    """One offered rate through the job; the figures of that step."""
    plan = plan_traffic(home.parent / "traffic-cache", [rate], duration_s, 0, seed=3)
    services, stack, sampler = start_services(home, state_store=state_store, shuffle_partitions=shuffle_partitions)
    try:
        system = prepare_system(PIPELINE, services, home, plan)
        print(f"offering {rate:,} events/s for {duration_s} s, state store {state_store} ...", flush=True)
        options = LoadOptions(drain_timeout_s=max(300, duration_s * 5), profile=False)
        result = run_system(system, plan, sampler, options)
    finally:
        sampler.stop()
        stack.stop()
    step = result["steps"][0]
    check = step["ledger_check"]
    return {
        "offered_rate": rate,
        "duration_s": duration_s,
        "state_store": state_store,
        "shuffle_partitions": shuffle_partitions,
        "events_sent": step["events_sent"],
        "producer_rate": step["offered_rate_achieved"],
        "sustained_rate": step["sustained_rate"],
        "end_to_end_rate": step["end_to_end_rate"],
        "latency_ms": step["latency_ms"],
        "job_cpu_cores": step["job_cpu_cores"],
        "job_peak_rss_mb": step["job_peak_rss_mb"],
        "state_rows_max": step["state_rows_max"],
        "billed_clicks": check["billed"],
        "ledger_equals_ground_truth": check["equal"],
        "ledger_check": check,
        "step": step,
        "batches": result["batches"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=int, default=20_000, help="offered events per second")
    parser.add_argument("--duration", type=int, default=60, help="seconds of traffic")
    parser.add_argument("--state-store", choices=["rocksdb", "hdfs"], default="rocksdb")
    parser.add_argument("--shuffle-partitions", type=int, default=Settings().shuffle_partitions)
    parser.add_argument("--out", type=Path, default=Path("var/bench"), help="folder for the run and its report")
    args = parser.parse_args(argv)
    home = (args.out / f"stream-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}").resolve()
    result = run(args.rate, args.duration, home, args.state_store, args.shuffle_partitions)
    (home / "report.json").write_text(json.dumps(result, indent=1))
    lat = result["latency_ms"]
    print(
        f"sustained {result['sustained_rate']:,} events/s, end to end {result['end_to_end_rate'] or 0:,} "
        f"(offered {args.rate:,}, sent at {result['producer_rate']:,}); "
        f"latency p50 {lat['p50']} ms, p99 {lat['p99']} ms, max {lat['max']} ms; "
        f"job CPU {result['job_cpu_cores']} cores, peak RSS {result['job_peak_rss_mb']} MB; "
        f"ledger equals ground truth: {result['ledger_equals_ground_truth']} ({result['billed_clicks']} clicks)"
    )
    print(f"report: {home / 'report.json'}")
    return 0 if result["ledger_equals_ground_truth"] else 1


if __name__ == "__main__":
    sys.exit(main())
