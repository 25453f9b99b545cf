"""`make bench-catalog`: how fast a catalog change reaches the running streaming job, and what a run whose prices
change every minute is billed, by the stream and in the end, against its ground truth.

Starts a one-node local stack (`adbill up --detach --no-traffic --no-web`: Kafka, Redis, the streaming job and
reconciliation) on free loopback ports in a fresh folder, with one-minute periods and a 30-second lateness horizon,
then:

1. `--changes` times: a new price for an ad, made now (`adbill catalog set-price`'s store), then an impression and
   click pair on that ad every 100 ms with the clock's time, until the ledger holds a bill at the new price; the
   time from the change to that bill's `billed_at_ms` is one sample. Prints each sample and the median.
2. `adbill produce --live --duration SECONDS --catalog-every 60 --new-ads 2`: live traffic that changes prices, pauses
   and resumes ads and creates ads every minute; once its periods are past the horizon, `adbill reconcile --until`
   closes them; prints the stream's bill (the ledger), the final bill (exports and adjustments, and the ledger plus
   corrections) and the ground truth (`billable.jsonl`), in clicks and micros.

The report goes to `var/bench/catalog-<time>/report.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from billing.catalog import AdChange, Catalog
from billing.corrections import Correction
from billing.events import Click, Impression
from billing.layout import DataLayout
from billing.store.corrections_arrow import CorrectionFiles
from billing.store.export_files import ExportFolders
from billing.store.parquet_ledger import read_ledger
from billing.store.schema_registry import open_registry
from ops.postgres_service import DATABASE, database_url
from ops.process import consecutive_free_port, free_ports
from ops.settings import PROJECT_ROOT, Settings
from producers.publisher import EventPublisher
from producers.wire import EventSerializer

PERIOD_MS = 60_000
HORIZON_MS = 30_000


def stack_env(home: Path) -> dict[str, str]:
    kafka, redis_port, web, postgres = free_ports(4)
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("ADBILL_")},
        "PYTHONPATH": os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")) if p),
        "ADBILL_HOME": str(home),
        "ADBILL_DEPS_DIR": os.environ.get("ADBILL_DEPS_DIR", str(PROJECT_ROOT / ".deps")),
        "ADBILL_KAFKA_BOOTSTRAP": f"127.0.0.1:{kafka}",
        "ADBILL_KAFKA_CONTROLLER_PORT": str(consecutive_free_port(1)),
        "ADBILL_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "ADBILL_DATABASE_URL": database_url(postgres, DATABASE),
        "ADBILL_WEB_PORT": str(web),
        "ADBILL_METRICS_PORT": "0",
        "ADBILL_PERIOD_MS": str(PERIOD_MS),
        "ADBILL_LATENESS_HORIZON_MS": str(HORIZON_MS),
        "ADBILL_RECONCILE_INTERVAL_S": "60",
        "ADBILL_NO_PROGRESS": "1",
    }


def adbill(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "ops.cli", *args], env=env, cwd=PROJECT_ROOT, capture_output=True, text=True
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"adbill {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    return done


def change_to_first_bill(settings: Settings, changes: int) -> list[float]:
    """Seconds from each price change to the first bill at the new price."""
    store = settings.catalog_store()
    publisher = EventPublisher(
        settings.kafka_bootstrap, EventSerializer(open_registry(settings.registry_location)), settings.topics
    )
    first = sorted(store.current().ad_ids)[0]
    warm = int(time.time() * 1000)
    publisher.publish_event(Impression("bench-warm-i", first, "bench-warm", warm - 1))
    publisher.publish_event(Click("bench-warm-c", first, "bench-warm", warm))
    publisher.flush(10)
    deadline = time.monotonic() + 300
    while not any(r["click_id"] == "bench-warm-c" for r in read_ledger(settings.layout.ledger).to_pylist()):
        if time.monotonic() > deadline:
            raise RuntimeError("the streaming job billed nothing within 300 s of its start")
        time.sleep(1)
    samples = []
    for n in range(changes):
        ad = sorted(store.current().ad_ids)[n % len(store.current())]
        price = 1_000_000 + 10_000 * n + 1

        def from_now(_held: Catalog | None, now: int, ad: str = ad, price: int = price) -> AdChange:
            return AdChange(ad, now, price)  # "now" as the store reads it, under the catalog's lock

        made = store.change(from_now)
        now_ms = next(p.effective_from for p in made[ad].prices if p.version == made.version)
        billed = None
        k = 0
        deadline = time.monotonic() + 120
        while billed is None and time.monotonic() < deadline:
            at = int(time.time() * 1000)
            user = f"bench-{n}-{k}"
            publisher.publish_event(Impression(f"bi-{n}-{k}", ad, user, at - 1))
            publisher.publish_event(Click(f"bc-{n}-{k}", ad, user, at))
            publisher.flush(5)
            k += 1
            time.sleep(0.1)
            ledger = read_ledger(settings.layout.ledger)
            at_price = [
                r["billed_at_ms"]
                for r in ledger.to_pylist()
                if r["ad_id"] == ad and r["amount_micros"] == price and r["click_id"].startswith(f"bc-{n}-")
            ]
            if at_price:
                billed = min(at_price)
        if billed is None:
            raise RuntimeError(f"no bill at the new price of {ad} within 120 s")
        samples.append((billed - now_ms) / 1000)
        print(f"change {n + 1}: ad {ad} at {price} micros, first bill at the new price after {samples[-1]:.2f} s")
    return samples


def bills_of_a_changing_run(env: dict[str, str], settings: Settings, duration_s: int, rate: int) -> dict[str, Any]:
    run_dir = settings.root / "runs" / "changing"
    adbill(env, "produce", "--live", "--duration", str(duration_s), "--rate", str(rate), "--seed", "5",
           "--catalog-every", "60", "--new-ads", "2", "--run-dir", str(run_dir), "--no-progress")  # fmt: skip
    ended = int(time.time() * 1000)
    until = (ended // PERIOD_MS + 1) * PERIOD_MS
    while time.time() * 1000 < until + HORIZON_MS + 5_000:
        time.sleep(1)
    for _ in range(20):  # the stream must have read everything; a scheduled run may hold the lock a moment
        done = adbill(env, "reconcile", "--until", str(until), check=False)
        if done.returncode == 0 and "held" not in done.stdout:
            break
        time.sleep(10)
    ledger = read_ledger(settings.layout.ledger).to_pylist()
    stream = [r for r in ledger if r["click_id"].startswith("s5-")]  # the run's clicks (seed 5's ids)
    truth = [json.loads(line) for line in (run_dir / "billable.jsonl").read_text().splitlines()]
    fixes = [c for c in CorrectionFiles(settings.layout).read() if c.click_id.startswith("s5-")]
    final_bill = books(settings, stream, fixes)
    truth_bill = {r["click_id"]: r["amount_micros"] for r in truth}
    reasons: dict[str, int] = {}
    for fix in fixes:
        reasons[fix.reason.value] = reasons.get(fix.reason.value, 0) + 1
    return {
        "duration_s": duration_s,
        "rate": rate,
        "catalog_version": settings.catalog_store().current().version,
        "stream": {"clicks": len(stream), "micros": sum(r["amount_micros"] for r in stream)},
        "final": {"clicks": len(final_bill), "micros": sum(final_bill.values())},
        "ground_truth": {"clicks": len(truth_bill), "micros": sum(truth_bill.values())},
        "final_equals_ground_truth": final_bill == truth_bill,
        "corrections": reasons,
    }


def books(settings: Settings, ledger: list[dict[str, Any]], fixes: list[Correction]) -> dict[str, int]:
    """What the books bill, click id -> micros (docs/billing-rules.md): a closed period's export plus the adjustments
    booked for it elsewhere, an open period's ledger plus its corrections."""
    exports = ExportFolders(settings.layout)
    closed = set(exports.exported())
    count: dict[str, int] = {}
    micros: dict[str, int] = {}

    def add(click_id: str, clicks: int, amount: int) -> None:
        count[click_id] = count.get(click_id, 0) + clicks
        micros[click_id] = micros.get(click_id, 0) + amount

    for period in closed:
        for row in exports.given(period):
            if row["click_id"].startswith("s5-"):
                add(row["click_id"], 1, row["amount_micros"])
    for row in ledger:
        if row["period"] not in closed:
            add(row["click_id"], 1, row["amount_micros"])
    for fix in fixes:
        if fix.corrects_period not in closed or fix.booked_period != fix.corrects_period:
            add(fix.click_id, fix.clicks, fix.amount_micros)
    return {click: micros[click] for click, n in count.items() if n == 1}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=10, help="price changes timed to their first bill")
    parser.add_argument("--duration", type=int, default=300, help="seconds of live traffic that changes prices")
    parser.add_argument("--rate", type=int, default=200, help="events per second of that traffic")
    parser.add_argument("--out", type=Path, default=Path("var/bench"))
    args = parser.parse_args(argv)
    folder = (args.out / f"catalog-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}").resolve()
    env = stack_env(folder / "home")
    settings = Settings.from_env(env)
    assert settings.root == DataLayout(folder / "home").root
    adbill(env, "up", "--detach", "--no-traffic", "--no-web")
    try:
        samples = change_to_first_bill(settings, args.changes)
        run = bills_of_a_changing_run(env, settings, args.duration, args.rate)
    finally:
        adbill(env, "down", check=False)
    report = {
        "change_to_first_bill_s": samples,
        "median_s": statistics.median(samples),
        "changing_run": run,
    }
    (folder / "report.json").write_text(json.dumps(report, indent=1))
    print(f"change to the first bill at the new price: median {report['median_s']:.2f} s of {len(samples)} changes "
          f"(min {min(samples):.2f}, max {max(samples):.2f})")  # fmt: skip
    print(
        f"run of {args.duration} s at {args.rate}/s, catalog changed every minute (version {run['catalog_version']}): "
        f"stream {run['stream']['clicks']:,} clicks / {run['stream']['micros']:,} micros; final "
        f"{run['final']['clicks']:,} / {run['final']['micros']:,}; ground truth {run['ground_truth']['clicks']:,} / "
        f"{run['ground_truth']['micros']:,}; final = ground truth: {run['final_equals_ground_truth']}; "
        f"corrections {run['corrections']}"
    )
    print(f"report: {folder / 'report.json'}")
    return 0 if run["final_equals_ground_truth"] else 1


if __name__ == "__main__":
    sys.exit(main())
