"""The chaos suite (`make chaos`, `python -m ops.chaos`): the local cluster under steady live traffic, faults at
seeded random moments, and a verdict on the books.

The cluster (`adbill up --cluster`) runs on free loopback ports in its own folder (`var/chaos/<time>/home`), with
one-minute periods and a one-minute lateness horizon, so that periods close during the run. Live simulated traffic
(`adbill produce --live`, its ground truth beside it) and 1 % poison records (garbage bytes, an unknown schema id,
empty values; their offsets noted) flow all along, and a web client reads the JSON API every second. The faults
come one after the other in a seeded order, each after a seeded pause, and each is recovered as an operator would
(`adbill up` again starts whatever is missing):

- `driver`: SIGKILL of the streaming job's driver;
- `worker`: SIGKILL of one Spark worker, restarted after a while;
- `broker`: SIGKILL of the leader broker of a partition, restarted after a while;
- `redis`: Redis SIGKILLed and its data folder removed; the job stopped, Redis started empty, the totals rebuilt
  from the ledger (`adbill rebuild-totals`), the job started;
- `outage`: the job stopped for longer than the lateness horizon; reconciliation must hold the periods it has not
  read, and close them once it has.

Then the traffic stops, the job catches up, `adbill reconcile --until` closes every period (never `--force`) and
`adbill audit` proves the books. The verdict: the ledger equals the ground truth, no click is billed in two
batches, Redis equals the ledger to the micro, the exports equal the ground truth, every poison record is in
quarantine, and the web API answered every read. Per fault: the time to recover (until the job billed a batch
again) and the events delayed (records that reached Kafka while the job could not bill them). Printed, and written
to `report.md` and `report.json`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.cookiejar
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from billing.store.catalog_file import save_catalog
from ops.process import pid_alive
from ops.settings import PROJECT_ROOT, Settings
from ops.stack import local_cluster_env

FAULTS = ["driver"] * 5 + ["worker"] + ["broker"] * 3 + ["redis", "outage"]
PERIOD_MS = 60_000
HORIZON_MS = 60_000
POISON_FRACTION = 0.01


@dataclass
class FaultRecord:
    kind: str
    pause_s: float
    """Seeded pause before the fault, after the previous one recovered."""
    at_s: float = 0.0
    """When it struck, seconds after the traffic started."""
    target: str = ""
    recovered_s: float | None = None
    """From the fault until the job billed a batch again (None: it did not, within the deadline)."""
    delayed_events: int = 0
    """Records that reached Kafka between the fault and the recovery."""
    note: str = ""


@dataclass
class WebReads:
    ok: int = 0
    failed: int = 0
    failed_during: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)


class Chaos:
    def __init__(self, out: Path, seed: int, rate: int) -> None:
        self.out = out
        self.seed = seed
        self.rate = rate
        self.rng = random.Random(seed)
        self.home = out / "home"
        self.env = cluster_env(self.home)
        self.settings = Settings.from_env(self.env)
        self.t0 = 0.0
        self.faults: list[FaultRecord] = []
        self.active_fault = ""
        self.stop = threading.Event()
        self.web = WebReads()
        self.poison: list[tuple[str, int, int, str]] = []
        self.poison_failed = 0
        self.traffic: subprocess.Popen[bytes] | None = None
        self.log = (out / "chaos.log").open("a")

    # Helpers -----------------------------------------------------------------------------------------------------
    def say(self, line: str) -> None:
        stamp = f"[{time.monotonic() - self.t0:7.1f} s] " if self.t0 else ""
        print(stamp + line, flush=True)
        self.log.write(stamp + line + "\n")
        self.log.flush()

    def adbill(self, *args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "ops.cli", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=600,
            input=stdin,
        )
        self.log.write(f"$ adbill {' '.join(args)} -> {done.returncode}\n{done.stdout}{done.stderr}\n")
        if check and done.returncode != 0:
            raise RuntimeError(f"adbill {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done

    def up(self) -> None:
        self.adbill("up", "--cluster", "--detach", "--no-traffic")

    def totals(self) -> Any:
        from billing.store.redis_totals import RedisTotals

        return RedisTotals.from_url(self.settings.redis_url, self.settings.redis_prefix)

    def last_batch(self) -> int:
        try:
            return int(self.totals().last_applied("billing") or -1)
        except Exception:  # Redis down: nothing known
            return -1

    def kafka_end(self) -> int:
        from attribution.stream_position import end_offsets

        try:
            ends = end_offsets(self.settings.kafka_bootstrap, list(self.settings.topics.values()))
        except Exception:
            return 0
        return sum(o for parts in ends.values() for o in parts.values())

    def pid(self, name: str) -> int:
        pid = pid_alive(self.settings.run_dir / f"{name}.pid")
        if pid is None:
            raise RuntimeError(f"{name} is not running")
        return pid

    def wait_billed_after(self, batch: int, deadline_s: float = 600) -> float | None:
        start = time.monotonic()
        while time.monotonic() - start < deadline_s:
            if self.last_batch() > batch:
                return time.monotonic() - start
            time.sleep(0.5)
        return None

    # The run -----------------------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        from producers.simulator import SimulationConfig

        config = SimulationConfig(seed=self.seed, duration_s=1)
        self.home.mkdir(parents=True)
        save_catalog(config.catalog(), self.settings.catalog_file)
        plan = list(FAULTS)
        self.rng.shuffle(plan)
        self.faults = [FaultRecord(kind, round(self.rng.uniform(5, 30), 1)) for kind in plan]
        self.say(f"chaos: seed {self.seed}, {self.rate} events/s, home {self.home}")
        self.say("chaos: plan " + ", ".join(f"{f.kind} after {f.pause_s} s" for f in self.faults))
        started = time.monotonic()
        try:
            self.up()
            self.say(
                f"cluster up in {time.monotonic() - started:.0f} s: {self.settings.kafka_bootstrap}, "
                f"{self.settings.spark_master}, {self.settings.redis_url}"
            )
            self.adbill("users", "add", "chaos", "--role", "finance", "--password-stdin", stdin="chaos-password\n")
            self.start_traffic()
            threads = [
                threading.Thread(target=self.read_web, daemon=True),
                threading.Thread(target=self.send_poison, daemon=True),
            ]
            for thread in threads:
                thread.start()
            first = self.wait_billed_after(-1)
            self.say(f"first batch billed {first:.0f} s after the traffic started" if first else "no batch billed!")
            for fault in self.faults:
                time.sleep(fault.pause_s)
                self.strike(fault)
            time.sleep(30)
            truth = self.stop_traffic()
            self.stop.set()
            for thread in threads:
                thread.join(timeout=30)
            return self.verdict(truth)
        finally:
            self.stop.set()
            if self.traffic is not None and self.traffic.poll() is None:
                self.traffic.send_signal(signal.SIGINT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.traffic.wait(timeout=60)
            done = self.adbill("down", "--cluster", check=False)
            self.say(f"down: {done.stdout.strip()}")

    def start_traffic(self) -> None:
        run_dir = self.out / "traffic"
        args = [
            "produce",
            "--live",
            "--duration",
            "7200",
            "--rate",
            str(self.rate),
            "--seed",
            str(self.seed),
            "--late",
            "0",
            "--bad",
            "0",
            "--run-dir",
            str(run_dir),
            "--no-progress",
        ]
        log = (self.out / "traffic.log").open("ab")
        self.traffic = subprocess.Popen([sys.executable, "-m", "ops.cli", *args], env=self.env, stdout=log, stderr=log)
        self.t0 = time.monotonic()
        self.say(f"traffic: adbill {' '.join(args)}")

    def stop_traffic(self) -> dict[str, int]:
        assert self.traffic is not None
        self.traffic.send_signal(signal.SIGINT)
        code = self.traffic.wait(timeout=300)
        summary = json.loads((self.out / "traffic" / "summary.json").read_text())
        self.say(f"traffic stopped (exit {code}); {json.dumps(summary.get('publish', summary))[:300]}")
        with (self.out / "traffic" / "billable.jsonl").open() as lines:
            return {row["click_id"]: row["amount_micros"] for row in map(json.loads, lines)}

    # Faults ------------------------------------------------------------------------------------------------------
    def strike(self, fault: FaultRecord) -> None:
        fault.at_s = round(time.monotonic() - self.t0, 1)
        self.active_fault = fault.kind
        before_end = self.kafka_end()
        before = self.last_batch()
        struck = time.monotonic()
        try:
            getattr(self, f"fault_{fault.kind}")(fault, before)
            recovered = self.wait_billed_after(max(before, self.last_batch()) if fault.kind == "redis" else before)
            fault.recovered_s = None if recovered is None else round(time.monotonic() - struck, 1)
        except Exception as exc:  # a fault that could not be dealt is reported, not fatal to the suite
            fault.note = f"{fault.note} FAILED: {exc}".strip()
        fault.delayed_events = max(0, self.kafka_end() - before_end)
        self.active_fault = ""
        self.say(
            f"fault {fault.kind:<7} at {fault.at_s:7.1f} s on {fault.target}: recovered in "
            f"{fault.recovered_s} s, {fault.delayed_events} events delayed {fault.note}"
        )

    def fault_driver(self, fault: FaultRecord, before: int) -> None:
        pid = self.pid("stream")
        fault.target = f"stream driver pid {pid}"
        os.kill(pid, signal.SIGKILL)
        self.up()

    def fault_worker(self, fault: FaultRecord, before: int) -> None:
        n = self.rng.randint(1, self.settings.spark_workers)
        pid = self.pid(f"spark-worker-{n}")
        fault.target = f"spark-worker-{n} pid {pid}"
        os.kill(pid, signal.SIGKILL)
        away = round(self.rng.uniform(20, 40), 1)
        billed = self.wait_billed_after(before, away)
        time.sleep(max(0.0, away - (billed or away)))
        self.up()
        fault.note = f"restarted after {away} s; billed on one worker after {billed and round(billed, 1)} s"

    def fault_broker(self, fault: FaultRecord, before: int) -> None:
        from ops.kafka_service import partition_leaders

        topic = self.rng.choice(list(self.settings.topics.values()))
        partition = self.rng.randrange(self.settings.topic_partitions)
        leader = partition_leaders(self.settings.kafka_bootstrap, topic)[partition]
        pid = self.pid(f"kafka-{leader}")
        fault.target = f"kafka-{leader} (leader of {topic}/{partition}) pid {pid}"
        os.kill(pid, signal.SIGKILL)
        away = round(self.rng.uniform(15, 30), 1)
        time.sleep(away)
        self.up()
        fault.note = f"restarted after {away} s"

    def fault_redis(self, fault: FaultRecord, before: int) -> None:
        pid = self.pid("redis")
        fault.target = f"redis pid {pid}, data folder removed"
        os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.settings.redis_dir, ignore_errors=True)
        time.sleep(5)
        # The operator: stop the job, start Redis empty, rebuild the totals from the ledger, start the job.
        stream = pid_alive(self.settings.run_dir / "stream.pid")
        if stream is not None:
            os.kill(stream, signal.SIGTERM)
            for _ in range(120):
                if pid_alive(self.settings.run_dir / "stream.pid") is None:
                    break
                time.sleep(0.5)
        self.adbill("up", "--cluster", "--detach", "--no-traffic", "--no-job", "--no-web")
        rebuilt = self.adbill("rebuild-totals").stdout.strip()
        self.adbill("users", "list")
        self.up()
        fault.note = rebuilt

    def fault_outage(self, fault: FaultRecord, before: int) -> None:
        pid = self.pid("stream")
        fault.target = f"stream stopped (pid {pid}) for the horizon + 45 s"
        log_file = self.settings.logs_dir / "reconcile.log"
        seen = log_file.stat().st_size
        os.kill(pid, signal.SIGTERM)
        time.sleep(HORIZON_MS / 1000 + 45)
        with log_file.open(errors="replace") as log:
            log.seek(seen)
            held = dict(re.findall(r"period (\S+) held: ([^\n]+)", log.read()))  # the last reason of each
        self.up()
        fault.note = f"recovery includes the {HORIZON_MS / 1000 + 45:.0f} s outage; held while down: " + (
            "; ".join(f"{p} ({why})" for p, why in sorted(held.items())) or "none"
        )

    # Side loads --------------------------------------------------------------------------------------------------
    def read_web(self) -> None:
        base = f"http://127.0.0.1:{self.settings.web_port}"
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        logged_in = False
        while not self.stop.is_set():
            try:
                if not logged_in:
                    page = opener.open(f"{base}/login", timeout=5).read().decode()
                    page = page[page.index('id="login-form"') :] if 'id="login-form"' in page else page
                    token = re.search(r'name="csrf_token" value="([^"]+)"', page)
                    data = urllib.parse.urlencode(
                        {
                            "username": "chaos",
                            "password": "chaos-password",
                            "csrf_token": token.group(1) if token else "",
                        }
                    ).encode()
                    opener.open(f"{base}/login", data=data, timeout=5).read()
                    logged_in = True
                for path in ("/api/v1/periods", "/api/v1/finance"):
                    with opener.open(base + path, timeout=5) as response:
                        json.load(response)
                    self.web.ok += 1
            except Exception as exc:
                self.web.failed += 1
                self.web.failed_during[self.active_fault or "none"] += 1
                at = round(time.monotonic() - self.t0, 1)
                self.web.failures.append(f"{at} s ({self.active_fault or 'no fault'}): {str(exc)[:120]}")
                logged_in = False
            self.stop.wait(1.0)

    def send_poison(self) -> None:
        from confluent_kafka import Producer

        producer = Producer(
            {
                "bootstrap.servers": self.settings.kafka_bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "log_level": 0,
            }
        )
        kinds = ["garbage", "schema", "empty"]
        rng = random.Random(self.seed + 1)  # its own: the faults' draws stay the seed's whatever this thread does
        interval = 1 / (self.rate * POISON_FRACTION)
        n = 0

        def delivered(err: Any, msg: Any, kind: str) -> None:
            if err is None:
                self.poison.append((msg.topic(), msg.partition(), msg.offset(), kind))
            else:
                self.poison_failed += 1

        while not self.stop.is_set():
            kind = kinds[n % 3]
            value = {
                "garbage": rng.randbytes(24),
                "schema": b"\x00" + (99_999).to_bytes(4, "big") + rng.randbytes(16),
                "empty": b"",
            }[kind]
            topic = list(self.settings.topics.values())[n % 2]
            producer.produce(
                topic,
                value=value,
                key=f"poison-{n}".encode(),
                on_delivery=functools.partial(delivered, kind=kind),
            )
            producer.poll(0)
            n += 1
            self.stop.wait(interval)
        producer.flush(120)

    # Verdict -----------------------------------------------------------------------------------------------------
    def verdict(self, truth: dict[str, int]) -> dict[str, Any]:
        import pyarrow.dataset as ds

        from billing.store.export_files import exported_bills, read_export
        from billing.store.parquet_ledger import read_ledger

        # The job catches up with everything sent.
        caught = None
        start = time.monotonic()
        while time.monotonic() - start < 600:
            rows = read_ledger(self.settings.layout.ledger).to_pylist()
            if len(rows) >= len(truth):
                caught = time.monotonic() - start
                break
            time.sleep(2)
        time.sleep(5)
        rows = read_ledger(self.settings.layout.ledger).to_pylist()
        self.say(f"ledger: {len(rows)} rows, truth {len(truth)} clicks; caught up in {caught and round(caught)} s")
        last_event_ms = max((r["click_time"] for r in rows), default=int(time.time() * 1000))
        until = (last_event_ms // PERIOD_MS + 1) * PERIOD_MS
        time.sleep(5)
        for _ in range(30):  # exit 4: the scheduled run holds the lock; try again once it is done
            reconcile = self.adbill("reconcile", "--until", str(until), check=False)
            if reconcile.returncode != 4:
                break
            time.sleep(10)
        self.say(f"reconcile --until {until}: exit {reconcile.returncode}: {reconcile.stdout.strip()[-600:]}")
        audit = self.adbill("audit", check=False)
        self.say(f"audit: exit {audit.returncode}: {audit.stdout.strip().splitlines()[-1] if audit.stdout else ''}")

        billed = Counter(r["click_id"] for r in rows)
        twice = sorted(c for c, n in billed.items() if n > 1)
        ledger = {r["click_id"]: r["amount_micros"] for r in rows}
        missing = sorted(set(truth) - set(ledger))
        extra = sorted(set(ledger) - set(truth))
        wrong = sorted(c for c in set(truth) & set(ledger) if truth[c] != ledger[c])

        per_period: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
        for r in rows:
            per_period[(r["period"], r["ad_id"])][0] += 1
            per_period[(r["period"], r["ad_id"])][1] += r["amount_micros"]
        redis_totals = {k: [t.clicks, t.micros] for k, t in self.totals().all_ad_totals().items()}
        redis_diff = sorted(
            str(k)
            for k in set(per_period) | set(redis_totals)
            if per_period.get(k, [0, 0]) != redis_totals.get(k, [0, 0])
        )

        exported: dict[str, int] = {}
        adjustments = 0
        exports_dir = self.settings.layout.exports
        periods_closed = 0
        for folder in sorted(exports_dir.iterdir()) if exports_dir.is_dir() else []:
            if folder.name.startswith("."):
                continue
            table = read_export(folder)
            periods_closed += 1
            bills = exported_bills(table).to_pylist()
            adjustments += table.num_rows - len(bills)
            for bill in bills:
                exported[bill["click_id"]] = exported.get(bill["click_id"], 0) + bill["net_micros"]
        exports_equal = exported == truth

        quarantine_dir = self.settings.layout.quarantine
        quarantined = set()
        if quarantine_dir.is_dir():
            table = ds.dataset(quarantine_dir, format="parquet", partitioning="hive").to_table(
                columns=["topic", "partition", "offset"]
            )
            quarantined = {(r["topic"], r["partition"], r["offset"]) for r in table.to_pylist()}
        poison_missing = [p for p in self.poison if (p[0], p[1], p[2]) not in quarantined]

        reads_failed_outside_redis = self.web.failed - self.web.failed_during.get("redis", 0)
        checks = {
            "ledger equals the ground truth": not (missing or extra or wrong),
            "no click billed in two batches": not twice,
            "Redis equals the ledger to the micro": not redis_diff,
            "exports after reconciliation equal the ground truth": exports_equal and reconcile.returncode == 0,
            "audit balances": audit.returncode == 0,
            "every poison record is in quarantine": not poison_missing and self.poison_failed == 0,
            "web API reads all answered (outside the Redis fault)": reads_failed_outside_redis == 0,
            "every fault recovered": all(f.recovered_s is not None for f in self.faults),
        }
        report = {
            "seed": self.seed,
            "rate": self.rate,
            "home": str(self.home),
            "passed": all(checks.values()),
            "checks": checks,
            "figures": {
                "billable_clicks": len(truth),
                "ledger_rows": len(rows),
                "missing": len(missing),
                "extra": len(extra),
                "wrong_amount": len(wrong),
                "billed_twice": len(twice),
                "redis_differences": len(redis_diff),
                "periods_exported": periods_closed,
                "exported_clicks": len(exported),
                "export_adjustment_rows": adjustments,
                "poison_sent": len(self.poison),
                "poison_by_kind": dict(Counter(p[3] for p in self.poison)),
                "poison_missing_from_quarantine": len(poison_missing),
                "web_reads_ok": self.web.ok,
                "web_reads_failed": self.web.failed,
                "web_reads_failed_by_fault": dict(self.web.failed_during),
                "caught_up_s": caught and round(caught, 1),
            },
            "faults": [asdict(f) for f in self.faults],
            "web_failures": self.web.failures,
            "examples": {"missing": missing[:5], "extra": extra[:5], "twice": twice[:5], "redis": redis_diff[:5]},
        }
        write_report(self.out, report)
        return report


def cluster_env(home: Path) -> dict[str, str]:
    """The environment of every adbill process of the run: the local cluster on free loopback ports."""
    return local_cluster_env(
        home,
        ADBILL_PERIOD_MS=str(PERIOD_MS),
        ADBILL_LATENESS_HORIZON_MS=str(HORIZON_MS),
        ADBILL_RECONCILE_INTERVAL_S="30",
        ADBILL_WEB_WORKERS="1",
    )


def write_report(out: Path, report: dict[str, Any]) -> None:
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    f = report["figures"]
    lines = [
        f"# Chaos run, seed {report['seed']}: {'PASSED' if report['passed'] else 'FAILED'}",
        "",
        f"`python -m ops.chaos --seed {report['seed']} --rate {report['rate']}`, {report['rate']} events/s live, "
        f"1 % poison; home `{report['home']}`.",
        "",
        "| check | result |",
        "| --- | --- |",
        *(f"| {name} | {'ok' if ok else 'FAILED'} |" for name, ok in report["checks"].items()),
        "",
        f"Billable clicks {f['billable_clicks']:,}; ledger rows {f['ledger_rows']:,} (missing {f['missing']}, "
        f"extra {f['extra']}, wrong amount {f['wrong_amount']}, billed twice {f['billed_twice']}); Redis "
        f"differences {f['redis_differences']}; {f['periods_exported']} periods exported with "
        f"{f['exported_clicks']:,} clicks and {f['export_adjustment_rows']} adjustment rows; poison "
        f"{f['poison_sent']} sent {f['poison_by_kind']}, {f['poison_missing_from_quarantine']} missing from "
        f"quarantine; web reads {f['web_reads_ok']:,} ok, {f['web_reads_failed']} failed "
        f"{f['web_reads_failed_by_fault']}; the job caught up {f['caught_up_s']} s after the traffic stopped.",
        "",
        "| # | fault | at (s) | target | recovered in (s) | events delayed | note |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *(
            f"| {i} | {x['kind']} | {x['at_s']} | {x['target']} | {x['recovered_s']} | {x['delayed_events']:,} | "
            f"{x['note']} |"
            for i, x in enumerate(report["faults"], 1)
        ),
        "",
        *(
            ["Failed web reads:", "", *(f"- {failure}" for failure in report["web_failures"]), ""]
            if report["web_failures"]
            else []
        ),
    ]
    (out / "report.md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.chaos", description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=None, help="the faults' order and moments (default: random)")
    parser.add_argument("--rate", type=int, default=100, help="live traffic, events per second")
    parser.add_argument("--out", type=Path, default=None, help="report folder (default var/chaos/<time>)")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 1_000_000)
    out = args.out or PROJECT_ROOT / "var" / "chaos" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out.mkdir(parents=True, exist_ok=True)
    report = Chaos(out, seed, args.rate).run()
    print((out / "report.md").read_text())
    print(f"report: {out / 'report.md'}, {out / 'report.json'}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
