"""The finance export of a closed period: its rows and statuses, the manifest, checksums, write-once, copies, and
files that pyarrow, DuckDB (and pandas, when installed) read back the same."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import stat
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from billing.catalog import Ad, Catalog
from billing.corrections import (
    ArrivalFacts,
    Correction,
    CorrectionKind,
    CorrectionReason,
    reconcile_period,
)
from billing.export import build_export
from billing.rule import BillableClick
from billing.store.export_files import (
    CSV_FILE,
    EXPORT_COLUMNS,
    EXPORT_SCHEMA,
    MANIFEST_FILE,
    PARQUET_FILE,
    SUMS_FILE,
    ExportCorruptError,
    ExportExistsError,
    Manifest,
    copy_export,
    export_folder,
    export_table,
    read_export,
    read_manifest,
    verify_export,
    write_export,
)

H = 3_600_000
S = 1_000
EARLIER = "20260101T0000Z"  # closed before PERIOD; its late data is booked in PERIOD as adjustments
PERIOD = "20260101T0100Z"  # the period exported
START = int(datetime(2026, 1, 1, 1, tzinfo=UTC).timestamp()) * 1000
END = START + H
CLOSED_AT = END + 2 * H  # 04:00Z: closed after its lateness horizon

CATALOG = Catalog(
    [
        Ad("ad-1", "cmp-1", "adv-1", 250_000, "EUR"),
        Ad("ad-2", "cmp-2", "adv-2", 1_000_000, "USD"),
        Ad("ad-free", "cmp-1", "adv-1", 0, "EUR"),
    ]
)


def bill(click_id: str, impression_id: str = "i1", *, ad: str = "ad-1", at: int = START + 60 * S) -> BillableClick:
    a = CATALOG[ad]
    return BillableClick(
        click_id, impression_id, ad, a.campaign_id, a.advertiser_id, "u1", at, at - 3 * S, a.cpc_micros, a.currency
    )


def ledger(click_id: str, impression_id: str = "i1", *, ad: str = "ad-1", at: int = START + 60 * S) -> dict:
    return {**bill(click_id, impression_id, ad=ad, at=at).to_dict(), "period": PERIOD, "batch_id": 1}


def scenario() -> tuple[list[BillableClick], list[dict], list[Correction], list[Correction]]:
    """One period with a click of every status, reconciled in two runs, plus two adjustments for EARLIER."""
    rows = [
        ledger("c1"),  # billed and confirmed
        ledger("c2"),  # billed twice: one copy is a duplicate
        ledger("c2"),
        ledger("c4"),  # billed, not billable in the end
        ledger("c5", "i5", ad="ad-2"),  # billed from a conflicting copy on ad-2; the standing copy is on ad-1
        ledger("c7", ad="ad-free"),  # a free ad: billed at 0
    ]
    confirmed = [bill("c1", "i2"), bill("c2"), bill("c3"), bill("c5", "i5"), bill("c7", ad="ad-free")]
    facts = ArrivalFacts(late_click_ids={"c3", "c6"}, conflicting_click_ids={"c5", "c6"})
    # 02:30Z: c6 (late) is billable so far; 03:30Z: a copy that arrived first quarantines it.
    first = reconcile_period(
        PERIOD, [*confirmed, bill("c6")], rows, [], booked_period=PERIOD, now_ms=END + 90 * 60 * S, facts=facts
    )
    second = reconcile_period(
        PERIOD, confirmed, rows, first, booked_period=PERIOD, now_ms=END + 150 * 60 * S, facts=facts
    )
    adjustments = reconcile_period(
        EARLIER,
        [bill("c0a", at=START - 10 * 60 * S)],
        [ledger("c0b", ad="ad-2", at=START - 20 * 60 * S)],
        [],
        booked_period=PERIOD,
        now_ms=END + 30 * 60 * S,
        facts=ArrivalFacts(late_impression_ids={"i1"}),
    )
    return confirmed, rows, [*first, *second], adjustments


@pytest.fixture
def table() -> pa.Table:
    return export_table(build_export(PERIOD, *scenario()))


def test_rows_statuses_and_net_micros(table: pa.Table) -> None:
    columns = ("record_type", "click_id", "status", "reason", "amount_micros", "net_micros", "currency")
    got = [tuple(row[c] for c in columns) for row in table.to_pylist()]
    assert got == [
        # Billed by the stream at its final charge, untouched.
        ("click", "c1", "billed", None, 250_000, 250_000, "EUR"),
        # Billed twice: the click is billed once, the extra copy was retracted as a duplicate.
        ("click", "c2", "billed", "duplicate", 250_000, 250_000, "EUR"),
        # Late: added by a correction.
        ("click", "c3", "added", "late_click", 250_000, 250_000, "EUR"),
        # Billed, then retracted: counts 0.
        ("click", "c4", "retracted", "not_billable", 250_000, 0, "EUR"),
        # Billed on ad-2 from a conflicting copy: the final bill on ad-1 was added in its place.
        ("click", "c5", "added", "id_conflict", 250_000, 250_000, "EUR"),
        # Added in one run, retracted in the next: never billed by the stream, counts 0.
        ("click", "c6", "retracted", "id_conflict", 250_000, 0, "EUR"),
        # A free ad is still a billed click, at 0.
        ("click", "c7", "billed", None, 0, 0, "EUR"),
        # Adjustments booked here for EARLIER, which was closed: signed.
        ("adjustment", "c0a", "added", "late_impression", 250_000, 250_000, "EUR"),
        ("adjustment", "c0b", "retracted", "not_billable", 1_000_000, -1_000_000, "USD"),
    ]


def test_click_rows_carry_the_final_impression_and_adjustments_their_period(table: pa.Table) -> None:
    rows = {(row["record_type"], row["click_id"]): row for row in table.to_pylist()}
    c5 = rows[("click", "c5")]
    assert (c5["ad_id"], c5["advertiser_id"], c5["impression_id"]) == ("ad-1", "adv-1", "i5")
    assert (c5["click_time"], c5["impression_time"], c5["user_id"]) == (START + 60 * S, START + 57 * S, "u1")
    assert (c5["corrects_period"], c5["booked_period"]) == (PERIOD, PERIOD)
    c4 = rows[("click", "c4")]
    assert c4["correction_id"] is not None and c4["reason"] == "not_billable"
    adjustment = rows[("adjustment", "c0b")]
    assert (adjustment["corrects_period"], adjustment["booked_period"]) == (EARLIER, PERIOD)
    assert (adjustment["ad_id"], adjustment["advertiser_id"]) == ("ad-2", "adv-2")
    assert adjustment["user_id"] is None and adjustment["click_time"] is None
    assert rows[("click", "c1")]["correction_id"] is None


def test_net_micros_sum_to_the_final_bill_plus_adjustments(table: pa.Table) -> None:
    final, _, _, adjustments = scenario()
    by_currency: dict[str, int] = {}
    for row in table.to_pylist():
        by_currency[row["currency"]] = by_currency.get(row["currency"], 0) + row["net_micros"]
    assert by_currency == {"EUR": 1_250_000, "USD": -1_000_000}
    assert sum(b.amount_micros for b in final) + sum(a.amount_micros for a in adjustments) == 250_000


def test_schema_is_plain_and_documented(table: pa.Table) -> None:
    assert table.schema.equals(EXPORT_SCHEMA, check_metadata=True)
    assert [f.name for f in EXPORT_SCHEMA] == [
        "record_type",
        "click_id",
        "impression_id",
        "ad_id",
        "campaign_id",
        "advertiser_id",
        "user_id",
        "click_time",
        "impression_time",
        "amount_micros",
        "net_micros",
        "currency",
        "status",
        "reason",
        "correction_id",
        "corrects_period",
        "booked_period",
    ]
    assert {f.type for f in EXPORT_SCHEMA} == {pa.string(), pa.int64()}
    assert all(f.metadata[b"description"] for f in EXPORT_SCHEMA)
    assert len(EXPORT_COLUMNS) == len(EXPORT_SCHEMA)


def test_refuses_a_period_that_is_not_reconciled() -> None:
    final, rows, corrections, adjustments = scenario()
    with pytest.raises(ValueError, match=f"period {PERIOD} is not reconciled: click c9"):
        build_export(PERIOD, final, [*rows, ledger("c9")], corrections, adjustments)


def test_refuses_corrections_in_the_wrong_place() -> None:
    final, rows, corrections, adjustments = scenario()
    # A correction of PERIOD booked later belongs to that later export, as an adjustment.
    moved = [*corrections[:-1], Correction(**{**corrections[-1].to_dict(), "booked_period": "20260101T0500Z"})]
    with pytest.raises(ValueError, match="takes the corrections of"):
        build_export(PERIOD, final, rows, moved, adjustments)
    # An "adjustment" that corrects PERIOD itself.
    with pytest.raises(ValueError, match="is not an adjustment booked in"):
        build_export(PERIOD, final, rows, corrections, [*adjustments, corrections[0]])


# --- Writing ---------------------------------------------------------------------------------------------------


def test_write_export_files_and_manifest(tmp_path: Path, table: pa.Table) -> None:
    manifest = write_export(tmp_path, PERIOD, table, START, END, CLOSED_AT)
    folder = export_folder(tmp_path, PERIOD)
    assert folder == tmp_path / "exports" / PERIOD
    assert sorted(p.name for p in folder.iterdir()) == [SUMS_FILE, CSV_FILE, PARQUET_FILE, MANIFEST_FILE]
    assert (manifest.period, manifest.period_start_ms, manifest.period_end_ms) == (PERIOD, START, END)
    # EUR and USD rows: a total per currency, and no one total (it would add micros of two currencies).
    assert (manifest.closed_at_ms, manifest.rows, manifest.total_micros) == (CLOSED_AT, 9, None)
    assert manifest.total_micros_by_currency == {"EUR": 1_250_000, "USD": -1_000_000}
    for name in (PARQUET_FILE, CSV_FILE):
        data = (folder / name).read_bytes()
        assert manifest.files[name].sha256 == hashlib.sha256(data).hexdigest()
        assert manifest.files[name].size_bytes == len(data)
        assert not os.stat(folder / name).st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
    on_disk = json.loads((folder / MANIFEST_FILE).read_text())
    assert on_disk["rows"] == 9 and on_disk["total_micros"] is None and on_disk["version"] == 2
    assert on_disk["total_micros_by_currency"] == {"EUR": 1_250_000, "USD": -1_000_000}
    assert on_disk["files"][PARQUET_FILE] == {
        "bytes": len((folder / PARQUET_FILE).read_bytes()),
        "sha256": manifest.files[PARQUET_FILE].sha256,
    }
    assert read_manifest(folder) == manifest
    assert verify_export(folder) == []
    # The staging folder is gone.
    assert [p.name for p in (tmp_path / "exports").iterdir()] == [PERIOD]


def test_an_export_is_never_overwritten(tmp_path: Path, table: pa.Table) -> None:
    write_export(tmp_path, PERIOD, table, START, END, CLOSED_AT)
    folder = export_folder(tmp_path, PERIOD)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    with pytest.raises(ExportExistsError, match="never rewritten"):
        write_export(tmp_path, PERIOD, table.slice(0, 3), START, END, CLOSED_AT + 1)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert [p.name for p in (tmp_path / "exports").iterdir()] == [PERIOD]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        # The bounds are not those of the period.
        (lambda t: (t, START + H, END + H), "is not the billing period"),
        # Not an hour's span at all.
        (lambda t: (t, START, END - 1), "is not the billing period"),
        # A table of another shape.
        (lambda t: (t.drop_columns(["reason"]), START, END), "EXPORT_SCHEMA"),
        # A row booked in another period.
        (
            lambda t: (
                t.set_column(16, EXPORT_SCHEMA.field("booked_period"), pa.array([EARLIER] * t.num_rows)),
                START,
                END,
            ),
            "booked in",
        ),
    ],
)
def test_write_export_refuses_inconsistent_input(tmp_path: Path, table: pa.Table, change: Any, message: str) -> None:
    bad, start, end = change(table)
    with pytest.raises(ValueError, match=message):
        write_export(tmp_path, PERIOD, bad, start, end, CLOSED_AT)
    assert not export_folder(tmp_path, PERIOD).exists()


def test_an_empty_period_exports_an_empty_table(tmp_path: Path) -> None:
    empty = export_table(build_export(PERIOD, [], [], [], []))
    manifest = write_export(tmp_path, PERIOD, empty, START, END, CLOSED_AT)
    assert (manifest.rows, manifest.total_micros, manifest.total_micros_by_currency) == (0, 0, {})
    assert verify_export(export_folder(tmp_path, PERIOD)) == []
    assert read_export(export_folder(tmp_path, PERIOD)).num_rows == 0


# --- Reading back ----------------------------------------------------------------------------------------------


def test_sha256sum_checks_an_export_and_finds_a_changed_file(tmp_path: Path, table: pa.Table) -> None:
    write_export(tmp_path, PERIOD, table, START, END, CLOSED_AT)
    folder = export_folder(tmp_path, PERIOD)
    listed = [line.split("  ")[1] for line in (folder / SUMS_FILE).read_text().splitlines()]
    assert listed == [PARQUET_FILE, CSV_FILE, MANIFEST_FILE]
    check = subprocess.run(["sha256sum", "-c", SUMS_FILE], cwd=folder, capture_output=True, text=True)
    assert check.returncode == 0, check
    assert check.stdout.splitlines() == [f"{PARQUET_FILE}: OK", f"{CSV_FILE}: OK", f"{MANIFEST_FILE}: OK"]
    (folder / CSV_FILE).chmod(0o644)
    with open(folder / CSV_FILE, "a", encoding="utf-8") as out:
        out.write("tampered\n")
    check = subprocess.run(["sha256sum", "-c", SUMS_FILE], cwd=folder, capture_output=True, text=True)
    assert check.returncode == 1 and f"{CSV_FILE}: FAILED" in check.stdout


def test_verify_and_copy_keep_the_sums_file(tmp_path: Path, table: pa.Table) -> None:
    write_export(tmp_path, PERIOD, table, START, END, CLOSED_AT)
    copied = copy_export(tmp_path, PERIOD, tmp_path / "out")
    assert (copied / SUMS_FILE).read_text() == (export_folder(tmp_path, PERIOD) / SUMS_FILE).read_text()
    sums = copied / SUMS_FILE
    sums.chmod(0o644)
    sums.write_text(sums.read_text().replace(PARQUET_FILE, "other.parquet"))
    assert verify_export(copied) == [f"{SUMS_FILE} does not match the files"]


def test_reads_back_with_pyarrow_and_duckdb(tmp_path: Path, table: pa.Table) -> None:
    write_export(tmp_path, PERIOD, table, START, END, CLOSED_AT)
    folder = export_folder(tmp_path, PERIOD)
    assert pq.read_table(folder / PARQUET_FILE).equals(table)
    assert read_export(folder).to_pylist() == table.to_pylist()
    parquet_sum = duckdb.sql(
        f"SELECT count(*), sum(net_micros), count(*) FILTER (WHERE status = 'retracted') "
        f"FROM read_parquet('{folder / PARQUET_FILE}')"
    ).fetchall()[0]
    assert parquet_sum == (9, 250_000, 3)
    csv_sum = duckdb.sql(
        f"SELECT count(*), sum(net_micros), count(reason) FROM read_csv('{folder / CSV_FILE}', header = true)"
    ).fetchall()[0]
    assert csv_sum == (9, 250_000, 7)


def test_a_large_export_is_written_in_row_groups_with_a_bloom_filter_on_the_click(
    tmp_path: Path, table: pa.Table
) -> None:
    rows = 70_000
    ids = pa.array([f"click-{i:06d}" for i in range(rows)])
    big = pa.concat_tables([table] * (rows // table.num_rows + 1)).slice(0, rows)
    big = big.set_column(big.schema.get_field_index("click_id"), big.schema.field("click_id"), ids)
    write_export(tmp_path, PERIOD, big, START, END, CLOSED_AT)
    path = export_folder(tmp_path, PERIOD) / PARQUET_FILE
    metadata = pq.ParquetFile(path).metadata
    assert [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)] == [65_536, rows - 65_536]
    blooms = duckdb.sql(
        f"SELECT count(*) FROM parquet_metadata('{path}') WHERE path_in_schema = 'click_id' "
        "AND bloom_filter_offset IS NOT NULL"
    ).fetchall()
    assert blooms == [(2,)], "each row group's click_id has its Bloom filter"
    found = duckdb.sql(f"SELECT click_id FROM read_parquet('{path}') WHERE click_id = 'click-069999'").fetchall()
    assert found == [("click-069999",)]


def test_csv_header_and_rows(tmp_path: Path, table: pa.Table) -> None:
    write_export(tmp_path, PERIOD, table, START, END, CLOSED_AT)
    with open(export_folder(tmp_path, PERIOD) / CSV_FILE, newline="", encoding="utf-8") as text:
        lines = list(csv.reader(text))
    assert lines[0] == [f.name for f in EXPORT_SCHEMA]
    assert len(lines) == 1 + table.num_rows
    first = dict(zip(lines[0], lines[1], strict=True))
    # Integers are written as digits; a null is an empty field.
    assert (first["click_id"], first["net_micros"], first["reason"]) == ("c1", "250000", "")


def test_reads_back_with_pandas(tmp_path: Path, table: pa.Table) -> None:
    pandas = pytest.importorskip("pandas")
    write_export(tmp_path, PERIOD, table, START, END, CLOSED_AT)
    frame = pandas.read_parquet(export_folder(tmp_path, PERIOD) / PARQUET_FILE)
    assert int(frame["net_micros"].sum()) == 250_000 and len(frame) == 9


# --- Checking and copying --------------------------------------------------------------------------------------


def test_verify_finds_a_changed_file(tmp_path: Path, table: pa.Table) -> None:
    write_export(tmp_path, PERIOD, table, START, END, CLOSED_AT)
    folder = export_folder(tmp_path, PERIOD)
    csv_path = folder / CSV_FILE
    csv_path.chmod(0o644)
    with open(csv_path, "a", encoding="utf-8") as out:
        out.write('"click","cX",,"ad-1","cmp-1","adv-1",,,,250000,250000,"EUR","added",,,"x","y"\n')
    problems = verify_export(folder)
    assert len(problems) == 2
    assert problems[0].startswith(f"{CSV_FILE}: ") and "bytes, the manifest says" in problems[0]
    assert problems[1].startswith(f"{CSV_FILE}: SHA-256 ")


def test_verify_finds_a_manifest_that_lies(tmp_path: Path, table: pa.Table) -> None:
    write_export(tmp_path, PERIOD, table, START, END, CLOSED_AT)
    folder = export_folder(tmp_path, PERIOD)
    manifest_path = folder / MANIFEST_FILE
    data = json.loads(manifest_path.read_text())
    data["total_micros_by_currency"]["EUR"] += 1
    manifest_path.chmod(0o644)
    manifest_path.write_text(json.dumps(data))
    assert verify_export(folder) == [
        f"{PARQUET_FILE} totals {{'EUR': 1250000, 'USD': -1000000}} micros by currency, the manifest says "
        "{'EUR': 1250001, 'USD': -1000000}",
        f"{SUMS_FILE} does not match the files",  # the manifest changed after SHA256SUMS was written
    ]
    (folder / PARQUET_FILE).chmod(0o644)
    (folder / PARQUET_FILE).unlink()
    assert verify_export(folder) == [f"{PARQUET_FILE} is missing"]
    manifest_path.unlink()
    assert verify_export(folder) == [f"no export in {folder}: {MANIFEST_FILE} is missing"]


def test_copy_export(tmp_path: Path, table: pa.Table) -> None:
    root, out = tmp_path / "home", tmp_path / "out"
    manifest = write_export(root, PERIOD, table, START, END, CLOSED_AT)
    copied = copy_export(root, PERIOD, out)
    assert copied == out / PERIOD
    assert verify_export(copied) == [] and read_manifest(copied) == manifest
    for name in (PARQUET_FILE, CSV_FILE, MANIFEST_FILE):
        assert (copied / name).read_bytes() == (export_folder(root, PERIOD) / name).read_bytes()
    # Copying again is harmless: the identical copy stays as it is.
    assert copy_export(root, PERIOD, out) == copied
    assert sorted(p.name for p in out.iterdir()) == [PERIOD]


def test_copy_export_refuses_a_different_destination_and_a_corrupt_source(tmp_path: Path, table: pa.Table) -> None:
    root = tmp_path / "home"
    write_export(root, PERIOD, table, START, END, CLOSED_AT)
    (tmp_path / "taken" / PERIOD).mkdir(parents=True)
    (tmp_path / "taken" / PERIOD / "notes.txt").write_text("mine")
    with pytest.raises(ExportExistsError):
        copy_export(root, PERIOD, tmp_path / "taken")
    assert (tmp_path / "taken" / PERIOD / "notes.txt").read_text() == "mine"
    parquet = export_folder(root, PERIOD) / PARQUET_FILE
    parquet.chmod(0o644)
    parquet.write_bytes(parquet.read_bytes()[:-1] + b"X")
    with pytest.raises(ExportCorruptError, match="does not verify"):
        copy_export(root, PERIOD, tmp_path / "out")
    assert not (tmp_path / "out" / PERIOD).exists()


def test_manifest_json_round_trip() -> None:
    manifest = Manifest(PERIOD, START, END, CLOSED_AT, 2, 500_000, {"EUR": 500_000})
    assert Manifest.from_json(manifest.to_json()) == manifest
    assert list(json.loads(manifest.to_json()))[:7] == [
        "version",
        "period",
        "period_start_ms",
        "period_end_ms",
        "closed_at_ms",
        "rows",
        "total_micros",
    ]


def test_status_kinds_match_corrections() -> None:
    # An addition adjustment is `added`, a retraction `retracted`: the status follows the kind, not the sign, so a
    # free ad's retraction (0 micros) still reads as one.
    free = reconcile_period(
        EARLIER,
        [],
        [ledger("cF", ad="ad-free", at=START - 5 * S)],
        [],
        booked_period=PERIOD,
        now_ms=CLOSED_AT,
    )
    assert [(c.kind, c.reason, c.amount_micros) for c in free] == [
        (CorrectionKind.RETRACTION, CorrectionReason.NOT_BILLABLE, 0)
    ]
    rows = build_export(PERIOD, [], [], [], free)
    assert [(r["record_type"], r["status"], r["net_micros"]) for r in rows] == [("adjustment", "retracted", 0)]


def test_csv_cells_that_a_spreadsheet_would_read_as_formulas_are_neutralised_and_the_parquet_is_exact(
    tmp_path: Path,
) -> None:
    # Ids come from producers: OWASP's CSV injection list (=, +, -, @, tab, carriage return) as the first character.
    hostile = ['=HYPERLINK("http://x","y")', "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(1)", "\tx", "\rx", "ok-id"]
    bills = [
        BillableClick(cid, "i1", "ad-1", "cmp-1", "adv-1", "u1", START + 60 * S, START + 57 * S, 250_000, "EUR")
        for cid in hostile
    ]
    rows = [{**b.to_dict(), "period": PERIOD, "batch_id": 1} for b in bills]
    table = export_table(build_export(PERIOD, bills, rows, [], []))
    write_export(tmp_path, PERIOD, table, START, END, CLOSED_AT)
    folder = export_folder(tmp_path, PERIOD)
    with open(folder / CSV_FILE, newline="", encoding="utf-8") as f:
        cells = {row["click_id"] for row in csv.DictReader(f)}
    assert cells == {"'" + c for c in hostile[:-1]} | {"ok-id"}
    for cell in cells:
        assert cell[0] not in "=+-@\t\r", cell
    assert sorted(pq.read_table(folder / PARQUET_FILE).column("click_id").to_pylist()) == sorted(hostile)
    assert verify_export(folder) == []
