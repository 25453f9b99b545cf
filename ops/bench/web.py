"""`make bench-web`: the advertiser dashboard and its API under concurrent clients, on the real WSGI server.

Starts its own redis-server on a free port, seeds a realistic sample (`web.sample_data`: by default 5 advertisers x
3 campaigns x 4 ads, 48 hourly periods, corrections, late and quarantined counts, exports), adds one account per
advertiser, starts `adbill web` (gunicorn) as a child process, logs in every client through the login form, then
drives the dashboard page and its JSON API with N concurrent keep-alive clients for a while, each client sending
its next request as soon as the last one is answered (a closed loop, no think time: the hardest reading of "N
concurrent clients"). Prints requests/s and p50/p99/max latency per route, with the command that measured them;
the report goes to `var/bench/web-*/report.json`.

The client is one asyncio process speaking HTTP/1.1 over raw streams, so that it costs the server's machine as
little CPU as possible; it runs on the same machine, so its own CPU time competes with the server's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode

import redis

from billing.catalog import generate_catalog
from billing.layout import DataLayout
from billing.store.catalog_db import CatalogDatabase
from ops.postgres_service import LocalPostgres
from ops.process import free_ports
from web.access import Role
from web.accounts import AccountsDatabase
from web.sample_data import SampleWriter, seed_sample

PASSWORD = "benchmark passphrase 1"  # accounts of a throwaway data folder, for the benchmark only  # nosec B105
PROJECT_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class RouteStats:
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0

    def summary(self, seconds: float) -> dict[str, float]:
        ordered = sorted(self.latencies_ms)
        if not ordered:
            return {"requests": 0, "errors": self.errors}
        return {
            "requests": len(ordered),
            "errors": self.errors,
            "per_second": round(len(ordered) / seconds, 1),
            "p50_ms": round(_quantile(ordered, 0.50), 2),
            "p90_ms": round(_quantile(ordered, 0.90), 2),
            "p99_ms": round(_quantile(ordered, 0.99), 2),
            "max_ms": round(ordered[-1], 2),
            "mean_ms": round(statistics.fmean(ordered), 2),
        }


def _quantile(ordered: list[float], q: float) -> float:
    """Nearest-rank quantile of sorted values."""
    index = max(0, min(len(ordered) - 1, int(-(-q * len(ordered) // 1)) - 1))
    return ordered[index]


class Connection:
    """One keep-alive HTTP/1.1 connection with a cookie jar of one session."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.cookies: dict[str, str] = {}
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        cookie = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        head = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}", "Connection: keep-alive"]
        if cookie:
            head.append(f"Cookie: {cookie}")
        if body:
            head += ["Content-Type: application/x-www-form-urlencoded", f"Content-Length: {len(body)}"]
        self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("server closed the connection")
        status = int(status_line.split()[1])
        headers: dict[str, str] = {}
        while True:
            line = (await self.reader.readline()).decode("latin-1").rstrip("\r\n")
            if not line:
                break
            name, _, value = line.partition(":")
            name, value = name.strip().lower(), value.strip()
            if name == "set-cookie":
                cookie_name, _, rest = value.partition("=")
                cookie_value = rest.split(";", 1)[0]
                if "max-age=0" in value.lower() or "expires=thu, 01 jan 1970" in value.lower():
                    self.cookies.pop(cookie_name, None)
                else:
                    self.cookies[cookie_name] = cookie_value
            headers[name] = value
        payload = await self.reader.readexactly(int(headers.get("content-length", "0")))
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return status, headers, payload

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


async def log_in(conn: Connection, username: str) -> None:
    status, _, page = await conn.request("GET", "/login")
    match = re.search(rb'id="login-form".*?name="csrf_token" value="([^"]+)"', page, re.S)
    if status != 200 or not match:
        raise RuntimeError(f"login form: HTTP {status}")
    body = urlencode({"username": username, "password": PASSWORD, "csrf_token": match.group(1).decode()}).encode()
    status, headers, _ = await conn.request("POST", "/login", body)
    if status != 302 or "adbill_session" not in conn.cookies:
        raise RuntimeError(f"login of {username}: HTTP {status}")


async def drive(
    host: str, port: int, users: list[str], clients: int, seconds: float, warmup: float
) -> tuple[dict[str, RouteStats], float]:
    connections = [Connection(host, port) for _ in range(clients)]
    await asyncio.gather(*(log_in(c, users[i % len(users)]) for i, c in enumerate(connections)))
    advertiser_of = {f"user{i}": f"adv-{i:04d}" for i in range(len(users))}
    stats = {"page /advertisers/ID": RouteStats(), "api /api/v1/advertisers/ID/dashboard": RouteStats()}
    start = time.perf_counter()
    measure_from = start + warmup
    stop_at = measure_from + seconds

    async def client(index: int, conn: Connection) -> None:
        advertiser = advertiser_of[users[index % len(users)]]
        routes = [
            ("page /advertisers/ID", f"/advertisers/{advertiser}"),
            ("api /api/v1/advertisers/ID/dashboard", f"/api/v1/advertisers/{advertiser}/dashboard"),
        ]
        turn = index % 2
        while (now := time.perf_counter()) < stop_at:
            name, path = routes[turn]
            turn ^= 1
            try:
                status, _, _ = await conn.request("GET", path)
                ok = status == 200
            except (ConnectionError, asyncio.IncompleteReadError, OSError):
                ok = False
                await conn.close()
            elapsed_ms = (time.perf_counter() - now) * 1000
            if now >= measure_from:
                if ok:
                    stats[name].latencies_ms.append(elapsed_ms)
                else:
                    stats[name].errors += 1

    await asyncio.gather(*(client(i, c) for i, c in enumerate(connections)))
    for conn in connections:
        await conn.close()
    return stats, seconds


def start_web(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """`adbill web` with `env`, in a session of its own (its workers are stopped with it), its output in `log`."""
    with log.open("wb") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "ops.cli", "web"],
            stdout=output,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=PROJECT_ROOT,
            start_new_session=True,
        )


def _wait_port(port: int, process: subprocess.Popen[bytes], what: str, log: Path, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on {port} within {timeout_s} s")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.bench.web", description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds measured")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds driven before measuring")
    parser.add_argument("--advertisers", type=int, default=5)
    parser.add_argument("--periods", type=int, default=48)
    parser.add_argument("--workers", type=int, default=2, help="gunicorn worker processes")
    parser.add_argument("--threads", type=int, default=4, help="threads per worker")
    args = parser.parse_args(argv)
    command = "python -m ops.bench.web " + " ".join(sys.argv[1:] if argv is None else argv)

    redis_server = shutil.which("redis-server")
    if not redis_server:
        raise SystemExit("redis-server is not installed: run `make deps`")
    out_dir = PROJECT_ROOT / "var" / "bench" / f"web-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    out_dir.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="adbill-bench-web-"))
    home.chmod(0o755)  # run as root, PostgreSQL runs as its own user, who must reach its folder
    redis_port, web_port, postgres_port = free_ports(3)
    postgres = LocalPostgres(home / "postgres" / "cluster", postgres_port, home / "run", log_dir=out_dir)
    postgres.start()
    redis_log = out_dir / "redis.log"
    with redis_log.open("wb") as log:
        redis_proc = subprocess.Popen(
            [redis_server, "--bind", "127.0.0.1", "--port", str(redis_port), "--save", "", "--appendonly", "no"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    web_proc: subprocess.Popen[bytes] | None = None
    try:
        _wait_port(redis_port, redis_proc, "redis-server", redis_log)
        redis_url = f"redis://127.0.0.1:{redis_port}/0"
        catalog = generate_catalog(args.advertisers, 3, 4, seed=1)
        CatalogDatabase(postgres.url).start(catalog)
        client = redis.Redis.from_url(redis_url, decode_responses=True)
        first_period = (int(time.time() * 1000) // 3_600_000 - args.periods) * 3_600_000
        seeded = seed_sample(
            SampleWriter(client, "adbill", DataLayout(home).exports), catalog, first_period, args.periods
        )
        accounts = AccountsDatabase(postgres.url)
        users = []
        for i, advertiser in enumerate(catalog.advertiser_ids):
            accounts.add(f"user{i}", Role.ADVERTISER, PASSWORD, advertiser)
            users.append(f"user{i}")
        env = {k: v for k, v in os.environ.items() if not k.startswith("ADBILL_")}
        env.update(
            ADBILL_HOME=str(home),
            ADBILL_REDIS_URL=redis_url,
            ADBILL_DATABASE_URL=postgres.url,
            ADBILL_WEB_PORT=str(web_port),
            ADBILL_WEB_WORKERS=str(args.workers),
            ADBILL_WEB_THREADS=str(args.threads),
            ADBILL_WEB_LOGIN_LIMIT="1000",
        )
        web_log = out_dir / "web.log"
        web_proc = start_web(env, web_log)
        _wait_port(web_port, web_proc, "adbill web", web_log)
        print(
            f"seeded {seeded}; {args.clients} clients over {len(users)} advertiser accounts, "
            f"gunicorn {args.workers} workers x {args.threads} threads on port {web_port}",
            flush=True,
        )
        load_before = os.getloadavg()
        cpu_before = os.times()
        stats, seconds = asyncio.run(drive("127.0.0.1", web_port, users, args.clients, args.duration, args.warmup))
        cpu_after = os.times()
        report = {
            "command": command,
            "clients": args.clients,
            "duration_s": args.duration,
            "cores": os.cpu_count(),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
            "client_cpu_s": round((cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system), 1),
            "server": {"workers": args.workers, "threads": args.threads, "worker_class": "gthread"},
            "data": seeded,
            "routes": {name: s.summary(seconds) for name, s in stats.items()},
        }
        all_ms = RouteStats(
            [ms for s in stats.values() for ms in s.latencies_ms], sum(s.errors for s in stats.values())
        )
        report["routes"]["all"] = all_ms.summary(seconds)
        (out_dir / "report.json").write_text(json.dumps(report, indent=1))
        print(f"\n{command}")
        print(f"{args.clients} concurrent clients, closed loop, {args.duration:.0f} s measured, {os.cpu_count()} cores")
        print(f"{'route':<40} {'req/s':>8} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8} {'errors':>7}")
        for name, row in report["routes"].items():
            print(
                f"{name:<40} {row.get('per_second', 0):>8} {row.get('p50_ms', 0):>8} {row.get('p90_ms', 0):>8} "
                f"{row.get('p99_ms', 0):>8} {row.get('max_ms', 0):>8} {row['errors']:>7}"
            )
        print(f"load average before/after: {report['load_average_before']} / {report['load_average_after']}")
        print(f"report: {out_dir / 'report.json'}")
        return 0
    finally:
        if web_proc is not None:
            _stop(web_proc)
        _stop(redis_proc)
        postgres.stop()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
