"""`make bench-stories`: how fast a click's story answers on a month of data.

Writes a month of simulated billing data into a fresh data folder, through the product's own writers: the archive,
ledger, `not_charged/` and `unbilled/` of each micro-batch (`attribution.batch_output.write_batch_files`, as the
streaming job writes them), the corrections of late clicks (`billing.store.corrections_arrow`), and the finance
export of every closed hour (`billing.export.build_export`, `billing.store.export_files.write_export`). Each click's
ground truth is known: charged, not charged (a known bot, the ad paused), added late, or not billable.

Then it keeps the folder as the product does after a reconciliation run (`keep_up`; `--as-written` leaves it as
written): the closed periods' and the quarantine's batch files compacted up to the stream's position, the open
periods' pass of `adbill reconcile --every`, the click filters of the closed periods; each timed. Then it times, on
this machine:

1. `ClickStories.tell` for `--lookups` click ids picked at random, without their day (the newest day first,
   `billing.store.click_files`, through the click filters): the time a page, the API or `adbill explain` spends,
   less the process's start;
2. one lookup after a new micro-batch was written;
3. `adbill explain CLICK_ID` as a command (a new Python process each time);
4. an ad's clicks by price over the month.

Every story told is checked against the ground truth. The report goes to `var/bench/stories-<time>.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from attribution.batch_output import ARCHIVE_COLUMNS, write_batch_files
from attribution.charging import NOT_CHARGED_ROWS, UNBILLED_ROWS
from billing.catalog import Ad, Catalog, generate_catalog
from billing.change_log import ChangeEntry, merge_log
from billing.corrections import Correction, CorrectionKind, CorrectionReason, correction_id
from billing.export import build_export
from billing.layout import DataLayout
from billing.periods import Periods
from billing.store.catalog_file import load_catalog, save_catalog
from billing.store.corrections_arrow import corrections_to_arrow
from billing.store.crawler_list import crawler_list
from billing.store.durable import make_folder
from billing.store.export_files import export_table, not_charged_table, write_export
from billing.store.parquet_ledger import LEDGER_COLUMNS
from ops.settings import PROJECT_ROOT

if TYPE_CHECKING:
    from billing.store.click_story import ClickStories as ClickStoriesType

T0 = 1_767_225_600_000  # 2026-01-01T00:00Z
HOUR_MS = 3_600_000
BOT = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"
BROWSER = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0 Safari/537.36"


@dataclass
class Month:
    """What was written, and each click's ground truth: `charged`, `late_click` (charged by a correction),
    `known_bot`, `ad_paused`, `not_billable`."""

    root: Path
    catalog: Catalog
    hours: int
    batches: int = 0
    clicks: int = 0
    impressions: int = 0
    truth: dict[str, str] = field(default_factory=dict)
    ad_of: dict[str, str] = field(default_factory=dict)


def write_month(
    root: Path,
    hours: int = 744,
    clicks_per_hour: int = 1_000,
    batches_per_hour: int = 12,
    open_hours: int = 2,
    seed: int = 1,
    progress: Callable[[str], None] = lambda line: None,
) -> Month:
    """A month (`hours` hourly periods from 2026-01-01) of clicks, two impressions a click (one qualifying), written
    as the product writes them; the last `open_hours` periods are not closed (no export)."""
    layout = DataLayout(root)
    rng = random.Random(seed)
    catalog = generate_catalog(advertisers=20, campaigns_per_advertiser=3, ads_per_campaign=4, seed=seed)
    paused = catalog.ad_ids[-1]
    catalog = store_catalog(root, catalog, paused)
    ads = catalog.ad_ids
    periods = Periods()
    month = Month(root, catalog, hours)
    batch_ms = HOUR_MS // batches_per_hour
    for hour in range(hours):
        start = T0 + hour * HOUR_MS
        period = periods.key(start)
        events: list[list[dict[str, Any]]] = [[] for _ in range(batches_per_hour)]
        ledger: list[list[dict[str, Any]]] = [[] for _ in range(batches_per_hour)]
        refused: list[list[dict[str, Any]]] = [[] for _ in range(batches_per_hour)]
        unpriced: list[list[dict[str, Any]]] = [[] for _ in range(batches_per_hour)]
        final: list[dict[str, Any]] = []
        stream_bills: list[dict[str, Any]] = []
        fixes: list[Correction] = []
        not_charged_rows: list[dict[str, Any]] = []
        for n in range(clicks_per_hour):
            click_id = f"c{hour:04d}-{n:05d}-{rng.getrandbits(32):08x}"
            ad = catalog[rng.choice(ads[:-1]) if rng.random() > 0.01 else paused]
            user = f"u{rng.randrange(20_000):05d}"
            at = start + rng.randrange(HOUR_MS - 20_000) + 10_000
            roll = rng.random()
            kind = (
                "not_billable"
                if roll < 0.03
                else "known_bot"
                if roll < 0.04
                else "late_click"
                if roll < 0.045
                else "charged"
            )
            if ad.ad_id == paused:
                kind = "ad_paused" if kind != "not_billable" else kind
            gap = rng.randrange(15_000, 40_000) if kind == "not_billable" else rng.randrange(0, 9_000)
            impression_id, impression_time = f"i{click_id[1:]}", at - gap
            ua = BOT if kind == "known_bot" else BROWSER
            late = kind == "late_click"
            received = at + (rng.randrange(600_000, 900_000) if late else rng.randrange(50, 2_000))
            batch = min(batches_per_hour - 1, (received - start) // batch_ms)
            base = hour * batches_per_hour
            partition = zlib.crc32(ad.ad_id.encode()) % 4
            for event_type, event_id, event_time, received_ms, is_late in (
                ("impression", impression_id, impression_time, impression_time + 300, False),
                ("click", click_id, at, received, late),
            ):
                month.impressions += event_type == "impression"
                b = min(batches_per_hour - 1, max(0, (received_ms - start) // batch_ms))
                events[b].append(
                    _archive_row(event_type, event_id, ad.ad_id, user, event_time, received_ms, partition, ua, is_late)
                )
                events[b][-1]["batch_id"] = base + b
            # A second impression for another user, now and then an extra one of the same user outside the window.
            other = _archive_row(
                "impression",
                f"x{click_id[1:]}",
                ad.ad_id,
                f"u{rng.randrange(20_000):05d}",
                at - rng.randrange(0, 60_000),
                at,
                partition,
                BROWSER,
                False,
            )
            other_batch = min(batches_per_hour - 1, max(0, (at - start) // batch_ms))
            events[other_batch].append({**other, "batch_id": base + other_batch})
            month.impressions += 1
            month.clicks += 1
            month.truth[click_id] = kind
            month.ad_of[click_id] = ad.ad_id
            bill = {
                "click_id": click_id,
                "impression_id": impression_id,
                "ad_id": ad.ad_id,
                "campaign_id": ad.campaign_id,
                "advertiser_id": ad.advertiser_id,
                "user_id": user,
                "click_time": at,
                "impression_time": impression_time,
                "amount_micros": _price(ad, at),
                "currency": ad.currency,
            }
            stamp = {
                "click_received_ms": received,
                "billed_at_ms": start + (batch + 1) * batch_ms,
                "period_start_ms": start,
                "period": period,
                "batch_id": base + batch,
            }
            if kind == "charged":
                ledger[batch].append({**bill, **stamp})
                final.append(bill)
                stream_bills.append(bill)
            elif kind == "known_bot":
                refused[batch].append({**bill, **stamp, "reason": "known_bot"})
                not_charged_rows.append({**bill, "reason": "known_bot"})
            elif kind == "ad_paused":
                row = {**bill, "reason": "ad_paused", "period_start_ms": start, "period": period}
                unpriced[batch].append({**row, "batch_id": base + batch, "campaign_id": None})
                not_charged_rows.append({**bill, "amount_micros": None, "reason": "ad_paused"})
            elif kind == "late_click":
                final.append(bill)
                fixes.append(
                    Correction(
                        correction_id(CorrectionKind.ADDITION, click_id, period, 0),
                        CorrectionKind.ADDITION,
                        click_id,
                        impression_id,
                        ad.ad_id,
                        ad.campaign_id,
                        ad.advertiser_id,
                        _price(ad, at) or 0,
                        ad.currency,
                        CorrectionReason.LATE_CLICK,
                        period,
                        period,
                        start + HOUR_MS + 900_000,
                    )
                )
        for b in range(batches_per_hour):
            if events[b]:
                table = pa.Table.from_pylist(events[b]).select(list(ARCHIVE_COLUMNS))
                write_batch_files(table, layout.archive, ["event_type", "period", "batch_id"], prune=False)
            if ledger[b]:
                write_batch_files(_table(ledger[b], LEDGER_COLUMNS), layout.ledger, ["period", "batch_id"])
            if refused[b]:
                write_batch_files(_table(refused[b], NOT_CHARGED_ROWS), layout.not_charged, ["period", "batch_id"])
            if unpriced[b]:
                write_batch_files(_table(unpriced[b], UNBILLED_ROWS), layout.unbilled, ["period", "batch_id"])
        month.batches += batches_per_hour
        if fixes:
            folder = layout.corrections_of(period)
            make_folder(folder)
            pq.write_table(corrections_to_arrow(fixes), folder / f"run-{hour:04d}.parquet")
        if hour < hours - open_hours:
            rows = build_export(period, final, stream_bills, fixes, [])
            write_export(
                root,
                period,
                export_table(rows),
                start,
                start + HOUR_MS,
                start + HOUR_MS + 900_000,
                not_charged_table(not_charged_rows),
                {"crawler_list_version": crawler_list().version, "flood_clicks": 20, "flood_window_ms": 60_000,
                 "duplicate_window_ms": 30_000},
            )  # fmt: skip
        if hour % 24 == 23:
            progress(f"day {hour // 24 + 1} written: {month.clicks:,} clicks, {month.impressions:,} impressions")
    return month


def store_catalog(root: Path, catalog: Catalog, paused: str) -> Catalog:
    """The catalog with the ad that is paused all month (a change of version 1), written beside the month."""
    from billing.catalog import AdChange

    catalog = catalog.with_change(AdChange(paused, T0, None), T0, backfill=True)
    save_catalog(catalog, DataLayout(root).catalog_file)
    return catalog


class MonthCatalog:
    """The month's catalog as the stories read it (`billing.store.catalog_db.CatalogSource`): held, not stored, so
    that the figures are the click finder's alone."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    def current(self) -> Catalog:
        return self.catalog

    def changes(self) -> list[ChangeEntry]:
        return merge_log(self.catalog, [])

    def changes_of(self, versions: Iterable[int]) -> dict[int, ChangeEntry]:
        wanted = set(versions)
        return {e.version: e for e in self.changes() if e.version in wanted}


def _archive_row(
    event_type: str,
    event_id: str,
    ad_id: str,
    user_id: str,
    event_time: int,
    received_ms: int,
    partition: int,
    user_agent: str,
    late: bool,
) -> dict[str, Any]:
    start = event_time - event_time % HOUR_MS
    return {
        "event_type": event_type,
        "event_id": event_id,
        "ad_id": ad_id,
        "user_id": user_id,
        "event_time": event_time,
        "received_ms": received_ms,
        "topic": f"{event_type}s",
        "partition": partition,
        "offset": received_ms,  # increasing with arrival, as offsets do
        "value": os.urandom(48),
        "user_agent": user_agent,
        "ip": "192.0.2.10",
        "late": late,
        "period_start_ms": start,
        "period": Periods().key(start),
    }


def _price(ad: Ad, at: int) -> int | None:
    price = ad.price_at(at)
    return price if isinstance(price, int) else None


def _table(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> pa.Table:
    return pa.Table.from_pylist([{c: r.get(c) for c in columns} for r in rows])


# --- The measurement ------------------------------------------------------------------------------------------------


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def run(args: argparse.Namespace) -> dict[str, Any]:
    from billing.store.click_story import ClickStories

    root = Path(args.folder or tempfile.mkdtemp(prefix="adbill-stories-", dir=PROJECT_ROOT / "var"))
    began = time.monotonic()
    month = write_month(
        root, args.hours, args.clicks_per_hour, args.batches_per_hour, seed=args.seed, progress=lambda s: print(s)
    )
    written_s = time.monotonic() - began
    print(f"wrote {month.clicks:,} clicks and {month.impressions:,} impressions in {written_s:.0f} s to {root}")
    layout = DataLayout(root)
    upkeep = {} if args.as_written else keep_up(layout, month.batches - 1)
    stories = ClickStories(layout, MonthCatalog(load_catalog(layout.catalog_file)))
    rng = random.Random(args.seed)
    picked = rng.sample(sorted(month.truth), args.lookups)
    timings: list[float] = []
    wrong: list[str] = []
    for click_id in picked:
        began = time.perf_counter()
        story = stories.tell(click_id)
        timings.append(time.perf_counter() - began)
        if truth_of(story) != month.truth[click_id]:
            wrong.append(f"{click_id}: told {truth_of(story)}, truth {month.truth[click_id]}")
    print(
        f"{len(picked)} lookups: p50 {percentile(timings, 0.5) * 1000:.0f} ms, p95 "
        f"{percentile(timings, 0.95) * 1000:.0f} ms, max {max(timings) * 1000:.0f} ms; {len(wrong)} wrong"
    )
    # A new micro-batch in the newest period, then a lookup of one of its clicks.
    newest = month.batches
    click_id = one_more_batch(root, month, newest)
    began = time.perf_counter()
    story = stories.tell(click_id)
    after_batch_s = time.perf_counter() - began
    assert story.outcome.status == "charged", story.outcome
    print(f"a lookup after a new batch: {after_batch_s * 1000:.0f} ms")
    command = explain_commands(root, picked[:3], wrong)
    print(f"adbill explain: {', '.join(f'{t:.2f} s' for t in command)} (a new process each)")
    by_price = split_by_price(
        stories, month.catalog.ad_ids[:5], Periods().key(T0), Periods().key(T0 + (args.hours - 1) * HOUR_MS)
    )
    if not by_price["same_as_rows"]:
        wrong.append(f"clicks by price of {month.catalog.ad_ids[0]}: not what the books' rows give")
    return {
        "folder": str(root),
        "hours": args.hours,
        "clicks": month.clicks,
        "impressions": month.impressions,
        "batches": month.batches,
        "written_s": round(written_s, 1),
        "upkeep": upkeep,
        "lookups": len(picked),
        "lookup_ms": {
            "p50": round(percentile(timings, 0.5) * 1000, 1),
            "p95": round(percentile(timings, 0.95) * 1000, 1),
            "max": round(max(timings) * 1000, 1),
        },
        "lookup_after_new_batch_ms": round(after_batch_s * 1000, 1),
        "explain_command_s": [round(t, 2) for t in command],
        "by_price": by_price,
        "wrong": wrong,
    }


def split_by_price(stories: ClickStoriesType, ads: list[str], first: str, last: str) -> dict[str, Any]:
    """Each of `ads`' clicks by price over the month as the ad's page asks (`ClickStories.by_price`: the closed
    periods' price counts where kept), timed, and the first checked against the books' rows themselves (every
    period's ledger, corrections and export), timed apart."""
    from billing.story import by_price

    times, answers = [], []
    for ad in ads:
        began = time.perf_counter()
        answers.append(stories.by_price(ad, first, last))
        times.append(time.perf_counter() - began)
    began = time.perf_counter()
    closed = stories.files.closed_periods()
    from_rows = by_price(stories.files.book_rows(first, last, ad_id=ads[0]), closed.__contains__)
    from_rows_s = time.perf_counter() - began
    print(
        f"clicks by price of {len(ads)} ads over the month: {', '.join(f'{t * 1000:.0f}' for t in times)} ms "
        f"({ads[0]}: {answers[0]}); from the rows themselves {from_rows_s * 1000:.0f} ms, "
        f"{'the same' if from_rows == answers[0] else 'ANOTHER ANSWER: ' + str(from_rows)}"
    )
    return {
        "ads": len(ads),
        "ms": [round(t * 1000, 1) for t in times],
        "clicks": [sum(n for _, n in answer) for answer in answers],
        "from_rows_ms": round(from_rows_s * 1000, 1),
        "same_as_rows": from_rows == answers[0],
    }


def explain_commands(root: Path, click_ids: list[str], wrong: list[str]) -> list[float]:
    """`adbill explain CLICK_ID` as a command, a new process each, with a PostgreSQL of its own on a free port (the
    catalog's database, which takes the month's catalog file in on first use); the seconds each took."""
    from ops.postgres_service import LocalPostgres, database_beside
    from ops.process import free_ports

    (port,) = free_ports(1)
    # Beside the data folder, in one the server's own user can reach (a temporary folder lets no one else through).
    home = Path(tempfile.mkdtemp(prefix="adbill-stories-postgres-", dir=root.parent))
    home.chmod(0o755)
    server = LocalPostgres(home / "cluster", port, home / "run", log_dir=home)
    server.start()
    seconds: list[float] = []
    try:
        env = {**os.environ, "ADBILL_HOME": str(root), "ADBILL_DATABASE_URL": database_beside(server.url, "stories")}
        for click_id in click_ids:
            began = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "ops.cli", "explain", click_id],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            seconds.append(time.perf_counter() - began)
            if done.returncode != 0:
                wrong.append(f"adbill explain {click_id}: exit {done.returncode}: {done.stderr.strip()}")
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)
    return seconds


def keep_up(layout: DataLayout, newest_batch: int) -> dict[str, Any]:
    """What a reconciliation run and `adbill reconcile --every` do to the folder after the month: the closed periods'
    and the quarantine's batch files compacted up to the stream's position (`compactable_through`), the open periods'
    pass, the click filters of the closed periods; each timed, the files of the batch folders counted before and
    after."""
    from billing.store.click_files import ClickFiles
    from billing.store.compaction import closed_pass, compactable_through, open_pass, open_periods

    files = ClickFiles(layout)
    closed = sorted(files.closed_periods())
    through = compactable_through(newest_batch, newest_batch)
    before = _batch_files(layout)
    began = time.monotonic()
    compacted = closed_pass(layout, closed, through)
    closed_s = time.monotonic() - began
    began = time.monotonic()
    opened = open_pass(layout, open_periods(layout, closed), through)
    open_s = time.monotonic() - began
    began = time.monotonic()
    refresh = files.refresh_filters(closed, recent_days=0)
    filters_s = time.monotonic() - began
    after = _batch_files(layout)
    for line in (compacted.describe(), opened.describe(), refresh.describe()):
        print(line)
    print(f"the batch folders' files: {before:,} before, {after:,} after")
    return {
        "through": through,
        "closed_pass_s": round(closed_s, 1),
        "closed_pass": compacted.describe(),
        "open_pass_s": round(open_s, 1),
        "open_pass": opened.describe(),
        "filters_s": round(filters_s, 1),
        "filters": refresh.describe(),
        "filter_bytes": sum(p.stat().st_size for p in layout.click_day_filters.glob("*.bloom")),
        "price_count_bytes": sum(p.stat().st_size for p in layout.price_counts.glob("*.parquet")),
        "batch_files_before": before,
        "batch_files_after": after,
    }


def _batch_files(layout: DataLayout) -> int:
    """The Parquet files of the batch folders (ledger, archive, unbilled/, not_charged/, quarantine, released/)."""
    folders = (layout.ledger, layout.archive, layout.unbilled, layout.not_charged, layout.quarantine, layout.released)
    return sum(1 for folder in folders if folder.is_dir() for _ in folder.rglob("*.parquet"))


def truth_of(story: Any) -> str:
    outcome = story.outcome
    if outcome.status == "charged":
        late = any(c.reason == "late_click" and c.kind == "addition" for c in story.corrections)
        return "late_click" if late else "charged"
    return outcome.reason if outcome.status == "not_charged" else outcome.status


def one_more_batch(root: Path, month: Month, batch_id: int) -> str:
    """A micro-batch after the month's last, with one charged click of the newest (open) period; its click id."""
    layout = DataLayout(root)
    ad = month.catalog[month.catalog.ad_ids[0]]
    at = T0 + month.hours * HOUR_MS - 5_000
    start = at - at % HOUR_MS
    click_id = f"c-new-{batch_id}"
    rows = [
        {**_archive_row("impression", f"i-new-{batch_id}", ad.ad_id, "u-new", at - 1_000, at, 0, BROWSER, False)},
        {**_archive_row("click", click_id, ad.ad_id, "u-new", at, at + 100, 0, BROWSER, False)},
    ]
    table = pa.Table.from_pylist([{**r, "batch_id": batch_id} for r in rows]).select(list(ARCHIVE_COLUMNS))
    write_batch_files(table, layout.archive, ["event_type", "period", "batch_id"])
    bill = {
        "click_id": click_id,
        "impression_id": f"i-new-{batch_id}",
        "ad_id": ad.ad_id,
        "campaign_id": ad.campaign_id,
        "advertiser_id": ad.advertiser_id,
        "user_id": "u-new",
        "click_time": at,
        "impression_time": at - 1_000,
        "amount_micros": _price(ad, at),
        "currency": ad.currency,
        "click_received_ms": at + 100,
        "billed_at_ms": at + 1_000,
        "period_start_ms": start,
        "period": Periods().key(start),
        "batch_id": batch_id,
    }
    write_batch_files(_table([bill], LEDGER_COLUMNS), layout.ledger, ["period", "batch_id"])
    return click_id


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--hours", type=int, default=744, help="hourly periods (744: a 31-day month)")
    parser.add_argument("--clicks-per-hour", type=int, default=1_000)
    parser.add_argument("--batches-per-hour", type=int, default=12, help="micro-batches an hour")
    parser.add_argument("--lookups", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--folder", help="the data folder to write (default: a new one under var/)")
    parser.add_argument(
        "--as-written",
        action="store_true",
        help="read the files as the writers left them (no compaction, no click filters)",
    )
    args = parser.parse_args(argv)
    report = run(args)
    out = PROJECT_ROOT / "var" / "bench" / f"stories-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"report: {out}")
    print(json.dumps({k: v for k, v in report.items() if k != "wrong"}, indent=1))
    if report["wrong"]:
        print("\n".join(report["wrong"][:20]), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
