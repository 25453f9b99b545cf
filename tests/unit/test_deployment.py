"""docker-compose.yml describes the cluster deployment; no Docker engine runs here, so its structure is checked."""

from __future__ import annotations

import shlex
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from ops.cli import CHILDREN, _parser
from ops.settings import PROJECT_ROOT, Settings, env_name, setting_names
from ops.stack import local_kafka_cluster, local_spark_cluster

COMPOSE = yaml.safe_load((PROJECT_ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
ADBILL_SERVICES = {name for name, svc in SERVICES.items() if svc.get("image") == "adbill:latest"}

# Subcommands the deployment runs that later work adds to the CLI. Empty once every one exists.
NOT_YET_IN_CLI: set[str] = set()


def _kafka_env(name: str) -> dict[str, str]:
    return {k: str(v) for k, v in SERVICES[name]["environment"].items()}


def test_three_kraft_brokers_with_replication_three_and_min_isr_two() -> None:
    brokers = sorted(name for name in SERVICES if name.startswith("kafka-"))
    assert brokers == ["kafka-1", "kafka-2", "kafka-3"]
    voters = {_kafka_env(b)["KAFKA_CONTROLLER_QUORUM_VOTERS"] for b in brokers}
    assert voters == {"1@kafka-1:9093,2@kafka-2:9093,3@kafka-3:9093"}
    assert sorted(_kafka_env(b)["KAFKA_NODE_ID"] for b in brokers) == ["1", "2", "3"]
    for broker in brokers:
        env = _kafka_env(broker)
        assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
        assert env["KAFKA_DEFAULT_REPLICATION_FACTOR"] == "3"
        assert env["KAFKA_MIN_INSYNC_REPLICAS"] == "2"
        assert env["KAFKA_ADVERTISED_LISTENERS"] == f"PLAINTEXT://{broker}:9092"
        assert len(env["CLUSTER_ID"]) == 22, "a KRaft cluster id is a base64 UUID of 22 characters"


def test_spark_master_with_two_workers_and_the_job_submitted_to_it() -> None:
    master = SERVICES["spark-master"]["entrypoint"]
    assert master[:2] == ["spark-class", "org.apache.spark.deploy.master.Master"]
    workers = [name for name in SERVICES if name.startswith("spark-worker-")]
    assert len(workers) == 2
    for worker in workers:
        entry = SERVICES[worker]["entrypoint"]
        assert entry[:3] == [
            "spark-class",
            "org.apache.spark.deploy.worker.Worker",
            "spark://spark-master:7077",
        ]
    stream = SERVICES["stream"]
    assert stream["command"] == ["stream"]
    assert stream["environment"]["ADBILL_SPARK_MASTER"] == "spark://spark-master:7077"
    assert set(workers) <= set(stream["depends_on"])


def test_every_service_dependency_exists() -> None:
    for name, svc in SERVICES.items():
        needs = svc.get("depends_on", [])
        for dependency in needs if isinstance(needs, list) else needs.keys():
            assert dependency in SERVICES, f"{name} depends on missing service {dependency}"


def test_the_product_talks_to_all_three_brokers_and_redis() -> None:
    for name in ("stream", "producers", "topics", "web"):
        env = SERVICES[name]["environment"]
        assert env["ADBILL_KAFKA_BOOTSTRAP"] == "kafka-1:9092,kafka-2:9092,kafka-3:9092"
        assert env["ADBILL_REDIS_URL"] == "redis://redis:6379/0"
    assert SERVICES["topics"]["environment"]["ADBILL_TOPIC_REPLICATION"] == "3"


@pytest.mark.parametrize("service", sorted(ADBILL_SERVICES))
def test_every_setting_passed_is_one_the_project_reads(service: str) -> None:
    env = SERVICES[service].get("environment", {})
    passed = {name for name in env if name.startswith("ADBILL_")}
    assert passed <= setting_names(), f"{service} passes settings the project does not read: {passed - setting_names()}"


@pytest.mark.parametrize("service", sorted(ADBILL_SERVICES))
def test_every_adbill_command_parses(service: str) -> None:
    command = SERVICES[service].get("command")
    if command is None:
        assert "entrypoint" in SERVICES[service], f"{service} runs neither an adbill command nor its own entrypoint"
        return
    argv = command if isinstance(command, list) else shlex.split(command)
    if argv[0] in NOT_YET_IN_CLI:
        pytest.skip(f"`adbill {argv[0]}` is added by later work")
    args = _parser().parse_args(argv)
    assert args.command == argv[0]


def test_pending_commands_list_shrinks_as_the_cli_grows() -> None:
    known = set(_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    assert not NOT_YET_IN_CLI & known, "a subcommand now exists: remove it from NOT_YET_IN_CLI"


def test_the_image_installs_the_project_and_its_jars() -> None:
    dockerfile = (PROJECT_ROOT / "Dockerfile").read_text()
    assert "openjdk-17" in dockerfile
    assert "pip install" in dockerfile and "adbill deps" in dockerfile
    for package in ("attribution", "billing", "producers", "web", "ops"):
        assert f"COPY {package} {package}" in dockerfile
    assert Path(PROJECT_ROOT / "ops" / "maven" / "kafka-broker.xml").exists()


def test_the_web_uis_health_check_asks_its_own_readyz(tmp_path: Path) -> None:
    from web.app import create_app

    web = SERVICES["web"]
    probe = " ".join(web["healthcheck"]["test"])
    assert f"http://127.0.0.1:{web['environment']['ADBILL_WEB_PORT']}/readyz" in probe
    settings = Settings.from_env({}, home=tmp_path)
    routes = {rule.rule for rule in create_app(settings).url_map.iter_rules()}
    assert {"/healthz", "/readyz"} <= routes


# The local cluster (`adbill up --cluster`) and this file are the same deployment: same services, same settings,
# same bounds. A process of one has its service in the other, under the same name (the traffic simulator is the
# `producers` service; `topics` is a step of `adbill up`, a one-shot service here).
LOCAL_NAME = {"producers": "traffic"}
ONE_SHOT = {"topics"}
BOUNDS = [
    "ADBILL_TOPIC_REPLICATION",
    "ADBILL_STREAM_CORES",
    "ADBILL_BATCH_CORES",
    "ADBILL_EXECUTOR_MEMORY",
    "ADBILL_DRIVER_MEMORY",
    "ADBILL_STATE_STORE",
    "ADBILL_RECONCILE_INTERVAL_S",
]


def _bound(settings: Settings, name: str) -> str:
    """The value of the setting `name` (an `ADBILL_*` variable) that a process runs with: the state store resolved."""
    field = next(f.name for f in fields(Settings) if env_name(f) == name)
    return settings.new_state_store if field == "state_store" else str(getattr(settings, field))


def _cluster_settings() -> Settings:
    return Settings.from_env({}, cluster=1)


def _local_cluster_processes() -> set[str]:
    settings = _cluster_settings()
    spark = local_spark_cluster(settings)
    return (
        {node.name for node in local_kafka_cluster(settings).nodes}
        | {spark.master.name, *(w.name for w in spark.worker_processes)}
        | {"redis", "postgres", "traffic", *CHILDREN}
    )


def test_the_compose_services_are_the_local_cluster_processes() -> None:
    compose = {LOCAL_NAME.get(name, name) for name in SERVICES} - ONE_SHOT
    assert compose == _local_cluster_processes()
    for name, args in CHILDREN.items():
        assert SERVICES[name]["command"] == args, f"{name} runs another command than `adbill up` starts"


def test_the_compose_file_has_the_local_clusters_settings_and_bounds() -> None:
    settings = _cluster_settings()
    for service in ("stream", "reconcile", "web", "producers", "topics"):
        env = {k: str(v) for k, v in SERVICES[service]["environment"].items()}
        for name in BOUNDS:
            assert name in env, f"{service} does not set {name}"
        compose = Settings.from_env({name: env[name] for name in BOUNDS}, cluster=1)
        for name in BOUNDS:
            assert _bound(compose, name) == _bound(settings, name), (
                f"{service}: {name}={env[name]}, the local cluster has {_bound(settings, name)}"
            )
    workers = sorted(name for name in SERVICES if name.startswith("spark-worker-"))
    assert len(workers) == settings.spark_workers
    for worker in workers:
        entry = SERVICES[worker]["entrypoint"]
        assert entry[entry.index("--cores") + 1] == str(settings.spark_worker_cores)
        assert entry[entry.index("--memory") + 1] == settings.spark_worker_memory
    # Room for both applications at once: the job and reconciliation never wait for each other's cores.
    assert settings.stream_cores + settings.batch_cores <= settings.spark_workers * settings.spark_worker_cores
    brokers = [name for name in SERVICES if name.startswith("kafka-")]
    local = local_kafka_cluster(settings)
    assert len(brokers) == len(local.nodes) == settings.topic_replication == 3
    for broker, node in zip(sorted(brokers), local.nodes, strict=True):
        env = _kafka_env(broker)
        assert int(env["KAFKA_MIN_INSYNC_REPLICAS"]) == node.min_insync == 2
        assert int(env["KAFKA_DEFAULT_REPLICATION_FACTOR"]) == node.replication
        assert f"-Xmx{node.heap}" in env["KAFKA_HEAP_OPTS"]
        assert len(env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")) == len(node.voters.split(","))


def test_every_long_running_service_has_a_health_check() -> None:
    for name, svc in SERVICES.items():
        if name in ONE_SHOT:
            assert svc.get("restart") == "no", f"{name} is one-shot: it should not restart"
            continue
        check = svc.get("healthcheck", {}).get("test")
        assert check, f"{name} has no health check"
        if check[:2] == ["CMD", "adbill"]:
            args = _parser().parse_args(check[2:])
            assert args.command == "health" and args.part == name


def test_the_reconcile_interval_comes_from_its_setting() -> None:
    assert SERVICES["reconcile"]["command"] == ["reconcile", "--every"]
    args = _parser().parse_args(SERVICES["reconcile"]["command"])
    assert args.every == 0, "--every without a number: every ADBILL_RECONCILE_INTERVAL_S"


def test_java_home_is_the_same_on_every_architecture() -> None:
    dockerfile = (PROJECT_ROOT / "Dockerfile").read_text()
    java_home = next(line for line in dockerfile.splitlines() if line.startswith("ENV JAVA_HOME="))
    assert "amd64" not in java_home and "arm64" not in java_home
    home = java_home.split("=", 1)[1].split()[0]
    assert "ln -sfn" in dockerfile and home in dockerfile.split("ENV JAVA_HOME")[0], "the image links JAVA_HOME"
    for svc in SERVICES.values():
        assert "amd64" not in str(svc.get("environment", {}))


def _mounts(service: dict) -> dict[str, str]:  # type: ignore[type-arg]
    """Container path -> volume of a service's named volumes."""
    out = {}
    for volume in service.get("volumes", []):
        source, target = str(volume).split(":")[:2]
        out[target] = source
    return out


def test_every_service_whose_processes_write_the_data_folder_mounts_it() -> None:
    """The adbill services write the data folder (ADBILL_HOME); so do the Spark workers' executors, where the stream's
    tasks write the batch files (`StreamConfig.write_on_executors`) and the join's state store writes the checkpoint
    (`DataLayout.checkpoints`, under ADBILL_HOME). A service without the volume would write into its own container,
    lost at its restart and unseen by the others."""
    from billing.layout import DataLayout

    adbill = {name for name in ADBILL_SERVICES if "ADBILL_HOME" in SERVICES[name].get("environment", {})}
    home = {str(SERVICES[name]["environment"]["ADBILL_HOME"]) for name in adbill}
    assert len(home) == 1
    data = home.pop()
    assert str(DataLayout(Path(data)).checkpoints).startswith(data), "the checkpoint lives in the data folder"
    writers = adbill | {name for name in SERVICES if name.startswith("spark-worker-")}
    volumes = {name: _mounts(SERVICES[name]).get(data) for name in writers}
    assert volumes == dict.fromkeys(writers, "adbill-data"), volumes
    assert "adbill-data" in COMPOSE["volumes"]
