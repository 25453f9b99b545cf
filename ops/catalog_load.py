"""Concurrent writers of the ad catalog at a steady rate of bid changes, for the network benchmark (`make
bench-network`) and the `database` fault of `make chaos`: each writer is a door of its own (its own connection, as
the web workers and commands are), and every change a door confirmed is checked in the database afterwards.

The writers change the prices of ads of their own (advertiser `LOAD_ADVERTISER`, created first), from a day ahead,
so that a run with traffic is billed as it would be without them. Given `repriced` ads (a benchmark's traffic's, whose
event times are all in the past), they change those too, in turn with their own, from now: after every click of that
traffic, so a click priced with a price made after its event time shows in its bill.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from billing.catalog import AdChange, Catalog, CatalogError, MadeBy
from billing.store.catalog_db import CatalogDatabase

LOAD_ADVERTISER = "load-writers"
LOAD_CAMPAIGN = "load-writers-bids"
AHEAD_MS = 86_400_000
"""How far ahead of its making a writer's price takes effect: no click of a run is priced by it."""


@dataclass(frozen=True)
class Confirmed:
    """A change a door confirmed: the ad, the price, from when, and the version the door was told."""

    ad_id: str
    effective_from: int
    cpc_micros: int
    version: int
    latency_ms: float
    at_s: float = 0.0
    """When the door was told, in seconds from the writers' start: where a slow change falls in the run."""


@dataclass
class WriterRun:
    """What the writers did: changes confirmed (with their latencies), refused (with one reason each, counted)."""

    confirmed: list[Confirmed] = field(default_factory=list)
    refused: dict[str, int] = field(default_factory=dict)
    started: float = 0.0
    ended: float = 0.0

    @property
    def seconds(self) -> float:
        return max(1e-9, self.ended - self.started)


class ChangeWriters:
    """`writers` threads making `rate` price changes a second between them on `ads` ads of their own (from a day
    ahead) and the `repriced` ads of the catalog (from now), in turn, through one store (as the threads of a web
    worker share theirs)."""

    def __init__(
        self, database_url: str, rate: float = 10.0, writers: int = 4, ads: int = 100, repriced: Sequence[str] = ()
    ) -> None:
        self.database_url = database_url
        self.rate = rate
        self.writers = writers
        self.ad_ids = [f"{LOAD_ADVERTISER}-ad-{i:04d}" for i in range(ads)]
        self.targets = [(ad_id, AHEAD_MS) for ad_id in self.ad_ids] + [(ad_id, 0) for ad_id in repriced]
        """(ad, how far ahead of now its price takes effect), changed in this order over and over."""
        self.run = WriterRun()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._mutex = threading.Lock()
        self.store = CatalogDatabase(database_url)

    def prepare(self) -> None:
        """Read the catalog (the doors' store, shared by their threads as a web worker's threads share it) and
        create the writers' ads (those missing), in the advertiser's one currency."""
        held = self.store.current()
        for ad_id in self.ad_ids:
            if ad_id not in held:
                held = self.store.change(_new_ad(ad_id), made_by=MadeBy("load-writer", "command"))

    def start(self) -> None:
        self.run = WriterRun(started=time.monotonic())
        self._stop.clear()
        self._threads = [
            threading.Thread(target=self._write, args=(n,), name=f"catalog-writer-{n}", daemon=True)
            for n in range(self.writers)
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> WriterRun:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)
        self.run.ended = time.monotonic()
        return self.run

    def _write(self, number: int) -> None:
        store = self.store
        interval = self.writers / self.rate
        due = time.monotonic() + interval * number / self.writers
        i = 0
        while not self._stop.is_set():
            pause = due - time.monotonic()
            if pause > 0 and self._stop.wait(pause):
                break
            due += interval
            ad_id, ahead_ms = self.targets[(number + i * self.writers) % len(self.targets)]
            price = 100_000 + (number * 1_000_003 + i * 7_919) % 900_000
            i += 1
            began = time.monotonic()
            try:
                made = store.change(bid(ad_id, price, ahead_ms), made_by=MadeBy(f"load-writer-{number}", "command"))
            except CatalogError as exc:
                with self._mutex:
                    reason = str(exc).split(":")[0][:80]
                    self.run.refused[reason] = self.run.refused.get(reason, 0) + 1
                continue
            latency = (time.monotonic() - began) * 1000
            entry = next(p for p in made[ad_id].prices if p.version == made.version)
            with self._mutex:
                self.run.confirmed.append(
                    Confirmed(
                        ad_id,
                        entry.effective_from,
                        price,
                        made.version,
                        round(latency, 2),
                        round(time.monotonic() - self.run.started, 3),
                    )
                )


def _new_ad(ad_id: str) -> Callable[[Catalog | None, int], AdChange]:
    """A writer's ad, created from "now" (read under the catalog's lock)."""
    return lambda current, now: AdChange(ad_id, now, 100_000, LOAD_CAMPAIGN, LOAD_ADVERTISER, "EUR")


def bid(ad_id: str, price: int, ahead_ms: int = AHEAD_MS) -> Callable[[Catalog | None, int], AdChange]:
    """A new price for `ad_id` from `ahead_ms` after "now" (read under the catalog's lock)."""
    return lambda current, now: AdChange(ad_id, now + ahead_ms, price)


def check_confirmed(database_url: str, confirmed: list[Confirmed]) -> tuple[list[Confirmed], list[Confirmed]]:
    """(lost, twice): confirmed changes the database does not hold as confirmed (its ad, price and effective time
    at its version, and the change log's row of that version), and those it holds more than once."""
    import psycopg

    lost: list[Confirmed] = []
    twice: list[Confirmed] = []
    if not confirmed:
        return lost, twice
    with psycopg.connect(database_url) as connection:
        rows = connection.execute(
            "SELECT ad_id, version, effective_from, cpc_micros FROM ad_prices WHERE ad_id = ANY(%s)",
            (sorted({c.ad_id for c in confirmed}),),
        ).fetchall()
        logged = {
            int(v): n
            for v, n in connection.execute(
                "SELECT version, count(*) FROM catalog_changes WHERE kind <> 'start' GROUP BY version"
            ).fetchall()
        }
    by_version = {int(version): (ad, int(effective), cpc) for ad, version, effective, cpc in rows}
    copies: dict[tuple[str, int, int], int] = {}
    for ad, _, effective, cpc in rows:
        key = (ad, int(effective), cpc)
        copies[key] = copies.get(key, 0) + 1
    for change in confirmed:
        held = by_version.get(change.version)
        if held != (change.ad_id, change.effective_from, change.cpc_micros) or logged.get(change.version) != 1:
            lost.append(change)
        elif copies.get((change.ad_id, change.effective_from, change.cpc_micros), 0) > 1:
            twice.append(change)
    return lost, twice


def percentile(values: list[float], share: float) -> float:
    """The value at `share` (0 to 1) of the sorted values, nearest rank; 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


def main(argv: list[str] | None = None) -> int:
    """`python -m ops.catalog_load URL --rate R --writers W --seconds S --out FILE [--repriced AD,AD...]`: the
    writers in a process of their own (as doors are) for S seconds or until SIGTERM, their run written to FILE as
    JSON; `writing` is printed once they write."""
    import argparse
    import json
    import signal
    from dataclasses import asdict

    parser = argparse.ArgumentParser(prog="python -m ops.catalog_load")
    parser.add_argument("url")
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=60.0, help="at most; SIGTERM stops them sooner")
    parser.add_argument("--repriced", default="", help="ads of the catalog changed from now too, comma-separated")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    repriced = [ad_id for ad_id in args.repriced.split(",") if ad_id]
    writers = ChangeWriters(args.url, rate=args.rate, writers=args.writers, repriced=repriced)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
    writers.prepare()
    writers.start()
    print("writing", flush=True)
    stop.wait(args.seconds)
    run = writers.stop()
    document = {
        "confirmed": [asdict(c) for c in run.confirmed],
        "refused": run.refused,
        "seconds": run.seconds,
        "started_monotonic": run.started,
    }
    with open(args.out, "w", encoding="utf-8") as out:
        json.dump(document, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
