"""`make bench-network`: the ad catalog of an ad network in PostgreSQL at 10,000, 100,000 and 1,000,000 ads (N/40
advertisers, 10 campaigns each, 4 ads per campaign: `adbill catalog generate`'s shape), through every door that
changes it, the pages that show it and the streaming job that prices with it.

The phases (`--phases`, all by default) but `stream` run first, size after size, on a PostgreSQL of their own
(Debian's server, `ops.postgres_service`) on a free loopback port: one database per size, `network_N`, into which the
generated catalog is loaded whichever of them runs.
1. `load`: the catalog loaded into the empty database (`CatalogDatabase.load`, what `adbill catalog import` does) and
   the round trip: exported (`catalog_document`) and read back equal. Then a new process reads the whole catalog
   (what the streaming job, a web worker or reconciliation pays once when it starts): seconds, and the memory it
   added to the process (resident set before and after).
2. `doors`: `--changes` price changes made one after another through the store a door uses: latency p50, p99, max;
   and `adbill catalog set-price` run `--commands` times, wall time, and the process start alone (`adbill --help`),
   reported apart.
3. `writers`: `--writers` doors (threads of one process, each its own connection) making `--rate` changes a second
   between them for `--seconds`, while a reader takes the changes every second as a batch of the stream does: the
   doors' latency p50/p99, every confirmed change checked in the database (none lost, none twice, each once in the
   change log), and the reader's catch-up per batch p50/p99 with how many versions it took each time. Beside them,
   the disk's own commit floor (`DiskProbe`: 8 kB written and `fdatasync`ed at the doors' rate, on the disk of the
   database's WAL), and how many doors over 100 ms overlapped a sync of the disk over 50 ms: a change commits with
   one such sync, and on a shared virtual disk its stalls are the doors' slow tail.
4. `web`: the real web UI (`adbill web`: gunicorn, `--web-workers` x `--web-threads`) on the size's database, with a
   Redis of the run's holding two days of one advertiser's figures (`web.sample_data`); an admin account, its API
   token and that advertiser's account made with `adbill users add` and `adbill tokens create`. Timed one request
   at a time on a keep-alive connection: the first request of a new worker (its catalog page: the worker reads the
   catalog whole), then requests on new connections, two per worker at once, three times (the other workers' first
   requests among them: the slowest); `--web-requests` requests after `--web-warmup` of the admin's catalog
   page (the first page of ads and a middle one), the advertiser's dashboard (each a second after the last, when the
   worker no longer keeps it: `web.cache`) and its ads' page: p50/p95/p99; `--changes` bid changes through the API
   (`POST /api/v1/catalog/ads/AD/prices`, `Authorization: Bearer`) and `--changes` through the ad's page (its page
   read for the form's CSRF token, the form posted, the page it redirects to read): p50/p99 of each. The server's
   processes' resident memory at the end.
5. `stream`, after the others, on services of its own (`ops.bench.systems.start_services`: Kafka, Redis and
   PostgreSQL): the traffic of `make bench-stream` (`ops.bench.traffic.plan_traffic`, pre-generated with its ground
   truth) at `--stream-rate` for `--stream-seconds`, sent to the real streaming job (`ops.bench.systems.run_system`)
   first for `--stream-warmup-seconds` through a job not compared (the new broker's JVM compiles and the caches fill
   under the first traffic: a baseline run first measured twice its later self), then once with the traffic's own
   catalog of 60 ads and no changes (the baseline), then once per size with a catalog of
   N ads in its database: the generated catalog whose 60 ads the traffic clicks on are the traffic's, at its prices
   (`traffic_catalog`). Meanwhile `--writers` doors make `--rate` changes a second (`ops.catalog_load`, a process of
   its own, writing before the job starts and until its run ends), on ads of their own from a day ahead and on the
   traffic's ads from now. For each run: the mean batch of the step (and over the batches after its first third),
   each with its ratio to the baseline's; a batch's cost by least squares over the run's batches (its fixed part,
   with its ratio, and its part per event: `ops.bench.analysis.batch_cost`); the job's CPU time per event read, with
   its ratio (its cost, whatever the size its batches grew to: a job that fell behind at its start reads larger
   batches, each slower); the job's start to the end of its first batch; the driver's (Python's) resident memory
   when it starts, at its first batch and at its peak (the catalog's share: its peak less the
   baseline's) and the JVM's; the sustained rate, the latency, and whether the ledger equals the ground truth; the
   writers' changes checked as in `writers`.
   With `--stream-rounds R`, the baseline and the sizes run R times in turn, each size compared with the baseline
   of its round, and the report gives every round's ratios and their medians: one run's ratio moves with the
   machine's hour (baselines of one machine on one day measured 1.9 to 3.0 s), the median of rounds much less.
   The traffic's event times are all before the run (the plan is generated once and cached), so every change of a
   traffic's ad takes effect after every click: a ledger equal to the ground truth says that no click was priced
   at a price made after its event time. A click after a change, priced at the new price, is not checked here
   (`make bench-catalog` checks it, with live traffic).

The report goes to `var/bench/network-<time>/report.json` (the web server's logs beside it, the jobs' under
`stream/`); the summary tables are printed at the end, in Markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPConnection, HTTPException
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from billing.catalog import Catalog, generate_catalog
from billing.store.catalog_db import CatalogDatabase, catalog_document, read_catalog_document
from billing.store.catalog_file import load_catalog
from ops.bench import analysis
from ops.bench.measure import Sampler, descendants, read_processes
from ops.bench.report import PIPELINE
from ops.bench.systems import LoadOptions, System, prepare_system, run_system, start_services
from ops.bench.traffic import TrafficPlan, plan_traffic
from ops.bench.web import PASSWORD, start_web
from ops.bench.web import _stop as stop_server
from ops.bench.web import _wait_port as wait_port
from ops.catalog_load import Confirmed, WriterRun, bid, check_confirmed, percentile
from ops.postgres_service import LocalPostgres, database_beside
from ops.process import free_ports
from ops.redis_service import LocalRedis
from ops.settings import PROJECT_ROOT, Settings

SIZES = (10_000, 100_000, 1_000_000)
PHASES = ("load", "doors", "writers", "web", "stream")
STREAM_SEED = 3
"""The traffic's seed: `make bench-stream`'s, so that a plan of the same rate and length is generated once for both."""
ADMIN, ADVERTISER = "bench-admin", "bench-advertiser"
WEB_PERIODS = 48
"""Hours of the advertiser's figures in Redis (`make bench-web`'s sample)."""
WARM_ROUNDS = 3
"""Rounds of requests on new connections, two per worker at once, that reach every worker (`_warm_workers`)."""
FORM = {"Content-Type": "application/x-www-form-urlencoded"}

_START_PROBE = """
import json, sys, time
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
from billing.store.catalog_db import CatalogDatabase
before = rss()
began = time.monotonic()
catalog = CatalogDatabase(sys.argv[1]).current()
seconds = time.monotonic() - began
print(json.dumps({"seconds": seconds, "rss_added_mb": (rss() - before) / 1e6, "ads": len(catalog),
                  "version": catalog.version}))
"""

Say = Callable[[str], None]


def network_catalog(ads: int) -> Catalog:
    """The generated catalog of `ads` ads (at least 40): `ads / 40` advertisers of 10 campaigns of 4 ads."""
    return generate_catalog(max(1, ads // 40), 10, 4, seed=1)


def traffic_catalog(plan_catalog: Catalog, ads: int) -> Catalog:
    """The network's catalog of `ads` ads holding the traffic's ads as the traffic's catalog has them (prices,
    budgets, IP exclusions): the traffic clicks on ads of the big catalog at the prices its ground truth bills. The
    traffic's ads are ads of the generated catalog's first advertisers, in the same currencies; a catalog smaller
    than the traffic's shape gets them on top."""
    kept = [ad for ad in network_catalog(ads) if ad.ad_id not in plan_catalog]
    return Catalog([*plan_catalog, *kept], plan_catalog.version, plan_catalog.budgets, plan_catalog.exclusions)


# --- The phases on the network's database -----------------------------------------------------------------------------


def measure_size(
    url: str, ads: int, args: argparse.Namespace, phases: set[str], redis_url: str | None, folders: Folders, say: Say
) -> dict[str, Any]:
    figures: dict[str, Any] = {"ads": ads}
    began = time.monotonic()
    catalog = network_catalog(ads)
    figures["generate_s"] = round(time.monotonic() - began, 2)
    say(f"{ads:,} ads: generated in {figures['generate_s']} s")

    store = CatalogDatabase(url)
    began = time.monotonic()
    store.load(catalog, [])
    figures["load_s"] = round(time.monotonic() - began, 2)
    say(f"  loaded in {figures['load_s']} s")
    if "load" in phases:
        began = time.monotonic()
        document = catalog_document(store.current(), store.changes())
        back, _ = read_catalog_document(document)
        figures["export_round_trip_s"] = round(time.monotonic() - began, 2)
        figures["export_mb"] = round(len(document) / 1e6, 1)
        figures["export_round_trip_equal"] = back == catalog
        say(f"  export {figures['export_mb']} MB read back equal: {back == catalog}")
        del document, back
        probe = subprocess.run(
            [sys.executable, "-c", _START_PROBE, url], capture_output=True, text=True, check=True, cwd=PROJECT_ROOT
        )
        figures["start"] = json.loads(probe.stdout)
        start = figures["start"]
        say(f"  a new process reads it whole in {start['seconds']:.2f} s, +{start['rss_added_mb']:.0f} MB")

    ad_ids = catalog.ad_ids
    if "doors" in phases:
        figures.update(measure_doors(store, url, ad_ids, args, say))
    if "writers" in phases:
        figures["writers"] = measure_writers(url, args, folders.scratch, say)
    if "web" in phases:
        assert redis_url is not None
        try:
            figures["web"] = measure_web(url, catalog, args, redis_url, folders, say)
        except Exception as exc:  # the report still shows what was measured, and why the phase ended there
            figures["web"] = {"error": str(exc)}
            say(f"  web: {exc}")
    return figures


def measure_doors(
    store: CatalogDatabase, url: str, ad_ids: list[str], args: argparse.Namespace, say: Say
) -> dict[str, Any]:
    """One door's changes one after another through the store, and the command's (module doc, `doors`)."""
    figures: dict[str, Any] = {}
    latencies = []
    for i in range(args.changes):
        ad_id = ad_ids[(i * 7_919) % len(ad_ids)]
        began = time.monotonic()
        store.change(bid(ad_id, 200_000 + i, ahead_ms=0))
        latencies.append((time.monotonic() - began) * 1000)
    figures["door_ms"] = _spread(latencies)
    say(f"  one door, {args.changes} changes: {_said(figures['door_ms'])}")

    env = {**os.environ, "ADBILL_DATABASE_URL": url, "ADBILL_NO_PROGRESS": "1"}
    command_s, start_s = [], []
    for i in range(args.commands):
        began = time.monotonic()
        adbill(env, "catalog", "set-price", ad_ids[i], "--cpc-micros", str(300_000 + i))
        command_s.append(time.monotonic() - began)
        began = time.monotonic()
        adbill(env, "--help")
        start_s.append(time.monotonic() - began)
    figures["command_s"] = {
        "median": round(statistics.median(command_s), 3),
        "process_start_median": round(statistics.median(start_s), 3),
    }
    say(
        f"  `adbill catalog set-price`: {figures['command_s']['median']} s, of which the process start "
        f"{figures['command_s']['process_start_median']} s"
    )
    return figures


def measure_writers(url: str, args: argparse.Namespace, scratch: Path, say: Say) -> dict[str, Any]:
    """The writers for `--seconds` while this process reads the changes as a batch does (module doc, `writers`)."""
    reader = CatalogDatabase(url)
    reader.current()
    catch_up: list[float] = []
    versions_taken: list[int] = []
    stop = threading.Event()

    def read_batches() -> None:
        held = reader.current().version
        while not stop.wait(1.0):
            began = time.monotonic()
            now = reader.current().version
            catch_up.append((time.monotonic() - began) * 1000)
            versions_taken.append(now - held)
            held = now

    # The doors in a process of their own, as web workers and commands are; this one reads as the stream does.
    ran = scratch / f"writers-{time.monotonic_ns()}.json"
    writing = start_writers(url, args, args.seconds, ran)
    batches = threading.Thread(target=read_batches, name="batches", daemon=True)
    batches.start()
    disk = DiskProbe(scratch, args.rate)
    disk.start()
    writing.wait()
    stop.set()
    disk.stop()
    batches.join()
    figures = writers_figures(url, ran, args)
    figures["reader_catch_up_ms"] = _spread(catch_up)
    figures["reader_versions_per_batch"] = _spread([float(v) for v in versions_taken])
    figures["disk_sync_ms"] = _spread([ms for _, ms in disk.syncs])
    figures["slow_doors"] = slow_doors(json.loads(ran.read_text()), disk.syncs)
    say(f"  {_writers_said(figures)}; a batch's catch-up {_said(figures['reader_catch_up_ms'])}")
    say(
        f"  the disk's own sync (8 kB and fdatasync, {args.rate}/s beside the doors): "
        f"{_said(figures['disk_sync_ms'])}; "
        f"doors over {SLOW_DOOR_MS} ms: {figures['slow_doors']['count']}, of which "
        f"{figures['slow_doors']['during_a_slow_sync']} while a sync of the disk took over {SLOW_SYNC_MS} ms"
    )
    return figures


SLOW_DOOR_MS = 100
SLOW_SYNC_MS = 50


class DiskProbe:
    """A commit's floor: 8 kB written and `fdatasync`ed `rate` times a second in `folder` (the disk PostgreSQL's WAL
    is on), each sync's (monotonic start, milliseconds) kept. A door's change commits with one such sync; when the
    disk's own sync stalls, so does every door waiting on the catalog's lock."""

    def __init__(self, folder: Path, rate: float) -> None:
        self.path = folder / f"disk-probe-{os.getpid()}.bin"
        self.interval = 1.0 / max(rate, 0.1)
        self.syncs: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="disk-probe", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.path.unlink(missing_ok=True)

    def _run(self) -> None:
        block, span = os.urandom(8192), 16 << 20
        descriptor = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.ftruncate(descriptor, span)
            os.fsync(descriptor)
            written = 0
            while not self._stop.wait(self.interval):
                os.pwrite(descriptor, block, written % span)
                written += len(block)
                began = time.monotonic()
                os.fdatasync(descriptor)
                self.syncs.append((began, round((time.monotonic() - began) * 1000, 2)))
        finally:
            os.close(descriptor)


def slow_doors(ran: dict[str, Any], syncs: list[tuple[float, float]]) -> dict[str, Any]:
    """The doors' changes slower than SLOW_DOOR_MS, and how many of them overlapped a sync of the disk slower than
    SLOW_SYNC_MS (the writers' and the probe's clocks are the same: the system's monotonic clock)."""
    started = ran.get("started_monotonic")
    slow = [c for c in ran["confirmed"] if c["latency_ms"] > SLOW_DOOR_MS]
    stalls = [(at, at + ms / 1000) for at, ms in syncs if ms > SLOW_SYNC_MS]
    during = 0
    if started is not None:
        for change in slow:
            end = started + change["at_s"]
            begin = end - change["latency_ms"] / 1000
            during += any(a < end and b > begin for a, b in stalls)
    return {"count": len(slow), "during_a_slow_sync": during if started is not None else None}


def start_writers(
    url: str, args: argparse.Namespace, seconds: float, out: Path, repriced: Iterable[str] = ()
) -> subprocess.Popen[str]:
    """`python -m ops.catalog_load` on `url` (`--writers` doors at `--rate` between them, for `seconds` or until
    SIGTERM), once its doors write: they read the catalog and make their ads first."""
    command = [sys.executable, "-m", "ops.catalog_load", url, "--rate", str(args.rate), "--writers", str(args.writers)]
    command += ["--seconds", str(seconds), "--out", str(out)]
    if repriced:
        command += ["--repriced", ",".join(repriced)]
    writing = subprocess.Popen(command, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, text=True)
    assert writing.stdout is not None
    if writing.stdout.readline().strip() != "writing":
        raise RuntimeError(f"the catalog's writers ended before they wrote, with code {writing.wait()}")
    return writing


def writers_figures(url: str, ran: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The writers' run (`ran`, written by `ops.catalog_load`), every confirmed change checked in the database."""
    document = json.loads(ran.read_text())
    run = WriterRun(confirmed=[Confirmed(**c) for c in document["confirmed"]], refused=document["refused"], started=0.0)
    run.ended = document["seconds"]
    lost, twice = check_confirmed(url, run.confirmed)
    return {
        "writers": args.writers,
        "rate_asked": args.rate,
        "seconds": round(run.seconds, 1),
        "confirmed": len(run.confirmed),
        "rate_made": round(len(run.confirmed) / run.seconds, 2),
        "refused": run.refused,
        "lost": len(lost),
        "twice": len(twice),
        "door_ms": _spread([c.latency_ms for c in run.confirmed]),
        "slowest": [
            {"at_s": c.at_s, "ms": c.latency_ms, "version": c.version}
            for c in sorted(run.confirmed, key=lambda c: -c.latency_ms)[:30]
        ],
    }


def _writers_said(w: dict[str, Any]) -> str:
    return (
        f"{w['writers']} doors at {w['rate_asked']}/s for {w['seconds']} s: {w['confirmed']} confirmed "
        f"({w['rate_made']}/s), {sum(w['refused'].values())} refused, {w['lost']} lost, {w['twice']} twice; "
        f"door {_said(w['door_ms'])}"
    )


# --- The web UI -------------------------------------------------------------------------------------------------------


class WebClient:
    """One keep-alive HTTP/1.1 connection to the web UI with a cookie jar (`http.client`, one request at a time):
    `ops.bench.web.Connection` sends no header of the caller's, and an API request needs its token's."""

    def __init__(self, port: int, cookies: dict[str, str] | None = None) -> None:
        self.connection = HTTPConnection("127.0.0.1", port, timeout=120)
        self.cookies = dict(cookies or {})

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes, float]:
        """(status, headers, body, milliseconds from the request's first byte sent to its last byte read)."""
        sent = dict(headers or {})
        if self.cookies:
            sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        # A GET on a connection the server closed after its keep-alive is sent again on a new one; a POST is not,
        # since the server may have made its change.
        for attempt in (1, 2) if method == "GET" else (2,):
            began = time.perf_counter()
            try:
                self.connection.request(method, path, body=body, headers=sent)
                response = self.connection.getresponse()
                payload = response.read()
                break
            except (HTTPException, ConnectionError):
                self.connection.close()
                if attempt == 2:
                    raise
        elapsed_ms = (time.perf_counter() - began) * 1000
        for name, value in response.getheaders():
            if name.lower() == "set-cookie":
                cookie, _, rest = value.partition("=")
                if "max-age=0" in value.lower():
                    self.cookies.pop(cookie, None)
                else:
                    self.cookies[cookie] = rest.split(";", 1)[0]
        return response.status, {k.lower(): v for k, v in response.getheaders()}, payload, elapsed_ms

    def get(self, path: str) -> float:
        """Milliseconds of a GET that must answer 200."""
        status, _, body, elapsed_ms = self.request("GET", path)
        if status != 200:
            raise RuntimeError(f"GET {path}: HTTP {status} {body[:300]!r}")
        return elapsed_ms

    def close(self) -> None:
        self.connection.close()


_LOGIN_CSRF = re.compile(rb'id="login-form".*?name="csrf_token" value="([^"]+)"', re.S)
_SET_PRICE_CSRF = re.compile(rb'id="set-price".*?name="csrf_token" value="([^"]+)"', re.S)


def log_in(client: WebClient, username: str) -> None:
    """Through the login form, as `ops.bench.web.log_in` does."""
    status, _, page, _ = client.request("GET", "/login")
    match = _LOGIN_CSRF.search(page)
    if status != 200 or not match:
        raise RuntimeError(f"login form: HTTP {status}")
    form = {"username": username, "password": PASSWORD, "csrf_token": match.group(1).decode()}
    status, _, _, _ = client.request("POST", "/login", urlencode(form).encode(), FORM)
    if status != 302 or "adbill_session" not in client.cookies:
        raise RuntimeError(f"login of {username}: HTTP {status}")


def measure_web(
    url: str, catalog: Catalog, args: argparse.Namespace, redis_url: str, folders: Folders, say: Say
) -> dict[str, Any]:
    """The web UI on the size's catalog (module doc, `web`)."""
    import redis

    from web.ad_catalog import ADS_PAGE
    from web.app import CACHE_S
    from web.sample_data import SampleWriter, seed_sample

    ads = len(catalog)
    (port,) = free_ports(1)
    settings = Settings.from_env(
        {},
        home=folders.scratch / f"web-{ads}",
        redis_url=redis_url,
        database_url=url,
        web_port=port,
        web_workers=args.web_workers,
        web_threads=args.web_threads,
        metrics_port=0,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADBILL_")}
    env.update(settings.to_env(), ADBILL_NO_PROGRESS="1")
    advertiser = catalog.advertiser_ids[len(catalog.advertiser_ids) // 2]
    adbill(env, "users", "add", ADMIN, "--role", "admin", "--password-stdin", stdin=PASSWORD)
    role = ("--role", "advertiser", "--advertiser", advertiser)
    adbill(env, "users", "add", ADVERTISER, *role, "--password-stdin", stdin=PASSWORD)
    token = adbill(env, "tokens", "create", ADMIN).stdout.strip()
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    first_period = (int(time.time() * 1000) // 3_600_000 - WEB_PERIODS) * 3_600_000
    owned = Catalog(ad for campaign in catalog.campaigns_of(advertiser) for ad in catalog.ads_of_campaign(campaign))
    seed_sample(SampleWriter(client, settings.redis_prefix, settings.layout.exports), owned, first_period, WEB_PERIODS)
    client.close()

    log = folders.out / f"web-{ads}.log"
    server = start_web(env, log)
    figures: dict[str, Any] = {"workers": args.web_workers, "threads": args.web_threads, "advertiser": advertiser}
    try:
        wait_port(port, server, "adbill web", log, timeout_s=60)
        admin = WebClient(port)
        log_in(admin, ADMIN)
        figures["first_request_of_a_worker_ms"] = round(admin.get("/catalog"), 1)
        figures["warm_up_ms"] = _spread(_warm_workers(port, admin.cookies, args.web_workers))
        say(
            f"  web ({args.web_workers} workers x {args.web_threads} threads): a new worker's first request "
            f"{figures['first_request_of_a_worker_ms']:.0f} ms; {figures['warm_up_ms']['n']} requests on new "
            f"connections, two per worker at once (the others' first among them), the slowest "
            f"{figures['warm_up_ms']['max']:.0f} ms"
        )
        owner = WebClient(port)
        log_in(owner, ADVERTISER)
        middle = len(catalog) // 2 // ADS_PAGE * ADS_PAGE
        # The dashboard asked again once the worker no longer keeps it (`web.cache`): each request computes it.
        pages = {
            "catalog, first page": (admin, "/catalog", 0.0),
            "catalog, middle page": (admin, f"/catalog?offset={middle}", 0.0),
            "advertiser's dashboard": (owner, f"/advertisers/{advertiser}", CACHE_S + 0.05),
            "advertiser's ads": (owner, f"/advertisers/{advertiser}/ads", 0.0),
        }
        figures["pages_ms"] = {}
        for name, (who, path, pause_s) in pages.items():
            timed = []
            for n in range(args.web_warmup + args.web_requests):
                time.sleep(pause_s)
                elapsed_ms = who.get(path)
                if n >= args.web_warmup:
                    timed.append(elapsed_ms)
            figures["pages_ms"][name] = _spread(timed)
            say(f"  {name} ({path}), {args.web_requests} requests: {_said(figures['pages_ms'][name], 0.95)}")
        figures["api_change_ms"] = _spread(_api_changes(WebClient(port), token, catalog.ad_ids, args.changes))
        say(f"  the API, {args.changes} bid changes: {_said(figures['api_change_ms'])}")
        page, post, after = _page_changes(admin, catalog.ad_ids, args.changes)
        figures["page_change_ms"] = _spread(post)
        figures["ad_page_ms"] = _spread(page)
        figures["page_after_change_ms"] = _spread(after)
        say(
            f"  the ad's page, {args.changes} bid changes: the form posted {_said(figures['page_change_ms'])}; "
            f"the page before {_said(figures['ad_page_ms'])}, the page after {_said(figures['page_after_change_ms'])}"
        )
        processes = read_processes()
        tree = [processes[pid] for pid in descendants(processes, server.pid)]
        figures["server_rss_mb"] = {f"{p.command} {p.pid}": round(p.rss_bytes / 1e6) for p in tree}
    finally:
        stop_server(server)
    return figures


def _warm_workers(port: int, cookies: dict[str, str], workers: int) -> list[float]:
    """Milliseconds of catalog pages asked on new connections, two per worker at once, `WARM_ROUNDS` times: a
    worker busy with its first request (reading the catalog) leaves the next connections to the others."""

    def one(_: int) -> float:
        client = WebClient(port, cookies)
        try:
            return client.get("/catalog?limit=1")
        finally:
            client.close()

    with ThreadPoolExecutor(2 * workers) as pool:
        return [ms for _ in range(WARM_ROUNDS) for ms in pool.map(one, range(2 * workers))]


def _api_changes(client: WebClient, token: str, ad_ids: list[str], count: int) -> list[float]:
    """Milliseconds of `count` bid changes through the API with the token alone (no session)."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    out = []
    for i in range(count):
        ad_id = ad_ids[(i * 7_919 + 1) % len(ad_ids)]
        body = json.dumps({"cpc_micros": str(400_000 + i)}).encode()
        status, _, answer, elapsed_ms = client.request("POST", f"/api/v1/catalog/ads/{ad_id}/prices", body, headers)
        if status != 201:
            raise RuntimeError(f"the API refused a bid change of {ad_id}: HTTP {status} {answer[:300]!r}")
        out.append(elapsed_ms)
    return out


def _page_changes(client: WebClient, ad_ids: list[str], count: int) -> tuple[list[float], list[float], list[float]]:
    """Milliseconds of `count` bid changes through the ad's page, as a person makes them: the ad's page (its form and
    CSRF token), the form posted, the page it redirects to."""
    page_ms, post_ms, after_ms = [], [], []
    for i in range(count):
        ad_id = ad_ids[(i * 7_919 + 2) % len(ad_ids)]
        status, _, page, elapsed_ms = client.request("GET", f"/catalog/ads/{ad_id}")
        match = _SET_PRICE_CSRF.search(page)
        if status != 200 or not match:
            raise RuntimeError(f"the page of {ad_id} has no price form: HTTP {status}")
        page_ms.append(elapsed_ms)
        form = {"csrf_token": match.group(1).decode(), "action": "set-price", "price": f"0.{40 + i % 50}"}
        path = f"/catalog/ads/{ad_id}/changes"
        status, headers, answer, elapsed_ms = client.request("POST", path, urlencode(form).encode(), FORM)
        if status != 303:
            raise RuntimeError(f"the page refused a bid change of {ad_id}: HTTP {status} {answer[:300]!r}")
        post_ms.append(elapsed_ms)
        location = urlsplit(headers["location"])
        after_ms.append(client.get(f"{location.path}?{location.query}" if location.query else location.path))
    return page_ms, post_ms, after_ms


# --- The stream -------------------------------------------------------------------------------------------------------


def measure_stream(sizes: list[int], args: argparse.Namespace, folders: Folders, say: Say) -> dict[str, Any]:
    """The baseline run, then one run per size while the writers write (module doc, `stream`): the baseline's
    figures, and each size's by size."""
    plan = plan_traffic(
        (PROJECT_ROOT / "var" / "bench" / "traffic-cache").resolve(),
        [args.stream_rate],
        args.stream_seconds,
        0,
        seed=STREAM_SEED,
    )
    plan_catalog = load_catalog(plan.catalog_file)
    folder = folders.out / "stream"
    options = LoadOptions(drain_timeout_s=max(300.0, args.stream_seconds * 5), profile=False)
    figures: dict[str, Any] = {"rate": args.stream_rate, "seconds": args.stream_seconds, "traffic": str(plan.folder)}
    services, stack, sampler = start_services(folder)
    try:
        say(
            f"stream: {args.stream_rate:,} events/s for {args.stream_seconds} s; first the traffic's catalog alone "
            f"({len(plan_catalog)} ads), no changes"
        )
        if args.stream_warmup_seconds:
            # The services are new: the broker's JVM compiles as the first job's traffic goes through it, and the
            # machine's caches fill, which a first measured run would pay alone (a baseline 2 x its later self).
            warmup = plan_traffic(
                (PROJECT_ROOT / "var" / "bench" / "traffic-cache").resolve(),
                [args.stream_rate],
                args.stream_warmup_seconds,
                0,
                seed=STREAM_SEED,
            )
            # The systems share one catalog (the first plan's, `prepare_system`): the warm-up's must be the same.
            if load_catalog(warmup.catalog_file) != plan_catalog:
                raise RuntimeError(f"the warm-up's traffic {warmup.folder} has another catalog than {plan.folder}")
            system = prepare_system(f"{PIPELINE}-warmup", services, folder, warmup)
            figures["warmup"] = stream_figures(run_system(system, warmup, sampler, options))
            say(f"  warm-up ({args.stream_warmup_seconds} s, not compared): {_stream_said(figures['warmup'])}")
        figures["rounds"] = []
        for number in range(1, args.stream_rounds + 1):
            label = "" if args.stream_rounds == 1 else f"-round{number}"
            said = "" if args.stream_rounds == 1 else f"round {number}: "
            figures["rounds"].append(
                _stream_round(plan, services, folder, sampler, options, sizes, args, label, say, said)
            )
        figures["baseline"] = figures["rounds"][-1]["baseline"]
        figures["sizes"] = _across_rounds(figures["rounds"])
        if args.stream_rounds > 1:
            for ads, size in figures["sizes"].items():
                if not size.get("error"):
                    say(
                        f"  {ads:,} ads over {args.stream_rounds} rounds, the median: mean batch "
                        f"x{size['median_batch_vs_baseline']} its round's baseline's "
                        f"({', '.join(f'x{r}' for r in size['rounds_batch_vs_baseline'])}), a batch's fixed cost "
                        f"x{size['median_fixed_cost_vs_baseline']}, the job's CPU per event "
                        f"x{size['median_cpu_per_event_vs_baseline']}"
                    )
    finally:
        sampler.stop()
        stack.stop()
    return figures


ROUND_RATIOS = ("batch_vs_baseline", "steady_batch_vs_baseline", "fixed_cost_vs_baseline", "cpu_per_event_vs_baseline")
"""The ratios of a size's run to its round's baseline, whose medians over the rounds the report gives."""


def _stream_round(
    plan: TrafficPlan,
    services: Settings,
    folder: Path,
    sampler: Sampler,
    options: LoadOptions,
    sizes: list[int],
    args: argparse.Namespace,
    label: str,
    say: Say,
    said: str,
) -> dict[str, Any]:
    """One round: the baseline (the traffic's catalog alone, no changes), then each size while the writers write,
    each size compared with the baseline just before it (the machine's hour moves both alike)."""
    plan_catalog = load_catalog(plan.catalog_file)
    system = prepare_system(f"{PIPELINE}-{len(plan_catalog)}ads{label}", services, folder, plan)
    baseline = {"ads": len(plan_catalog), **stream_figures(run_system(system, plan, sampler, options))}
    say(f"  {said}{len(plan_catalog)} ads: {_stream_said(baseline)}")
    figures: dict[str, Any] = {"baseline": baseline, "sizes": {}}
    for ads in sizes:
        system = prepare_system(f"{PIPELINE}-{ads}ads{label}", services, folder, plan, own_catalog=True)
        try:
            size = _stream_size(system, ads, plan, sampler, options, args)
        except Exception as exc:  # the report still shows what was measured, and why the run ended there
            figures["sizes"][ads] = {"error": str(exc)}
            say(f"  {said}{ads:,} ads: {exc}")
            continue
        size["batch_vs_baseline"] = analysis.ratio(size["batch_ms_mean"], baseline["batch_ms_mean"])
        size["steady_batch_vs_baseline"] = analysis.ratio(
            size["batch_ms_mean_steady"], baseline["batch_ms_mean_steady"]
        )
        size["fixed_cost_vs_baseline"] = analysis.ratio(
            size["batch_cost"]["fixed_ms"], baseline["batch_cost"]["fixed_ms"]
        )
        size["cpu_per_event_vs_baseline"] = analysis.ratio(size["cpu_us_per_event"], baseline["cpu_us_per_event"])
        peak, baseline_peak = size["driver_python_mb"]["peak"], baseline["driver_python_mb"]["peak"]
        size["catalog_share_of_driver_mb"] = None if None in (peak, baseline_peak) else peak - baseline_peak
        figures["sizes"][ads] = size
        say(
            f"  {said}{ads:,} ads: {_stream_said(size)}; mean batch x{size['batch_vs_baseline']} the baseline's "
            f"(x{size['steady_batch_vs_baseline']} after the first third), a batch's fixed cost "
            f"x{size['fixed_cost_vs_baseline']}, the job's CPU per event "
            f"x{size['cpu_per_event_vs_baseline']}, the catalog's share of the driver "
            f"{size['catalog_share_of_driver_mb']} MB"
        )
        say(f"    {_writers_said(size['writers'])}")
    return figures


def _across_rounds(rounds: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Each size's figures of the last round, with every round's ratios (`rounds_RATIO`) and their medians
    (`median_RATIO`): one run's ratio moves with the machine's hour, their median much less."""
    sizes: dict[int, dict[str, Any]] = {}
    for ads, last in rounds[-1]["sizes"].items():
        size = dict(last)
        if not size.get("error"):
            for name in ROUND_RATIOS:
                found = [r["sizes"][ads][name] for r in rounds if r["sizes"].get(ads, {}).get(name) is not None]
                size[f"rounds_{name}"] = found
                size[f"median_{name}"] = round(statistics.median(found), 3) if found else None
        sizes[ads] = size
    return sizes


def _stream_size(
    system: System, ads: int, plan: TrafficPlan, sampler: Sampler, options: LoadOptions, args: argparse.Namespace
) -> dict[str, Any]:
    """The N-ad catalog in the system's database, then its run while the writers write (module doc, `stream`)."""
    url = system.settings.database_url
    plan_catalog = load_catalog(plan.catalog_file)
    began = time.monotonic()
    CatalogDatabase(url).load(traffic_catalog(plan_catalog, ads), [])
    loaded_s = round(time.monotonic() - began, 1)
    ran = system.settings.root / "writers.json"
    # From before the job starts until the run ends (SIGTERM); the hour is a bound, should this process die.
    writing = start_writers(url, args, 3 * args.stream_seconds + 3_600, ran, repriced=plan_catalog.ad_ids)
    try:
        result = run_system(system, plan, sampler, options)
    finally:
        writing.send_signal(signal.SIGTERM)
        writing.wait(timeout=120)
    return {**stream_figures(result), "catalog_loaded_s": loaded_s, "writers": writers_figures(url, ran, args)}


def stream_figures(result: dict[str, Any]) -> dict[str, Any]:
    """What a run of the job (`run_system`'s result, one step) says of the catalog's cost."""
    steps = result.get("steps") or []
    step: dict[str, Any] = steps[0] if steps else {}
    by_process = result.get("memory_by_process") or {}
    python, java = by_process.get("python") or [], by_process.get("java") or []
    started = result.get("startup_s")
    until_first = [mb for t, mb in python if started is not None and t <= started]
    check = step.get("ledger_check") or {}
    steady = []
    if step:  # the step's batches after the first third of its sending, as its sustained rate (`analysis`)
        first_ms, last_ms = step["sender"]["first_send"] * 1000, step["sender"]["last_send"] * 1000
        steady_from = first_ms + analysis.WARMUP_FRACTION * (last_ms - first_ms)
        steady = [b["duration_ms"] for b in result["batches"] if b["input_rows"] > 0 and b["start_ms"] >= steady_from]
    return {
        "system": result["system"],
        "error": result.get("error"),
        "start_to_first_batch_s": started,
        "batch_ms_mean": step.get("batch_duration_ms_mean"),
        "batch_ms_mean_steady": round(statistics.fmean(steady)) if steady else None,
        "batch_rows_mean": step.get("batch_rows_mean"),
        "batches": step.get("batches"),
        "phase_ms_mean": step.get("phase_ms_mean"),
        "offered_rate_achieved": step.get("offered_rate_achieved"),
        "sustained_rate": step.get("sustained_rate"),
        "kept_up": analysis.keeps_up(step) if step else False,
        "latency_ms": step.get("latency_ms"),
        "ledger_equal": check.get("equal"),
        "ledger_check": check,
        "driver_python_mb": {
            "at_first_batch": until_first[-1] if until_first else None,
            "peak": max((mb for _, mb in python), default=None),
        },
        "jvm_mb_peak": max((mb for _, mb in java), default=None),
        "job_peak_rss_mb": step.get("job_peak_rss_mb"),
        "job_cpu_cores": step.get("job_cpu_cores"),
        "machine_cpu_cores": step.get("machine_cpu_cores"),
        "cpu_us_per_event": _cpu_per_event(step),
        "batch_cost": analysis.batch_cost(
            [{**b, "batch_duration_ms": b["duration_ms"]} for b in result.get("batches") or [] if b["input_rows"]]
        ),
        "run": {k: result.get(k) for k in ("batches", "memory_by_process")},
    }


def _cpu_per_event(step: dict[str, Any]) -> float | None:
    """The job's CPU time per event read (µs): its cost, whatever the size its batches grew to (a job that falls
    behind reads larger batches, each slower, at the same cost per event)."""
    cores, rate = step.get("job_cpu_cores"), step.get("sustained_rate")
    return round(cores * 1e6 / rate, 1) if cores and rate else None


def _stream_said(s: dict[str, Any]) -> str:
    if s["batch_ms_mean"] is None:
        return f"no step measured: {s['error']}"
    memory, cost = s["driver_python_mb"], s["batch_cost"]
    check = s["ledger_check"]
    ledger = "equals the ground truth" if s["ledger_equal"] else f"DIFFERS from the ground truth ({check})"
    return (
        f"start to first batch {s['start_to_first_batch_s']} s, mean batch {s['batch_ms_mean']} ms "
        f"({s['batch_rows_mean']:,} rows; {s['batch_ms_mean_steady']} ms after the first third), sustained "
        f"{s['sustained_rate']:,}/s, latency p99 {s['latency_ms']['p99']} ms; driver (Python) "
        f"{memory['at_first_batch']} MB at its first batch, "
        f"{memory['peak']} MB at its peak, JVM {s['jvm_mb_peak']} MB; the job used {s['job_cpu_cores']} cores of the "
        f"{s['machine_cpu_cores']} the machine was busy with ({s['cpu_us_per_event']} µs of CPU per event); a "
        f"batch's cost (least squares) {cost['fixed_ms']} ms + {cost['per_event_us']} µs per event; ledger {ledger}"
    )


# --- The summary ------------------------------------------------------------------------------------------------------


def summary(report: dict[str, Any]) -> list[str]:
    """The report's figures per size as Markdown tables: the doors and pages, then the stream (the phases that ran)."""
    lines = []
    rows = []
    for size in report["sizes"]:
        start, web, writers = size.get("start"), size.get("web") or {}, size.get("writers")
        pages = web.get("pages_ms") or {}
        rows.append(
            [
                f"{size['ads']:,}",
                _cell(size.get("load_s"), "{} s"),
                f"{start['seconds']:.1f} s, +{start['rss_added_mb']:.0f} MB" if start else "-",
                _p(size.get("door_ms")),
                _p(web.get("api_change_ms")),
                _p(web.get("page_change_ms")),
                f"{size['command_s']['median']} s ({size['command_s']['process_start_median']} s)"
                if "command_s" in size
                else "-",
                f"{writers['confirmed']}, {writers['lost']}, {writers['twice']}; {_p(writers['door_ms'])}"
                + (f"; the disk's sync {_p(writers['disk_sync_ms'])}" if writers and "disk_sync_ms" in writers else "")
                if writers
                else "-",
                _p(pages.get("catalog, first page"), 0.95),
                _p(pages.get("catalog, middle page"), 0.95),
                _p(pages.get("advertiser's dashboard"), 0.95),
                _cell(web.get("first_request_of_a_worker_ms"), "{:.0f} ms"),
            ]
        )
    if any(any(cell != "-" for cell in row[1:]) for row in rows):
        lines += _table(
            [
                "ads",
                "load",
                "a new process reads it",
                "store door p50 / p99",
                "API p50 / p99",
                "page p50 / p99",
                "command (process start)",
                "writers: confirmed, lost, twice; door p50 / p99; the disk's sync p50 / p99",
                "catalog's first page p50 / p95",
                "a middle page p50 / p95",
                "dashboard p50 / p95",
                "a new worker's first request",
            ],
            rows,
        )
    stream = report.get("stream")
    if stream:
        baseline = stream["baseline"]
        rows = [_stream_row(f"{baseline['ads']} (baseline)", baseline)]
        rows += [_stream_row(f"{size['ads']:,}", size["stream"]) for size in report["sizes"] if "stream" in size]
        lines += ["", f"the stream at {stream['rate']:,} events/s for {stream['seconds']} s:"]
        lines += _table(
            [
                "ads",
                "mean batch (x baseline)",
                "after the first third",
                "start to first batch",
                "driver (Python) at first batch / peak; the catalog's share",
                "JVM peak",
                "CPU cores: the job / the machine",
                "a batch's cost: fixed (x baseline) + per event",
                "the job's CPU per event (x baseline)",
                "sustained",
                "latency p99",
                "ledger = ground truth",
                "writers: confirmed, lost, twice; door p50 / p99",
            ],
            rows,
        )
        rounds = [s for s in report["sizes"] if len(s.get("stream", {}).get("rounds_batch_vs_baseline", ())) > 1]
        for size in rounds:
            s = size["stream"]
            fixed = ", ".join(f"x{r}" for r in s["rounds_fixed_cost_vs_baseline"])
            lines.append(
                f"{size['ads']:,} ads over {len(s['rounds_batch_vs_baseline'])} rounds, each against its round's "
                f"baseline (the table: the last round): mean batch x{s['median_batch_vs_baseline']} "
                f"({', '.join(f'x{r}' for r in s['rounds_batch_vs_baseline'])}), fixed cost "
                f"x{s['median_fixed_cost_vs_baseline']} ({fixed}), "
                f"CPU per event x{s['median_cpu_per_event_vs_baseline']}"
            )
    return lines


def _stream_row(label: str, s: dict[str, Any]) -> list[str]:
    memory, writers = s["driver_python_mb"], s.get("writers")
    share = s.get("catalog_share_of_driver_mb")
    return [
        label,
        _cell(s["batch_ms_mean"], "{} ms") + (f" (x{s['batch_vs_baseline']})" if s.get("batch_vs_baseline") else ""),
        _cell(s["batch_ms_mean_steady"], "{} ms")
        + (f" (x{s['steady_batch_vs_baseline']})" if s.get("steady_batch_vs_baseline") else ""),
        _cell(s["start_to_first_batch_s"], "{} s"),
        f"{_cell(memory['at_first_batch'], '{}')} / {_cell(memory['peak'], '{} MB')}"
        + (f"; {share} MB" if share is not None else ""),
        _cell(s["jvm_mb_peak"], "{} MB"),
        f"{_cell(s['job_cpu_cores'], '{}')} / {_cell(s['machine_cpu_cores'], '{}')}",
        _cell((s.get("batch_cost") or {}).get("fixed_ms"), "{} ms")
        + (f" (x{s['fixed_cost_vs_baseline']})" if s.get("fixed_cost_vs_baseline") else "")
        + _cell((s.get("batch_cost") or {}).get("per_event_us"), " + {} µs"),
        _cell(s.get("cpu_us_per_event"), "{} µs")
        + (f" (x{s['cpu_per_event_vs_baseline']})" if s.get("cpu_per_event_vs_baseline") else ""),
        _cell(s["sustained_rate"], "{:,}/s"),
        _cell((s["latency_ms"] or {}).get("p99"), "{:,} ms"),
        {True: "yes", False: "NO", None: "-"}[s["ledger_equal"]],
        f"{writers['confirmed']}, {writers['lost']}, {writers['twice']}; {_p(writers['door_ms'])}" if writers else "-",
    ]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + " --- |" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def _cell(value: Any, form: str) -> str:
    return "-" if value is None else form.format(value)


def _p(spread: dict[str, float] | None, high: float = 0.99) -> str:
    """`p50 / p99 ms` (or p95) of a spread, `-` when not measured."""
    if not spread or not spread.get("n"):
        return "-"
    return f"{spread['p50']:.1f} / {spread[f'p{round(high * 100)}']:.1f} ms"


def _spread(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50": round(percentile(values, 0.50), 2),
        "p95": round(percentile(values, 0.95), 2),
        "p99": round(percentile(values, 0.99), 2),
        "max": round(max(values), 2),
    }


def _said(spread: dict[str, float], high: float = 0.99) -> str:
    name = f"p{round(high * 100)}"
    return f"p50 {spread.get('p50')} ms, {name} {spread.get(name)} ms, max {spread.get('max')} ms"


def adbill(env: dict[str, str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """`adbill ARGS` in a process of its own, `stdin` its input; RuntimeError with its error when it fails."""
    done = subprocess.run(
        [sys.executable, "-m", "ops.cli", *args], env=env, cwd=PROJECT_ROOT, input=stdin, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"adbill {' '.join(args)} exited with {done.returncode}: {done.stderr[-2000:]}")
    return done


class Folders:
    """Where a run writes: `out`, its report and logs (kept); `scratch`, what it throws away at the end."""

    def __init__(self, out: Path, scratch: Path) -> None:
        self.out, self.scratch = out, scratch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.bench.network", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--sizes", default=",".join(str(s) for s in SIZES), help="catalog sizes in ads, comma-separated"
    )
    parser.add_argument("--phases", default=",".join(PHASES), help=f"which to run, comma-separated: {PHASES}")
    parser.add_argument("--changes", type=int, default=200, help="changes through each door, one after another")
    parser.add_argument("--commands", type=int, default=5, help="runs of `adbill catalog set-price`")
    parser.add_argument("--writers", type=int, default=4, help="concurrent doors")
    parser.add_argument("--rate", type=float, default=10.0, help="changes a second between the doors")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the doors write (600: ten minutes)")
    parser.add_argument("--web-requests", type=int, default=50, help="requests timed per page")
    parser.add_argument("--web-warmup", type=int, default=5, help="requests per page before those timed")
    parser.add_argument("--web-workers", type=int, default=Settings().web_workers, help="gunicorn worker processes")
    parser.add_argument("--web-threads", type=int, default=Settings().web_threads, help="threads per worker")
    parser.add_argument("--stream-rate", type=int, default=10_000, help="events a second sent to the streaming job")
    parser.add_argument("--stream-seconds", type=int, default=120, help="how long the traffic is (600: ten minutes)")
    parser.add_argument(
        "--stream-warmup-seconds",
        type=int,
        default=30,
        help="traffic sent through a job not compared, before the baseline, to warm the new services (0: none)",
    )
    parser.add_argument(
        "--stream-rounds",
        type=int,
        default=1,
        help="rounds of the baseline then each size, each size compared with its round's baseline; the medians",
    )
    args = parser.parse_args(argv)
    phases = {p.strip() for p in args.phases.split(",") if p.strip()}
    if not phases or phases - set(PHASES):
        parser.error(f"--phases: one or more of {', '.join(PHASES)}")
    sizes = [int(s) for s in args.sizes.split(",")]
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = PROJECT_ROOT / "var" / "bench" / f"network-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    home = Path(tempfile.mkdtemp(prefix="adbill-bench-network-"))
    home.chmod(0o755)  # run as root, PostgreSQL runs as its own user, who must reach its folder
    folders = Folders(out, home)
    by_size: dict[int, dict[str, Any]] = {ads: {"ads": ads} for ads in sizes}
    report: dict[str, Any] = {
        "command": "python -m ops.bench.network " + " ".join(sys.argv[1:] if argv is None else argv),
        "phases": [p for p in PHASES if p in phases],
        "cores": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "sizes": list(by_size.values()),
    }

    def save() -> None:
        report["load_average_now"] = [round(x, 2) for x in os.getloadavg()]
        (out / "report.json").write_text(json.dumps(report, indent=1))

    try:
        if phases - {"stream"}:
            postgres_port, redis_port = free_ports(2)
            server = LocalPostgres(home / "cluster", postgres_port, home / "run", log_dir=out)
            redis_server = LocalRedis(home / "redis", redis_port, home / "run", appendonly=False)
            try:
                server.start()
                if "web" in phases:
                    redis_server.start()
                for ads in sizes:
                    url = database_beside(server.url, f"network_{ads}")
                    by_size[ads].update(measure_size(url, ads, args, phases, redis_server.url, folders, say))
                    save()
            finally:
                if "web" in phases:
                    redis_server.stop()
                server.stop()
        if "stream" in phases:
            report["stream"] = measure_stream(sizes, args, folders, say)
            for ads, figures in report["stream"].pop("sizes").items():
                by_size[ads]["stream"] = figures
            save()
    finally:
        shutil.rmtree(home, ignore_errors=True)
    say("")
    for line in summary(report):
        say(line)
    save()
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    print(f"report: {out / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
