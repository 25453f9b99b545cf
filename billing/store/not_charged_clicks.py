"""Adapter: the billable clicks that were not charged, one row each, as people look them up (the web's list).

A closed period's come from its export's `not_charged.parquet` (final: what finance was given); an open period's from
the stream's `not_charged/period=P/batch_id=N/` files (provisional: reconciliation may still find more, or fewer, and
writes what differs as corrections, listed with the corrections). A period is closed here when its export is written
(`billing.store.export_files.write_export`, at the close).

A reconciliation run reads the stream's verdicts of the periods it reconciles (`not_charged_by_stream`, and the clicks
the stream could not price, `unbilled_by_stream`), to tell what it changes from what the stream decided.

The open periods' batch files are compacted while the web reads them (`billing.store.compaction.compact_open`, no
lock here): each reader lists them through `read_listed`, which skips the batch files a compacted file beside them
holds and lists again when a file listed is gone before it is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from billing.layout import DataLayout
from billing.periods import Periods
from billing.store.compaction import read_listed
from billing.store.export_files import MANIFEST_FILE, read_not_charged

COLUMNS = ("click_id", "click_time", "ad_id", "campaign_id", "advertiser_id", "reason", "amount_micros", "currency")


@dataclass(frozen=True, slots=True)
class NotChargedClick:
    """A billable click not charged: when, on which ad, why, and what it would have cost (integer micros in
    `currency`; None when it had no price)."""

    period: str
    click_id: str
    click_time: int
    ad_id: str
    campaign_id: str
    advertiser_id: str
    reason: str
    amount_micros: int | None
    currency: str
    final: bool
    """True when read from the closed period's export; False: the stream's decision, the period still open."""


def not_charged_clicks(
    layout: DataLayout, periods: Periods, advertiser_id: str, start_ms: int, end_ms: int
) -> list[NotChargedClick]:
    """The advertiser's not-charged clicks of the periods that start in [start_ms, end_ms), newest first."""
    exported = {
        folder.name
        for folder in (layout.exports.iterdir() if layout.exports.is_dir() else [])
        if (folder / MANIFEST_FILE).is_file() and _within(periods, folder.name, start_ms, end_ms)
    }
    out: list[NotChargedClick] = []
    for period in sorted(exported):
        table = read_not_charged(layout.export(period))
        out += _clicks(table.filter(pc.equal(table["advertiser_id"], advertiser_id)), period, final=True)
    out += _stream(layout.not_charged, periods, advertiser_id, start_ms, end_ms, exported)
    return sorted(out, key=lambda c: (-c.click_time, c.click_id))


def _stream(
    folder: Path, periods: Periods, advertiser_id: str, start_ms: int, end_ms: int, exported: set[str]
) -> list[NotChargedClick]:
    """The open periods' clicks the stream did not charge; a click written by two batches (a replay) once."""
    keys = [
        p.name.removeprefix("period=")
        for p in (folder.glob("period=*") if folder.is_dir() else [])
        if p.name.removeprefix("period=") not in exported
    ]
    keys = [k for k in keys if _within(periods, k, start_ms, end_ms)]
    if not keys:
        return []
    table = stream_rows(folder, keys, [*COLUMNS, "period"], pc.field("advertiser_id") == advertiser_id)
    if not table.num_columns:
        return []
    seen: set[str] = set()
    out = []
    for period in sorted(keys):
        for click in _clicks(table.filter(pc.equal(table["period"], period)), period, final=False):
            if click.click_id not in seen:
                seen.add(click.click_id)
                out.append(click)
    return out


def stream_rows(folder: Path, keys: list[str], columns: list[str], where: pc.Expression | None = None) -> pa.Table:
    """`columns` of the rows `where` of the batch files of the periods `keys` under `folder` (`not_charged/`,
    `unbilled/`; `period` and `batch_id` from the path), each file once: listed by `read_listed`, which skips what
    a compacted file holds and lists again when a compaction removes a file listed. A table without rows nor
    columns when no file is there."""
    wanted = set(keys)

    def read(files: list[Path]) -> pa.Table:
        mine = [str(f) for f in files if f.parent.parent.name.removeprefix("period=") in wanted]
        if not mine:
            return pa.table({})
        dataset = ds.dataset(mine, format="parquet", partitioning="hive", partition_base_dir=str(folder))
        return dataset.to_table(columns=columns, filter=where)

    return read_listed(folder, 2, read)


def _clicks(table: pa.Table, period: str, final: bool) -> list[NotChargedClick]:
    return [
        NotChargedClick(period=period, **{**r, "currency": r["currency"] or ""}, final=final)
        for r in table.select(list(COLUMNS)).to_pylist()
    ]


def _within(periods: Periods, key: str, start_ms: int, end_ms: int) -> bool:
    try:
        return start_ms <= periods.parse_key(key) < end_ms
    except ValueError:
        return False


def not_charged_by_stream(layout: DataLayout, due: list[str]) -> dict[str, str]:
    """The clicks of the due periods the stream priced and did not charge, with its reason (`not_charged/`)."""
    found = stream_rows(layout.not_charged, due, ["click_id", "reason"])
    if not found.num_columns:
        return {}
    return dict(zip(found["click_id"].to_pylist(), found["reason"].to_pylist(), strict=True))


def unbilled_by_stream(layout: DataLayout, due: list[str]) -> set[str]:
    """The clicks of the due periods that the stream matched but could not price at their time (its `unbilled`
    table): a bill reconciliation adds for one of them comes from a catalog change the stream had not seen."""
    found = stream_rows(layout.unbilled, due, ["click_id"])
    return set(found["click_id"].to_pylist()) if found.num_columns else set()
