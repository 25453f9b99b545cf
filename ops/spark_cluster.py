"""A Spark standalone cluster on loopback, from the installed pyspark's own jars: one master and its workers, each a
`bin/spark-class` process (`org.apache.spark.deploy.master.Master`, `...deploy.worker.Worker`)."""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ops import deps
from ops.process import ManagedProcess, ServiceError, port_open
from ops.settings import PROJECT_ROOT

DAEMON_MEMORY = "256m"
"""Heap of the master and of each worker daemon (executors have their own, from the application's settings)."""


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def daemon_env() -> dict[str, str]:
    """Environment of the daemons, and so of the executors they start: loopback only, the project importable."""
    java = Path(deps.java_binary()).resolve()
    env = dict(os.environ)
    env.update(
        SPARK_HOME=str(spark_home()),
        JAVA_HOME=str(java.parent.parent),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_DAEMON_MEMORY=DAEMON_MEMORY,
        PYSPARK_PYTHON=sys.executable,
        PYTHONPATH=os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")) if p),
        MALLOC_ARENA_MAX="2",
    )
    return env


@dataclass
class LocalSparkCluster:
    """A master on 127.0.0.1:`port` (web UI on `ui_port`) and `workers` workers of `worker_cores` cores and
    `worker_memory` each; logs and work folders in `data_dir`."""

    data_dir: Path
    port: int
    ui_port: int
    run_dir: Path
    workers: int = 2
    worker_cores: int = 2
    worker_memory: str = "2g"
    master: ManagedProcess = field(init=False)
    worker_processes: list[ManagedProcess] = field(init=False)

    def __post_init__(self) -> None:
        self.data_dir = self.data_dir.resolve()
        spark_class = str(spark_home() / "bin" / "spark-class")
        logs = self.data_dir / "logs"
        env = daemon_env()
        self.master = ManagedProcess(
            name="spark-master",
            command=[
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--webui-port",
                str(self.ui_port),
            ],
            run_dir=self.run_dir,
            log_dir=logs,
            env=env,
        )
        self.worker_processes = [
            ManagedProcess(
                name=f"spark-worker-{n}",
                command=[
                    spark_class,
                    "org.apache.spark.deploy.worker.Worker",
                    self.url,
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    str(self.worker_cores),
                    "--memory",
                    self.worker_memory,
                    "--webui-port",
                    "0",
                    "--work-dir",
                    str(self.data_dir / f"work-{n}"),
                ],
                run_dir=self.run_dir,
                log_dir=logs,
                env=env,
            )
            for n in range(1, self.workers + 1)
        ]

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def ui(self) -> str:
        return f"http://127.0.0.1:{self.ui_port}/"

    def state(self) -> dict[str, Any]:
        """The master's own JSON view: workers, cores, running applications."""
        with urllib.request.urlopen(f"{self.ui}json/", timeout=3) as response:
            return dict(json.load(response))

    def alive_workers(self) -> int:
        return int(self.state().get("aliveworkers", 0))

    def start(self, timeout_s: float = 120.0) -> list[ManagedProcess]:
        """Start what is not running, wait until every worker is registered and alive; returns what started."""
        started = []
        if not (self.master.running_pid() and _answers(self.state)):
            for port in (self.port, self.ui_port):
                if port_open("127.0.0.1", port):
                    raise ServiceError(
                        f"port {port} is taken by another program: "
                        "set ADBILL_SPARK_MASTER or ADBILL_SPARK_MASTER_UI_PORT"
                    )
            self.master.start()
            self.master.wait_ready(lambda: port_open("127.0.0.1", self.port), timeout_s, f"master on {self.url}")
            self.master.wait_ready(lambda: _answers(self.state), timeout_s, f"master UI on {self.ui}")
            started.append(self.master)
        for worker in self.worker_processes:
            if not worker.running_pid():
                self.start_worker(worker, timeout_s)
                started.append(worker)
        return started

    def start_worker(self, worker: ManagedProcess, timeout_s: float = 120.0) -> None:
        """Start one worker and wait until the master counts it alive."""
        worker.start()
        worker.wait_ready(lambda: _registered(worker), timeout_s, "registered with the master")

    def worker(self, n: int) -> ManagedProcess:
        return self.worker_processes[n - 1]

    def applications(self) -> list[dict[str, Any]]:
        """The running applications: name, cores, memory per executor, state."""
        return list(self.state().get("activeapps", []))

    def stop(self) -> None:
        for worker in self.worker_processes:
            worker.stop(timeout_s=20)
        self.master.stop(timeout_s=20)


def _registered(worker: ManagedProcess) -> bool:
    """The worker's log says, since its last start, that the master took it (a restarted worker's old self may
    still count as alive at the master until its heartbeat times out)."""
    text = worker.log_file.read_text(errors="replace")
    return "Successfully registered with master" in text[text.rfind("\n--- ") :]


def _answers(state: Any) -> bool:
    try:
        state()
    except OSError:
        return False
    return True
