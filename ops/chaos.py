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
from pathlib import Path
from typing import Any

from attribution.stream_position import BILLING_QUERY
from billing.budgets import DAY_MS, OVER_BUDGET, utc_day
from billing.store.catalog_file import save_catalog
from billing.store.stream_offsets import committed_offsets, end_offsets, records_behind
from ops.chaos_books import past_budget
from ops.chaos_plan import (
    BUDGET_EXHAUSTED_WAIT_S,
    CATALOG_EVERY_S,
    CHANGES_AT_S,
    DISK_FULL_S,
    DISK_SIZE,
    FAULTS,
    HORIZON_MS,
    INVALID_TRAFFIC_BUDGET_SHARE,
    JOB_STOPS_BY_ITSELF_S,
    NEW_ADS,
    OUTAGE_S,
    OUTSIDE_THE_DATA_DISK,
    PERIOD_MS,
    POISON_FRACTION,
    RECOVERY_DEADLINE_S,
    SCHEMA_DEPLOY_AT_S,
    ChaosOptions,
    FaultRecord,
    WebReads,
)
from ops.chaos_verdict import verdict
from ops.process import pid_alive, stop_child
from ops.settings import PROJECT_ROOT, Settings
from ops.stack import local_cluster_env


class Chaos:
    def __init__(self, out: Path, options: ChaosOptions) -> None:
        self.out = out.resolve()  # the services' folders are links from the data disk: absolute ones
        self.options = options
        self.rng = random.Random(options.seed)
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
        """`redis-restarted` faults under which the job went on running on the empty Redis."""
        self.database_changes: dict[str, int] = {"confirmed": 0, "lost": 0, "twice": 0}
        """The `database` faults' changes: confirmed by a door while the database died, and of those, lost or twice."""
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
        pid = pid_alive(self.settings.layout.run / f"{name}.pid")
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

        config = SimulationConfig(seed=self.options.seed, duration_s=1)
        self.home.mkdir(parents=True)
        self.mount_data_disk()
        save_catalog(config.catalog(), self.settings.catalog_file)
        plan = list(self.options.plan)
        self.rng.shuffle(plan)
        self.faults = [FaultRecord(kind, round(self.rng.uniform(5, 30), 1)) for kind in plan]
        self.say(f"chaos: seed {self.options.seed}, {self.options.rate} events/s, home {self.home}; {self.disk}")
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
            return verdict(self, truth)
        finally:
            self.stop.set()
            if self.traffic is not None:
                stop_child(self.traffic, timeout_s=60)
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
            str(self.options.rate),
            "--seed",
            str(self.options.seed),
            "--late",
            "0",
            "--bad",
            "0",
            "--catalog-every",
            str(CATALOG_EVERY_S),
            "--new-ads",
            str(NEW_ADS),
            "--deploy-schema-at",
            str(self.options.schema_deploy_at_s),
            "--run-dir",
            str(run_dir),
            "--no-progress",
            *(self.invalid_traffic_args() if self.options.invalid_traffic else ()),
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
        return [*args, "--changes-at", str(self.options.changes_at_s)]

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
        leader, where = self.partition_leader()
        pid = self.pid(f"kafka-{leader}")
        fault.target = f"kafka-{leader} ({where}) pid {pid}"
        os.kill(pid, signal.SIGKILL)
        fault.note = f"restarted after {self.back_after(15, 30)} s"

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
        away = self.back_after(15, 30)
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
            if pid_alive(self.settings.layout.run / "stream.pid") is None:
                return True
            time.sleep(1)
        return False

    def lose_redis_data(self) -> None:
        """Remove what Redis kept on disk (its folder may be a link to the machine's disk: its contents go)."""
        folder = self.settings.layout.redis
        for item in folder.iterdir() if folder.is_dir() else []:
            if item.is_dir() and not item.is_symlink():
                shutil.rmtree(item, ignore_errors=True)
            else:
                item.unlink(missing_ok=True)

    def restore_redis(self, fault: FaultRecord) -> None:
        """The operator after Redis lost its data: stop the job, start Redis empty, rebuild the totals from the
        data folder, start the job."""
        stream = pid_alive(self.settings.layout.run / "stream.pid")
        if stream is not None:
            os.kill(stream, signal.SIGTERM)
            for _ in range(120):
                if pid_alive(self.settings.layout.run / "stream.pid") is None:
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
        away = self.back_after(20, 40)
        code = run.wait()
        fault.note = f"worker restarted after {away} s; the reconciliation ended with exit {code}"

    def back_after(self, low_s: float, high_s: float) -> float:
        """A random while (`low_s` to `high_s`, to a tenth of a second) waited, then what is down brought back by
        `adbill up`; the while."""
        away = round(self.rng.uniform(low_s, high_s), 1)
        time.sleep(away)
        self.up()
        return away

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
        fault.target = f"stream stopped (pid {pid}) for {self.options.outage_s:.0f} s under live traffic"
        log_file = self.settings.layout.logs / "reconcile.log"
        seen = log_file.stat().st_size
        os.kill(pid, signal.SIGTERM)
        time.sleep(self.options.outage_s)
        with log_file.open(errors="replace") as log:
            log.seek(seen)
            held = dict(re.findall(r"period (\S+) held: ([^\n]+)", log.read()))  # the last reason of each
        self.up()
        fault.note = f"recovery includes the {self.options.outage_s:.0f} s outage; held while down: " + (
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
        rng = random.Random(self.options.seed + 1)  # its own: the faults' draws stay the seed's, whatever it draws
        interval = 1 / (self.options.rate * POISON_FRACTION)
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
        options = ChaosOptions(
            seed,
            args.rate,
            faults or list(FAULTS),
            args.outage_minutes * 60,
            args.deploy_schema_at,
            args.invalid_traffic,
            args.changes_at,
        )
        report = Chaos(out, options).run()
    except RuntimeError as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 1
    print((out / "report.md").read_text())
    print(f"report: {out / 'report.md'}, {out / 'report.json'}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
