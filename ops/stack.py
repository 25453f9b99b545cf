"""The local stack: Kafka, Redis and the product's own processes on one machine, started and stopped together."""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass, field

from billing.catalog import Catalog, generate_catalog
from ops import deps
from ops.kafka_service import TOPIC_CONFIGS, LocalKafka, broker_ready, ensure_topics
from ops.process import ManagedProcess, pid_alive, stop_pid
from ops.redis_service import LocalRedis
from ops.settings import Settings

# Children stop in this order: traffic first, services last, so nothing writes to a stopped broker.
STOP_ORDER = ["traffic", "web", "reconcile", "stream", "redis", "kafka"]


def local_kafka(settings: Settings) -> LocalKafka:
    return LocalKafka(
        data_dir=settings.kafka_dir,
        port=settings.kafka_port,
        controller_port=settings.kafka_controller_port,
        deps_dir=settings.deps_dir,
        run_dir=settings.run_dir,
    )


def local_redis(settings: Settings) -> LocalRedis:
    return LocalRedis(data_dir=settings.redis_dir, port=settings.redis_port, run_dir=settings.run_dir)


def ensure_stack_topics(settings: Settings) -> list[str]:
    """The impressions, clicks and quarantine topics, created if missing, all with `TOPIC_CONFIGS` (idempotent);
    returns their names."""
    names = [settings.topic_impressions, settings.topic_clicks, settings.topic_quarantine]
    ensure_topics(settings.kafka_bootstrap, names, settings.topic_partitions, settings.topic_replication, TOPIC_CONFIGS)
    return names


def ensure_catalog(settings: Settings) -> Catalog:
    """The catalog file, generated (small and deterministic) when there is none yet."""
    if settings.catalog_file.exists():
        return Catalog.load(settings.catalog_file)
    catalog = generate_catalog(
        advertisers=5, campaigns_per_advertiser=3, ads_per_campaign=4, seed=settings.traffic_seed
    )
    catalog.save(settings.catalog_file)
    return catalog


def ensure_schemas(settings: Settings) -> dict[str, int]:
    """Register the event schemas (idempotent); returns topic to schema id."""
    from billing.schema_registry import open_registry
    from billing.schemas import schema_text, subject_of

    registry = open_registry(settings.registry_location)
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
        if s.kafka_is_local:
            kafka = local_kafka(s)
            if kafka.start():
                self.started.append(kafka.process)
                _say(f"kafka    started   {s.kafka_bootstrap}  (data {s.kafka_dir})")
            else:
                _say(f"kafka    running   {s.kafka_bootstrap}  (already up, left as it is)")
        elif not broker_ready(s.kafka_bootstrap, timeout_s=10):
            raise SystemExit(f"Kafka at {s.kafka_bootstrap} does not answer")
        if s.redis_is_local:
            redis = local_redis(s)
            if redis.start():
                self.started.append(redis.process)
                _say(f"redis    started   {s.redis_url}  (AOF in {s.redis_dir})")
            else:
                _say(f"redis    running   {s.redis_url}  (already up, left as it is)")
        ensure_stack_topics(s)
        _say(
            f"topics   ready     {s.topic_impressions}, {s.topic_clicks}, {s.topic_quarantine} "
            f"({s.topic_partitions} partitions)"
        )
        catalog = ensure_catalog(s)
        _say(f"catalog  ready     {len(catalog)} ads of {len(catalog.advertiser_ids)} advertisers  ({s.catalog_file})")
        ids = ensure_schemas(s)
        _say(f"schemas  ready     {ids}  ({s.registry_location})")

    def start_child(self, name: str, args: list[str]) -> None:
        """Run `adbill ARGS` as a child named NAME, unless one is already running."""
        child = ManagedProcess(
            name=name,
            command=[sys.executable, "-m", "ops.cli", *args],
            run_dir=self.settings.run_dir,
            log_dir=self.settings.logs_dir,
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
        for name in STOP_ORDER:
            for child in [c for c in self.started if c.name == name]:
                _say(f"stopping {name} ...")
                child.stop()
                self.started.remove(child)


def down(settings: Settings) -> list[str]:
    """Stop every process a stack left in the background, found by its pid file. Returns their names."""
    stopped = []
    for name in STOP_ORDER:
        pid_file = settings.run_dir / f"{name}.pid"
        pid = pid_alive(pid_file)
        if pid is not None:
            stop_pid(pid, timeout_s=30)
            stopped.append(name)
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


def _child_env(settings: Settings) -> dict[str, str]:
    import os

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
    _say("adbill local stack")
    _say(f"  kafka       {s.kafka_bootstrap}   topics {s.topic_impressions}, {s.topic_clicks}, {s.topic_quarantine}")
    _say(f"  redis       {s.redis_url}")
    _say(f"  web         http://{s.web_host}:{s.web_port}/   accounts: adbill users add NAME --role admin")
    _say(f"  probes      http://{s.web_host}:{s.web_port}/healthz (alive), /readyz (Redis and the job's last batch)")
    _say(f"  data        {s.root}")
    _say(f"  logs        {s.logs_dir}  (kafka: {s.kafka_dir / 'logs'})")
    _say(
        f"  watch       adbill kafka console-consumer --bootstrap-server {s.kafka_bootstrap} "
        f"--topic {s.topic_clicks} --property print.key=true --max-messages 5"
    )
    _say("  stop        Ctrl-C (or `adbill down` for a stack left in the background)")
    _say("")
