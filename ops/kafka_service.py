"""A real Kafka broker in KRaft mode (one node, broker and controller), from the jars in `.deps/`."""

from __future__ import annotations

import base64
import logging
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ops import deps
from ops.process import ManagedProcess, ServiceError, port_open
from ops.reach import KAFKA_CLIENT_LOGGER, kafka_answers

log = logging.getLogger(__name__)

LOG4J_CONFIG = Path(__file__).resolve().parent / "kafka-log4j2.xml"

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


@dataclass
class LocalKafka:
    """One broker+controller node on loopback; its storage is formatted on first start and kept in `data_dir`."""

    data_dir: Path
    port: int
    controller_port: int
    deps_dir: Path
    run_dir: Path
    heap: str = "768m"
    process: ManagedProcess = field(init=False)

    def __post_init__(self) -> None:
        self.data_dir = self.data_dir.resolve()
        self.process = ManagedProcess(name="kafka", command=[], run_dir=self.run_dir, log_dir=self.data_dir / "logs")

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def config_file(self) -> Path:
        return self.data_dir / "server.properties"

    def write_config(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(
            "\n".join(
                [
                    "# Written by adbill for the local broker; edit ADBILL_* settings instead.",
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
                    f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
                    f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                    "controller.listener.names=CONTROLLER",
                    "inter.broker.listener.name=PLAINTEXT",
                    "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
                    f"log.dirs={self.data_dir / 'data'}",
                    "auto.create.topics.enable=false",
                    "offsets.topic.replication.factor=1",
                    "offsets.topic.num.partitions=4",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "share.coordinator.state.topic.replication.factor=1",
                    "share.coordinator.state.topic.min.isr=1",
                    "group.initial.rebalance.delay.ms=0",
                    "num.network.threads=2",
                    "num.io.threads=4",
                    "log.retention.hours=168",
                    "",
                ]
            )
        )

    def _java(self, main_class: str, *args: str, heap: str | None = None) -> list[str]:
        return [
            deps.java_binary(),
            f"-Xmx{heap or self.heap}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
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
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        formatter = ManagedProcess(
            name="kafka-format",
            command=self._java(
                "kafka.tools.StorageTool",
                "format",
                # `=`: a random id may begin with "-", which the tool would take for an option.
                f"--cluster-id={cluster_id}",
                "-c",
                str(self.config_file),
                "--ignore-formatted",
                heap="256m",
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
        if self.process.running_pid() and self.ready():
            return False
        if port_open("127.0.0.1", self.port):
            raise ServiceError(f"port {self.port} is taken by another program: set ADBILL_KAFKA_BOOTSTRAP")
        self.write_config()
        self.format_storage()
        self.process.command = self._java("kafka.Kafka", str(self.config_file))
        self.process.start()
        self.process.wait_ready(self.ready, timeout_s, f"Kafka answering on {self.bootstrap}")
        return True

    def ready(self) -> bool:
        return broker_ready(self.bootstrap)

    def stop(self) -> None:
        self.process.stop(timeout_s=30)

    def tool_command(self, tool: str, *args: str) -> list[str]:
        return self._java(TOOLS[tool], *args, heap="256m")


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
