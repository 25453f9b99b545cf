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
- `redis-restarted`: once a budget has run out, Redis SIGKILLed, its data folder removed and Redis started again
  empty at once, as a supervisor restarts it (`restart: unless-stopped`), under the running job: the job must stop
  by itself before it charges a click on the empty day totals (the budget watch below sees no day past its
  budget), and is then recovered as for `redis`;
- `outage`: the job stopped for 20 minutes (`--outage-minutes`) under live traffic, far past the lateness horizon,
  prices changing meanwhile; reconciliation must hold the periods it has not read, and close them once it has;
- overlapping: `driver+broker` (the leader broker of a partition SIGKILLed while the job starts again after its
  own SIGKILL), `redis+reconcile` (Redis lost while a reconciliation runs), `worker+closing` (a Spark worker
  SIGKILLed while a reconciliation closes periods);
- `disk`: the data folder, on a small tmpfs of its own (the services' folders and the catalog stay on the
  machine's disk), filled with a ballast file until writes fail with ENOSPC for 30 s, then freed: the job and
  reconciliation wait, say so in their status records, and go on by themselves. Skipped, with the mount's error in
  the report, where the suite may not mount a filesystem.

The traffic changes the catalog all through the run (`--catalog-every 60 --new-ads 2`): its ground truth is priced
by the history, as the pipeline prices. It carries the local stack's invalid traffic (crawlers, clicks from
excluded ranges, floods, double clicks, late twins) and three budgeted campaigns whose budgets run out during the
faults and change 15 minutes in (`--changes-at`: one raised, one halved, one made unlimited, and a range added to the
IP exclusion list; `--no-invalid-traffic`: plain traffic). Its producers deploy a new schema version of both event
types 20 minutes in (`--deploy-schema-at`, about halfway), which the job must decode from then on without a restart
by hand.

A recovery step that fails (a command's exit code, a process missing) is reported at once with the step; the suite
then starts whatever is missing once more and, if billing does not come back within 5 minutes, stops the schedule
there and gives its verdict on the books as they stand.

Then the traffic stops, the job catches up, `adbill reconcile --until` closes every period (never `--force`) and
`adbill audit` proves the books. The verdict: the ledger equals the ground truth (with invalid traffic, which the
stream judges with what it has read so far: the ledger plus reconciliation's corrections does, the stream charged
no click of a crawler or an excluded range, and no campaign's charged total of a day in Redis, read every second,
passed its budget), no click is billed in two batches, Redis equals the ledger to the micro, the exports with the
adjustments booked for them later (in later periods' exports, or in the period still open) equal the ground truth,
every poison record is in quarantine, and the web API answered every read. Per fault: the time to recover (until
the job billed a batch again) and the events delayed (records that reached Kafka while the job could not bill them).
Printed, and written to `report.md` and `report.json`.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
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
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from attribution.stream_position import BILLING_QUERY
from billing.budgets import DAY_MS, OVER_BUDGET, day_start, utc_day
from billing.catalog import Catalog
from billing.change_log import ChangeEntry
from billing.corrections import Correction
from billing.export import ExportStatus, RecordType
from billing.store.catalog_file import save_catalog
from billing.store.stream_offsets import committed_offsets, end_offsets, records_behind
from ops.process import pid_alive, stop_pid
from ops.settings import PROJECT_ROOT, Settings
from ops.stack import local_cluster_env

FAULTS = ["driver"] * 3 + ["worker"] + ["broker"] * 2 + ["redis", "redis-restarted", "outage"]
FAULTS += ["driver+broker", "redis+reconcile", "worker+closing", "disk", "database"]
"""One at a time, then overlapping (a second fault while the first one's recovery runs), then the full disk."""
PERIOD_MS = 60_000
HORIZON_MS = 60_000
POISON_FRACTION = 0.01
CATALOG_EVERY_S = 60
NEW_ADS = 2
DISK_SIZE = "1g"
"""The small filesystem of the data folder (a tmpfs), which the `disk` fault fills."""
DISK_FULL_S = 30.0
OUTSIDE_THE_DATA_DISK = ("kafka", "redis", "postgres", "run", "logs", "spark", "spark-events")
"""Folders of HOME that stay on the machine's own disk: the services' data and logs (a full data folder is the
fault, not a broker or a log that dies of it)."""
INVALID_TRAFFIC_BUDGET_SHARE = "0.10"
"""With invalid traffic on: each budgeted campaign's daily budget as a share of what the traffic (two hours) would
spend on it, so that budgets run out about 12 minutes in, in the middle of the faults."""
RECOVERY_DEADLINE_S = 600.0
BUDGET_EXHAUSTED_WAIT_S = 900.0
"""How long the `redis-restarted` fault waits for a budget to run out before it strikes all the same."""
JOB_STOPS_BY_ITSELF_S = 120.0
"""How long the job may take to stop by itself on a Redis restarted empty: its next batch (a trigger and a batch, or
Redis calls' deadlines while Redis was away)."""
OUTAGE_S = 1200.0
"""How long the `outage` fault keeps the job down: 20 minutes of live traffic, prices changing, periods held."""
CHANGES_AT_S = 900.0
"""With invalid traffic on: when the budgets change (one raised by half, one halved, one made unlimited) and a range
joins the IP exclusion list (`adbill produce --changes-at`), seconds after the traffic started: after the budgets ran
out, so that a raised and an unlimited budget let the stream charge again, under the faults (a run with a 5-minute
outage sends traffic for some 20 minutes)."""
SCHEMA_DEPLOY_AT_S = 1200.0
"""When the traffic's producers deploy a new schema version (`adbill produce --deploy-schema-at`), seconds after
the traffic started: about halfway through a full run."""


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
    failed_step: str = ""
    """The recovery step that failed (the command and its output's last line); empty when none did."""


@dataclass
class WebReads:
    ok: int = 0
    failed: int = 0
    failed_during: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)


class Chaos:
    def __init__(
        self,
        out: Path,
        seed: int,
        rate: int,
        faults: list[str] | None = None,
        outage_s: float = OUTAGE_S,
        schema_deploy_at_s: float = SCHEMA_DEPLOY_AT_S,
        invalid_traffic: bool = True,
        changes_at_s: float = CHANGES_AT_S,
    ) -> None:
        self.out = out.resolve()  # the services' folders are links from the data disk: absolute ones
        self.seed = seed
        self.rate = rate
        self.outage_s = outage_s
        self.schema_deploy_at_s = schema_deploy_at_s
        self.invalid_traffic = invalid_traffic
        self.changes_at_s = changes_at_s
        self.plan = list(faults or FAULTS)
        self.rng = random.Random(seed)
        self.home = self.out / "home"
        self.env = cluster_env(self.home)
        self.settings = Settings.from_env(self.env)
        self.t0 = 0.0
        self.t0_ms = 0
        """When the traffic started, epoch ms (the change log's clock)."""
        self.traffic_s = 0.0
        """How long the traffic ran, seconds."""
        self.faults: list[FaultRecord] = []
        self.active_fault = ""
        self.stop = threading.Event()
        self.web = WebReads()
        self.poison: list[tuple[str, int, int, str]] = []
        self.poison_failed = 0
        self.traffic: subprocess.Popen[bytes] | None = None
        self.log = (out / "chaos.log").open("a")
        self.disk = ""
        """How the data folder's small filesystem was mounted, or why it was not."""
        self.disk_mounted = False
        self.budget_breaches: set[str] = set()
        """Each campaign's day seen charged past every budget the campaign had (`check_budgets`)."""
        self.budget_reads = 0
        self.ran_on_empty_redis = 0
        self.database_changes: dict[str, int] = {"confirmed": 0, "lost": 0, "twice": 0}
        """The `database` faults' changes: confirmed by a door while the database died, and of those, lost or twice."""
        """`redis-restarted` faults under which the job went on running on the empty Redis."""
        self.catalog = self.settings.catalog_store()
        self.budget_totals = self.totals()
        """One client for the budget reads of every second (it connects again by itself after a Redis fault)."""
        self.stopped = ""
        """Why the schedule stopped early (a recovery that failed and could not be made good); empty if it ran."""

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
        self.mount_data_disk()
        save_catalog(config.catalog(), self.settings.catalog_file)
        plan = list(self.plan)
        self.rng.shuffle(plan)
        self.faults = [FaultRecord(kind, round(self.rng.uniform(5, 30), 1)) for kind in plan]
        self.say(f"chaos: seed {self.seed}, {self.rate} events/s, home {self.home}; {self.disk}")
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
                threading.Thread(target=self.watch_budgets, daemon=True),
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
                if fault.recovered_s is None and not self.bring_back(fault):
                    self.stopped = f"stopped after fault {fault.kind}: {fault.failed_step or 'no batch billed'}"
                    self.say(f"chaos: {self.stopped}; the verdict on the books as they stand")
                    break
            time.sleep(30)
            truth = self.stop_traffic()
            self.stop.set()
            for thread in threads:
                thread.join(timeout=30)
            return self.verdict(truth)
        finally:
            self.stop.set()
            if self.traffic is not None and self.traffic.poll() is None:
                stop_pid(self.traffic.pid, timeout_s=60)
            done = self.adbill("down", "--cluster", check=False)
            self.say(f"down: {done.stdout.strip()}")
            self.unmount_data_disk()

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
            "--catalog-every",
            str(CATALOG_EVERY_S),
            "--new-ads",
            str(NEW_ADS),
            "--deploy-schema-at",
            str(self.schema_deploy_at_s),
            "--run-dir",
            str(run_dir),
            "--no-progress",
            *(self.invalid_traffic_args() if self.invalid_traffic else ()),
        ]
        log = (self.out / "traffic.log").open("ab")
        self.traffic = subprocess.Popen([sys.executable, "-m", "ops.cli", *args], env=self.env, stdout=log, stderr=log)
        self.t0 = time.monotonic()
        self.t0_ms = time.time_ns() // 1_000_000
        self.say(f"traffic: adbill {' '.join(args)}")

    def invalid_traffic_args(self) -> list[str]:
        """The local stack's invalid traffic (crawlers, excluded ranges, floods, double clicks, late twins) and three
        budgeted campaigns whose budgets run out during the faults (`INVALID_TRAFFIC_BUDGET_SHARE`) and change at
        `changes_at_s`, with the IP exclusion list."""
        from ops.cli import STACK_INVALID_TRAFFIC

        args = list(STACK_INVALID_TRAFFIC)
        args[args.index("--budget-share") + 1] = INVALID_TRAFFIC_BUDGET_SHARE
        return [*args, "--changes-at", str(self.changes_at_s)]

    def stop_traffic(self) -> dict[str, int]:
        assert self.traffic is not None
        # SIGTERM, which adbill ends on as on Ctrl-C: a suite started in the background (nohup, `&` in a script)
        # hands its children SIGINT ignored, and the producers would go on for their whole duration.
        self.traffic_s = time.monotonic() - self.t0
        self.traffic.send_signal(signal.SIGTERM)
        try:
            code = self.traffic.wait(timeout=300)
        except subprocess.TimeoutExpired:
            self.traffic.kill()
            raise RuntimeError(
                "the traffic's producers did not stop within 300 s of SIGTERM (killed): no ground truth, no verdict; "
                f"see {self.out / 'traffic.log'}"
            ) from None
        summary = json.loads((self.out / "traffic" / "summary.json").read_text())
        self.say(f"traffic stopped (exit {code}); {json.dumps(summary.get('publish', summary))[:300]}")
        with (self.out / "traffic" / "billable.jsonl").open() as lines:
            return {row["click_id"]: row["amount_micros"] for row in map(json.loads, lines)}

    def watch_budgets(self) -> None:
        """Every second, each budgeted campaign's charged total of the day (what Redis shows people: the stream's
        charges and the corrections') against the budgets it had, as long as the run goes."""
        while not self.stop.wait(1.0):
            self.check_budgets()

    def check_budgets(self) -> None:
        """One read of today's and yesterday's charged totals of the campaigns with budgets; a total past every
        budget its campaign had is kept in `budget_breaches`. Nothing is read while Redis is away."""
        try:
            catalog = self.catalog.current()  # read again only when the file changed
            now = int(time.time() * 1000)
            days = {utc_day(now), utc_day(now - DAY_MS)}
            charged = self.budget_totals.day_charged((c, day) for c in catalog.budgets for day in days)
        except Exception:  # redis.RedisError while Redis is a fault's target, a catalog file being replaced
            return
        self.budget_reads += 1
        self.budget_breaches.update(past_budget(charged, catalog))

    def records_behind(self) -> int | None:
        """Records the event topics hold past the billing query's committed offsets; None when Kafka is away."""
        topics = [self.settings.topic_impressions, self.settings.topic_clicks]
        try:
            end = end_offsets(self.settings.kafka_bootstrap, topics)
        except Exception:  # confluent_kafka's KafkaException: a broker away
            return None
        return sum(records_behind(committed_offsets(self.settings.layout.checkpoint(BILLING_QUERY)), end).values())

    def refused_in_truth(self) -> dict[str, str]:
        """click_id -> reason of every billable click the ground truth does not charge."""
        from producers.ground_truth import NOT_CHARGED_FILE

        path = self.out / "traffic" / NOT_CHARGED_FILE
        if not path.exists():
            return {}
        with path.open() as lines:
            return {row["click_id"]: row["reason"] for row in map(json.loads, lines)}

    # Faults ------------------------------------------------------------------------------------------------------
    def strike(self, fault: FaultRecord) -> None:
        exhausted = None
        if fault.kind == "redis-restarted":  # strikes once a budget has run out: waited for before the clock starts
            exhausted = self.wait_budget_exhausted(BUDGET_EXHAUSTED_WAIT_S)
        fault.note = "" if exhausted is None else ("a budget had run out" if exhausted else "no budget had run out")
        fault.at_s = round(time.monotonic() - self.t0, 1)
        self.active_fault = fault.kind
        before_end = self.kafka_end()
        before = self.last_batch()
        struck = time.monotonic()
        try:
            getattr(self, f"fault_{fault.kind.replace('+', '_').replace('-', '_')}")(fault, before)
            # Redis restored, or the disk freed: billed again means a batch after the last one before the recovery.
            after = max(before, self.last_batch()) if fault.kind.startswith(("redis", "disk")) else before
            recovered = self.wait_billed_after(after, RECOVERY_DEADLINE_S)
            fault.recovered_s = None if recovered is None else round(time.monotonic() - struck, 1)
        except Exception as exc:  # a recovery step that failed: reported at once, with the step
            fault.failed_step = _first_lines(str(exc))
            fault.note = f"{fault.note} FAILED: {fault.failed_step}".strip()
        fault.delayed_events = max(0, self.kafka_end() - before_end)
        self.active_fault = ""
        self.say(
            f"fault {fault.kind:<7} at {fault.at_s:7.1f} s on {fault.target}: recovered in "
            f"{fault.recovered_s} s, {fault.delayed_events} events delayed {fault.note}"
        )

    def bring_back(self, fault: FaultRecord) -> bool:
        """After a fault that did not recover: start whatever is missing once more and wait a few minutes for a
        batch. False when billing does not come back (the schedule stops there, with its verdict)."""
        self.say(f"fault {fault.kind}: not recovered ({fault.failed_step or 'no batch billed'}); bringing it back")
        before = self.last_batch()
        try:
            self.up()
        except Exception as exc:
            fault.note += f"; bringing back failed: {_first_lines(str(exc))}"
            return False
        back = self.wait_billed_after(before, 300)
        fault.note += f"; brought back by `adbill up`: {'billed after ' + str(round(back)) + ' s' if back else 'no'}"
        return back is not None

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
        self.lose_redis_data()
        time.sleep(5)
        self.restore_redis(fault)

    def fault_redis_restarted(self, fault: FaultRecord, before: int) -> None:
        exhausted = fault.note
        pid = self.pid("redis")
        fault.target = f"redis pid {pid}, data folder removed, started again empty under the job"
        os.kill(pid, signal.SIGKILL)
        self.lose_redis_data()
        time.sleep(1)
        self.adbill("up", "--cluster", "--detach", "--no-traffic", "--no-job", "--no-web")
        stopped = self.wait_stream_stopped(JOB_STOPS_BY_ITSELF_S)
        said = (
            f"{exhausted}; the job {'stopped by itself' if stopped else 'did not stop by itself'} within "
            f"{JOB_STOPS_BY_ITSELF_S:.0f} s"
        )
        if not stopped:
            self.ran_on_empty_redis += 1
        self.restore_redis(fault)
        fault.note = f"{said}; {fault.note}"

    def fault_database(self, fault: FaultRecord, before: int) -> None:
        """The catalog's database killed (the server and its sessions) while four doors make ten changes a second;
        `adbill up` starts it again. The stream prices with the catalog it holds meanwhile; afterwards every change
        a door confirmed must be in the database, once."""
        from ops.catalog_load import ChangeWriters, check_confirmed

        writers = ChangeWriters(self.settings.database_url, rate=10.0)
        writers.prepare()
        writers.start()
        time.sleep(5)
        pid = self.pid("postgres")
        fault.target = f"postgres pid {pid} and its sessions, under 10 changes a second"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        away = round(self.rng.uniform(15, 30), 1)
        time.sleep(away)
        self.up()
        time.sleep(10)
        run = writers.stop()
        lost, twice = check_confirmed(self.settings.database_url, run.confirmed)
        self.database_changes["confirmed"] += len(run.confirmed)
        self.database_changes["lost"] += len(lost)
        self.database_changes["twice"] += len(twice)
        refused = sum(run.refused.values())
        fault.note = (
            f"restarted after {away} s; {len(run.confirmed)} changes confirmed, {refused} refused at the door "
            f"meanwhile; of those confirmed {len(lost)} lost, {len(twice)} twice"
        )

    def wait_budget_exhausted(self, deadline_s: float) -> bool:
        """Wait until the stream has found a click over budget (a budget ran out), at most `deadline_s`."""
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            try:
                counters = self.budget_totals.client.hgetall(self.budget_totals.keys.counters())
                if int(counters.get(f"not_charged_{OVER_BUDGET}", 0) or 0) > 0:
                    return True
            except Exception:  # redis.RedisError: Redis away a moment
                pass
            time.sleep(2)
        return False

    def wait_stream_stopped(self, deadline_s: float) -> bool:
        """Whether the streaming job's process ends within `deadline_s`."""
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            if pid_alive(self.settings.run_dir / "stream.pid") is None:
                return True
            time.sleep(1)
        return False

    def lose_redis_data(self) -> None:
        """Remove what Redis kept on disk (its folder may be a link to the machine's disk: its contents go)."""
        folder = self.settings.redis_dir
        for item in folder.iterdir() if folder.is_dir() else []:
            if item.is_dir() and not item.is_symlink():
                shutil.rmtree(item, ignore_errors=True)
            else:
                item.unlink(missing_ok=True)

    def restore_redis(self, fault: FaultRecord) -> None:
        """The operator after Redis lost its data: stop the job, start Redis empty, rebuild the totals from the
        data folder, start the job."""
        stream = pid_alive(self.settings.run_dir / "stream.pid")
        if stream is not None:
            os.kill(stream, signal.SIGTERM)
            for _ in range(120):
                if pid_alive(self.settings.run_dir / "stream.pid") is None:
                    break
                time.sleep(0.5)
        self.adbill("up", "--cluster", "--detach", "--no-traffic", "--no-job", "--no-web")
        for attempt in range(4):  # refused while the job's last heartbeat is fresh: the operator tries again
            done = self.adbill("rebuild-totals", check=attempt == 3)
            if done.returncode == 0:
                break
            time.sleep(15)
        self.adbill("users", "list")
        self.up()
        fault.note = done.stdout.strip()

    # Overlapping faults: the second strikes while the first one's recovery runs -------------------------------
    def fault_driver_broker(self, fault: FaultRecord, before: int) -> None:
        """The driver SIGKILLed, and the leader broker of a partition SIGKILLed while the job starts again."""
        pid = self.pid("stream")
        os.kill(pid, signal.SIGKILL)
        restarting = Background(self.up)
        time.sleep(round(self.rng.uniform(3, 15), 1))
        leader, where = self.partition_leader()
        broker = self.pid(f"kafka-{leader}")
        os.kill(broker, signal.SIGKILL)
        fault.target = f"stream driver pid {pid}, then kafka-{leader} ({where}) pid {broker} while it restarted"
        away = round(self.rng.uniform(15, 30), 1)
        time.sleep(away)
        restarting.join("adbill up (the job starting again)")
        self.up()
        fault.note = f"broker restarted after {away} s"

    def fault_redis_reconcile(self, fault: FaultRecord, before: int) -> None:
        """Redis SIGKILLed and its data folder removed while a reconciliation runs; then the operator's restore."""
        run = self.reconcile_in_background("redis")
        time.sleep(round(self.rng.uniform(5, 20), 1))
        pid = self.pid("redis")
        fault.target = f"redis pid {pid}, data folder removed, during `adbill reconcile` ({run.what})"
        os.kill(pid, signal.SIGKILL)
        self.lose_redis_data()
        code = run.wait()
        fault.note = f"the reconciliation ended with exit {code}; "
        time.sleep(5)
        self.restore_redis(fault)
        fault.note = f"reconciliation during the fault: exit {code}; {fault.note}"

    def fault_worker_closing(self, fault: FaultRecord, before: int) -> None:
        """A Spark worker SIGKILLed while a reconciliation closes periods; restarted after a while."""
        run = self.reconcile_in_background("worker")
        time.sleep(round(self.rng.uniform(5, 20), 1))
        n = self.rng.randint(1, self.settings.spark_workers)
        pid = self.pid(f"spark-worker-{n}")
        fault.target = f"spark-worker-{n} pid {pid}, during `adbill reconcile` ({run.what})"
        os.kill(pid, signal.SIGKILL)
        away = round(self.rng.uniform(20, 40), 1)
        time.sleep(away)
        self.up()
        code = run.wait()
        fault.note = f"worker restarted after {away} s; the reconciliation ended with exit {code}"

    def partition_leader(self) -> tuple[int, str]:
        from ops.kafka_service import partition_leaders

        topic = self.rng.choice(list(self.settings.topics.values()))
        partition = self.rng.randrange(self.settings.topic_partitions)
        return partition_leaders(self.settings.kafka_bootstrap, topic)[partition], f"leader of {topic}/{partition}"

    def reconcile_in_background(self, tag: str) -> Reconciliation:
        """`adbill reconcile` started beside the scheduled runs; started again while the scheduled one holds the
        lock (exit 4), for up to a minute, so that a run of its own is under way."""
        for _ in range(30):
            run = Reconciliation(self.env, self.out / f"reconcile-{tag}-{int(time.monotonic())}.log")
            for _ in range(60):  # a single run takes the lock before it starts Spark
                time.sleep(1)
                if run.process.poll() is not None or "Spark" in run.log.read_text(errors="replace"):
                    break
            if run.process.poll() != 4:
                return run
        return run

    # The full disk -------------------------------------------------------------------------------------------------
    def mount_data_disk(self) -> None:
        """The data folder (HOME) on a small tmpfs of its own; the services' folders stay on the machine's disk
        (links). When the mount is refused, the `disk` fault is skipped and the report says why."""
        command = ["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE}", "tmpfs", str(self.home)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            self.disk = f"data folder on the machine's disk: `{' '.join(command)}` refused: {done.stderr.strip()}"
            return
        self.disk_mounted = True
        self.disk = f"data folder on a {DISK_SIZE} tmpfs of its own"
        system = self.out / "system"
        for name in OUTSIDE_THE_DATA_DISK:
            (system / name).mkdir(parents=True, exist_ok=True)
            (self.home / name).symlink_to(system / name)

    def unmount_data_disk(self) -> None:
        """Keep the data folder (copied to the machine's disk, at the same place) and unmount the tmpfs."""
        if not self.disk_mounted:
            return
        for ballast in self.home.glob(".ballast*"):
            ballast.unlink()
        copy = self.out / "home-copy"
        shutil.copytree(self.home, copy, symlinks=True)
        subprocess.run(["umount", "-l", str(self.home)], check=False)
        if not any(self.home.iterdir()):
            self.home.rmdir()
            copy.rename(self.home)
        self.disk_mounted = False

    def fault_disk(self, fault: FaultRecord, before: int) -> None:
        """The data folder's disk filled with a ballast file until writes fail with ENOSPC, for DISK_FULL_S, then
        freed: the job and reconciliation wait, say so, and go on by themselves."""
        from billing.store.part_status import read_status

        if not self.disk_mounted:
            fault.target = "skipped"
            fault.note = self.disk
            return
        ballast = self.home / ".ballast"
        size = fill_disk(ballast)
        fault.target = f"data folder's {DISK_SIZE} tmpfs filled ({size / 1e6:.0f} MB ballast) for {DISK_FULL_S:.0f} s"
        started = time.monotonic()
        said: dict[str, dict[str, str]] = {}
        while time.monotonic() - started < DISK_FULL_S:
            time.sleep(1)
            fill_disk(ballast)  # what a failed write gave back is taken again
            with contextlib.suppress(Exception):
                client = self.totals().client
                for part in ("stream", "reconcile"):
                    status = read_status(client, self.settings.redis_prefix, part)
                    if status:
                        said[part] = status
        ballast.unlink()
        fault.note = "; ".join(f"{part} said: {status.get('message', '')[:160]}" for part, status in said.items())
        fault.note = fault.note or "nothing wrote to the data folder while it was full"

    def fault_outage(self, fault: FaultRecord, before: int) -> None:
        pid = self.pid("stream")
        fault.target = f"stream stopped (pid {pid}) for {self.outage_s:.0f} s under live traffic"
        log_file = self.settings.logs_dir / "reconcile.log"
        seen = log_file.stat().st_size
        os.kill(pid, signal.SIGTERM)
        time.sleep(self.outage_s)
        with log_file.open(errors="replace") as log:
            log.seek(seen)
            held = dict(re.findall(r"period (\S+) held: ([^\n]+)", log.read()))  # the last reason of each
        self.up()
        fault.note = f"recovery includes the {self.outage_s:.0f} s outage; held while down: " + (
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
        import pyarrow.compute as pc
        import pyarrow.dataset as ds

        from attribution.audit import closed_periods, pending_adjustments
        from attribution.closing import CorrectionFiles, not_charged_by_stream
        from billing.store.export_files import read_export
        from billing.store.parquet_ledger import read_ledger

        layout = self.settings.layout
        # The job catches up with everything sent: a committed batch read every record the event topics hold.
        caught = None
        start = time.monotonic()
        while time.monotonic() - start < 600:
            if self.records_behind() == 0:
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

        corrections = CorrectionFiles(layout).read()
        final = final_ledger(rows, corrections)
        periods = [folder.name.removeprefix("period=") for folder in layout.not_charged.glob("period=*")]
        final_missing = sorted(set(truth) - set(final))
        final_extra = sorted(set(final) - set(truth))
        final_wrong = sorted(c for c in set(truth) & set(final) if truth[c] != final[c])
        refused = self.refused_in_truth()
        bots = {c for c, reason in refused.items() if reason in ("known_bot", "excluded_ip")}
        bots_charged = sorted(bots & {r["click_id"] for r in rows})
        self.check_budgets()

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

        # What finance was given: each closed period's export (the periods closing marked closed, as the audit
        # reads them), and the adjustments booked for it later: in later periods' exports (a late twin found after
        # its period closed retracts the click billed there and adds the twin), or in the period still open (the
        # last reconciliation found one), which finance gets when that period closes.
        closed = closed_periods(layout)
        tables = [read_export(layout.export(period)) for period in sorted(closed)]
        periods_closed = len(tables)
        pending = pending_adjustments(corrections, closed)
        exported = exported_books((row for table in tables for row in table.to_pylist()), pending)
        adjustments = sum(
            pc.sum(pc.equal(table["record_type"], RecordType.ADJUSTMENT.value)).as_py() or 0 for table in tables
        )
        exports_equal = exported == truth

        quarantine_dir = self.settings.layout.quarantine
        quarantined = set()
        if quarantine_dir.is_dir():
            table = ds.dataset(quarantine_dir, format="parquet", partitioning="hive").to_table(
                columns=["topic", "partition", "offset"]
            )
            quarantined = {(r["topic"], r["partition"], r["offset"]) for r in table.to_pylist()}
        poison_missing = [p for p in self.poison if (p[0], p[1], p[2]) not in quarantined]

        reads_failed_outside_redis = self.web.failed - sum(
            n for kind, n in self.web.failed_during.items() if kind.startswith("redis")
        )
        if self.invalid_traffic:
            # The stream judges invalid traffic and budgets with what it has read so far (a flood's first clicks,
            # the order it reads a day's clicks in): reconciliation's corrections make the books exact.
            books = {
                "the ledger and its corrections equal the ground truth": not (
                    final_missing or final_extra or final_wrong
                ),
                "no click of a crawler or an excluded range charged by the stream": not bots_charged,
                "no campaign's day charged past its budget (Redis, read every second)": not self.budget_breaches,
            }
        else:
            books = {"ledger equals the ground truth": not (missing or extra or wrong)}
        checks = {
            **books,
            "no click billed in two batches": not twice,
            "Redis equals the ledger to the micro": not redis_diff,
            "exports and their later adjustments equal the ground truth": exports_equal and reconcile.returncode == 0,
            "audit balances": audit.returncode == 0,
            "every poison record is in quarantine": not poison_missing and self.poison_failed == 0,
            "web API reads all answered (outside the Redis fault)": reads_failed_outside_redis == 0,
            "every fault recovered": all(f.recovered_s is not None for f in self.faults if f.target != "skipped"),
            "the schedule ran to its end": not self.stopped,
        }
        if any(f.kind == "database" for f in self.faults):
            checks["every catalog change a door confirmed while the database died is there, once"] = (
                self.database_changes["confirmed"] > 0
                and self.database_changes["lost"] == 0
                and self.database_changes["twice"] == 0
            )
        if any(f.kind == "redis-restarted" and f.target != "skipped" for f in self.faults):
            checks["the job stopped by itself on a Redis restarted empty"] = self.ran_on_empty_redis == 0
        publish_file = self.out / "traffic" / "publish.json"
        deployed = json.loads(publish_file.read_text()).get("schema_deployed") if publish_file.exists() else None
        if self.traffic_s > self.schema_deploy_at_s:
            # The ledger holds the clicks of both versions (it equals the ground truth): the version came in use.
            checks["the producers deployed a schema version mid-run"] = bool(deployed)
        # The catalog's change log: the budget and range changes made after the traffic's first minute (those of
        # its start come at once), and the clicks the stream charged after each raise.
        log = self.catalog.changes()
        changed = budget_and_range_changes(log, after_ms=self.t0_ms + 60_000) if self.invalid_traffic else Counter()
        raised = charged_after_raises(log, self.catalog.current(), rows)
        if self.invalid_traffic and self.traffic_s > self.changes_at_s + 60:
            # Three budgets changed and one range excluded while the job ran; the books above were judged with them.
            checks["budgets and the IP exclusion list changed mid-run"] = (
                changed["set-budget"] >= 3 and changed["exclude-ip"] >= 1
            )
            checks["the stream charged again where a budget was raised or lifted"] = bool(raised) and all(
                raised.values()
            )
        report = {
            "seed": self.seed,
            "rate": self.rate,
            "home": str(self.home),
            "plan": self.plan,
            "outage_s": self.outage_s,
            "traffic_s": round(self.traffic_s, 1),
            "schema_deployed": {"at_s": self.schema_deploy_at_s, "ids": deployed},
            "changed_mid_run": {
                "at_s": self.changes_at_s if self.invalid_traffic else None,
                "kinds": dict(changed),
                "charged_after_raises": raised,
            },
            "data_disk": self.disk,
            "stopped": self.stopped,
            "passed": all(checks.values()),
            "checks": checks,
            "figures": {
                "billable_clicks": len(truth),
                "ledger_rows": len(rows),
                "missing": len(missing),
                "extra": len(extra),
                "wrong_amount": len(wrong),
                "billed_twice": len(twice),
                "final_missing": len(final_missing),
                "final_extra": len(final_extra),
                "final_wrong_amount": len(final_wrong),
                "not_charged_in_truth": dict(Counter(refused.values())),
                "not_charged_by_the_stream": dict(Counter(not_charged_by_stream(layout, periods).values())),
                "bots_charged_by_the_stream": len(bots_charged),
                "budget_reads": self.budget_reads,
                "days_past_budget": sorted(self.budget_breaches),
                "redis_differences": len(redis_diff),
                "periods_exported": periods_closed,
                "exported_clicks": len(exported),
                "export_adjustment_rows": adjustments,
                "adjustments_booked_in_open_periods": len(pending),
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
            "examples": {
                "missing": missing[:5],
                "extra": extra[:5],
                "twice": twice[:5],
                "redis": redis_diff[:5],
                "final_missing": final_missing[:5],
                "final_extra": final_extra[:5],
                "final_wrong": final_wrong[:5],
                "bots_charged": bots_charged[:5],
            },
        }
        write_report(self.out, report)
        return report


class Background:
    """A step run in a thread (a recovery under way while the next fault strikes)."""

    def __init__(self, step: Any) -> None:
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(step,), daemon=True)
        self.thread.start()

    def _run(self, step: Any) -> None:
        try:
            step()
        except BaseException as exc:
            self.failure = exc

    def join(self, what: str) -> None:
        """Wait for the step; its failure raised here, naming the step."""
        self.thread.join(timeout=900)
        if self.thread.is_alive():
            raise RuntimeError(f"{what}: still running after 900 s")
        if self.failure is not None:
            raise RuntimeError(f"{what}: {self.failure}") from self.failure


class Reconciliation:
    """An `adbill reconcile` run in the background, its output in `log`."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        self.what = f"log {log.name}"
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "ops.cli", "reconcile"], env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def wait(self, timeout: float = 900) -> int | None:
        """Its exit code; None when it is still running after `timeout` (then it is stopped)."""
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.terminate()
            return None


def budget_and_range_changes(entries: Iterable[ChangeEntry], after_ms: int) -> Counter[str]:
    """Changes of budgets and of the IP exclusion list made after `after_ms` (epoch ms), by kind (`set-budget`,
    `exclude-ip`, `include-ip`); entries without the time they were made are not counted."""
    kinds = ("set-budget", "exclude-ip", "include-ip")
    return Counter(
        entry.kind
        for entry in entries
        if entry.kind in kinds and entry.made_at is not None and entry.made_at > after_ms
    )


def charged_after_raises(
    changes: Iterable[ChangeEntry], catalog: Catalog, rows: Iterable[Mapping[str, Any]]
) -> dict[str, int]:
    """For each budget change of `changes` that raised a campaign's budget or made it unlimited: the clicks of the
    campaign that the stream charged (`rows`, the ledger) from the change's effective time to the end of its UTC
    day. A stream that did not see the change would charge none there once the old budget was spent."""
    raised: dict[tuple[str, int], int] = {}
    for entry in changes:
        if entry.kind != "set-budget" or entry.campaign_id is None or entry.effective_from is None:
            continue
        before = catalog.budget_at(entry.campaign_id, entry.effective_from - 1)
        after = entry.daily_budget_micros
        if before is not None and (after is None or after > before):
            raised[(entry.campaign_id, entry.effective_from)] = 0
    day_ends = {key: day_start(key[1]) + DAY_MS for key in raised}
    for row in rows:
        for campaign, effective_from in raised:
            if (
                row["campaign_id"] == campaign
                and effective_from <= row["click_time"] < day_ends[(campaign, effective_from)]
            ):
                raised[(campaign, effective_from)] += 1
    return {f"{campaign} from {effective_from}": count for (campaign, effective_from), count in raised.items()}


def final_ledger(rows: list[dict[str, Any]], corrections: Iterable[Correction]) -> dict[str, int]:
    """The provisional ledger's rows plus every correction, netted per click (`net_bills`)."""
    entries = [(row["click_id"], 1, row["amount_micros"]) for row in rows]
    entries += [(c.click_id, c.clicks, c.amount_micros) for c in corrections]
    return net_bills(entries)


def exported_books(rows: Iterable[dict[str, Any]], pending: Iterable[Correction] = ()) -> dict[str, int]:
    """The exports' rows netted per click (`net_bills`): a click row billed or added is one bill (a retracted one
    none), an adjustment added one more and an adjustment retracted one less; with `pending`, the adjustments for
    the exported periods booked in a period not closed yet (finance gets them when it closes), as the audit counts
    them (`attribution.audit`)."""
    retracted = ExportStatus.RETRACTED.value
    entries = [
        (
            row["click_id"],
            (0 if row["status"] == retracted else 1)
            if row["record_type"] == RecordType.CLICK.value
            else (-1 if row["status"] == retracted else 1),
            row["net_micros"],
        )
        for row in rows
    ]
    entries += [(c.click_id, c.clicks, c.amount_micros) for c in pending]
    return net_bills(entries)


def net_bills(entries: Iterable[tuple[str, int, int]]) -> dict[str, int]:
    """(click id, bills, micros) entries summed per click: click id -> net micros of the clicks that net to one bill.
    A click that nets to anything but none or one bill is kept with minus its count, so that it differs from any
    ground truth."""
    clicks: Counter[str] = Counter()
    micros: Counter[str] = Counter()
    for click, bills, amount in entries:
        clicks[click] += bills
        micros[click] += amount
    return {click: micros[click] if n == 1 else -n for click, n in clicks.items() if n != 0}


def past_budget(charged: Mapping[tuple[str, str], int], catalog: Catalog) -> list[str]:
    """Each (campaign, UTC day) of `charged` whose total passed every daily budget the campaign had (a campaign
    that was ever unlimited passes none)."""
    out = []
    for (campaign, day), total in sorted(charged.items()):
        limits = [b.daily_budget_micros for b in catalog.budgets.get(campaign, ())]
        bounded = [limit for limit in limits if limit is not None]
        if bounded and len(bounded) == len(limits) and total > max(bounded):
            out.append(f"{campaign} {day}: {total} > {max(bounded)}")
    return out


def fill_disk(ballast: Path) -> int:
    """Append zeros to `ballast` until its disk is full (ENOSPC, in 1 MiB then 4 KiB steps); the bytes it holds."""
    size = 0
    for step in (1 << 20, 4096):
        block = b"\0" * step
        try:
            with ballast.open("ab") as out:
                while True:
                    out.write(block)
                    out.flush()
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
        size = ballast.stat().st_size if ballast.exists() else 0
    return size


def _first_lines(text: str, lines: int = 3) -> str:
    """The start of a failure's text, on one line (a recovery step's command, exit code and output)."""
    return " / ".join(line.strip() for line in text.strip().splitlines()[:lines] if line.strip())[:400]


def cluster_env(home: Path) -> dict[str, str]:
    """The environment of every adbill process of the run: the local cluster on free loopback ports."""
    return local_cluster_env(
        home,
        # The catalog beside the data folder, on the machine's disk: the advertisers' changes go on while the data
        # folder is full (its own fault).
        ADBILL_CATALOG=str(home.parent / "catalog.json"),
        ADBILL_PERIOD_MS=str(PERIOD_MS),
        ADBILL_LATENESS_HORIZON_MS=str(HORIZON_MS),
        ADBILL_RECONCILE_INTERVAL_S="30",
        ADBILL_WEB_WORKERS="1",
    )


def _deployed(deploy: dict[str, Any] | None) -> str:
    if not deploy:
        return "no schema version deployed"
    ids = deploy.get("ids")
    when = f"{deploy['at_s']:.0f} s in"
    return f"a schema version deployed {when} (ids {ids})" if ids else f"no schema version deployed (due {when})"


def _changed(changed: dict[str, Any] | None) -> str:
    if not changed or changed.get("at_s") is None:
        return "no budget nor IP exclusion change mid-run"
    kinds = changed.get("kinds") or {}
    made = ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items())) or "none made"
    raised = changed.get("charged_after_raises") or {}
    again = "; charged by the stream after a raise: " + ", ".join(f"{n} ({key})" for key, n in raised.items())
    return f"budgets and the IP exclusion list changed {changed['at_s']:.0f} s in ({made}{again if raised else ''})"


def write_report(out: Path, report: dict[str, Any]) -> None:
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    f = report["figures"]
    lines = [
        f"# Chaos run, seed {report['seed']}: {'PASSED' if report['passed'] else 'FAILED'}",
        "",
        f"`python -m ops.chaos --seed {report['seed']} --rate {report['rate']}"
        f"{' --faults ' + ','.join(report['plan']) if report.get('plan') and report['plan'] != FAULTS else ''}`, "
        f"{report['rate']} events/s live for {report.get('traffic_s', 0):.0f} s, "
        f"1 % poison, the catalog changed every {CATALOG_EVERY_S} s ({NEW_ADS} new ads), "
        f"{_deployed(report.get('schema_deployed'))}, {_changed(report.get('changed_mid_run'))}, "
        f"an outage of {report.get('outage_s', 0):.0f} s; "
        f"home `{report['home']}`, {report.get('data_disk', '')}.",
        "",
        *([f"**The schedule stopped early**: {report['stopped']}.", ""] if report.get("stopped") else []),
        "| check | result |",
        "| --- | --- |",
        *(f"| {name} | {'ok' if ok else 'FAILED'} |" for name, ok in report["checks"].items()),
        "",
        f"Billable clicks {f['billable_clicks']:,}; ledger rows {f['ledger_rows']:,} (missing {f['missing']}, "
        f"extra {f['extra']}, wrong amount {f['wrong_amount']}, billed twice {f['billed_twice']}); Redis "
        f"differences {f['redis_differences']}; {f['periods_exported']} periods exported with "
        f"{f['exported_clicks']:,} clicks and {f['export_adjustment_rows']} adjustment rows "
        f"({f.get('adjustments_booked_in_open_periods', 0)} more booked in the open period); poison "
        f"{f['poison_sent']} sent {f['poison_by_kind']}, {f['poison_missing_from_quarantine']} missing from "
        f"quarantine; web reads {f['web_reads_ok']:,} ok, {f['web_reads_failed']} failed "
        f"{f['web_reads_failed_by_fault']}; the job caught up {f['caught_up_s']} s after the traffic stopped.",
        "",
        "| # | fault | at (s) | target | recovered in (s) | events delayed | failed step | note |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        *(
            f"| {i} | {x['kind']} | {x['at_s']} | {x['target']} | {x['recovered_s']} | {x['delayed_events']:,} | "
            f"{x.get('failed_step') or ''} | {' '.join(str(x['note']).split())} |"
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
    parser.add_argument(
        "--faults",
        default=None,
        help=f"a shorter run: these faults only, comma-separated (default: all of {','.join(sorted(set(FAULTS)))})",
    )
    parser.add_argument(
        "--outage-minutes",
        type=float,
        default=OUTAGE_S / 60,
        help=f"how long the outage fault keeps the job down (default {OUTAGE_S / 60:.0f})",
    )
    parser.add_argument(
        "--deploy-schema-at",
        type=float,
        default=SCHEMA_DEPLOY_AT_S,
        metavar="SECONDS",
        help="when the producers deploy a new schema version, seconds after the traffic starts "
        f"(default {SCHEMA_DEPLOY_AT_S:.0f})",
    )
    parser.add_argument(
        "--no-invalid-traffic",
        dest="invalid_traffic",
        action="store_false",
        help="plain traffic: no crawlers, excluded ranges, floods, double clicks nor budgets (the verdict then holds "
        "the provisional ledger itself to the ground truth)",
    )
    parser.add_argument(
        "--changes-at",
        type=float,
        default=CHANGES_AT_S,
        metavar="SECONDS",
        help="with invalid traffic: when the budgets change and a range joins the IP exclusion list, seconds after "
        f"the traffic starts (default {CHANGES_AT_S:.0f}: after the budgets ran out)",
    )
    args = parser.parse_args(argv)
    faults = args.faults.split(",") if args.faults else None
    if faults and set(faults) - set(FAULTS):
        parser.error(f"--faults: unknown {sorted(set(faults) - set(FAULTS))}")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 1_000_000)
    out = args.out or PROJECT_ROOT / "var" / "chaos" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out.mkdir(parents=True, exist_ok=True)
    try:
        report = Chaos(
            out,
            seed,
            args.rate,
            faults,
            args.outage_minutes * 60,
            args.deploy_schema_at,
            args.invalid_traffic,
            args.changes_at,
        ).run()
    except RuntimeError as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 1
    print((out / "report.md").read_text())
    print(f"report: {out / 'report.md'}, {out / 'report.json'}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
