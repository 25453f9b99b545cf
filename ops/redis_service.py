"""A real redis-server (Debian's package) on loopback, with AOF persistence for the local stack."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ops import deps
from ops.process import ManagedProcess, ServiceError, port_open


@dataclass
class LocalRedis:
    """redis-server on 127.0.0.1:`port`, data and log in `data_dir`."""

    data_dir: Path
    port: int
    run_dir: Path
    appendonly: bool = True
    process: ManagedProcess = field(init=False)

    def __post_init__(self) -> None:
        self.data_dir = self.data_dir.resolve()
        self.process = ManagedProcess(name="redis", command=[], run_dir=self.run_dir, log_dir=self.data_dir)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 30.0) -> bool:
        """Start and wait for PING. False if it was already running."""
        if self.process.running_pid() and self.ready():
            return False
        if port_open("127.0.0.1", self.port):
            raise ServiceError(f"port {self.port} is taken by another program: set ADBILL_REDIS_URL")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.process.command = [
            deps.ensure_redis_server(),
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dir",
            str(self.data_dir),
            "--appendonly",
            "yes" if self.appendonly else "no",
            # Every write on disk before Redis answers: a live total, the record of the batches applied or a
            # correction acknowledged survives a power loss (`docs/operations.md`, "Power loss").
            "--appendfsync",
            "always",
            "--save",
            "",
            "--daemonize",
            "no",
            "--protected-mode",
            "yes",
        ]
        self.process.start()
        self.process.wait_ready(self.ready, timeout_s, f"Redis answering PING on port {self.port}")
        return True

    def ready(self) -> bool:
        import redis

        return bool(redis.Redis.from_url(self.url, socket_timeout=1).ping())

    def stop(self) -> None:
        self.process.stop(timeout_s=20)
