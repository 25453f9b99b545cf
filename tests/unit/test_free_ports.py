"""`ops.process`'s free ports: a port this process handed out is not handed out again while its service may not have
bound it yet, so the services of one local cluster never get the same port (a broker's port was once the Spark
master's, chosen by two calls a moment apart)."""

from __future__ import annotations

from pathlib import Path

from ops.process import consecutive_free_port, free_port, free_ports
from ops.stack import local_cluster_env


def test_no_port_is_handed_out_twice_by_calls_one_after_the_other() -> None:
    """The kernel alone, asked 400 times, hands some port out again (a port let go is as free as any other)."""
    ports = [free_port() for _ in range(200)] + [port for _ in range(100) for port in free_ports(2)]
    first = consecutive_free_port(3)
    ports += [first, first + 1, first + 2]
    assert len(set(ports)) == len(ports)


def test_a_local_clusters_services_have_different_ports(tmp_path: Path) -> None:
    for _ in range(20):
        env = local_cluster_env(tmp_path)
        controller = int(env["ADBILL_KAFKA_CONTROLLER_PORT"])
        ports = [
            *(int(address.rsplit(":", 1)[1]) for address in env["ADBILL_KAFKA_BOOTSTRAP"].split(",")),
            int(env["ADBILL_SPARK_MASTER"].rsplit(":", 1)[1]),
            int(env["ADBILL_SPARK_MASTER_UI_PORT"]),
            int(env["ADBILL_REDIS_URL"].rsplit(":", 1)[1].split("/")[0]),
            int(env["ADBILL_WEB_PORT"]),
            int(env["ADBILL_DATABASE_URL"].rsplit(":", 1)[1].split("/")[0]),
            controller,
            controller + 1,
            controller + 2,
        ]
        assert len(set(ports)) == len(ports), ports
