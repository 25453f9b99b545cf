"""A real PostgreSQL server (Debian's package, `initdb` and `postgres`) on loopback, for the records that several
processes and hosts share.

The cluster lives in `data_dir` (made by `initdb` on first start: one superuser role, `adbill`, trusted on loopback
only; the database `adbill` made on first start). PostgreSQL refuses to run as root: a root caller (the test
fixtures, `make up` in a container) runs the server as the `postgres` system user that Debian's package creates,
which then owns `data_dir`, and every folder above it must let that user through.
"""

from __future__ import annotations

import os
import pwd
import signal
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ops import deps
from ops.process import ManagedProcess, ServiceError, interrupt, port_open

ROLE = "adbill"
DATABASE = "adbill"
SYSTEM_USER = "postgres"
"""Who runs the server when the caller is root (PostgreSQL refuses root)."""


@dataclass
class LocalPostgres:
    """postgres on 127.0.0.1:`port`, its cluster in `data_dir`, its socket and pid file in `run_dir`."""

    data_dir: Path
    port: int
    run_dir: Path
    log_dir: Path | None = None
    process: ManagedProcess = field(init=False)

    def __post_init__(self) -> None:
        self.data_dir = self.data_dir.resolve()
        self.run_dir = self.run_dir.resolve()
        self.process = ManagedProcess(
            name="postgres", command=[], run_dir=self.run_dir, log_dir=(self.log_dir or self.data_dir.parent)
        )

    @property
    def url(self) -> str:
        return database_url(self.port, DATABASE)

    def start(self, timeout_s: float = 60.0) -> bool:
        """Make the cluster on first use, start the server and wait until it answers, with the product's database
        made. False if it was already running."""
        if self.process.running_pid() and self.ready():
            return False
        if port_open("127.0.0.1", self.port):
            raise ServiceError(f"port {self.port} is taken by another program: set ADBILL_DATABASE_URL")
        binaries = deps.ensure_postgres()
        runner = _runner()
        socket_dir = self.run_dir / "postgres-socket"
        for folder in (self.data_dir.parent, socket_dir):
            folder.mkdir(parents=True, exist_ok=True)
        if runner:
            _hand_over(self.data_dir.parent, socket_dir)
        if not (self.data_dir / "PG_VERSION").exists():
            _initdb(binaries, self.data_dir, runner)
        self.process.command = [
            *runner,
            str(binaries / "postgres"),
            "-D",
            str(self.data_dir),
            "-c",
            "listen_addresses=127.0.0.1",
            "-p",
            str(self.port),
            "-c",
            f"unix_socket_directories={socket_dir}",
            "-c",
            "fsync=on",
        ]
        self.process.start()
        self.process.wait_ready(self.ready_server, timeout_s, f"PostgreSQL answering on port {self.port}")
        ensure_database(database_url(self.port, "postgres"), DATABASE)
        return True

    def ready_server(self) -> bool:
        return _answers(database_url(self.port, "postgres"))

    def ready(self) -> bool:
        return _answers(self.url)

    def stop(self, timeout_s: float = 30.0, immediate: bool = False) -> None:
        """A fast shutdown (SIGINT: open sessions are ended, everything committed is on disk), then the usual
        SIGTERM and SIGKILL if it does not end in time. `immediate` (SIGQUIT) skips the shutdown checkpoint, which
        writes every changed page to the data files: for a cluster about to be deleted (a test session's, whose
        databases take a checkpoint of seconds). A cluster stopped so recovers from its WAL at the next start,
        nothing committed lost."""
        process = self.process.process()
        if process is not None:
            interrupt(process, signal.SIGQUIT if immediate else signal.SIGINT, timeout_s)
        self.process.stop(timeout_s=5)


def database_url(port: int, database: str) -> str:
    return f"postgresql://{ROLE}@127.0.0.1:{port}/{database}"


def ensure_database(admin_url: str, name: str) -> bool:
    """Create the database `name` if it does not exist; True when it was made."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as connection:
        if connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            return False
        connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return True


def database_beside(url: str, name: str) -> str:
    """The URL of the database `name` on the server of `url` (same role), made if missing: a benchmark's system or
    a scratch run with a catalog of its own."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    ensure_database(urlunsplit(parts._replace(path="/postgres")), name)
    return urlunsplit(parts._replace(path=f"/{name}"))


def _answers(url: str) -> bool:
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=2) as connection:
            return connection.execute("SELECT 1").fetchone() == (1,)
    except psycopg.Error:
        return False


def _runner() -> list[str]:
    """The prefix that runs a command as the server's user: nothing for a user other than root; for root, `setpriv`
    to the `postgres` system user (it execs, so the pid recorded is the server's own)."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        raise ServiceError(
            f"PostgreSQL does not run as root, and there is no {SYSTEM_USER!r} user to run it as: install Debian's "
            "postgresql package (make deps), which creates it"
        ) from None
    return ["setpriv", f"--reuid={SYSTEM_USER}", f"--regid={SYSTEM_USER}", "--init-groups", "--"]


def _hand_over(*folders: Path) -> None:
    """Give the server's user the folders it writes, and check it can reach them: every folder above must let
    others through (`o+x`)."""
    user = pwd.getpwnam(SYSTEM_USER)
    for folder in folders:
        os.chown(folder, user.pw_uid, user.pw_gid)
        for above in folder.parents:
            mode = above.stat().st_mode
            if not mode & stat.S_IXOTH and above.stat().st_uid != user.pw_uid:
                raise ServiceError(
                    f"PostgreSQL runs as {SYSTEM_USER!r}, which cannot reach {folder}: {above} lets no one else "
                    f"through (mode {stat.filemode(mode)}); keep the database folder under one that does"
                )


def _initdb(binaries: Path, data_dir: Path, runner: list[str]) -> None:
    command = [
        *runner,
        str(binaries / "initdb"),
        "-D",
        str(data_dir),
        "-U",
        ROLE,
        "--auth=trust",
        "--encoding=UTF8",
        "--locale=C.UTF-8",
        "--no-instructions",
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ServiceError(f"initdb failed ({' '.join(command)}): {done.stderr.strip() or done.stdout.strip()}")
