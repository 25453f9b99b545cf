"""`ops.process`'s free ports: the services of one local cluster never get the same port, however the kernel hands
them out (a broker's port was once the Spark master's, chosen by two calls)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ops import process
from ops.process import consecutive_free_port, free_ports
from ops.stack import local_cluster_env


def test_consecutive_ports_skip_those_to_avoid(monkeypatch: pytest.MonkeyPatch) -> None:
    chosen = free_ports(8)
    firsts = iter([[chosen[3]], [chosen[5] - 1], *([p] for p in free_ports(40))])
    monkeypatch.setattr(process, "free_ports", lambda count, host="127.0.0.1": next(firsts))
    first = consecutive_free_port(3, avoid=chosen)
    assert not {first, first + 1, first + 2} & set(chosen)


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
