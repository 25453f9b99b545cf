"""`python -m ops.bench.story_options`: the ways of finding which rows of which files name a click id, measured
side by side on the same data folder (docs/click-stories-at-scale.md).

1. **Writes** `--days` simulated days of `--clicks-per-day` clicks into a fresh data folder, in the product's layout
   and schemas (`billing.layout`): each micro-batch's archive (`event_type=T/period=P/batch_id=N/part-TTTTT.parquet`,
   one file per task, `--tasks`), ledger, `unbilled/`, `not_charged/` and quarantine, as `write_batch_files` writes
   them (snappy, the partition columns in the paths; without its fsyncs, which only cost time here), `--batches-per-
   hour` batches an hour (3,600 is the job's 1 s trigger); the corrections of late clicks
   (`billing.store.corrections_arrow`) and the finance export of every closed hour (`write_export`). Vectorized, so a
   day of a million clicks takes a minute, not the hour `make bench-stories`' writer would. Click ids are random
   UUIDs: nothing about an id says where it lies.
2. **Measures**, for the clicks picked (every kind of outcome: charged, added late, a known bot, a paused ad, not
   billable, a bad copy in quarantine) and ids that are nowhere, each option's build or keep-up cost, its bytes and
   files, and its lookups with the click's day given and without it (newest day first), each checked against what was
   written (every row found, no other, each with the batch that wrote it):
   - (`sqlite`, the SQLite click index of the time, was measured in run A of the docs: removed since with the index,
     replaced by `billing.store.click_files`);
   - `files`: pyarrow datasets over the files as written (the day's period folders; without a day, day after day);
   - `duckdb-files`: DuckDB over the same files;
   - `compacted`: after compacting every period's batches up to `--tail-batches` before the newest (`compact`): one
     file per period and kind, sorted by click id (impressions by user and time), row-group statistics, the batch
     of each row kept in `source_batch_id`; pyarrow, then `duckdb-compacted`;
   - `sidecar`: the compacted files and one small file per day (`index/click-days/DAY.bloom`) holding a split-block
     Bloom filter of the click ids of each of its periods: only the periods that may hold the id are read.
3. **At full scale** (`--full-period-clicks 4166667`: one hour at 100 million clicks a day), the files of one
   closed period as compaction writes them (archive clicks by id with a Bloom filter on `user_id`, impressions by
   user and time, the ledger by click id, and by campaign and time with a Bloom filter on `click_id`) and its export
   as `write_export` writes it (and with smaller row groups), each queried with pyarrow and DuckDB: the lookup of an
   id, a user's clicks and impressions around a time, a campaign's books before a time, the footer; and the day's
   filter built and probed.
4. **A PostgreSQL table** of click id -> period (`--postgres-rows`): bytes per row, the rate COPY fills it at, a
   lookup (on `--database-url`, or on a server of its own started and stopped here).
5. **The product's own path** (`--options product`, `measure_product`): its closed and open compaction passes, its
   day filters and its finder, timed on a cold and a warm page cache. With `--close-daily` the closed pass runs
   after each day is written, as reconciliation closes periods while the stream writes on, so that seven days of
   ten million clicks fit a disk that cannot hold them as written (`make bench-stories-scale`).

The report goes to `var/bench/story-options-<time>.json`; the data folder is removed unless `--keep`. The machine's
other work shows in every figure: compare options within one run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shutil
import struct
import sys
import tempfile
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from attribution.charging import NOT_CHARGED_ROWS, UNBILLED_ROWS
from attribution.decode import QUARANTINE_COLUMNS
from billing.catalog import generate_catalog
from billing.corrections import Correction, CorrectionKind, CorrectionReason, correction_id
from billing.layout import DataLayout
from billing.periods import Periods
from billing.rule import BILLABLE_FIELDS
from billing.store.click_files import (
    ARCHIVE_CLICK,
    ARCHIVE_IMPRESSION,
    BATCHED,
    CORRECTION,
    EXPORT,
    EXPORT_NOT_CHARGED,
    LEDGER,
    NOT_CHARGED,
    QUARANTINE,
    UNBILLED,
    ClickFiles,
    Located,
    read_located,
)
from billing.store.click_filters import BITS_PER_ID, block_and_masks, bloom_blocks, hash_ids
from billing.store.compaction import CompactionReport, closed_pass, open_pass, open_periods
from billing.store.corrections_arrow import corrections_to_arrow
from billing.store.durable import fsync_folder, replace_files
from billing.store.export_files import EXPORT_SCHEMA, NOT_CHARGED_FILE, NOT_CHARGED_SCHEMA, PARQUET_FILE, write_export
from billing.store.parquet_ledger import LEDGER_COLUMNS
from ops.reconcile import ReconcileConfig
from ops.settings import PROJECT_ROOT

T0 = 1_767_225_600_000  # 2026-01-01T00:00Z
HOUR_MS = 3_600_000
DAY_MS = 86_400_000
BOT = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"
BROWSER = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0 Safari/537.36"
VALUE_BYTES = 48
"""Raw bytes kept per archive row, as `make bench-stories` writes them."""

CHARGED, LATE, KNOWN_BOT, AD_PAUSED, NOT_BILLABLE = "charged", "late_click", "known_bot", "ad_paused", "not_billable"
OUTCOMES = (CHARGED, LATE, KNOWN_BOT, AD_PAUSED, NOT_BILLABLE)

ID_COLUMN = {ARCHIVE_CLICK: "event_id", ARCHIVE_IMPRESSION: "event_id", QUARANTINE: "event_id"}
SORT_KEYS: dict[str, tuple[str, ...]] = {
    ARCHIVE_CLICK: ("event_id",),
    ARCHIVE_IMPRESSION: ("user_id", "event_time"),
    LEDGER: ("click_id",),
    UNBILLED: ("click_id",),
    NOT_CHARGED: ("click_id",),
    QUARANTINE: ("event_id",),
}
"""How a compacted file is sorted: by click id where ids are looked up, impressions by user and time (a story reads
those of the click's user around its time)."""
SOURCE_BATCH = "source_batch_id"
"""A compacted file's column: the batch that wrote each row (its folder's `batch_id` is the newest it holds)."""
COMPACTED = "compacted-"


def id_of(kind: str) -> str:
    return ID_COLUMN.get(kind, "click_id")


def kind_root(layout: DataLayout, kind: str) -> Path:
    """The folder of a kind's `period=P/` folders."""
    return {
        ARCHIVE_CLICK: layout.archive_of("click"),
        ARCHIVE_IMPRESSION: layout.archive_of("impression"),
        LEDGER: layout.ledger,
        UNBILLED: layout.unbilled,
        NOT_CHARGED: layout.not_charged,
        CORRECTION: layout.corrections,
    }[kind]


def day_periods(day: int) -> list[str]:
    return [Periods().key(T0 + day * DAY_MS + hour * HOUR_MS) for hour in range(24)]


def batch_of(name: str) -> int | None:
    return int(name.removeprefix("batch_id=")) if name.startswith("batch_id=") else None


def compacted_span(name: str) -> tuple[int, int] | None:
    """(first, last) batch of a compacted file's name `compacted-FIRST-LAST.parquet`."""
    if not name.startswith(COMPACTED):
        return None
    first, last = name.removeprefix(COMPACTED).removesuffix(".parquet").split("-")
    return int(first), int(last)


def percentile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else 0.0


def timing(values: Sequence[float]) -> dict[str, float]:
    """p50, p95, max in ms."""
    return {
        "p50_ms": round(percentile(values, 0.5) * 1000, 1),
        "p95_ms": round(percentile(values, 0.95) * 1000, 1),
        "max_ms": round(max(values, default=0.0) * 1000, 1),
        "n": len(values),
    }


def folder_bytes(folder: Path) -> tuple[int, int]:
    """(bytes, files) under `folder`."""
    size = count = 0
    for base, _, names in os.walk(folder):
        for name in names:
            size += os.stat(os.path.join(base, name)).st_size
            count += 1
    return size, count


# --- Writing the days --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ads:
    """The catalog's ads as arrays: ids, owners, price and Kafka partition (by ad); the last one paused."""

    ids: np.ndarray
    campaigns: np.ndarray
    advertisers: np.ndarray
    currencies: np.ndarray
    prices: np.ndarray
    partitions: np.ndarray

    @classmethod
    def generated(cls, seed: int) -> Ads:
        catalog = generate_catalog(advertisers=20, campaigns_per_advertiser=3, ads_per_campaign=4, seed=seed)
        ads = [catalog[ad_id] for ad_id in catalog.ad_ids]
        prices = [ad.price_at(T0) for ad in ads]
        return cls(
            ids=np.array([a.ad_id for a in ads], dtype=object),
            campaigns=np.array([a.campaign_id for a in ads], dtype=object),
            advertisers=np.array([a.advertiser_id for a in ads], dtype=object),
            currencies=np.array([a.currency for a in ads], dtype=object),
            prices=np.array([p if isinstance(p, int) else 0 for p in prices], dtype=np.int64),
            partitions=np.array([zlib.crc32(a.ad_id.encode()) % 4 for a in ads], dtype=np.int64),
        )


@dataclass(frozen=True)
class Truth:
    """What was written of one click: its outcome, day, period, the batch that received it, a bad copy in
    quarantine, whether its period was closed (exported)."""

    click_id: str
    outcome: str
    day: int
    period: str
    batch: int
    quarantined: bool
    closed: bool

    def expected(self) -> Counter[str]:
        """The rows a lookup must find, by kind."""
        rows = Counter({ARCHIVE_CLICK: 1})
        rows.update(
            {
                CHARGED: [LEDGER],
                LATE: [CORRECTION],
                KNOWN_BOT: [NOT_CHARGED],
                AD_PAUSED: [UNBILLED],
                NOT_BILLABLE: [],
            }[self.outcome]
        )
        if self.closed and self.outcome in (CHARGED, LATE):
            rows[EXPORT] += 1
        if self.closed and self.outcome in (KNOWN_BOT, AD_PAUSED):
            rows[EXPORT_NOT_CHARGED] += 1
        if self.quarantined:
            rows[QUARANTINE] += 1
        return rows


@dataclass
class Written:
    root: Path
    days: int
    clicks: int = 0
    impressions: int = 0
    files: int = 0
    seconds: float = 0.0
    newest_batch: int = 0
    truth: list[Truth] = field(default_factory=list)


def _prefixed(prefix: str, numbers: np.ndarray, width: int) -> pa.Array:
    text = pc.utf8_lpad(pc.cast(pa.array(numbers, pa.int64()), pa.string()), width, "0")
    return pc.binary_join_element_wise(pa.scalar(prefix), text, "")


def _ip(users: np.ndarray) -> pa.Array:
    parts = [pc.cast(pa.array((users >> shift) & 255, pa.int64()), pa.string()) for shift in (16, 8, 0)]
    return pc.binary_join_element_wise(pa.scalar("10"), *parts, ".")


def _binary(rng: np.random.Generator, rows: int, size: int) -> pa.Array:
    offsets = pa.py_buffer(np.arange(0, size * (rows + 1), size, dtype=np.int32).tobytes())
    return pa.Array.from_buffers(pa.binary(), rows, [None, offsets, pa.py_buffer(rng.bytes(size * rows))])


def random_ids(rng: np.random.Generator, rows: int) -> pa.Array:
    raw = rng.bytes(16 * rows)
    return pa.array([str(uuid.UUID(bytes=raw[i : i + 16], version=4)) for i in range(0, 16 * rows, 16)], pa.string())


@dataclass
class Hour:
    """One hour's rows, before they are split into micro-batches: the archive (clicks, then two impressions a click),
    the stream's ledger, `not_charged/`, `unbilled/` and quarantine rows (each with `batch_id`), the corrections and
    the export."""

    period: str
    start: int
    archive: pa.Table
    ledger: pa.Table
    not_charged: pa.Table
    unbilled: pa.Table
    quarantine: pa.Table
    corrections: list[Correction]
    export: pa.Table
    export_not_charged: pa.Table
    outcomes: np.ndarray
    click_ids: pa.Array
    batches: np.ndarray
    quarantined: np.ndarray


def make_hour(
    rng: np.random.Generator, ads: Ads, hour: int, clicks: int, users: int, batch_ms: int, quarantine_share: float
) -> Hour:
    """An hour of clicks (ids random UUIDs), each with its qualifying impression and one of another user, received
    within 2 s (a late click 10 to 15 minutes after: a later batch, maybe the next hour's); outcomes as
    `make bench-stories` draws them. Every impression lies in the click's hour, so no folder is written twice."""
    n = clicks
    start = T0 + hour * HOUR_MS
    period = Periods().key(start)
    click_ids = random_ids(rng, n)
    tail = pc.utf8_slice_codeunits(click_ids, 1)
    impression_ids = pc.binary_join_element_wise(pa.scalar("i"), tail, "")
    other_ids = pc.binary_join_element_wise(pa.scalar("x"), tail, "")
    ad = rng.integers(0, len(ads.ids) - 1, n)
    paused = rng.random(n) < 0.01
    ad[paused] = len(ads.ids) - 1
    user = rng.integers(0, users, n)
    other_user = rng.integers(0, users, n)
    at = start + rng.integers(70_000, HOUR_MS - 20_000, n)
    roll = rng.random(n)
    outcomes = np.select([roll < 0.03, roll < 0.04, roll < 0.045], [NOT_BILLABLE, KNOWN_BOT, LATE], CHARGED)
    outcomes[paused & (outcomes != NOT_BILLABLE)] = AD_PAUSED
    gap = np.where(outcomes == NOT_BILLABLE, rng.integers(15_000, 40_000, n), rng.integers(0, 9_000, n))
    impression_time = at - gap
    late = outcomes == LATE
    received = at + np.where(late, rng.integers(600_000, 900_000, n), rng.integers(50, 2_000, n))
    other_time = at - rng.integers(0, 60_000, n)
    batch = (received - T0) // batch_ms
    quarantined = (rng.random(n) < quarantine_share) & ~late
    user_ids = _prefixed("u", user, 7)
    ad_ids = pa.array(ads.ids[ad], pa.string())
    partition = ads.partitions[ad]
    agents = pc.if_else(pa.array(outcomes == KNOWN_BOT), BOT, BROWSER)
    ips = _ip(user)

    def archive(
        event_type: str, ids: pa.Array, users_: pa.Array, ips_: pa.Array, times: np.ndarray, got: np.ndarray, lates: Any
    ) -> pa.Table:
        rows = len(times)
        return pa.table(
            {
                "event_type": pa.array([event_type] * rows, pa.string()),
                "event_id": ids,
                "ad_id": ad_ids,
                "user_id": users_,
                "event_time": pa.array(times, pa.int64()),
                "received_ms": pa.array(got, pa.int64()),
                "topic": pa.array([f"{event_type}s"] * rows, pa.string()),
                "partition": pa.array(partition, pa.int64()),
                "offset": pa.array(got, pa.int64()),
                "value": _binary(rng, rows, VALUE_BYTES),
                "user_agent": agents if event_type == "click" else pa.array([BROWSER] * rows, pa.string()),
                "ip": ips_,
                "late": pa.array(lates, pa.bool_()),
                "period_start_ms": pa.array(np.full(rows, start), pa.int64()),
                "period": pa.array([period] * rows, pa.string()),
                "batch_id": pa.array((got - T0) // batch_ms, pa.int64()),
            }
        )

    no = np.zeros(n, dtype=bool)
    events = pa.concat_tables(
        [
            archive("click", click_ids, user_ids, ips, at, received, late),
            archive("impression", impression_ids, user_ids, ips, impression_time, impression_time + 300, no),
            archive(
                "impression",
                other_ids,
                _prefixed("u", other_user, 7),
                _ip(other_user),
                other_time,
                other_time + 300,
                no,
            ),
        ]
    )
    bills = pa.table(
        {
            "click_id": click_ids,
            "impression_id": impression_ids,
            "ad_id": ad_ids,
            "campaign_id": pa.array(ads.campaigns[ad], pa.string()),
            "advertiser_id": pa.array(ads.advertisers[ad], pa.string()),
            "user_id": user_ids,
            "click_time": pa.array(at, pa.int64()),
            "impression_time": pa.array(impression_time, pa.int64()),
            "amount_micros": pa.array(ads.prices[ad], pa.int64()),
            "currency": pa.array(ads.currencies[ad], pa.string()),
            "click_received_ms": pa.array(received, pa.int64()),
            "billed_at_ms": pa.array(T0 + (batch + 1) * batch_ms, pa.int64()),
            "period_start_ms": pa.array(np.full(n, start), pa.int64()),
            "period": pa.array([period] * n, pa.string()),
            "batch_id": pa.array(batch, pa.int64()),
            "reason": pc.if_else(pa.array(outcomes == KNOWN_BOT), "known_bot", "ad_paused"),
        }
    )

    def of(outcome: str) -> pa.Table:
        return bills.filter(pa.array(outcomes == outcome))

    unbilled = of(AD_PAUSED)
    unbilled = unbilled.set_column(
        unbilled.schema.get_field_index("amount_micros"), "amount_micros", pa.nulls(unbilled.num_rows, pa.int64())
    )
    q = np.flatnonzero(quarantined)
    bad_received = received[q] + 1
    quarantine = pa.table(
        {
            "reason": pa.array(["unknown_schema"] * len(q), pa.string()),
            "topic": pa.array(["clicks"] * len(q), pa.string()),
            "partition": pa.array(partition[q], pa.int64()),
            "offset": pa.array(bad_received, pa.int64()),
            "received_ms": pa.array(bad_received, pa.int64()),
            "value": _binary(rng, len(q), VALUE_BYTES),
            "value_size": pa.array(np.full(len(q), VALUE_BYTES), pa.int64()),
            "value_sha256": pa.nulls(len(q), pa.string()),
            "event_id": click_ids.take(pa.array(q)),
            "ad_id": ad_ids.take(pa.array(q)),
            "event_time": pa.array(at[q], pa.int64()),
            "batch_id": pa.array((bad_received - T0) // batch_ms, pa.int64()),
        }
    )
    corrections = [
        Correction(
            correction_id(CorrectionKind.ADDITION, row["click_id"], period, 0),
            CorrectionKind.ADDITION,
            row["click_id"],
            row["impression_id"],
            row["ad_id"],
            row["campaign_id"],
            row["advertiser_id"],
            row["amount_micros"],
            row["currency"],
            CorrectionReason.LATE_CLICK,
            period,
            period,
            start + HOUR_MS + 900_000,
        )
        for row in of(LATE).to_pylist()
    ]
    exported = pa.concat_tables([of(CHARGED), of(LATE)]).sort_by("click_id")
    is_late = pc.is_in(exported["click_id"], value_set=pa.array([c.click_id for c in corrections], pa.string()))
    ids_of_late = {c.click_id: c.correction_id for c in corrections}
    rows = exported.num_rows
    export = pa.table(
        {
            "record_type": pa.array(["click"] * rows, pa.string()),
            **{name: exported[name] for name in BILLABLE_FIELDS if name != "currency"},
            "net_micros": exported["amount_micros"],
            "currency": exported["currency"],
            "status": pc.if_else(is_late, "added", "billed"),
            "reason": pc.if_else(is_late, "late_click", pa.scalar(None, pa.string())),
            "correction_id": pa.array([ids_of_late.get(c) for c in exported["click_id"].to_pylist()], pa.string()),
            "corrects_period": pa.array([period] * rows, pa.string()),
            "booked_period": pa.array([period] * rows, pa.string()),
        }
    ).cast(EXPORT_SCHEMA)
    refused = pa.concat_tables([of(KNOWN_BOT), unbilled])
    return Hour(
        period=period,
        start=start,
        archive=events,
        ledger=of(CHARGED).select(list(LEDGER_COLUMNS)),
        not_charged=of(KNOWN_BOT).select(list(NOT_CHARGED_ROWS)),
        unbilled=unbilled.select(list(UNBILLED_ROWS)),
        quarantine=quarantine.select([*QUARANTINE_COLUMNS, "batch_id"]),
        corrections=corrections,
        export=export,
        export_not_charged=refused.select(NOT_CHARGED_SCHEMA.names).cast(NOT_CHARGED_SCHEMA),
        outcomes=outcomes,
        click_ids=click_ids,
        batches=batch,
        quarantined=quarantined,
    )


def write_batches(table: pa.Table, base: Path, path_keys: Sequence[str], tasks: int) -> int:
    """The rows of `table` as one file per folder `base/k=v/...` of `path_keys` and task (`part-TTTTT.parquet`, the
    task by Kafka partition when the table has one), in order of receipt, without the path's columns; the files
    written."""
    if table.num_rows == 0:
        return 0
    received = [c for c in ("received_ms", "click_received_ms", "click_time") if c in table.column_names][:1]
    table = table.sort_by([(k, "ascending") for k in (*path_keys, *received)])
    group = pc.binary_join_element_wise(*[pc.cast(table[k], pa.string()) for k in path_keys], "/")
    codes = np.asarray(pc.dictionary_encode(group).combine_chunks().indices)
    edges = [0, *(np.flatnonzero(np.diff(codes)) + 1).tolist(), table.num_rows]
    written = 0
    for first, last in zip(edges[:-1], edges[1:], strict=True):
        part = table.slice(first, last - first)
        folder = base.joinpath(*(f"{k}={part[k][0].as_py()}" for k in path_keys))
        folder.mkdir(parents=True, exist_ok=True)
        part = part.drop_columns(list(path_keys))
        task_of = np.asarray(part["partition"]) % tasks if tasks > 1 and "partition" in part.column_names else None
        for task in range(tasks) if task_of is not None else [0]:
            rows = part.filter(pa.array(task_of == task)) if task_of is not None else part
            if rows.num_rows:
                pq.write_table(rows, folder / f"part-{task:05d}.parquet", compression="snappy")
                written += 1
    return written


def write_days(
    root: Path,
    days: int,
    clicks_per_day: int,
    batches_per_hour: int,
    tasks: int,
    picks_per_hour: int,
    open_hours: int = 2,
    quarantine_share: float = 0.001,
    seed: int = 1,
    each_day: Callable[[int, int], None] | None = None,
) -> Written:
    """The days, hour by hour, as the product writes them (module doc); the last `open_hours` periods have no export.
    The truth of `picks_per_hour` random clicks an hour and of one click of a rarer outcome (or with a bad copy).
    `each_day(day, newest batch)` runs after each day but the last is written; its time is not the writing's."""
    layout = DataLayout(root)
    rng = np.random.default_rng(seed)
    pick = random.Random(seed)
    ads = Ads.generated(seed)
    batch_ms = HOUR_MS // batches_per_hour
    users = max(1_000, clicks_per_day // 5)
    hours = days * 24
    out = Written(root, days)
    began = time.monotonic()
    aside = 0.0
    rare = [LATE, KNOWN_BOT, AD_PAUSED, NOT_BILLABLE, "quarantined"]
    for hour in range(hours):
        h = make_hour(rng, ads, hour, clicks_per_day // 24, users, batch_ms, quarantine_share)
        out.files += write_batches(h.archive, layout.archive, ("event_type", "period", "batch_id"), tasks)
        for kind, table in ((LEDGER, h.ledger), (NOT_CHARGED, h.not_charged), (UNBILLED, h.unbilled)):
            out.files += write_batches(table, kind_root(layout, kind), ("period", "batch_id"), 1)
        out.files += write_batches(h.quarantine, layout.quarantine, ("batch_id",), tasks)
        if h.corrections:
            folder = layout.corrections_of(h.period)
            folder.mkdir(parents=True, exist_ok=True)
            pq.write_table(corrections_to_arrow(h.corrections), folder / f"run-{hour:05d}.parquet")
            out.files += 1
        closed = hour < hours - open_hours
        if closed:
            write_export(
                root,
                h.period,
                h.export,
                h.start,
                h.start + HOUR_MS,
                h.start + HOUR_MS + 900_000,
                h.export_not_charged,
                {"flood_window_ms": 60_000, "duplicate_window_ms": 30_000},
            )
            out.files += 5
        out.clicks += len(h.outcomes)
        out.impressions += 2 * len(h.outcomes)
        out.newest_batch = max(out.newest_batch, int(h.batches.max()))
        chosen = pick.sample(range(len(h.outcomes)), picks_per_hour)
        want = rare[hour % len(rare)]
        matching = np.flatnonzero(h.quarantined if want == "quarantined" else h.outcomes == want)
        if len(matching):
            chosen.append(int(matching[pick.randrange(len(matching))]))
        ids = h.click_ids.take(pa.array(chosen)).to_pylist()
        for i, click_id in zip(chosen, ids, strict=True):
            out.truth.append(
                Truth(
                    click_id,
                    str(h.outcomes[i]),
                    hour // 24,
                    h.period,
                    int(h.batches[i]),
                    bool(h.quarantined[i]),
                    closed,
                )
            )
        if hour % 24 == 23:
            print(
                f"  day {hour // 24 + 1} written: {out.clicks:,} clicks, {out.files:,} files, "
                f"{time.monotonic() - began - aside:.0f} s",
                flush=True,
            )
            if each_day is not None and hour < hours - 1:
                paused = time.monotonic()
                each_day(hour // 24, out.newest_batch)
                aside += time.monotonic() - paused
    out.seconds = time.monotonic() - began - aside
    return out


# --- Compaction (a prototype: no lock, no check of the stream's and reconciliation's positions) -------------------


@dataclass
class Compaction:
    seconds: float = 0.0
    rows: int = 0
    files_read: int = 0
    files_written: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    read_s: float = 0.0
    """Listing and reading the files."""
    sort_write_s: float = 0.0
    """Sorting and writing the compacted file (flushed, renamed into place)."""
    remove_s: float = 0.0
    """Removing the files and folders it holds."""

    def add(self, other: Compaction) -> None:
        names = ("seconds", "rows", "files_read", "files_written", "bytes_read", "bytes_written", "read_s")
        for name in (*names, "sort_write_s", "remove_s"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


def _batch_files(folder: Path, through: int) -> list[tuple[int, Path]]:
    """(batch, file) of every Parquet file of the batch folders of `folder` up to batch `through`."""
    out = []
    for entry in os.scandir(folder):
        batch = batch_of(entry.name)
        if batch is None or batch > through or not entry.is_dir():
            continue
        for file in os.scandir(entry.path):
            if file.name.endswith(".parquet") and not file.name.startswith("."):
                out.append((batch, Path(file.path)))
    return out


def write_parquet(table: pa.Table, path: Path, row_group_rows: int | None, bloom: Sequence[str], ndv: int) -> None:
    """`table` as a snappy Parquet file of `row_group_rows` rows a row group (None: pyarrow's default), with a Bloom
    filter at 1% false positives, sized for `ndv` distinct values, on each column of `bloom`."""
    pq.write_table(
        table,
        path,
        compression="snappy",
        row_group_size=row_group_rows,
        bloom_filter_options={c: {"ndv": ndv, "fpp": 0.01} for c in bloom} or None,
    )


def compact_folder(
    folder: Path, keys: Sequence[str], through: int, row_group_rows: int, bloom: Sequence[str] = ()
) -> Compaction:
    """Compact the batch folders of `folder` (a period's, or the quarantine's) up to batch `through` into one file,
    `batch_id=M/compacted-A-M.parquet` (A, M: the first and last batch it holds), sorted by `keys`, each row's batch
    in `source_batch_id`; then remove the files it holds. Readers that take a batch from the path see M for every
    row: the same answer for any `batch_id <= X` with X >= M, and the newest batch of the period unchanged."""
    figures = Compaction()
    began = time.perf_counter()
    found = _batch_files(folder, through)
    if not found or (len(found) == 1 and found[0][1].name.startswith(COMPACTED)):
        return figures
    tables = []
    first = min(batch for batch, _ in found)
    for batch, path in found:
        table = pq.read_table(path)
        span = compacted_span(path.name)
        if span is not None:
            first = min(first, span[0])
        if SOURCE_BATCH not in table.column_names:
            table = table.append_column(SOURCE_BATCH, pa.array(np.full(table.num_rows, batch), pa.int64()))
        tables.append(table)
        figures.bytes_read += path.stat().st_size
    figures.read_s = time.perf_counter() - began
    table = pa.concat_tables(tables, promote_options="default").sort_by([(k, "ascending") for k in keys])
    last = max(batch for batch, _ in found)
    target_folder = folder / f"batch_id={last}"
    target = target_folder / f"{COMPACTED}{first}-{last}.parquet"
    staging = target_folder / f".{target.name}.tmp"
    write_parquet(table, staging, row_group_rows, bloom, row_group_rows)
    replace_files([(staging, target)], [target_folder])
    figures.sort_write_s = time.perf_counter() - began - figures.read_s
    for _, path in found:
        if path != target:
            path.unlink()
    for batch in {batch for batch, _ in found} - {last}:
        (folder / f"batch_id={batch}").rmdir()
    fsync_folder(folder)
    figures.rows = table.num_rows
    figures.files_read = len(found)
    figures.files_written = 1
    figures.bytes_written = target.stat().st_size
    figures.seconds = time.perf_counter() - began
    figures.remove_s = figures.seconds - figures.read_s - figures.sort_write_s
    return figures


def compact(layout: DataLayout, days: int, through: int, batches_per_day: int, row_group_rows: int) -> Compaction:
    """Every period's batch folders of every batched kind, up to batch `through`; the quarantine by day of receipt."""
    total = Compaction()
    for kind in (*BATCHED, ARCHIVE_IMPRESSION):
        root = kind_root(layout, kind)
        for day in range(days):
            for period in day_periods(day):
                folder = root / f"period={period}"
                if folder.is_dir():
                    bloom = ("user_id",) if kind == ARCHIVE_CLICK else ()
                    total.add(compact_folder(folder, SORT_KEYS[kind], through, row_group_rows, bloom))
    for day in range(days):
        first, last = day * batches_per_day, min(through, (day + 1) * batches_per_day - 1)
        total.add(compact_quarantine_day(layout.quarantine, first, last, row_group_rows))
    return total


def compact_quarantine_day(folder: Path, first: int, last: int, row_group_rows: int) -> Compaction:
    """The quarantine's batches `first` to `last` (one day of receipt) in one file, as `compact_folder` does."""
    if not folder.is_dir() or last < first:
        return Compaction()
    scratch = folder / f".day-{first}"
    scratch.mkdir(exist_ok=True)
    moved = []
    for entry in os.scandir(folder):
        batch = batch_of(entry.name)
        if batch is not None and first <= batch <= last:
            os.rename(entry.path, scratch / entry.name)
            moved.append(entry.name)
    if not moved:
        scratch.rmdir()
        return Compaction()
    figures = compact_folder(scratch, SORT_KEYS[QUARANTINE], last, row_group_rows)
    for entry in os.scandir(scratch):
        os.rename(entry.path, folder / entry.name)
    scratch.rmdir()
    return figures


# --- The per-day sidecar: a split-block Bloom filter of each period's click ids -------------------------------------

SIDECAR_MAGIC = b"ADBILLB1"
QUARANTINE_PART = "quarantine"


def write_sidecar(path: Path, parts: dict[str, pa.Array]) -> int:
    """One file of filters, one per part (a period, the quarantine): a header naming each part's offset and blocks,
    then the blocks; written whole (staged, renamed). Its size."""
    filters = {name: bloom_blocks(ids) for name, ids in parts.items()}
    header_parts: dict[str, list[int]] = {}
    offset = 0
    for name, words in filters.items():
        header_parts[name] = [offset, len(words)]
        offset += words.nbytes
    header = json.dumps({"hash": "fnv1a64+splitmix64", "bits_per_id": BITS_PER_ID, "parts": header_parts}).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.tmp")
    with open(staging, "wb") as out:
        out.write(SIDECAR_MAGIC + struct.pack("<I", len(header)) + header)
        for words in filters.values():
            out.write(words.tobytes())
    replace_files([(staging, path)], [path.parent])
    return path.stat().st_size


class Sidecar:
    """A day's filters, read a block at a time (the header once per process)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "rb") as handle:
            head = handle.read(12)
            if head[:8] != SIDECAR_MAGIC:
                raise ValueError(f"{path} is not a sidecar")
            length = struct.unpack("<I", head[8:])[0]
            self.parts: dict[str, list[int]] = json.loads(handle.read(length))["parts"]
            self.base = 12 + length

    def parts_with(self, click_id: str) -> set[str]:
        """The parts whose filter may hold `click_id`."""
        hashes = hash_ids(pa.array([click_id], pa.string()))
        found = set()
        fd = os.open(self.path, os.O_RDONLY)
        try:
            for name, (offset, blocks) in self.parts.items():
                block, masks = block_and_masks(hashes, blocks)
                words = np.frombuffer(os.pread(fd, 32, self.base + offset + int(block[0]) * 32), dtype=np.uint32)
                if ((words & masks[0]) == masks[0]).all():
                    found.add(name)
        finally:
            os.close(fd)
        return found


def sidecar_path(layout: DataLayout, day: int) -> Path:
    return layout.root / "index" / "click-days" / f"{day_periods(day)[0][:8]}.bloom"


def build_sidecar(layout: DataLayout, day: int, through: int, batches_per_day: int) -> tuple[int, int]:
    """The day's sidecar from its compacted files, its corrections and exports: (bytes, ids hashed). Files written
    after the compaction (batches after `through`) are not in it: a lookup reads them whatever the filter says."""
    parts: dict[str, pa.Array] = {}
    for period in day_periods(day):
        ids: list[pa.Array] = []
        for kind in BATCHED:
            folder = kind_root(layout, kind) / f"period={period}"
            for _, path in _batch_files(folder, through) if folder.is_dir() else []:
                if path.name.startswith(COMPACTED):
                    ids.append(pq.read_table(path, columns=[id_of(kind)])[id_of(kind)].combine_chunks())
        for path in files_of(layout, CORRECTION, period) + files_of(layout, EXPORT, period):
            ids.append(pq.read_table(path, columns=["click_id"])["click_id"].combine_chunks())
        if ids:
            parts[period] = pa.concat_arrays(ids)
    quarantine = [
        pq.read_table(p, columns=["event_id"])["event_id"].combine_chunks()
        for p in quarantine_files(layout, day, batches_per_day)
        if p.name.startswith(COMPACTED)
    ]
    if quarantine:
        parts[QUARANTINE_PART] = pa.concat_arrays(quarantine)
    hashed = sum(len(a) for a in parts.values())
    return write_sidecar(sidecar_path(layout, day), parts), hashed


# --- Finding a click's rows --------------------------------------------------------------------------------------


def files_of(layout: DataLayout, kind: str, period: str) -> list[Path]:
    """The Parquet files of one kind in one period (the batch folders listed)."""
    if kind in (EXPORT, EXPORT_NOT_CHARGED):
        path = layout.export(period) / (PARQUET_FILE if kind == EXPORT else NOT_CHARGED_FILE)
        return [path] if path.exists() else []
    folder = kind_root(layout, kind) / f"period={period}"
    if not folder.is_dir():
        return []
    if kind == CORRECTION:
        return [Path(e.path) for e in os.scandir(folder) if e.name.endswith(".parquet") and e.name[0] != "."]
    return [path for _, path in _batch_files(folder, sys.maxsize)]


def quarantine_files(layout: DataLayout, day: int, batches_per_day: int) -> list[Path]:
    """The quarantine's files of the batches received on `day` (its compacted file named by its span)."""
    folder = layout.quarantine
    if not folder.is_dir():
        return []
    first, last = day * batches_per_day, (day + 1) * batches_per_day - 1
    out = []
    for entry in os.scandir(folder):
        batch = batch_of(entry.name)
        if batch is None or batch < first or batch > last + batches_per_day:
            continue
        for file in os.scandir(entry.path):
            span = compacted_span(file.name) or (batch, batch)
            if file.name.endswith(".parquet") and span[0] <= last and span[1] >= first:
                out.append(Path(file.path))
    return out


LOOKUP_KINDS = (ARCHIVE_CLICK, LEDGER, UNBILLED, NOT_CHARGED, CORRECTION, EXPORT, EXPORT_NOT_CHARGED)


@dataclass
class FileFinder:
    """A click's rows from the data folder's files: pyarrow datasets or DuckDB, over every period of the day (or
    those the day's sidecar names, with `sidecar`)."""

    layout: DataLayout
    days: int
    batches_per_day: int
    engine: str = "pyarrow"
    sidecar: bool = False
    files_read: int = 0
    _sidecars: dict[int, Sidecar] = field(default_factory=dict)
    _duck: Any = None

    def plan(self, click_id: str, day: int) -> dict[str, list[Path]]:
        """The files to read, by kind."""
        filter_ = self._sidecar(day) if self.sidecar else None
        wanted = filter_.parts_with(click_id) if filter_ is not None else None
        plan: dict[str, list[Path]] = {kind: [] for kind in (*LOOKUP_KINDS, QUARANTINE)}
        for period in day_periods(day):
            hit = wanted is None or period in wanted
            for kind in LOOKUP_KINDS:
                files = files_of(self.layout, kind, period)
                if not hit:  # only what the filter does not cover: files written since the compaction
                    files = [f for f in files if kind in BATCHED and not f.name.startswith(COMPACTED)]
                plan[kind] += files
        quarantine = quarantine_files(self.layout, day, self.batches_per_day)
        if wanted is not None and QUARANTINE_PART not in wanted:
            quarantine = [f for f in quarantine if not f.name.startswith(COMPACTED)]
        plan[QUARANTINE] = quarantine
        return plan

    def _sidecar(self, day: int) -> Sidecar | None:
        if day not in self._sidecars:
            path = sidecar_path(self.layout, day)
            if not path.exists():
                return None
            self._sidecars[day] = Sidecar(path)
        return self._sidecars[day]

    def find(self, click_id: str, day: int | None) -> list[dict[str, Any]]:
        """The rows naming `click_id` in its day, or, without one, in the newest day that has any."""
        for d in [day] if day is not None else range(self.days - 1, -1, -1):
            rows = []
            for kind, files in self.plan(click_id, d).items():
                if files:
                    self.files_read += len(files)
                    rows += self._read(kind, files, click_id)
            if rows:
                return rows
        return []

    def _read(self, kind: str, files: list[Path], click_id: str) -> list[dict[str, Any]]:
        column = id_of(kind)
        if self.engine == "duckdb":
            return self._duckdb(kind, files, column, click_id)
        schema = pq.read_schema(files[-1])
        if kind in BATCHED or kind == QUARANTINE:
            if SOURCE_BATCH not in schema.names:
                schema = schema.append(pa.field(SOURCE_BATCH, pa.int64()))
            schema = pa.schema([f for f in schema if f.name != "value"])
        dataset = ds.dataset([str(f) for f in files], schema=schema, format="parquet")
        rows = []
        for tagged in dataset.scanner(filter=ds.field(column) == click_id, columns=schema.names).scan_batches():
            if tagged.record_batch.num_rows:
                for row in tagged.record_batch.to_pylist():
                    rows.append(_row(kind, tagged.fragment.path, row))
        return rows

    def _duckdb(self, kind: str, files: list[Path], column: str, click_id: str) -> list[dict[str, Any]]:
        import duckdb

        if self._duck is None:
            self._duck = duckdb.connect()
        out = []
        # Files of one layout per query: a compacted file has a column more than the batch files beside it.
        groups: dict[bool, list[str]] = {}
        for f in files:
            groups.setdefault(f.name.startswith(COMPACTED), []).append(str(f))
        exclude = " EXCLUDE (value)" if kind in (ARCHIVE_CLICK, QUARANTINE) else ""
        for paths in groups.values():
            cursor = self._duck.execute(
                f"SELECT *{exclude} FROM read_parquet($files, filename = true, hive_partitioning = false) "  # nosec B608: constants
                f"WHERE {column} = $id",
                {"files": paths, "id": click_id},
            )
            names = [d[0] for d in cursor.description]
            for values in cursor.fetchall():
                row = dict(zip(names, values, strict=True))
                out.append(_row(kind, row.pop("filename"), row))
        return out


def _row(kind: str, path: str, row: dict[str, Any]) -> dict[str, Any]:
    """A row found, with its kind, file and the batch that wrote it (its column, else its folder)."""
    batch = row.pop(SOURCE_BATCH, None)
    if batch is None:
        batch = next((batch_of(p) for p in Path(path).parts if p.startswith("batch_id=")), None)
    return {**row, "found_in": kind, "file": path, "batch_id": batch}


def check(truth: Truth, rows: Sequence[dict[str, Any]]) -> str | None:
    """What is wrong with the rows found for a click (None: exactly what was written)."""
    found = Counter(r["found_in"] for r in rows)
    if found != truth.expected():
        return f"{truth.click_id} ({truth.outcome}): found {dict(found)}, written {dict(truth.expected())}"
    for r in rows:
        if r["found_in"] in BATCHED and r["batch_id"] != truth.batch:
            return f"{truth.click_id}: {r['found_in']} row of batch {r['batch_id']}, written by batch {truth.batch}"
    return None


def time_lookups(
    find: Callable[[str, int | None], list[dict[str, Any]]],
    truths: Sequence[Truth],
    with_day: bool,
    absent: Sequence[str] = (),
) -> dict[str, Any]:
    """Lookups of each click (with its day, or without), checked; then ids that are nowhere (without a day only)."""
    times: list[float] = []
    wrong: list[str] = []
    for truth in truths:
        began = time.perf_counter()
        rows = find(truth.click_id, truth.day if with_day else None)
        times.append(time.perf_counter() - began)
        problem = check(truth, rows)
        if problem:
            wrong.append(problem)
    out: dict[str, Any] = {**timing(times), "wrong": len(wrong), "wrong_examples": wrong[:3]}
    if absent:
        missing = []
        for click_id in absent:
            began = time.perf_counter()
            rows = find(click_id, None)
            missing.append(time.perf_counter() - began)
            if rows:
                out["wrong"] += 1
        out["absent"] = timing(missing)
    return out


# --- The run ------------------------------------------------------------------------------------------------------


def data_figures(layout: DataLayout, days: int) -> dict[str, Any]:
    """Bytes and files of every kind of data, and the files of the first (closed) day."""
    kinds = {
        "archive": layout.archive,
        "ledger": layout.ledger,
        "unbilled": layout.unbilled,
        "not_charged": layout.not_charged,
        "quarantine": layout.quarantine,
        "corrections": layout.corrections,
        "exports": layout.exports,
    }
    out: dict[str, Any] = {}
    total_bytes = 0
    for name, folder in kinds.items():
        size, files = folder_bytes(folder) if folder.exists() else (0, 0)
        out[name] = {"bytes": size, "files": files}
        total_bytes += size
    out["bytes"] = total_bytes
    first_day = 0
    for kind in (*BATCHED, ARCHIVE_IMPRESSION, CORRECTION):
        for period in day_periods(0):
            folder = kind_root(layout, kind) / f"period={period}"
            first_day += folder_bytes(folder)[1] if folder.exists() else 0
    for period in day_periods(0):
        first_day += folder_bytes(layout.export(period))[1] if layout.export(period).exists() else 0
    out["files_of_day_1_but_quarantine"] = first_day
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {"args": vars(args), "load_average_before": os.getloadavg()}
    if args.full_period_clicks:
        report["full_period"] = full_period(args)
    if args.postgres_rows:
        report["postgres"] = postgres_table(args)
    if not args.days:
        report["load_average_after"] = os.getloadavg()
        return report
    root = Path(args.folder) if args.folder else Path(tempfile.mkdtemp(prefix="story-options-", dir=args.scratch))
    try:
        report.update(measure_days(args, root))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    report["load_average_after"] = os.getloadavg()
    return report


def measure_days(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    report: dict[str, Any] = {"folder": str(root)}
    options = set(args.options.split(","))
    layout = DataLayout(root)
    print(f"writing {args.days} day(s) of {args.clicks_per_day:,} clicks to {root}", flush=True)
    daily = DailyClosing(layout, args.tail_batches) if args.close_daily else None
    written = write_days(
        root,
        args.days,
        args.clicks_per_day,
        args.batches_per_hour,
        args.tasks,
        args.picks_per_hour,
        each_day=daily,
    )
    clicks = written.clicks
    report["written"] = {
        "clicks": clicks,
        "impressions": written.impressions,
        "files": written.files,
        "seconds": round(written.seconds, 1),
        "newest_batch": written.newest_batch,
        "data": data_figures(layout, args.days),
    }
    print(f"written in {written.seconds:.0f} s: {written.files:,} files", flush=True)
    rng = random.Random(args.seed)
    truths = rng.sample(written.truth, min(args.lookups, len(written.truth)))
    slow = truths[: args.slow_lookups]
    absent = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(args.absent)]
    batches_per_day = args.batches_per_hour * 24
    figures: dict[str, Any] = {}
    report["options"] = figures

    def lookups(name: str, finder: FileFinder, sample: Sequence[Truth]) -> None:
        read = getattr(finder, "files_read", 0)
        day = time_lookups(finder.find, sample, with_day=True)
        day["files_read_per_lookup"] = round((getattr(finder, "files_read", 0) - read) / max(1, len(sample)))
        no_day = time_lookups(
            finder.find,
            sample,
            with_day=False,
            absent=absent[: max(1, len(absent) * len(sample) // max(1, len(truths)))],
        )
        figures.setdefault(name, {}).update({"with_day": day, "without_day": no_day})
        print(
            f"{name}: with the day p50 {day['p50_ms']} p95 {day['p95_ms']} max {day['max_ms']} ms "
            f"({day['files_read_per_lookup']} files); without p50 {no_day['p50_ms']} p95 {no_day['p95_ms']} max "
            f"{no_day['max_ms']} ms, absent {no_day.get('absent', {}).get('p50_ms')} ms; wrong "
            f"{day['wrong'] + no_day['wrong']}",
            flush=True,
        )

    def finder_lookups(names: tuple[str, str], sample: Sequence[Truth], sidecar: bool = False) -> None:
        """`lookups` through a FileFinder with pyarrow, then with DuckDB, named by `names`: each that `--options`
        asks for (with `sidecar`, both: the sidecar's option asks for them)."""
        for engine, name in zip(("pyarrow", "duckdb"), names, strict=True):
            if sidecar or name in options:
                lookups(name, FileFinder(layout, args.days, batches_per_day, engine, sidecar=sidecar), sample)

    finder_lookups(("files", "duckdb-files"), slow)
    through = written.newest_batch - args.tail_batches
    if "product" in options:
        figures["product"] = measure_product(layout, through, clicks, truths, absent, daily)
        return report
    if daily is not None:
        raise SystemExit("--close-daily is for --options product")
    if options & {"compacted", "duckdb-compacted", "sidecar"}:
        before = report["written"]["data"]
        compaction = compact(layout, args.days, through, batches_per_day, args.row_group_rows)
        after = data_figures(layout, args.days)
        figures["compacted"] = {
            "through_batch": through,
            "seconds": round(compaction.seconds, 1),
            "us_per_click": round(compaction.seconds / clicks * 1e6, 2),
            "rows": compaction.rows,
            "files_read": compaction.files_read,
            "files_written": compaction.files_written,
            "bytes_read": compaction.bytes_read,
            "bytes_written": compaction.bytes_written,
            "read_ms_per_file": round(compaction.read_s / max(1, compaction.files_read) * 1000, 2),
            "remove_ms_per_file": round(compaction.remove_s / max(1, compaction.files_read) * 1000, 2),
            "sort_write_us_per_row": round(compaction.sort_write_s / max(1, compaction.rows) * 1e6, 2),
            "data_bytes_before": before["bytes"],
            "data_bytes_after": after["bytes"],
            "files_of_day_1_before": before["files_of_day_1_but_quarantine"],
            "files_of_day_1_after": after["files_of_day_1_but_quarantine"],
            "data_after": after,
        }
        print(
            f"compacted in {compaction.seconds:.0f} s ({compaction.files_read:,} files into "
            f"{compaction.files_written:,}); day 1: {after['files_of_day_1_but_quarantine']:,} files",
            flush=True,
        )
        finder_lookups(("compacted", "duckdb-compacted"), truths)
        if "sidecar" in options:
            began = time.monotonic()
            size = hashed = 0
            for day in range(args.days):
                made, count = build_sidecar(layout, day, through, batches_per_day)
                size += made
                hashed += count
            seconds = time.monotonic() - began
            figures["sidecar"] = {
                "build_s": round(seconds, 1),
                "build_us_per_click": round(seconds / clicks * 1e6, 2),
                "bytes": size,
                "bytes_per_click": round(size / clicks, 2),
                "ids_hashed": hashed,
            }
            print(f"sidecars: {seconds:.1f} s, {size / 1e6:.1f} MB", flush=True)
            finder_lookups(("sidecar", "duckdb-sidecar"), truths, sidecar=True)
    return report


class CountingClickFiles(ClickFiles):
    """The product's finder, counting the files its lookups read, by kind."""

    files_read = 0

    def __init__(self, layout: DataLayout) -> None:
        super().__init__(layout)
        self.by_kind: Counter[str] = Counter()

    def _located(self, kind: str, files: Callable[[], Sequence[Path]], click_id: str) -> list[Located]:
        def counted() -> Sequence[Path]:
            listed = files()
            self.files_read += len(listed)
            self.by_kind[kind] += len(listed)
            return listed

        return super()._located(kind, counted, click_id)


def drop_page_cache() -> bool:
    """Write the dirty pages and drop the page cache (Linux, root only); whether it was dropped."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


class DailyClosing:
    """The closed pass run after each day is written (`--close-daily`), as reconciliation closes periods while the
    stream writes the next ones: the data folder never holds more than about a day as written, and the passes' work
    and time add up to what one pass at the end would report."""

    def __init__(self, layout: DataLayout, tail_batches: int) -> None:
        self.layout = layout
        self.tail_batches = tail_batches
        self.report = CompactionReport(label="closed pass")
        self.seconds = 0.0
        self.first_day: dict[str, Any] | None = None
        """The data folder after the first day was written, before any pass."""

    def __call__(self, day: int, newest_batch: int) -> None:
        if self.first_day is None:
            self.first_day = data_figures(self.layout, 1)
        closed = sorted(ClickFiles(self.layout).closed_periods())
        began = time.monotonic()
        done = closed_pass(self.layout, closed, newest_batch - self.tail_batches)
        self.report.through = done.through
        self.report.add(done)
        self.seconds += time.monotonic() - began
        free = shutil.disk_usage(self.layout.root).free
        print(
            f"  day {day + 1} closed: {time.monotonic() - began:.0f} s ({self.seconds:.0f} s in all), "
            f"{free / 1e9:.0f} GB free",
            flush=True,
        )


def measure_product(
    layout: DataLayout,
    through: int,
    clicks: int,
    truths: Sequence[Truth],
    absent: Sequence[str],
    daily: DailyClosing | None = None,
) -> dict[str, Any]:
    """The product's own path over the data folder: its compaction of the closed periods and the quarantine
    (`compact_closed`, `compact_quarantine`, as a reconciliation run's closed pass), the open periods' pass, its day
    filters (`ClickFiles.write_filters`), and its finder (`ClickFiles.rows_of`, `read_located`) timed with the day,
    without it (newest first) and for ids that are nowhere, each lookup checked against what was written; the same
    lookups without the filters, for the difference they make. Each set of lookups runs on a cold page cache (dropped
    first, where the process is root) and the filters' again at once on a warm one."""
    finder = CountingClickFiles(layout)
    closed = sorted(finder.closed_periods())
    before = data_figures(layout, 1)
    began = time.monotonic()
    compaction = closed_pass(layout, closed, through)
    compact_s = time.monotonic() - began
    if daily is not None:  # the passes after each day, then this one: the same work as one pass at the end
        daily.report.through = compaction.through
        compaction = daily.report.add(compaction)
        compact_s += daily.seconds
        before = daily.first_day or before
    after = data_figures(layout, 1)
    print(f"product compaction: {compact_s:.0f} s, {compaction.describe()}", flush=True)
    began = time.monotonic()  # the open periods, as `adbill reconcile --every` keeps them between its runs
    opened = open_pass(layout, open_periods(layout, closed), through)
    open_s = time.monotonic() - began
    print(f"product open pass: {open_s:.0f} s, {opened.describe()}", flush=True)
    began = time.monotonic()
    hashed = finder.write_filters(closed)
    chunks = finder.refresh_chunk_filters()  # the quarantine's and released/'s compacted chunks
    filters_s = time.monotonic() - began
    filter_bytes = sum(p.stat().st_size for p in layout.click_day_filters.glob("*.bloom"))
    print(
        f"product filters: {filters_s:.1f} s, {hashed:,} ids, {chunks} quarantine chunk(s), "
        f"{filter_bytes / 1e6:.1f} MB",
        flush=True,
    )
    out: dict[str, Any] = {
        "through_batch": through,
        "closed_periods": len(closed),
        "compaction_s": round(compact_s, 1),
        "compaction_us_per_click": round(compact_s / clicks * 1e6, 2),
        "compaction": compaction.describe(),
        "open_pass_s": round(open_s, 1),
        "open_pass": opened.describe(),
        "files_of_day_1_before": before["files_of_day_1_but_quarantine"],
        "files_of_day_1_after": after["files_of_day_1_but_quarantine"],
        "data_bytes_after": after["bytes"],
        "filters_s": round(filters_s, 1),
        "filters_us_per_click": round(filters_s / clicks * 1e6, 2),
        "filter_ids_hashed": hashed,
        "chunk_filters": chunks,
        "filter_bytes": filter_bytes,
        "filter_bytes_per_click": round(filter_bytes / clicks, 2),
    }
    if daily is not None:
        out["closed_daily"] = True
        out["data_of_day_1_as_written"] = daily.first_day

    def find_with(files: CountingClickFiles) -> Callable[[str, int | None], list[dict[str, Any]]]:
        def find(click_id: str, day: int | None) -> list[dict[str, Any]]:
            date = None if day is None else dt.datetime.strptime(day_periods(day)[0][:8], "%Y%m%d").date()
            return read_located(files.rows_of(click_id, date))

        return find

    no_filters = CountingClickFiles(layout)
    no_filters.filters.of = lambda day: None  # type: ignore[method-assign]  # the same finder, every period read
    # Cold: the page cache dropped first where this process may (root), as a lookup of a click nobody read lately
    # meets it; warm: the same lookups again at once.
    for name, files, cold in (
        ("filters", finder, True),
        ("filters_warm", finder, False),
        ("no_filters", no_filters, True),
    ):
        dropped = drop_page_cache() if cold else False
        read, files.by_kind = files.files_read, Counter()
        with_day = time_lookups(find_with(files), truths, with_day=True)
        with_day["files_read_per_lookup"] = round((files.files_read - read) / max(1, len(truths)), 1)
        with_day["files_by_kind"] = {k: round(n / max(1, len(truths)), 1) for k, n in sorted(files.by_kind.items())}
        read, files.by_kind = files.files_read, Counter()
        if cold:
            drop_page_cache()
        without = time_lookups(find_with(files), truths, with_day=False, absent=absent)
        lookups_made = max(1, len(truths) + len(absent))
        without["files_read_per_lookup"] = round((files.files_read - read) / lookups_made, 1)
        without["files_by_kind"] = {k: round(n / lookups_made, 1) for k, n in sorted(files.by_kind.items())}
        out[name] = {"with_day": with_day, "without_day": without, "cache_dropped": dropped}
        print(
            f"product finder, {name}{' (page cache dropped)' if dropped else ''}: with the day p50 "
            f"{with_day['p50_ms']} p95 {with_day['p95_ms']} max {with_day['max_ms']} ms "
            f"({with_day['files_read_per_lookup']} files); without p50 {without['p50_ms']} "
            f"p95 {without['p95_ms']} max {without['max_ms']} ms ({without['files_read_per_lookup']} files), absent "
            f"{without.get('absent', {}).get('p50_ms')} ms; wrong {with_day['wrong'] + without['wrong']}; files a "
            f"lookup with the day {with_day['files_by_kind']}, without {without['files_by_kind']}",
            flush=True,
        )
    return out


# --- One period at full scale --------------------------------------------------------------------------------------


def full_period(args: argparse.Namespace) -> dict[str, Any]:
    """One hour of `--full-period-clicks` clicks written as compaction writes a closed period (archive clicks by id
    with a Bloom filter on `user_id`, impressions by user and time, the ledger by click id and, again, by campaign
    and time with a Bloom filter on `click_id`) and its export (as written, and in smaller row groups), then
    queried with pyarrow and DuckDB (module doc, 3)."""
    import duckdb

    folder = Path(tempfile.mkdtemp(prefix="story-period-", dir=args.scratch))
    out: dict[str, Any] = {"clicks": args.full_period_clicks, "row_group_rows": args.row_group_rows}
    try:
        rng = np.random.default_rng(args.seed)
        began = time.perf_counter()
        hour = make_hour(rng, Ads.generated(args.seed), 0, args.full_period_clicks, 20_000_000, 1_000, 0.001)
        out["generate_s"] = round(time.perf_counter() - began, 1)
        archive = hour.archive.append_column(SOURCE_BATCH, hour.archive["batch_id"])
        archive = archive.drop_columns(["event_type", "period", "batch_id"])
        is_click = pc.starts_with(archive["topic"], "click")
        tables = {
            ARCHIVE_CLICK: archive.filter(is_click),
            ARCHIVE_IMPRESSION: archive.filter(pc.invert(is_click)),
            LEDGER: hour.ledger.rename_columns(
                [SOURCE_BATCH if c == "batch_id" else c for c in hour.ledger.column_names]
            ).drop_columns(["period"]),
        }
        export = hour.export
        del archive, hour
        paths: dict[str, Path] = {}
        rg = args.row_group_rows
        # Each file: (name, table, sort keys, Bloom filter columns, rows a row group). The export as `write_export`
        # writes it (pyarrow's default row groups; an export is never rewritten), and as it could be written.
        layouts: list[tuple[str, pa.Table, Sequence[str], Sequence[str], int | None]] = [
            (EXPORT, export, (), (), None),
            ("export_small_row_groups", export, (), (), rg),
            (ARCHIVE_CLICK, tables[ARCHIVE_CLICK], SORT_KEYS[ARCHIVE_CLICK], ("user_id",), rg),
            (ARCHIVE_IMPRESSION, tables[ARCHIVE_IMPRESSION], SORT_KEYS[ARCHIVE_IMPRESSION], (), rg),
            (LEDGER, tables[LEDGER], SORT_KEYS[LEDGER], (), rg),
            ("ledger_by_campaign", tables[LEDGER], ("campaign_id", "click_time"), ("click_id",), rg),
        ]
        for name, table, keys, bloom, rows in layouts:
            began = time.perf_counter()
            ordered = table.sort_by([(k, "ascending") for k in keys]) if keys else table
            path = folder / f"{name}.parquet"
            write_parquet(ordered, path, rows, bloom, rg)
            seconds = time.perf_counter() - began
            paths[name] = path
            meta = pq.ParquetFile(path).metadata
            out[name] = {
                "rows": table.num_rows,
                "bytes": path.stat().st_size,
                "bytes_per_row": round(path.stat().st_size / table.num_rows, 1),
                "sort_write_s": round(seconds, 1),
                "sort_write_us_per_row": round(seconds / table.num_rows * 1e6, 2),
                "row_groups": meta.num_row_groups,
                "footer_bytes": meta.serialized_size,
            }
        del export, layouts, ordered
        clicks = tables[ARCHIVE_CLICK]
        pick = random.Random(args.seed)
        sample = [pick.randrange(clicks.num_rows) for _ in range(args.lookups)]
        ids = clicks["event_id"].take(pa.array(sample)).to_pylist()
        users = clicks["user_id"].take(pa.array(sample)).to_pylist()
        ads = clicks["ad_id"].take(pa.array(sample)).to_pylist()
        times = clicks["event_time"].take(pa.array(sample)).to_pylist()
        ledger = tables[LEDGER]
        campaigns = ledger["campaign_id"].take(pa.array([pick.randrange(ledger.num_rows) for _ in sample])).to_pylist()
        del tables, clicks, ledger
        con = duckdb.connect()

        def timed(run_one: Callable[[int], Any]) -> dict[str, float]:
            spent = []
            for i in range(len(sample)):
                began = time.perf_counter()
                run_one(i)
                spent.append(time.perf_counter() - began)
            return timing(spent)

        def arrow(kind: str, expression: Any, columns: list[str] | None = None) -> pa.Table:
            return ds.dataset(str(paths[kind]), format="parquet").to_table(filter=expression, columns=columns)

        def duck(kind: str, where: str, params: list[Any], select: str = "* EXCLUDE (value)") -> Any:
            return con.execute(
                f"SELECT {select} FROM read_parquet('{paths[kind]}') WHERE {where}",  # nosec B608: constants
                params,
            ).fetchall()

        click_cols = [c for c in pq.read_schema(paths[ARCHIVE_CLICK]).names if c != "value"]
        out["footer_read"] = timed(lambda i: pq.ParquetFile(paths[ARCHIVE_CLICK]).metadata)
        out["id_lookup_pyarrow"] = timed(lambda i: arrow(ARCHIVE_CLICK, ds.field("event_id") == ids[i], click_cols))
        out["id_lookup_duckdb"] = timed(lambda i: duck(ARCHIVE_CLICK, "event_id = ?", [ids[i]]))
        out["ledger_id_lookup_pyarrow"] = timed(lambda i: arrow(LEDGER, ds.field("click_id") == ids[i]))
        out["ledger_id_lookup_duckdb"] = timed(lambda i: duck(LEDGER, "click_id = ?", [ids[i]], "*"))
        out["export_id_lookup_pyarrow"] = timed(lambda i: arrow(EXPORT, ds.field("click_id") == ids[i]))
        out["export_id_lookup_duckdb"] = timed(lambda i: duck(EXPORT, "click_id = ?", [ids[i]], "*"))
        small = "export_small_row_groups"
        out["export_small_row_groups_lookup_pyarrow"] = timed(lambda i: arrow(small, ds.field("click_id") == ids[i]))
        out["export_small_row_groups_lookup_duckdb"] = timed(lambda i: duck(small, "click_id = ?", [ids[i]], "*"))
        by_campaign = "ledger_by_campaign"
        out["ledger_by_campaign_id_lookup_pyarrow"] = timed(
            lambda i: arrow(by_campaign, ds.field("click_id") == ids[i])
        )
        out["ledger_by_campaign_id_lookup_duckdb"] = timed(lambda i: duck(by_campaign, "click_id = ?", [ids[i]], "*"))
        out["ledger_by_campaign_before_duckdb"] = timed(
            lambda i: duck(
                by_campaign,
                "campaign_id = ? AND click_time < ?",
                [campaigns[i], times[i]],
                "count(*), sum(amount_micros)",
            )
        )
        window = 60_000
        out["user_clicks_pyarrow"] = timed(
            lambda i: arrow(
                ARCHIVE_CLICK,
                (ds.field("user_id") == users[i])
                & (ds.field("event_time") >= times[i] - window)
                & (ds.field("event_time") <= times[i] + window),
                click_cols,
            )
        )
        out["user_clicks_duckdb"] = timed(
            lambda i: duck(
                ARCHIVE_CLICK,
                "user_id = ? AND event_time BETWEEN ? AND ?",
                [users[i], times[i] - window, times[i] + window],
            )
        )
        out["impressions_pyarrow"] = timed(
            lambda i: arrow(
                ARCHIVE_IMPRESSION,
                (ds.field("user_id") == users[i])
                & (ds.field("ad_id") == ads[i])
                & (ds.field("event_time") >= times[i] - 60_000)
                & (ds.field("event_time") <= times[i] + 10_000),
                click_cols,
            )
        )
        out["impressions_duckdb"] = timed(
            lambda i: duck(
                ARCHIVE_IMPRESSION,
                "user_id = ? AND ad_id = ? AND event_time BETWEEN ? AND ?",
                [users[i], ads[i], times[i] - 60_000, times[i] + 10_000],
            )
        )
        out["campaign_before_pyarrow"] = timed(
            lambda i: pc.sum(
                arrow(
                    LEDGER,
                    (ds.field("campaign_id") == campaigns[i]) & (ds.field("click_time") < times[i]),
                    ["amount_micros"],
                )["amount_micros"]
            )
        )
        out["campaign_before_duckdb"] = timed(
            lambda i: duck(
                LEDGER, "campaign_id = ? AND click_time < ?", [campaigns[i], times[i]], "count(*), sum(amount_micros)"
            )
        )
        began = time.perf_counter()
        every = pq.read_table(paths[ARCHIVE_CLICK], columns=["event_id"])["event_id"]
        read_s = time.perf_counter() - began
        began = time.perf_counter()
        size = write_sidecar(folder / "day.bloom", {"20260101T0000Z": every})
        build_s = time.perf_counter() - began
        sidecar = Sidecar(folder / "day.bloom")
        out["sidecar"] = {
            "ids": len(every),
            "read_ids_us_per_id": round(read_s / len(every) * 1e6, 3),
            "build_us_per_id": round(build_s / len(every) * 1e6, 3),
            "bytes_per_id": round(size / len(every), 2),
            "probe": timed(lambda i: sidecar.parts_with(ids[i])),
            "false_positives_in_10000": sum(
                bool(sidecar.parts_with(str(uuid.UUID(int=pick.getrandbits(128), version=4)))) for _ in range(10_000)
            ),
        }
        for name, value in out.items():
            print(f"full period: {name}: {value}", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return out


def postgres_table(args: argparse.Namespace) -> dict[str, Any]:
    """A PostgreSQL table of click id -> period start (`--postgres-rows` random ids, COPY in 100,000 at a time):
    its bytes per row with its primary key, the rate it is filled at, the lookup of one id. On `--database-url`, or
    on a server of its own started in `--scratch` (`ops.postgres_service.LocalPostgres`) and stopped after."""
    import psycopg

    from ops.postgres_service import LocalPostgres
    from ops.process import free_port

    server = None
    folder = Path(args.scratch) / f"story-options-pg-{os.getpid()}"
    url = args.database_url
    out: dict[str, Any] = {"rows": args.postgres_rows}
    try:
        if url is None:
            folder.mkdir(parents=True)
            folder.chmod(0o755)  # the server's own user goes through it when this runs as root
            server = LocalPostgres(folder / "data", free_port(), folder / "run")
            server.start()
            url = server.url
        rng = np.random.default_rng(args.seed)
        with psycopg.connect(url, autocommit=True) as db:
            db.execute("DROP TABLE IF EXISTS story_click_periods")
            db.execute("CREATE TABLE story_click_periods (click_id text PRIMARY KEY, period_start bigint NOT NULL)")
            spent = 0.0
            sample: list[str] = []
            for first in range(0, args.postgres_rows, 100_000):
                count = min(100_000, args.postgres_rows - first)
                ids = random_ids(rng, count).to_pylist()
                starts = (T0 + rng.integers(0, 90 * 24, count) * HOUR_MS).tolist()
                sample += ids[:: max(1, count // 10)]
                began = time.perf_counter()
                with db.transaction(), db.cursor().copy("COPY story_click_periods FROM STDIN") as copy:
                    for row in zip(ids, starts, strict=True):
                        copy.write_row(row)
                spent += time.perf_counter() - began
            size = db.execute("SELECT pg_total_relation_size('story_click_periods')").fetchone()
            times = []
            for click_id in sample[: args.lookups]:
                began = time.perf_counter()
                db.execute("SELECT period_start FROM story_click_periods WHERE click_id = %s", (click_id,)).fetchone()
                times.append(time.perf_counter() - began)
            db.execute("DROP TABLE story_click_periods")
        bytes_ = int(size[0]) if size else 0
        out.update(
            {
                "copy_s": round(spent, 1),
                "rows_per_s": round(args.postgres_rows / spent),
                "bytes": bytes_,
                "bytes_per_row": round(bytes_ / args.postgres_rows, 1),
                "lookup": timing(times),
            }
        )
        print(f"postgres: {out}", flush=True)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(folder, ignore_errors=True)
    return out


def summary(report: dict[str, Any]) -> str:
    """The options as a table (Markdown)."""
    lines = [
        "| option | with day p50 / p95 / max ms | without day p50 / p95 / max ms | absent id ms | wrong | files read "
        "with the day | build or keep-up |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    options = report.get("options", {})
    for name, o in options.items():
        if "with_day" not in o:
            continue
        d, n = o["with_day"], o["without_day"]
        cost = (
            f"{o['build_us_per_click']} us/click"
            if "build_us_per_click" in o
            else f"{options['compacted']['us_per_click']} us/click (compaction)"
            if "compacted" in name
            else "none"
        )
        lines.append(
            f"| {name} | {d['p50_ms']} / {d['p95_ms']} / {d['max_ms']} | {n['p50_ms']} / {n['p95_ms']} / "
            f"{n['max_ms']} | {n.get('absent', {}).get('p50_ms')} | {d['wrong'] + n['wrong']} | "
            f"{d.get('files_read_per_lookup')} | {cost} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--days", type=int, default=2)
    parser.add_argument("--clicks-per-day", type=int, default=1_000_000)
    parser.add_argument("--batches-per-hour", type=int, default=360, help="3600: the job's 1 s trigger")
    parser.add_argument("--tasks", type=int, default=1, help="archive files per batch folder (the job: one a task)")
    parser.add_argument("--picks-per-hour", type=int, default=2, help="clicks an hour whose truth is kept")
    parser.add_argument("--lookups", type=int, default=40)
    parser.add_argument("--slow-lookups", type=int, default=3, help="lookups of the options over the files as written")
    parser.add_argument("--absent", type=int, default=4, help="ids that are nowhere, looked up without a day")
    parser.add_argument(
        "--tail-batches",
        type=int,
        default=0,
        help="newest batches left as written (0: the open pass's interval, ADBILL_COMPACT_INTERVAL_S's 120 s)",
    )
    parser.add_argument("--row-group-rows", type=int, default=65_536)
    parser.add_argument(
        "--options",
        default="duckdb-files,compacted,duckdb-compacted,sidecar",
        help="of files, duckdb-files, compacted, duckdb-compacted, sidecar (files takes minutes); or product alone: "
        "the product's compaction, day filters and finder (billing.store.click_files), with and without the filters",
    )
    parser.add_argument("--full-period-clicks", type=int, default=0, help="4166667: an hour at 100 M clicks a day")
    parser.add_argument("--postgres-rows", type=int, default=0, help="ids in a PostgreSQL table of click periods")
    parser.add_argument("--database-url", help="the PostgreSQL server for --postgres-rows (default: one started here)")
    parser.add_argument(
        "--close-daily",
        action="store_true",
        help="run the closed pass after each day is written (with --options product): about a day as written on disk",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--scratch", default=str(PROJECT_ROOT / "var"), help="where the data folder is made")
    parser.add_argument("--folder", help="the data folder to write (default: a new one in --scratch)")
    parser.add_argument("--keep", action="store_true", help="keep the data folder")
    args = parser.parse_args(argv)
    if not args.tail_batches:
        # The most a lookup meets: the open pass runs every `compact_interval_s` and takes the batches up to then.
        args.tail_batches = max(1, args.batches_per_hour * ReconcileConfig.compact_interval_s // 3600)
    report = run(args)
    out = PROJECT_ROOT / "var" / "bench" / f"story-options-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str))
    print(summary(report))
    print(f"report: {out}")
    wrong = sum(
        o["with_day"]["wrong"] + o["without_day"]["wrong"]
        for o in report.get("options", {}).values()
        if "with_day" in o
    )
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
