"""`make bench-stream`: simulated traffic at a fixed offered rate through Kafka and the streaming job.

Starts its own Kafka and Redis on free ports in a fresh folder, the job (`adbill stream`) and the simulator
(`adbill produce --rate R`) as child processes, samples the job's CPU and memory from /proc, and prints:

- sustained throughput: events the job read, over the time from the first event sent to the batch that finished
  the last one;
- latency from a click's arrival in Kafka (its record timestamp) to its bill in Redis (the end of the micro-batch
  that applied it), p50 / p99 / max over every billed click;
- CPU (of the job's process tree, in cores) and peak resident memory;
- whether the ledger equals the simulator's ground truth exactly (the run has no late events).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from billing.parquet_ledger import read_ledger
from ops.process import free_port
from ops.settings import Settings
from ops.stack import Stack

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class ProcessSampler:
    """CPU seconds and resident memory of a process and its descendants, sampled every `interval_s`."""

    pid: int
    interval_s: float = 1.0
    samples: list[tuple[float, float, int]] = field(default_factory=list)  # (time, cpu seconds, rss bytes)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=self._run, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            cpu, rss = 0.0, 0
            for pid in _tree(self.pid):
                try:
                    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                    cpu += (int(stat[11]) + int(stat[12])) / CLOCK_TICKS
                    rss += int(stat[21]) * os.sysconf("SC_PAGE_SIZE")
                except (OSError, IndexError, ValueError):
                    continue
            self.samples.append((time.time(), cpu, rss))

    def cores_between(self, start: float, end: float) -> float:
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2:
            return 0.0
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])

    @property
    def peak_rss(self) -> int:
        return max((s[2] for s in self.samples), default=0)


def _tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def percentile(sorted_values: list[int], q: float) -> int:
    if not sorted_values:
        return 0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def run(rate: int, duration_s: int, home: Path, state_store: str, shuffle_partitions: int) -> dict[str, object]:
    settings = Settings.from_env(
        {},
        home=home,
        kafka_bootstrap=f"127.0.0.1:{free_port()}",
        kafka_controller_port=free_port(),
        redis_url=f"redis://127.0.0.1:{free_port()}/0",
        metrics_port=0,
        state_store=state_store,
        shuffle_partitions=shuffle_partitions,
        traffic_seed=3,
    )
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ADBILL_")}, **settings.to_env()}
    env["ADBILL_NO_PROGRESS"] = "1"
    stack = Stack(settings)
    stack.start_services()
    logs = settings.logs_dir
    logs.mkdir(parents=True, exist_ok=True)
    job = subprocess.Popen(
        [sys.executable, "-m", "ops.cli", "stream"],
        env=env,
        stdout=(logs / "stream.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    sampler = ProcessSampler(job.pid)
    sampler.start()
    import redis

    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    prefix = settings.redis_prefix
    try:
        _wait(lambda: client.exists(f"{prefix}:health:query:billing"), 180, "the job to start", job)
        events = rate * duration_s
        run_dir = home / "run"
        print(
            f"offering {rate:,} events/s for {duration_s} s ({events:,} events), state store {state_store} ...",
            flush=True,
        )
        started = time.time()
        producer = subprocess.run(
            [
                sys.executable,
                "-m",
                "ops.cli",
                "produce",
                "--events",
                str(events),
                "--rate",
                str(rate),
                "--seed",
                "3",
                "--late",
                "0",
                "--run-dir",
                str(run_dir),
                "--no-progress",
            ],
            env=env,
            capture_output=True,
            text=True,
        )
        sent_done = time.time()
        if producer.returncode != 0:
            raise RuntimeError(f"the producer failed:\n{producer.stderr[-2000:]}")
        print(producer.stderr.strip().splitlines()[-2], flush=True)
        truth = {}
        with (run_dir / "billable.jsonl").open() as lines:
            for line in lines:
                row = json.loads(line)
                truth[row["click_id"]] = row["amount_micros"]
        sent = json.loads((run_dir / "publish.json").read_text())["delivered"]

        def caught_up() -> bool:
            return sum(h["input_rows"] for h in client_history(client, prefix)) >= sent

        _wait(caught_up, max(300, duration_s * 5), "the job to read every event", job)
        history = client_history(client, prefix)
        finished = max(_batch_end(h) for h in history if h["input_rows"] > 0) / 1000
    finally:
        sampler.stop()
        job.terminate()
        job.wait(timeout=60)
        stack.stop()
    ledger = read_ledger(home / "ledger").to_pylist()
    batch_end = {h["batch_id"]: _batch_end(h) for h in history}
    latencies = sorted(batch_end[row["batch_id"]] - row["click_received_ms"] for row in ledger)
    billed = {row["click_id"]: row["amount_micros"] for row in ledger}
    return {
        "offered_rate": rate,
        "duration_s": duration_s,
        "state_store": state_store,
        "shuffle_partitions": shuffle_partitions,
        "events_sent": sent,
        "producer_rate": round(sent / (sent_done - started)),
        "sustained_rate": round(sent / (finished - started)),
        "latency_ms": {
            "p50": percentile(latencies, 0.50),
            "p99": percentile(latencies, 0.99),
            "max": latencies[-1] if latencies else 0,
        },
        "job_cpu_cores": round(sampler.cores_between(started, finished), 2),
        "job_peak_rss_mb": round(sampler.peak_rss / 2**20),
        "state_rows_last": history[0]["state_rows"] if history else 0,
        "billed_clicks": len(billed),
        "ledger_equals_ground_truth": billed == truth and len(ledger) == len(billed),
        "batches": [
            {k: h[k] for k in ("batch_id", "input_rows", "durations_ms", "state_rows", "rows_dropped_by_watermark")}
            for h in sorted(history, key=lambda h: h["batch_id"])
        ],
    }


def client_history(client, prefix: str) -> list[dict]:  # type: ignore[no-untyped-def]
    return [json.loads(h) for h in client.lrange(f"{prefix}:health:history:billing", 0, -1)]


def _batch_end(record: dict) -> int:
    from datetime import datetime

    start = datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00")).timestamp() * 1000
    return int(start + record["batch_duration_ms"])


def _wait(check, timeout_s: float, what: str, job: subprocess.Popen) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if job.poll() is not None:
            raise RuntimeError(f"the job exited with code {job.returncode} while waiting for {what}")
        if check():
            return
        time.sleep(1)
    raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")


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
        f"sustained {result['sustained_rate']:,} events/s "
        f"(offered {args.rate:,}, producer {result['producer_rate']:,}); "
        f"latency p50 {lat['p50']} ms, p99 {lat['p99']} ms, max {lat['max']} ms; "  # type: ignore[index]
        f"job CPU {result['job_cpu_cores']} cores, peak RSS {result['job_peak_rss_mb']} MB; "
        f"ledger equals ground truth: {result['ledger_equals_ground_truth']} ({result['billed_clicks']} clicks)"
    )
    print(f"report: {home / 'report.json'}")
    return 0 if result["ledger_equals_ground_truth"] else 1


if __name__ == "__main__":
    sys.exit(main())
