"""`make bench-network`: the ad catalog of an ad network in PostgreSQL, at 10,000, 100,000 and 1,000,000 ads (N/40
advertisers, 10 campaigns each, 4 ads per campaign: `adbill catalog generate`'s shape).

A PostgreSQL of its own (Debian's server, `ops.postgres_service`) on a free loopback port, one database per size.
For each size:
1. `load`: the generated catalog loaded into the empty database (`CatalogDatabase.load`, what `adbill catalog import`
   does), and the round trip: exported (`catalog_document`) and read back equal.
2. `start`: a new process reads the whole catalog (what the streaming job, a web worker or reconciliation pays once
   when it starts): seconds, and the memory it added to the process (resident set before and after).
3. `door`: `--changes` price changes made one after another through the store a door uses (the command's, the
   page's, the API's): latency p50, p99, max.
4. `command`: `adbill catalog set-price` run `--commands` times, wall time, and the process start alone
   (`adbill --help`), reported apart.
5. `writers`: `--writers` doors (threads, each its own connection) making `--rate` changes a second between them
   for `--seconds`, while a reader takes the changes every second as a batch of the stream does: the doors'
   latency p50/p99, every confirmed change checked in the database (none lost, none twice), and the reader's
   catch-up per batch p50/p99 with how many versions it took each time.

The report goes to `var/bench/network-<time>/report.json`; the summary is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from billing.catalog import generate_catalog
from billing.store.catalog_db import CatalogDatabase, catalog_document, read_catalog_document
from ops.catalog_load import Confirmed, WriterRun, bid, check_confirmed, percentile
from ops.postgres_service import LocalPostgres, database_beside
from ops.process import free_ports
from ops.settings import PROJECT_ROOT

SIZES = (10_000, 100_000, 1_000_000)

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


def measure_size(url: str, ads: int, args: argparse.Namespace, say: Any) -> dict[str, Any]:
    figures: dict[str, Any] = {"ads": ads}
    began = time.monotonic()
    catalog = generate_catalog(max(1, ads // 40), 10, 4, seed=1)
    figures["generate_s"] = round(time.monotonic() - began, 2)
    say(f"{ads:,} ads: generated in {figures['generate_s']} s")

    store = CatalogDatabase(url)
    began = time.monotonic()
    store.load(catalog, [])
    figures["load_s"] = round(time.monotonic() - began, 2)
    began = time.monotonic()
    document = catalog_document(store.current(), store.changes())
    back, _ = read_catalog_document(document)
    figures["export_round_trip_s"] = round(time.monotonic() - began, 2)
    figures["export_mb"] = round(len(document) / 1e6, 1)
    figures["export_round_trip_equal"] = back == catalog
    say(f"  loaded in {figures['load_s']} s; export {figures['export_mb']} MB read back equal: {back == catalog}")
    del document, back

    probe = subprocess.run(
        [sys.executable, "-c", _START_PROBE, url], capture_output=True, text=True, check=True, cwd=PROJECT_ROOT
    )
    figures["start"] = json.loads(probe.stdout)
    start = figures["start"]
    say(f"  a new process reads it whole in {start['seconds']:.2f} s, +{start['rss_added_mb']:.0f} MB")

    ad_ids = catalog.ad_ids
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
        subprocess.run(
            [sys.executable, "-m", "ops.cli", "catalog", "set-price", ad_ids[i], "--cpc-micros", str(300_000 + i)],
            env=env,
            cwd=PROJECT_ROOT,
            check=True,
            capture_output=True,
        )
        command_s.append(time.monotonic() - began)
        began = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "ops.cli", "--help"], env=env, cwd=PROJECT_ROOT, check=True, capture_output=True
        )
        start_s.append(time.monotonic() - began)
    figures["command_s"] = {
        "median": round(statistics.median(command_s), 3),
        "process_start_median": round(statistics.median(start_s), 3),
    }
    say(
        f"  `adbill catalog set-price`: {figures['command_s']['median']} s, of which the process start "
        f"{figures['command_s']['process_start_median']} s"
    )

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
    ran = Path(tempfile.mkdtemp(prefix="adbill-writers-")) / "run.json"
    writing = subprocess.Popen(
        [sys.executable, "-m", "ops.catalog_load", url, "--rate", str(args.rate), "--writers", str(args.writers)]
        + ["--seconds", str(args.seconds), "--out", str(ran)],
        cwd=PROJECT_ROOT,
    )
    batches = threading.Thread(target=read_batches, name="batches", daemon=True)
    batches.start()
    writing.wait()
    stop.set()
    batches.join()
    document = json.loads(ran.read_text())
    run = WriterRun(confirmed=[Confirmed(**c) for c in document["confirmed"]], refused=document["refused"], started=0.0)
    run.ended = document["seconds"]
    lost, twice = check_confirmed(url, run.confirmed)
    figures["writers"] = {
        "writers": args.writers,
        "rate_asked": args.rate,
        "seconds": round(run.seconds, 1),
        "confirmed": len(run.confirmed),
        "rate_made": round(len(run.confirmed) / run.seconds, 2),
        "refused": run.refused,
        "lost": len(lost),
        "twice": len(twice),
        "door_ms": _spread([c.latency_ms for c in run.confirmed]),
        "reader_catch_up_ms": _spread(catch_up),
        "reader_versions_per_batch": _spread([float(v) for v in versions_taken]),
    }
    w = figures["writers"]
    say(
        f"  {args.writers} doors at {args.rate}/s for {w['seconds']} s: {w['confirmed']} confirmed "
        f"({w['rate_made']}/s), {sum(run.refused.values())} refused, {w['lost']} lost, {w['twice']} twice; "
        f"door {_said(w['door_ms'])}; a batch's catch-up {_said(w['reader_catch_up_ms'])}"
    )
    return figures


def _spread(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50": round(percentile(values, 0.50), 2),
        "p99": round(percentile(values, 0.99), 2),
        "max": round(max(values), 2),
    }


def _said(spread: dict[str, float]) -> str:
    return f"p50 {spread.get('p50')} ms, p99 {spread.get('p99')} ms, max {spread.get('max')} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.bench.network", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--sizes", default=",".join(str(s) for s in SIZES), help="catalog sizes in ads, comma-separated"
    )
    parser.add_argument("--changes", type=int, default=200, help="changes through one door, one after another")
    parser.add_argument("--commands", type=int, default=5, help="runs of `adbill catalog set-price`")
    parser.add_argument("--writers", type=int, default=4, help="concurrent doors")
    parser.add_argument("--rate", type=float, default=10.0, help="changes a second between the doors")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the doors write (600: ten minutes)")
    args = parser.parse_args(argv)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = PROJECT_ROOT / "var" / "bench" / f"network-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    home = Path(tempfile.mkdtemp(prefix="adbill-bench-network-"))
    home.chmod(0o755)  # run as root, PostgreSQL runs as its own user, who must reach its folder
    (port,) = free_ports(1)
    server = LocalPostgres(home / "cluster", port, home / "run", log_dir=out)
    report: dict[str, Any] = {"command": "python -m ops.bench.network " + " ".join(sys.argv[1:]), "sizes": []}
    try:
        server.start()
        for ads in (int(s) for s in args.sizes.split(",")):
            url = database_beside(server.url, f"network_{ads}")
            report["sizes"].append(measure_size(url, ads, args, say))
            (out / "report.json").write_text(json.dumps(report, indent=1))
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    print(f"report: {out / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
