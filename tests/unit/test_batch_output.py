"""A collected micro-batch split into its matched clicks, archive and quarantine rows, their Redis figures and their
files; the matched clicks charged on the driver (`attribution.charging`) into the ledger and `unbilled/`."""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest

from attribution.batch_output import (
    ARCHIVE_COLUMNS,
    BILL_COLUMNS,
    BatchFigures,
    PartitionWriter,
    batch_figures,
    bill_totals,
    clock_ahead_counts,
    late_counts,
    prune_batch_folders,
    quarantine_counts,
    split_batch,
    write_batch_files,
)
from attribution.charging import Charged, Charging
from attribution.decode import QUARANTINE_COLUMNS
from billing.budgets import BudgetChange
from billing.catalog import Ad, Catalog, PriceChange
from billing.invalid import IvtRules
from billing.layout import DataLayout
from billing.periods import Periods
from billing.store.parquet_ledger import LEDGER_COLUMNS, LedgerCorruptError, read_batches, read_ledger
from billing.store.redis_totals import ClockAheadCount, LateCount, QuarantineCount, TotalsRow

HOUR = 3_600_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00Z
ADVERTISER_OF = {"ad-1": "adv-1", "ad-2": "adv-2"}
CATALOG = Catalog(
    [
        Ad("ad-1", "camp-ad-1", "adv-1", 1_500_000, "USD"),
        Ad("ad-2", "camp-ad-2", "adv-2", 70_000, "USD"),
        # Paused an hour in, priced again two hours in.
        Ad("ad-p", "camp-ad-p", "adv-2", 10_000, "USD",
           (PriceChange(0, 10_000), PriceChange(T0 + HOUR, None, 1), PriceChange(T0 + 2 * HOUR, 20_000, 2))),
    ]
)  # fmt: skip

SCHEMA = pa.schema(
    [
        ("click_id", pa.string()),
        ("impression_id", pa.string()),
        ("ad_id", pa.string()),
        ("user_id", pa.string()),
        ("click_time", pa.int64()),
        ("impression_time", pa.int64()),
        ("click_received_ms", pa.int64()),
        ("ip", pa.string()),
        ("event_type", pa.string()),
        ("event_id", pa.string()),
        ("event_time", pa.int64()),
        ("received_ms", pa.int64()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("value", pa.binary()),
        ("user_agent", pa.string()),
        ("reason", pa.string()),
        ("kind", pa.string()),
        ("value_size", pa.int32()),
        ("value_sha256", pa.string()),
    ]
)
"""The columns of the job's output as `BatchSink` collects them: the bill branch's, then the intake's, then the size
and digest of the bad records' bytes (`attribution.decode.quarantined_value`)."""


def bill(click_id: str, ad_id: str, click_time: int, micros: int = 0) -> dict[str, object]:
    """A matched click (`micros`: what the catalog prices it at, for the reader; the sink prices it)."""
    return {
        "kind": "bill",
        "click_id": click_id,
        "impression_id": f"i-{click_id}",
        "ad_id": ad_id,
        "user_id": f"u-{click_id}",  # a user of its own: none of these clicks is a duplicate of another
        "click_time": click_time,
        "impression_time": click_time - 1_000,
        "click_received_ms": click_time + 5,
        "ip": None,
        "known_bot": False,
    }


def received(
    event_type: str,
    event_id: str,
    ad_id: str | None,
    event_time: int | None,
    offset: int,
    reason=None,
    received_ms: int | None = None,
):
    value = f"bytes-{offset}".encode()
    return {
        "kind": "intake",
        "event_type": event_type,
        "event_id": event_id,
        "ad_id": ad_id,
        "user_id": "u-1",
        "event_time": event_time,
        "received_ms": (event_time or T0) + 7 if received_ms is None else received_ms,
        "topic": f"{event_type}s",
        "partition": 2,
        "offset": offset,
        "value": value,
        "reason": reason,
        "value_size": len(value) if reason else None,
        "value_sha256": hashlib.sha256(value).hexdigest() if reason else None,
    }


@pytest.fixture()
def batch() -> pa.Table:
    rows = [
        bill("c-1", "ad-1", T0 + 10, 1_500_000),
        bill("c-2", "ad-1", T0 + HOUR + 10, 1_500_000),  # the next period
        bill("c-3", "ad-1", T0 + 20, 1_500_000),
        bill("c-4", "ad-2", T0 + 30, 70_000),
        received("impression", "i-1", "ad-1", T0 + 1, 10),
        received("click", "c-1", "ad-1", T0 + 10, 11),
        received("click", "c-2", "ad-1", T0 + HOUR + 10, 12),
        received("impression", "i-old", "ad-2", T0 - 60_000, 13),  # at or below the watermark: late
        received("click", "c-old", "ad-2", T0 - 30_000, 14),  # the watermark itself: late
        received("click", "x-1", None, None, 15, reason="undecodable"),
        received("click", "c-9", "ad-9", T0, 16, reason="unknown_ad"),
    ]
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def split(batch: pa.Table, batch_id: int = 7):
    return split_batch(
        batch,
        batch_id,
        late_watermark_ms=T0 - 30_000,
        periods=Periods(HOUR),
        quarantine_columns=QUARANTINE_COLUMNS,
    )


def charge(
    batch: pa.Table,
    root: Path,
    batch_id: int = 7,
    billed_at_ms: int = T0 + 2 * HOUR,
    catalog: Catalog = CATALOG,
    counted: bool = False,
) -> Charged:
    """The batch's matched clicks charged on the driver, as `BatchSink` does after the tasks wrote their shares
    (`counted`: Redis had applied the batch before)."""
    out = split(batch, batch_id)
    charging = Charging(DataLayout(root), Periods(HOUR), IvtRules())
    return charging.charge(
        batch_id, out.bills, out.clicks, catalog, T0 - 30_000, billed_at_ms, lambda pairs: {}, counted=counted
    )


def test_split_gives_matched_clicks_archive_and_quarantine_rows_with_periods(batch: pa.Table, tmp_path: Path) -> None:
    out = split(batch)
    assert out.bills.column_names == list(BILL_COLUMNS)
    assert out.events.column_names == list(ARCHIVE_COLUMNS)
    assert out.bad.column_names == [*QUARANTINE_COLUMNS, "batch_id"]
    assert sorted(out.clicks.column("click_id").to_pylist()) == ["c-1", "c-2", "c-old"]

    charged = charge(batch, tmp_path)
    assert charged.ledger.column_names == list(LEDGER_COLUMNS)
    bills = {row["click_id"]: row for row in charged.ledger.to_pylist()}
    assert sorted(bills) == ["c-1", "c-2", "c-3", "c-4"]
    assert (bills["c-1"]["period"], bills["c-1"]["period_start_ms"]) == ("20260101T0000Z", T0)
    assert (bills["c-2"]["period"], bills["c-2"]["period_start_ms"]) == ("20260101T0100Z", T0 + HOUR)
    assert {row["billed_at_ms"] for row in bills.values()} == {T0 + 2 * HOUR}
    assert {row["batch_id"] for row in bills.values()} == {7}

    events = {row["event_id"]: row for row in out.events.to_pylist()}
    assert sorted(events) == ["c-1", "c-2", "c-old", "i-1", "i-old"]
    assert {event_id for event_id, row in events.items() if row["late"]} == {"c-old", "i-old"}
    assert events["i-old"]["period"] == "20251231T2300Z"
    assert events["c-1"]["value"] == b"bytes-11"

    bad = {row["reason"]: row for row in out.bad.to_pylist()}
    assert sorted(bad) == ["undecodable", "unknown_ad"]
    assert (bad["undecodable"]["offset"], bad["undecodable"]["value"]) == (15, b"bytes-15")
    assert bad["undecodable"]["value_size"] == 8
    assert bad["undecodable"]["value_sha256"] == hashlib.sha256(b"bytes-15").hexdigest()
    assert bad["unknown_ad"]["batch_id"] == 7


def test_redis_figures_of_a_batch(batch: pa.Table, tmp_path: Path) -> None:
    out = split(batch)
    assert sorted(charge(batch, tmp_path).totals, key=lambda t: (t.period, t.ad_id)) == [
        TotalsRow("20260101T0000Z", T0, "adv-1", "camp-ad-1", "ad-1", 2, 3_000_000),
        TotalsRow("20260101T0000Z", T0, "adv-2", "camp-ad-2", "ad-2", 1, 70_000),
        TotalsRow("20260101T0100Z", T0 + HOUR, "adv-1", "camp-ad-1", "ad-1", 1, 1_500_000),
    ]
    assert sorted(late_counts(out.events, ADVERTISER_OF), key=lambda c: c.event_type) == [
        LateCount("20251231T2300Z", T0 - HOUR, "adv-2", "ad-2", "click", 1),
        LateCount("20251231T2300Z", T0 - HOUR, "adv-2", "ad-2", "impression", 1),
    ]
    assert sorted(quarantine_counts(out.bad, ADVERTISER_OF), key=lambda c: c.reason) == [
        QuarantineCount("undecodable", "clicks", None, 1),
        QuarantineCount("unknown_ad", "clicks", None, 1),
    ]


MINUTE = 60_000
TOLERANCE = MINUTE


@pytest.mark.parametrize(
    ("event_time", "received_ms", "late", "ahead"),
    [
        # On time, received 7 ms later: late exactly when the event time is at or below the watermark.
        (T0 - 30_000 - 7, T0 - 30_000, True, False),
        (T0 - 30_000 + 1, T0 - 30_000 + 8, False, False),
        # 50 minutes ahead of its receipt, received after the watermark: not late, and counted as clock ahead.
        (T0 + 50 * MINUTE, T0, False, True),
        # 50 minutes ahead, but received at the watermark: late, as the join (its watermark time is its receipt).
        (T0 - 30_000 + 50 * MINUTE, T0 - 30_000, True, True),
        # Ahead by exactly the tolerance: not counted; one millisecond more: counted.
        (T0 + TOLERANCE, T0, False, False),
        (T0 + TOLERANCE + 1, T0, False, True),
        # Behind its receipt by any amount: its event time decides, as before.
        (T0 - HOUR, T0, True, False),
    ],
)
def test_late_follows_the_watermark_time_and_clock_ahead_the_tolerance(
    event_time: int, received_ms: int, late: bool, ahead: bool
) -> None:
    event = received("click", "c-x", "ad-1", event_time, 20, received_ms=received_ms)
    out = split(pa.Table.from_pylist([event], schema=SCHEMA))
    assert out.events.column("late").to_pylist() == [late]
    counted = clock_ahead_counts(out.events, ADVERTISER_OF, TOLERANCE)
    period_start = event_time - event_time % HOUR
    key = Periods(HOUR).key(period_start)
    assert counted == ([ClockAheadCount(key, period_start, "adv-1", "ad-1", "click", 1)] if ahead else [])


def test_an_empty_batch_writes_and_counts_nothing(batch: pa.Table, tmp_path: Path) -> None:
    out = split(batch.slice(0, 0))
    assert (out.bills.num_rows, out.events.num_rows, out.bad.num_rows) == (0, 0, 0)
    charged = charge(batch.slice(0, 0), tmp_path / "data")
    assert charged.totals == [] and charged.ledger.num_rows == 0 and late_counts(out.events, ADVERTISER_OF) == []
    tmp_path = tmp_path / "files"
    tmp_path.mkdir()
    assert write_batch_files(out.events, tmp_path, ("event_type", "period", "batch_id")) == []
    assert list(tmp_path.iterdir()) == []


def test_files_are_partitioned_like_spark_writes_them_and_read_back_whole(batch: pa.Table, tmp_path: Path) -> None:
    out = split(batch)
    ledger = tmp_path / "ledger"
    bills = charge(batch, tmp_path / "data").ledger
    written = write_batch_files(bills, ledger, ("period", "batch_id"))
    assert sorted(str(path.relative_to(ledger)) for path in written) == [
        "period=20260101T0000Z/batch_id=7/part-00000.parquet",
        "period=20260101T0100Z/batch_id=7/part-00000.parquet",
    ]
    back = read_ledger(ledger).sort_by("click_id")
    assert back.to_pylist() == bills.sort_by("click_id").to_pylist()

    archive = tmp_path / "archive"
    write_batch_files(out.events, archive, ("event_type", "period", "batch_id"))
    assert (archive / "event_type=click" / "period=20251231T2300Z" / "batch_id=7" / "part-00000.parquet").exists()
    table = ds.dataset(archive, format="parquet", partitioning="hive").to_table()
    assert "late" in table.column_names
    assert sorted(table.column("event_id").to_pylist()) == sorted(out.events.column("event_id").to_pylist())


def test_the_bills_of_a_range_of_batches_are_read_from_their_own_folders(batch: pa.Table, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    bills = charge(batch, tmp_path / "data").ledger  # batch 7, in 00:00 and 01:00
    write_batch_files(bills, ledger, ("period", "batch_id"))
    # A later batch being written: its staging dot-file is not read.
    staging = ledger / "period=20260101T0000Z" / "batch_id=8" / ".part-00000.parquet.tmp"
    staging.parent.mkdir(parents=True)
    staging.write_bytes(b"PAR1 half a file")
    of_00 = bills.filter(pc.equal(bills["period"], "20260101T0000Z"))
    back = read_batches(ledger, ["20260101T0000Z", "20260102T0000Z"], 6, 8)
    assert back.column_names == list(LEDGER_COLUMNS)
    assert back.sort_by("click_id").to_pylist() == of_00.sort_by("click_id").to_pylist()
    assert read_batches(ledger, ["20260101T0000Z", "20260101T0100Z"], 7, 9).num_rows == 0, "after batch 7 only"
    assert read_batches(ledger, ["20260101T0100Z"], 5, 6).num_rows == 0, "up to batch 6 only"


def test_a_period_whose_only_file_is_still_being_written_reads_as_no_bills(batch: pa.Table, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    # The first write of a new period, caught half-way: its folder holds the staging dot-file only.
    staging = ledger / "period=20260101T0200Z" / "batch_id=8" / ".part-00000.parquet.tmp"
    staging.parent.mkdir(parents=True)
    staging.write_bytes(b"PAR1 half a file")
    assert read_ledger(ledger).num_rows == 0
    assert read_ledger(ledger).column_names == list(LEDGER_COLUMNS)
    # Beside a period with bills, the same.
    bills = charge(batch, tmp_path / "data").ledger
    write_batch_files(bills, ledger, ("period", "batch_id"))
    assert read_ledger(ledger).num_rows == bills.num_rows


def test_writing_a_replayed_batch_again_replaces_its_files(batch: pa.Table, tmp_path: Path) -> None:
    first = charge(batch, tmp_path / "data")
    ledger = tmp_path / "ledger"
    write_batch_files(first.ledger, ledger, ("period", "batch_id"))
    earlier = ledger / "period=20260101T0000Z" / "batch_id=7" / "part-00000-from-an-earlier-attempt.parquet"
    earlier.write_bytes((ledger / "period=20260101T0000Z" / "batch_id=7" / "part-00000.parquet").read_bytes())
    again = charge(batch, tmp_path / "data", billed_at_ms=T0 + 3 * HOUR, counted=True)
    assert again.replayed and again.decisions == first.decisions
    write_batch_files(again.ledger, ledger, ("period", "batch_id"))
    back = read_ledger(ledger)
    assert back.num_rows == first.ledger.num_rows
    assert set(back.column("billed_at_ms").to_pylist()) == {T0 + 3 * HOUR}
    assert [path.name for path in ledger.rglob(".*")] == []  # no staging file left behind
    assert not earlier.exists()


def test_every_file_and_folder_written_is_flushed_to_disk_before_the_write_returns(
    batch: pa.Table, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flushed: list[Path] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        flushed.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    bills = charge(batch, tmp_path / "data").ledger
    monkeypatch.setattr(os, "fsync", fsync)
    (tmp_path / "ledger").mkdir()
    written = write_batch_files(bills, tmp_path / "ledger", ("period", "batch_id"))
    monkeypatch.undo()

    # Each file's bytes (flushed under its staging name, then renamed), its folder's entry for it, and the entry of
    # each folder created on the way.
    staged = [p for p in flushed if p.name.startswith(".part-00000.parquet.")]
    assert len(staged) == len(written) == 2
    folders = {p for p in flushed if p.is_dir()}
    assert folders == {p.parent for p in written} | {p.parent.parent for p in written} | {tmp_path / "ledger"}


def test_a_reader_that_meets_a_broken_ledger_file_fails_and_names_it(batch: pa.Table, tmp_path: Path) -> None:
    bills = charge(batch, tmp_path / "data").ledger
    tmp_path = tmp_path / "ledger"
    first, second = sorted(write_batch_files(bills, tmp_path, ("period", "batch_id")))
    (first.parent / ".part-00000.parquet.123.tmp").write_bytes(b"half a file")  # a write in progress: not the ledger
    assert read_ledger(tmp_path).num_rows == bills.num_rows

    # A file cut short, as a power loss without fsync leaves one: before, read_ledger skipped it without a word
    # and the ledger lacked its bills.
    whole = first.read_bytes()
    first.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(LedgerCorruptError) as raised:
        read_ledger(tmp_path)
    assert str(first) in str(raised.value) and str(second) not in str(raised.value)
    assert list(raised.value.broken) == [first]

    # An emptied one as well; every broken file is named.
    second.write_bytes(b"")
    with pytest.raises(LedgerCorruptError) as raised:
        read_ledger(tmp_path)
    assert sorted(raised.value.broken) == [first, second]
    assert "0 bytes" in str(raised.value)


def _writer(tmp_path: Path, batch_id: int = 7, late_watermark_ms: int = T0 - 30_000) -> PartitionWriter:
    return PartitionWriter(
        batch_id=batch_id,
        late_watermark_ms=late_watermark_ms,
        period_ms=HOUR,
        clock_tolerance_ms=TOLERANCE,
        archive_dir=tmp_path / "archive",
        quarantine_dir=tmp_path / "quarantine",
        quarantine_columns=tuple(QUARANTINE_COLUMNS),
    )


def _charge_figures(figures: BatchFigures, root: Path) -> Charged:
    charging = Charging(DataLayout(root), Periods(HOUR), IvtRules())
    return charging.charge(7, figures.bills, figures.clicks, CATALOG, T0 - 30_000, T0 + 2 * HOUR, lambda pairs: {})


def test_tasks_that_write_their_shares_give_the_figures_and_files_of_the_whole_batch(
    batch: pa.Table, tmp_path: Path
) -> None:
    whole = split(batch)
    writer = _writer(tmp_path)
    # The batch's rows spread over three tasks, as Spark's partitions spread them; each writes its own files.
    shares = [batch.slice(0, 2), batch.slice(2, 5), batch.slice(7)]
    figures = batch_figures(
        pa.concat_tables(writer.write(share, partition)[1] for partition, share in enumerate(shares)),
        ADVERTISER_OF,
    )
    key = lambda row: (row.period, row.ad_id, getattr(row, "event_type", ""))  # noqa: E731
    charged = _charge_figures(figures, tmp_path / "data")
    assert sorted(charged.totals, key=key) == sorted(bill_totals(charge(batch, tmp_path / "whole").ledger), key=key)
    assert sorted(figures.late, key=key) == sorted(late_counts(whole.events, ADVERTISER_OF), key=key)
    assert figures.clock_ahead == clock_ahead_counts(whole.events, ADVERTISER_OF, TOLERANCE)
    by_reason = lambda count: count.reason  # noqa: E731
    assert sorted(figures.quarantined, key=by_reason) == sorted(
        quarantine_counts(whole.bad, ADVERTISER_OF), key=by_reason
    )
    assert (figures.bills.num_rows, figures.events, figures.bad) == (4, 5, 2)
    assert sorted(figures.clicks.column("click_id").to_pylist()) == ["c-1", "c-2", "c-old"]
    # Partition 1 has three archive rows; partition 2 two archive rows and the two bad records (the bills are
    # charged and written on the driver).
    assert sorted(str(path.relative_to(tmp_path)) for path in figures.files) == [
        "archive/event_type=click/period=20251231T2300Z/batch_id=7/part-00002.parquet",
        "archive/event_type=click/period=20260101T0000Z/batch_id=7/part-00001.parquet",
        "archive/event_type=click/period=20260101T0100Z/batch_id=7/part-00001.parquet",
        "archive/event_type=impression/period=20251231T2300Z/batch_id=7/part-00002.parquet",
        "archive/event_type=impression/period=20260101T0000Z/batch_id=7/part-00001.parquet",
        "quarantine/batch_id=7/part-00002.parquet",
    ]
    archived = ds.dataset(tmp_path / "archive", format="parquet", partitioning="hive").to_table()
    assert sorted(archived.column("event_id").to_pylist()) == sorted(whole.events.column("event_id").to_pylist())


def test_a_replayed_batch_spread_otherwise_leaves_only_its_last_attempts_files(batch: pa.Table, tmp_path: Path) -> None:
    writer = _writer(tmp_path)
    first = batch_figures(writer.write(batch.slice(4, 4), 3)[1], ADVERTISER_OF)  # an earlier attempt: one task
    shares = [batch.slice(4, 1), batch.slice(5, 3)]
    again = batch_figures(
        pa.concat_tables(writer.write(share, partition)[1] for partition, share in enumerate(shares)), ADVERTISER_OF
    )
    removed = prune_batch_folders(again.files)
    assert {path.name for path in removed} == {"part-00003.parquet"} and set(removed) <= set(first.files)
    archived = ds.dataset(tmp_path / "archive", format="parquet", partitioning="hive").to_table()
    assert sorted(archived.column("event_id").to_pylist()) == ["c-1", "c-2", "i-1", "i-old"]


def test_bills_are_priced_by_the_history_at_their_time_and_clicks_without_a_price_are_kept_and_counted(
    tmp_path: Path,
) -> None:
    rows = [
        bill("c-before", "ad-p", T0 + HOUR - 1, 0),  # the last millisecond of the first price
        bill("c-paused", "ad-p", T0 + HOUR, 0),  # the pause takes effect at its millisecond
        bill("c-again", "ad-p", T0 + 2 * HOUR, 0),  # the new price, from its millisecond
        bill("c-unknown", "ad-new", T0, 0),  # an ad the catalog does not know (yet)
    ]
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    out = charge(table, tmp_path)
    priced = {r["click_id"]: (r["amount_micros"], r["campaign_id"], r["currency"]) for r in out.ledger.to_pylist()}
    assert priced == {"c-before": (10_000, "camp-ad-p", "USD"), "c-again": (20_000, "camp-ad-p", "USD")}
    held = {r["click_id"]: (r["reason"], r["period"], r["batch_id"]) for r in out.unbilled.to_pylist()}
    assert held == {
        "c-paused": ("ad_paused", "20260101T0100Z", 7),
        "c-unknown": ("unknown_ad", "20260101T0000Z", 7),
    }
    assert sorted((c.ad_id, c.advertiser_id, c.reason, c.clicks) for c in out.unbilled_counts) == [
        ("ad-new", "", "unknown_ad", 1),
        ("ad-p", "adv-2", "ad_paused", 1),
    ]


def _a_click(click_id: str, user_id: str, at: int, offset: int) -> list[dict[str, object]]:
    """A click on ad-1 as a batch carries it: matched (a bill) and received (the archive)."""
    return [
        {**bill(click_id, "ad-1", at), "user_id": user_id},
        {**received("click", click_id, "ad-1", at, offset), "user_id": user_id},
    ]


def _run_batch(charging: Charging, root: Path, batch_id: int, rows: list[dict[str, object]], watermark: int) -> Charged:
    """One batch as the sink runs it: the task writes the archive, then the driver charges the bills."""
    writer = _writer(root, batch_id, watermark)
    figures = batch_figures(writer.write(pa.Table.from_pylist(rows, schema=SCHEMA), 0)[1], ADVERTISER_OF)
    return charging.charge(batch_id, figures.bills, figures.clicks, CATALOG, watermark, T0 + HOUR, lambda pairs: {})


@pytest.mark.parametrize(
    ("restarted_at", "watermark"),
    [(1, 0), (2, T0 - 30_000)],
    ids=["restarted-before-the-stream-has-a-watermark", "restarted-with-a-watermark"],
)
def test_a_restarted_driver_judges_a_click_by_the_clicks_received_before_the_restart(
    tmp_path: Path, restarted_at: int, watermark: int
) -> None:
    """The invalid traffic rules of a restarted driver read the clicks before it from the archive: a second click
    10 s after the first, by its user on its ad, is a `duplicate_click` however the restart fell. (A restart in the
    checkpoint's second batch runs without a watermark: Spark sets the first one at the end of that batch.)"""
    root = tmp_path / "data"
    before = Charging(DataLayout(root), Periods(HOUR), IvtRules())
    first = _run_batch(before, root, 0, _a_click("c-1", "u-1", T0 + 10_000, 1), watermark=0)
    assert first.decisions == {"c-1": "charged"}
    for batch_id in range(1, restarted_at):
        _run_batch(before, root, batch_id, _a_click(f"c-other-{batch_id}", "u-2", T0 + 11_000, 1 + batch_id), 0)

    after = Charging(DataLayout(root), Periods(HOUR), IvtRules())  # the restarted driver's
    again = _run_batch(after, root, restarted_at, _a_click("c-2", "u-1", T0 + 20_000, 9), watermark)
    assert again.decisions == {"c-2": "duplicate_click"}
    assert again.ledger.num_rows == 0 and again.not_charged.column("reason").to_pylist() == ["duplicate_click"]


def test_a_new_checkpoints_driver_without_a_watermark_reads_only_its_own_checkpoints_clicks(tmp_path: Path) -> None:
    """A new epoch (`attribution.epoch`) starting at batch 5 and restarted in its second batch, before a watermark:
    the clicks of its first batch are read back, the earlier checkpoint's are not (the whole archive could be
    months; a pair across the change is reconciliation's)."""
    root = tmp_path / "data"
    old = Charging(DataLayout(root), Periods(HOUR), IvtRules())
    _run_batch(old, root, 4, _a_click("c-old", "u-1", T0 + 10_000, 1), watermark=T0 - 30_000)
    new = Charging(DataLayout(root), Periods(HOUR), IvtRules(), first_batch_id=5)
    _run_batch(new, root, 5, _a_click("c-new", "u-2", T0 + 12_000, 2), watermark=0)

    restarted = Charging(DataLayout(root), Periods(HOUR), IvtRules(), first_batch_id=5)
    rows = _a_click("c-after-old", "u-1", T0 + 20_000, 3) + _a_click("c-after-new", "u-2", T0 + 20_000, 4)
    out = _run_batch(restarted, root, 6, rows, watermark=0)
    assert out.decisions == {"c-after-old": "charged", "c-after-new": "duplicate_click"}
    assert sorted(restarted.recent.ids) == ["c-after-new", "c-after-old", "c-new"]


def test_the_stream_finds_a_duplicate_click_however_many_clicks_of_its_user_on_other_ads_lie_between() -> None:
    """With the flood threshold raised (a setting), a user may click many other ads between two clicks on one ad:
    the stream's duplicate rule reads the click's predecessor on its ad, as the plain rule does, not a fixed number
    of the user's clicks back."""
    from attribution.charging import RecentClicks
    from billing.invalid import duplicate_clicks

    rules = IvtRules(flood_clicks=1_000)
    recent = RecentClicks(rules)
    others = [(f"o-{n:03d}", f"ad-o{n}", T0 + 100 + n * 100) for n in range(200)]  # 200 ads in 20 s
    clicks = [("c-first", "ad-1", T0), *others, ("c-again", "ad-1", T0 + 25_000), ("c-late", "ad-1", T0 + 54_000)]
    recent.add([c for c, _, _ in clicks], [a for _, a, _ in clicks], ["u-1"] * len(clicks), [t for _, _, t in clicks])
    found = {c for c, a, t in clicks if recent.duplicate("u-1", a, t, c)}
    on_ad = [(t, c) for c, a, t in clicks if a == "ad-1"]
    assert found == duplicate_clicks(on_ad, rules) == {"c-again", "c-late"}
    # Evicted behind the watermark, a click no longer makes the next one a duplicate.
    recent.evict_before(T0 + 25_000)
    assert not recent.duplicate("u-1", "ad-1", T0 + 25_000, "c-again") and recent.duplicate(
        "u-1", "ad-1", T0 + 56_000, "c-late"
    )
    assert ("u-1", "ad-1") in recent.by_user_ad and len(recent.by_user_ad[("u-1", "ad-1")]) == 2


@pytest.mark.parametrize("seed", range(40))
def test_the_streams_flood_rule_flags_what_the_plain_rule_flags_click_by_click(seed: int) -> None:
    """The stream judges a click by the runs of its user's clicks that hold it; the plain rule
    (`billing.invalid.flood_clicks`) by every run of the user's clicks at once. Users whose clicks come in bursts
    around the thresholds (three fewer to two more clicks than a flood takes, spread over about the window, ties on
    the millisecond, bursts that touch), under the product's thresholds and others: the same clicks are floods."""
    from attribution.charging import RecentClicks
    from billing.invalid import flood_clicks

    rng = random.Random(seed)
    rules = rng.choice([IvtRules(), IvtRules(flood_clicks=3, flood_window_ms=2_000), IvtRules(flood_clicks=1)])
    recent = RecentClicks(rules)
    clicks: list[tuple[str, str, int]] = []
    users = ("u-1", "u-2", "u-3")
    for user in users:
        at = T0
        for burst in range(rng.randint(1, 4)):
            size = rules.flood_clicks + rng.randint(-2, 3)
            span = rules.flood_window_ms + rng.choice([-1, 0, 1, rules.flood_window_ms // 2])
            times = sorted(at + rng.randint(0, span) for _ in range(max(size, 1)))
            if rng.random() < 0.3:
                times[-1] = times[0] + rules.flood_window_ms  # a run that spans the window exactly
            clicks += [(f"{user}-{burst}-{n:02d}", user, moment) for n, moment in enumerate(times)]
            clicks += [(f"{user}-{burst}-tie", user, times[0])]  # the same millisecond as the burst's first
            at = times[-1] + rng.choice([0, 1, rules.flood_window_ms, 3 * rules.flood_window_ms])
    rng.shuffle(clicks)
    recent.add([c for c, _, _ in clicks], ["ad-1"] * len(clicks), [u for _, u, _ in clicks], [t for _, _, t in clicks])
    stream = {c for c, u, t in clicks if recent.flood(u, t, c)}
    plain = set().union(*(flood_clicks([(t, c) for c, u, t in clicks if u == user], rules) for user in users))
    assert stream == plain
    assert not recent.flood("u-1", T0, "not-received")


BOT = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"
BUDGETED = Catalog(
    [Ad("ad-1", "camp-ad-1", "adv-1", 1_500_000, "USD")], budgets={"camp-ad-1": [BudgetChange(0, 3_000_000, 0)]}
)


def test_a_replayed_batch_that_redis_has_not_counted_is_decided_again_on_the_day_as_redis_holds_it(
    tmp_path: Path,
) -> None:
    """The first attempt at batch 7 decided one bill and stopped before Redis. Its replay, after a restart that
    decodes records the first attempt quarantined, has two more: a crawler's click and a click that the day's budget
    no longer holds. Nothing but the first attempt's own files knew its decisions, so the replay decides every bill
    again, on the day total Redis holds now; once Redis has counted the batch, a further replay decides as that
    attempt did, whatever the day total has become."""
    root = tmp_path / "data"
    first_bills = [bill("c-1", "ad-1", T0 + 10)]
    extra = [{**bill("c-bot", "ad-1", T0 + 20), "user_agent": BOT}, bill("c-more", "ad-1", T0 + 30)]
    for_first = split(pa.Table.from_pylist(first_bills, schema=SCHEMA))
    first = Charging(DataLayout(root), Periods(HOUR), IvtRules()).charge(
        7, for_first.bills, for_first.clicks, BUDGETED, T0 - 30_000, T0 + HOUR, lambda pairs: dict.fromkeys(pairs, 0)
    )
    assert first.decisions == {"c-1": "charged"}
    replay = split(pa.Table.from_pylist(first_bills + extra, schema=SCHEMA))
    spent_before = lambda pairs: dict.fromkeys(pairs, 1_500_000)  # noqa: E731
    again = Charging(DataLayout(root), Periods(HOUR), IvtRules()).charge(
        7, replay.bills, replay.clicks, BUDGETED, T0 - 30_000, T0 + HOUR, spent_before
    )
    assert again.decisions == {"c-1": "charged", "c-bot": "known_bot", "c-more": "over_budget"}
    assert again.ledger.column("click_id").to_pylist() == ["c-1"] and not again.replayed
    assert sorted(again.not_charged.column("reason").to_pylist()) == ["known_bot", "over_budget"]
    assert again.day_totals_read == {("camp-ad-1", "2026-01-01"): 1_500_000}, "what the apply holds Redis to"
    counted = Charging(DataLayout(root), Periods(HOUR), IvtRules()).charge(
        7, replay.bills, replay.clicks, BUDGETED, T0 - 30_000, T0 + HOUR, lambda pairs: {}, counted=True
    )
    assert counted.replayed and counted.decisions == again.decisions and counted.day_totals_read == {}


def test_a_replayed_batch_that_redis_already_counted_leaves_a_new_bill_to_reconciliation(tmp_path: Path) -> None:
    """Redis applied batch 7 before the crash (it applies a batch once): a bill the replay has and the first attempt
    had not could never reach the live totals, so the stream writes it nowhere and reconciliation bills it."""
    root = tmp_path / "data"
    first_bills = [bill("c-1", "ad-1", T0 + 10)]
    for_first = split(pa.Table.from_pylist(first_bills, schema=SCHEMA))
    Charging(DataLayout(root), Periods(HOUR), IvtRules()).charge(
        7, for_first.bills, for_first.clicks, CATALOG, T0 - 30_000, T0 + HOUR, lambda pairs: {}
    )
    replay = split(pa.Table.from_pylist([*first_bills, bill("c-new", "ad-1", T0 + 20)], schema=SCHEMA))
    again = Charging(DataLayout(root), Periods(HOUR), IvtRules()).charge(
        7, replay.bills, replay.clicks, CATALOG, T0 - 30_000, T0 + HOUR, lambda pairs: {}, counted=True
    )
    assert again.ledger.column("click_id").to_pylist() == ["c-1"] and again.not_charged.num_rows == 0
    assert [t.clicks for t in again.totals] == [1]
