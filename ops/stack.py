"""The local stack: Kafka, Redis and the product's own processes on one machine, started and stopped together; with
ADBILL_CLUSTER=1 (`adbill up --cluster`) the local cluster: three Kafka brokers and a Spark master with its workers,
the jobs submitted to that master."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from billing.catalog import CatalogError, generate_catalog
from billing.store.database import without_password
from ops import deps
from ops.kafka_service import TOPIC_CONFIGS, LocalKafka, LocalKafkaCluster, broker_ready, ensure_topics
from ops.postgres_service import DATABASE, LocalPostgres, database_url
from ops.process import (
    ManagedProcess,
    consecutive_free_port,
    free_ports,
    interrupt,
    recorded_process,
    stop_processes,
)
from ops.redis_service import LocalRedis
from ops.settings import PROJECT_ROOT, Settings
from ops.spark_cluster import LocalSparkCluster

# Children stop in this order: traffic first, services last, so nothing writes to a stopped broker. A name ending
# in "-" stands for its numbered processes (kafka-1, kafka-2, ...).
STOP_ORDER = [
    "traffic",
    "web",
    "reconcile",
    "stream",
    "spark-worker-",
    "spark-master",
    "postgres",
    "redis",
    "kafka",
    "kafka-",
]


def stop_rank(name: str) -> int:
    """Where a child named `name` comes in STOP_ORDER."""
    for rank, entry in enumerate(STOP_ORDER):
        if name == entry or (entry.endswith("-") and name.startswith(entry) and name[len(entry) :].isdigit()):
            return rank
    return len(STOP_ORDER)


def local_kafka(settings: Settings) -> LocalKafka:
    return LocalKafka(port=settings.kafka_port, **_local_kafka_home(settings))


def local_kafka_cluster(settings: Settings) -> LocalKafkaCluster:
    return LocalKafkaCluster(ports=settings.kafka_ports, **_local_kafka_home(settings))


def _local_kafka_home(settings: Settings) -> dict[str, Any]:
    """What the local broker and the local cluster are given alike: the data folder, the (first) controller port,
    the jars and the folder of the pid files."""
    return {
        "data_dir": settings.layout.kafka,
        "controller_port": settings.kafka_controller_port,
        "deps_dir": settings.deps_dir,
        "run_dir": settings.layout.run,
    }


def local_spark_cluster(settings: Settings) -> LocalSparkCluster:
    return LocalSparkCluster(
        data_dir=settings.root / "spark",
        port=settings.spark_master_port,
        ui_port=settings.spark_master_ui_port,
        run_dir=settings.layout.run,
        workers=settings.spark_workers,
        worker_cores=settings.spark_worker_cores,
        worker_memory=settings.spark_worker_memory,
    )


def local_redis(settings: Settings) -> LocalRedis:
    return LocalRedis(data_dir=settings.layout.redis, port=settings.redis_port, run_dir=settings.layout.run)


def local_postgres(settings: Settings) -> LocalPostgres:
    return LocalPostgres(
        data_dir=settings.postgres_dir,
        port=settings.postgres_port,
        run_dir=settings.layout.run,
        log_dir=settings.layout.logs,
    )


def ensure_stack_topics(settings: Settings) -> list[str]:
    """The impressions, clicks and quarantine topics, created if missing, all with `TOPIC_CONFIGS` (idempotent);
    returns their names."""
    names = [settings.topic_impressions, settings.topic_clicks, settings.topic_quarantine]
    replication = settings.topic_replication
    # With three copies a write needs two of them: one broker may die without losing an acknowledged record.
    configs = dict(TOPIC_CONFIGS)
    if replication >= 3:
        configs["min.insync.replicas"] = str(replication - 1)
    ensure_topics(settings.kafka_bootstrap, names, settings.topic_partitions, replication, configs)
    return names


def ensure_catalog(settings: Settings) -> None:
    """A catalog in the database: generated (small and deterministic) when there is none yet (a data folder's
    catalog file written before the database is taken in first). Reads nothing of a catalog that exists: the job
    reads it once, when it starts (a million ads take seconds to read)."""
    store = settings.catalog_store()
    if store.exists():
        return
    catalog = generate_catalog(
        advertisers=5, campaigns_per_advertiser=3, ads_per_campaign=4, seed=settings.traffic_seed
    )
    with contextlib.suppress(CatalogError):  # another process made one meanwhile
        store.start(catalog)


def ensure_schemas(settings: Settings) -> dict[str, int]:
    """Register the event schemas (idempotent); returns topic to schema id."""
    from billing.schemas import schema_text, subject_of

    registry = settings.schema_registry_store()
    return {
        topic: registry.register(subject_of(event_type), schema_text(event_type))
        for event_type, topic in settings.topics.items()
    }


@dataclass
class Stack:
    """What `adbill up` owns. Services it found already running are used, and left running at the end."""

    settings: Settings
    started: list[ManagedProcess] = field(default_factory=list)

    def start_services(self) -> None:
        s = self.settings
        deps.ensure_kafka_jars(s.deps_dir)
        if s.kafka_is_local and len(s.kafka_ports) > 1:
            cluster = local_kafka_cluster(s)
            started = cluster.start()
            self.started.extend(node.process for node in started)
            for node in cluster.nodes:
                state = "started" if node in started else "running"
                _say(
                    f"{node.name:<8} {state:<9} {node.bootstrap}  controller :{node.controller_port}  ({node.data_dir})"
                )
        elif s.kafka_is_local:
            self.start_service("kafka", local_kafka(s), s.kafka_bootstrap, f"data {s.layout.kafka}")
        elif not broker_ready(s.kafka_bootstrap, timeout_s=10):
            raise SystemExit(f"Kafka at {s.kafka_bootstrap} does not answer")
        if s.redis_is_local:
            self.start_service("redis", local_redis(s), s.redis_url, f"AOF in {s.layout.redis}")
        if s.database_is_local:
            self.start_service("postgres", local_postgres(s), s.database_url, f"cluster in {s.postgres_dir}")
        if s.spark_is_local_cluster:
            spark = local_spark_cluster(s)
            started_spark = spark.start()
            self.started.extend(started_spark)
            for process in [spark.master, *spark.worker_processes]:
                state = "started" if process in started_spark else "running"
                where = f"{spark.url}  UI {spark.ui}" if process is spark.master else f"{s.spark_worker_cores} cores"
                _say(f"{process.name:<14} {state:<9} {where}")
        ensure_stack_topics(s)
        _say(
            f"topics   ready     {s.topic_impressions}, {s.topic_clicks}, {s.topic_quarantine} "
            f"({s.topic_partitions} partitions, replication {s.topic_replication})"
        )
        ensure_catalog(s)
        catalog = s.catalog_store().current()
        _say(
            f"catalog  ready     {len(catalog)} ads of {len(catalog.advertiser_ids)} advertisers, version "
            f"{catalog.version}  ({s.database_url})"
        )
        ids = ensure_schemas(s)
        _say(f"schemas  ready     {ids}  ({without_password(s.registry_location)})")

    def start_service(self, name: str, service: LocalKafka | LocalRedis | LocalPostgres, url: str, where: str) -> None:
        """Start a local service unless it already runs (then it is used, and left running at the end)."""
        if service.start():
            self.started.append(service.process)
            _say(f"{name:<8} started   {url}  ({where})")
        else:
            _say(f"{name:<8} running   {url}  (already up, left as it is)")

    def start_child(self, name: str, args: list[str]) -> None:
        """Run `adbill ARGS` as a child named NAME, unless one is already running."""
        child = ManagedProcess(
            name=name,
            command=[sys.executable, "-m", "ops.cli", *args],
            run_dir=self.settings.layout.run,
            log_dir=self.settings.layout.logs,
            env=_child_env(self.settings),
            log_max_bytes=self.settings.log_max_bytes,
            log_backups=self.settings.log_backups,
        )
        if child.running_pid():
            _say(f"{name:<8} running   (pid {child.running_pid()}, left as it is)")
            return
        child.start()
        self.started.append(child)
        _say(f"{name:<8} started   pid {child.popen.pid if child.popen else '?'}, log {child.log_file}")

    def wait_healthy(self, name: str, url: str, timeout_s: float = 60.0) -> None:
        """Wait until the child NAME answers 200 at `url` (its `/healthz`); fail early, with its log, if it dies."""
        child = next((c for c in self.started if c.name == name), None)
        if child is None:
            return  # found running, not ours to wait for
        child.wait_ready(lambda: http_ok(url), timeout_s, f"200 from {url}")
        _say(f"{name:<8} healthy   {url}")

    def watch(self, ready_url: str | None = None) -> None:
        """Block until Ctrl-C or SIGTERM, or until a child of ours dies; then stop what we started. With
        `ready_url` (the web UI's `/readyz`), say once when the whole stack is ready: Redis and the job's batches."""
        stop = {"now": False}
        next_probe = 0.0

        def on_signal(signum: int, _frame: object) -> None:
            stop["now"] = True

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        try:
            while not stop["now"]:
                for child in self.started:
                    code = child.exited()
                    if code is not None:
                        _say(f"{child.name} exited with code {code}; its log ends with:\n{child.log_tail(15)}")
                        if child.name != "traffic":
                            return
                        self.started.remove(child)
                        break
                if ready_url and time.monotonic() >= next_probe:
                    next_probe = time.monotonic() + 5
                    if http_ok(ready_url):
                        _say(f"stack    ready     {ready_url}: Redis answers, the job's batches are recent")
                        ready_url = None
                time.sleep(0.5)
        finally:
            self.stop()

    def stop(self) -> None:
        for rank in sorted({stop_rank(c.name) for c in self.started}):
            group = [c for c in self.started if stop_rank(c.name) == rank]
            _say(f"stopping {', '.join(c.name for c in group)} ...")
            stop_processes([c.identity for c in group if c.identity is not None], timeout_s=30)
            for child in group:
                child.stop(timeout_s=1)
        self.started.clear()


def down(settings: Settings) -> list[str]:
    """Stop every process a stack left in the background, found by its pid file. Returns their names."""
    stopped: list[str] = []
    # Numbered processes of one kind (the brokers, the workers) stop together.
    pid_files = [f for f in settings.layout.run.glob("*.pid") if stop_rank(f.stem) < len(STOP_ORDER)]
    for rank in sorted({stop_rank(f.stem) for f in pid_files}):
        group = sorted(f for f in pid_files if stop_rank(f.stem) == rank)
        alive = {f.stem: process for f in group if (process := recorded_process(f)) is not None}
        if "postgres" in alive:  # a fast shutdown: its sessions end, everything committed is on disk
            interrupt(alive["postgres"], signal.SIGINT, timeout_s=30)
        stop_processes(list(alive.values()), timeout_s=30)
        stopped.extend(alive)
        for pid_file in group:
            pid_file.unlink(missing_ok=True)
    return stopped


def http_ok(url: str, timeout_s: float = 2.0) -> bool:
    """True when a GET of `url` (a loopback probe of ours) answers 200."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # nosec B310: our own http URL
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def local_cluster_env(home: Path, **overrides: str) -> dict[str, str]:
    """The environment of `adbill` processes running a throwaway local cluster (three brokers, a Spark master,
    Redis, the web UI) in `home`, on free loopback ports: this process's environment without its `ADBILL_*`
    variables, this checkout on PYTHONPATH, and `overrides` (more `ADBILL_*` settings) on top."""
    brokers = free_ports(3)
    master, ui, redis_port, web, postgres = free_ports(5)
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("ADBILL_")},
        "PYTHONPATH": os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")) if p),
        "ADBILL_CLUSTER": "1",
        "ADBILL_HOME": str(home),
        "ADBILL_DEPS_DIR": os.environ.get("ADBILL_DEPS_DIR", str(PROJECT_ROOT / ".deps")),
        "ADBILL_KAFKA_BOOTSTRAP": ",".join(f"127.0.0.1:{port}" for port in brokers),
        "ADBILL_KAFKA_CONTROLLER_PORT": str(consecutive_free_port(3)),
        "ADBILL_SPARK_MASTER": f"spark://127.0.0.1:{master}",
        "ADBILL_SPARK_MASTER_UI_PORT": str(ui),
        "ADBILL_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "ADBILL_DATABASE_URL": database_url(postgres, DATABASE),
        "ADBILL_WEB_PORT": str(web),
        "ADBILL_METRICS_PORT": "0",
        **overrides,
    }


def _child_env(settings: Settings) -> dict[str, str]:
    env = dict(os.environ)
    env["ADBILL_HOME"] = str(settings.root)
    env["ADBILL_NO_PROGRESS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _say(line: str) -> None:
    print(line, flush=True)


def print_where(settings: Settings) -> None:
    s = settings
    _say("")
    _say("adbill local cluster" if s.cluster else "adbill local stack")
    _say(f"  kafka       {s.kafka_bootstrap}   topics {s.topic_impressions}, {s.topic_clicks}, {s.topic_quarantine}")
    if len(s.kafka_ports) > 1:
        _say(
            f"              {len(s.kafka_ports)} KRaft nodes, controllers from :{s.kafka_controller_port}, "
            f"replication {s.topic_replication}, min.insync.replicas {max(1, s.topic_replication - 1)}"
        )
    if s.spark_master.startswith("spark://"):
        _say(f"  spark       {s.spark_master}   master UI http://127.0.0.1:{s.spark_master_ui_port}/")
        _say(
            f"              stream {s.stream_cores} cores, reconcile and audit {s.batch_cores} each; "
            f"executors {s.executor_memory}, drivers {s.driver_memory}"
        )
    _say(f"  redis       {s.redis_url}")
    _say(f"  postgres    {s.database_url}   (the catalog, its history and change log)")
    _say(f"  web         http://{s.web_host}:{s.web_port}/   accounts: adbill users add NAME --role admin")
    _say(f"  probes      http://{s.web_host}:{s.web_port}/healthz (alive), /readyz (Redis and the job's last batch)")
    _say(f"  data        {s.root}")
    kafka_logs = s.layout.kafka / ("kafka-N/logs" if len(s.kafka_ports) > 1 else "logs")
    spark_logs = f", spark: {s.root / 'spark' / 'logs'}" if s.spark_is_local_cluster else ""
    _say(f"  logs        {s.layout.logs}  (kafka: {kafka_logs}{spark_logs})")
    _say(
        f"  watch       adbill kafka console-consumer --bootstrap-server {s.kafka_bootstrap} "
        f"--topic {s.topic_clicks} --property print.key=true --max-messages 5"
    )
    down = "adbill down --cluster" if s.cluster else "adbill down"
    _say(f"  stop        Ctrl-C (or `{down}` for a stack left in the background)")
    _say("")
