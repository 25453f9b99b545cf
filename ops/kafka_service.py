"""Real Kafka brokers in KRaft mode, from the jars in `.deps/`: one node (broker and controller), or a cluster of
several such nodes on loopback, each its own process, ports and data folder, all of them voters of the quorum."""

from __future__ import annotations

import base64
import logging
import os
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ops import deps
from ops.process import ManagedProcess, ServiceError, port_open
from ops.reach import KAFKA_CLIENT_LOGGER, kafka_answers

log = logging.getLogger(__name__)

LOG4J_CONFIG = Path(__file__).resolve().parent / "kafka-log4j2.xml"
"""The broker's logging: its `server.log`, rolled over by the broker."""
TOOLS_LOG4J_CONFIG = Path(__file__).resolve().parent / "kafka-tools-log4j2.xml"
"""Kafka's command-line tools' logging: warnings to standard error, never into a broker's `server.log`."""

TOOLS = {
    "console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "console-producer": "org.apache.kafka.tools.ConsoleProducer",
    "topics": "org.apache.kafka.tools.TopicCommand",
    "consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "get-offsets": "org.apache.kafka.tools.GetOffsetShell",
    "consumer-perf": "org.apache.kafka.tools.ConsumerPerformance",
    "producer-perf": "org.apache.kafka.tools.ProducerPerformance",
}
"""Kafka's own command-line tools, by the name `adbill kafka TOOL` knows them."""

BROKER_GC_OPTIONS = ("-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20")
"""The collector Kafka's own start script gives a broker."""


def gc_options(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """`BROKER_GC_OPTIONS`, unless the JVM's options from the environment (`JAVA_TOOL_OPTIONS`, `JDK_JAVA_OPTIONS`)
    already choose a collector: a JVM given two refuses to start ("Multiple garbage collectors selected")."""
    chosen = " ".join(environ.get(name, "") for name in ("JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS"))
    return () if re.search(r"-XX:\+Use\w+GC\b", chosen) else BROKER_GC_OPTIONS


@dataclass
class LocalKafka:
    """One broker+controller node on loopback; its storage is formatted on first start and kept in `data_dir`.

    Alone by default; in a cluster, `node_id` is its place in `voters` (`id@127.0.0.1:port,...`, every node's
    controller), `replication` the factor of the internal topics and the default of new ones, with
    `min.insync.replicas` one less, and all nodes share `cluster_id`."""

    data_dir: Path
    port: int
    controller_port: int
    deps_dir: Path
    run_dir: Path
    heap: str = "768m"
    node_id: int = 1
    voters: str = ""
    replication: int = 1
    cluster_id: str = ""
    name: str = "kafka"
    process: ManagedProcess = field(init=False)

    def __post_init__(self) -> None:
        self.data_dir = self.data_dir.resolve()
        self.voters = self.voters or f"{self.node_id}@127.0.0.1:{self.controller_port}"
        logs = self.data_dir / "logs"
        self.process = ManagedProcess(
            name=self.name, command=[], run_dir=self.run_dir, log_dir=logs, own_log=logs / "server.log"
        )

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def config_file(self) -> Path:
        return self.data_dir / "server.properties"

    @property
    def min_insync(self) -> int:
        return max(1, self.replication - 1)

    def write_config(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(
            "\n".join(
                [
                    "# Written by adbill for the local broker; edit ADBILL_* settings instead.",
                    "process.roles=broker,controller",
                    f"node.id={self.node_id}",
                    f"controller.quorum.voters={self.voters}",
                    f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
                    f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                    "controller.listener.names=CONTROLLER",
                    "inter.broker.listener.name=PLAINTEXT",
                    "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
                    f"log.dirs={self.data_dir / 'data'}",
                    "auto.create.topics.enable=false",
                    f"default.replication.factor={self.replication}",
                    f"min.insync.replicas={self.min_insync}",
                    f"offsets.topic.replication.factor={self.replication}",
                    "offsets.topic.num.partitions=4",
                    f"transaction.state.log.replication.factor={self.replication}",
                    f"transaction.state.log.min.isr={self.min_insync}",
                    f"share.coordinator.state.topic.replication.factor={self.replication}",
                    f"share.coordinator.state.topic.min.isr={self.min_insync}",
                    "group.initial.rebalance.delay.ms=0",
                    "num.network.threads=2",
                    "num.io.threads=4",
                    "log.retention.hours=168",
                    "",
                ]
            )
        )

    def _java(self, main_class: str, *args: str, heap: str | None = None, log4j: Path = LOG4J_CONFIG) -> list[str]:
        return [
            deps.java_binary(),
            f"-Xmx{heap or self.heap}",
            *gc_options(),
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={log4j}",
            f"-Dkafka.logs.dir={self.data_dir / 'logs'}",
            "-cp",
            deps.kafka_classpath(self.deps_dir),
            main_class,
            *args,
        ]

    def format_storage(self) -> None:
        """Format the KRaft storage once; a formatted folder is left as it is."""
        if (self.data_dir / "data" / "meta.properties").exists():
            return
        cluster_id = self.cluster_id or new_cluster_id()
        formatter = ManagedProcess(
            name=f"{self.name}-format",
            command=self._java(
                "kafka.tools.StorageTool",
                "format",
                # `=`: a random id may begin with "-", which the tool would take for an option.
                f"--cluster-id={cluster_id}",
                "-c",
                str(self.config_file),
                "--ignore-formatted",
                heap="256m",
                log4j=TOOLS_LOG4J_CONFIG,
            ),
            run_dir=self.run_dir,
            log_dir=self.data_dir / "logs",
        )
        formatter.start()
        assert formatter.popen is not None
        code = formatter.popen.wait(timeout=120)
        formatter.pid_file.unlink(missing_ok=True)
        if code != 0:
            raise ServiceError(f"formatting Kafka storage failed ({code}):\n{formatter.log_tail()}")

    def start(self, timeout_s: float = 90.0) -> bool:
        """Start and wait until the broker answers metadata requests. False if it was already running."""
        if not self.launch():
            return False
        self.process.wait_ready(self.ready, timeout_s, f"Kafka answering on {self.bootstrap}")
        return True

    def launch(self) -> bool:
        """Start the process without waiting (a cluster's nodes answer only once a majority of them runs).
        False if it was already running."""
        if self.process.running_pid() and self.ready():
            return False
        for port in (self.port, self.controller_port):
            if port_open("127.0.0.1", port):
                raise ServiceError(
                    f"port {port} is taken by another program: "
                    "set ADBILL_KAFKA_BOOTSTRAP or ADBILL_KAFKA_CONTROLLER_PORT"
                )
        self.write_config()
        self.format_storage()
        self.process.command = self._java("kafka.Kafka", str(self.config_file))
        self.process.start()
        return True

    def ready(self) -> bool:
        return broker_ready(self.bootstrap)

    def stop(self) -> None:
        self.process.stop(timeout_s=30)

    def tool_command(self, tool: str, *args: str) -> list[str]:
        return self._java(TOOLS[tool], *args, heap="256m", log4j=TOOLS_LOG4J_CONFIG)


@dataclass
class LocalKafkaCluster:
    """`len(ports)` KRaft nodes on loopback, each broker and controller, named `kafka-1`... with data in
    `data_dir/kafka-N`; node N's controller listens on `controller_port + N - 1`. Every node is a voter, so the
    quorum and the partitions outlive one node's death."""

    data_dir: Path
    ports: list[int]
    controller_port: int
    deps_dir: Path
    run_dir: Path
    heap: str = "512m"
    nodes: list[LocalKafka] = field(init=False)

    def __post_init__(self) -> None:
        self.data_dir = self.data_dir.resolve()
        controllers = [self.controller_port + i for i in range(len(self.ports))]
        voters = ",".join(f"{i + 1}@127.0.0.1:{port}" for i, port in enumerate(controllers))
        self.nodes = [
            LocalKafka(
                data_dir=self.data_dir / f"kafka-{i + 1}",
                port=port,
                controller_port=controllers[i],
                deps_dir=self.deps_dir,
                run_dir=self.run_dir,
                heap=self.heap,
                node_id=i + 1,
                voters=voters,
                replication=min(3, len(self.ports)),
                name=f"kafka-{i + 1}",
            )
            for i, port in enumerate(self.ports)
        ]

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    def start(self, timeout_s: float = 120.0) -> list[LocalKafka]:
        """Start the nodes that are not running and wait until every broker is in the metadata; returns the nodes
        started here."""
        # One cluster id for every node, chosen on the first start and kept beside their folders.
        self.data_dir.mkdir(parents=True, exist_ok=True)
        id_file = self.data_dir / "cluster.id"
        if not id_file.exists():
            id_file.write_text(new_cluster_id())
        for node in self.nodes:
            node.cluster_id = id_file.read_text().strip()
        started = [node for node in self.nodes if node.launch()]
        deadline = time.monotonic() + timeout_s
        for node in started:
            node.process.wait_ready(
                lambda: brokers_listed(self.bootstrap) >= len(self.nodes),
                max(1.0, deadline - time.monotonic()),
                f"all {len(self.nodes)} brokers in the metadata",
            )
        return started

    def node(self, node_id: int) -> LocalKafka:
        return self.nodes[node_id - 1]

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()


def new_cluster_id() -> str:
    """A KRaft cluster id: a base64 UUID of 22 characters."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def brokers_listed(bootstrap: str, timeout_s: float = 2.0) -> int:
    """How many brokers the metadata lists (0: no answer)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 2000, "log_level": 0})
    try:
        return len(admin.list_topics(timeout=timeout_s).brokers)
    except Exception:  # KafkaException: no broker answered in time
        return 0


def partition_leaders(bootstrap: str, topic: str, timeout_s: float = 10.0) -> dict[int, int]:
    """Partition -> node id of its leader (-1: none)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    described = admin.list_topics(topic, timeout=timeout_s).topics[topic]
    return {p: meta.leader for p, meta in described.partitions.items()}


def broker_ready(bootstrap: str, timeout_s: float = 2.0) -> bool:
    """True when a broker answers a metadata request and lists itself; False (not an exception) when none does."""
    return kafka_answers(bootstrap, timeout_s)


TOPIC_CONFIGS = {"message.timestamp.type": "LogAppendTime"}
"""Configs of the product's topics. `LogAppendTime`: a record's timestamp is when the broker appended it, the
"time Kafka received it" of the contract (the future-time limit, the watermark's tolerance), whatever timestamp
the producer set."""


def ensure_topics(
    bootstrap: str,
    names: list[str],
    partitions: int,
    replication: int = 1,
    configs: dict[str, str] | None = None,
    timeout_s: float = 30.0,
) -> None:
    """Create the topics that are missing, with `configs`; existing ones must have `partitions` partitions, and
    get the `configs` they lack (one that differs is altered, and said so in the log). Idempotent."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": logging.getLogger(KAFKA_CLIENT_LOGGER)}
    admin = AdminClient(config)
    existing = admin.list_topics(timeout=timeout_s).topics
    missing = [name for name in names if name not in existing]
    if configs:
        _align_configs(admin, [name for name in names if name in existing], configs, timeout_s)
    if missing:
        futures = admin.create_topics(
            [NewTopic(name, partitions, replication, config=configs or {}) for name in missing],
            operation_timeout=timeout_s,
        )
        for name, future in futures.items():
            try:
                future.result(timeout=timeout_s)
            except KafkaException as exc:
                if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
                    raise ServiceError(f"cannot create topic {name}: {exc}") from exc
    # A topic just created may take a moment to show in the metadata: wait for it, with a deadline.
    deadline = time.monotonic() + timeout_s
    while True:
        metadata = admin.list_topics(timeout=timeout_s).topics
        found = {name: len(metadata[name].partitions) if name in metadata else 0 for name in names}
        wrong = {name: n for name, n in found.items() if n and n != partitions}
        if wrong:
            raise ServiceError(
                f"topics {wrong} do not have {partitions} partitions: impressions and clicks must have the same "
                "count so one ad's events share a partition number"
            )
        if all(found.values()):
            return
        if time.monotonic() > deadline:
            raise ServiceError(f"topics {[n for n, c in found.items() if not c]} did not appear within {timeout_s} s")
        time.sleep(0.2)


def topic_configs(bootstrap: str, name: str, timeout_s: float = 30.0) -> dict[str, str]:
    """The configs in force on topic `name` (set or default)."""
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, name)
    entries = admin.describe_configs([resource])[resource].result(timeout=timeout_s)
    return {key: entry.value for key, entry in entries.items()}


def _align_configs(admin: Any, names: list[str], configs: dict[str, str], timeout_s: float) -> None:
    """Set `configs` on the existing topics `names` where they differ."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    for name in names:
        resource = ConfigResource(ResourceType.TOPIC, name)
        current = admin.describe_configs([resource])[resource].result(timeout=timeout_s)
        differ = {key: value for key, value in configs.items() if key not in current or current[key].value != value}
        if not differ:
            continue
        log.warning(
            "topic %s: setting %s (was %s)", name, differ, {k: current[k].value for k in differ if k in current}
        )
        change = ConfigResource(
            ResourceType.TOPIC,
            name,
            incremental_configs=[
                ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET) for key, value in differ.items()
            ],
        )
        try:
            admin.incremental_alter_configs([change])[change].result(timeout=timeout_s)
        except Exception as exc:
            raise ServiceError(
                f"cannot set {differ} on topic {name}: {exc}; set it with Kafka's kafka-configs.sh, or allow this "
                "client to alter the topic's configs"
            ) from exc
