"""The finance export's files: `ROOT/exports/PERIOD/billing.parquet`, `billing.csv` (the same rows),
`manifest.json` (row count, total micros, bytes and SHA-256 of each file) and `SHA256SUMS`; written once,
atomically, and never changed again. The rows themselves are `billing.export.build_export`'s; a reconciliation run
reads and writes the exports through `ExportFolders`.

Types are plain strings and int64 (times in epoch ms, UTC), so pyarrow, pandas, DuckDB and Spark read them alike.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from billing.export import ExportStatus, RecordType, export_totals
from billing.layout import DataLayout
from billing.money import Amounts
from billing.periods import ANY_PERIOD, Periods
from billing.rule import NOT_CHARGED_FIELDS
from billing.store.columns import schema
from billing.store.compaction import ROW_GROUP_ROWS
from billing.store.durable import fsync_file, fsync_folder, make_folder
from billing.store.redis_totals import NOT_CHARGED_REASONS, NotChargedCount

EXPORT_COLUMNS: tuple[tuple[str, pa.DataType, bool, str], ...] = (
    ("record_type", pa.string(), False, "`click` or `adjustment`"),
    ("click_id", pa.string(), False, "the click"),
    (
        "impression_id",
        pa.string(),
        True,
        "click rows: the final (latest qualifying) impression; for a retracted click, the impression of the "
        "retracted bill; adjustments: as in the correction",
    ),
    ("ad_id", pa.string(), False, "the ad charged"),
    ("campaign_id", pa.string(), False, "the ad's campaign"),
    ("advertiser_id", pa.string(), False, "the ad's advertiser, who pays"),
    ("user_id", pa.string(), True, "the user who clicked; null on adjustments"),
    ("click_time", pa.int64(), True, "click event time, epoch ms UTC; null on adjustments"),
    ("impression_time", pa.int64(), True, "event time of `impression_id`, epoch ms UTC; null on adjustments"),
    ("amount_micros", pa.int64(), False, "the price of the click (the ad's cpc_micros), never negative"),
    (
        "net_micros",
        pa.int64(),
        False,
        "what the row counts in this period: click rows billed or added +amount, retracted 0; "
        "adjustments the signed correction (+amount added, -amount retracted)",
    ),
    ("currency", pa.string(), False, "ISO 4217 code of both amounts"),
    ("status", pa.string(), False, "`billed`, `added` or `retracted`"),
    (
        "reason",
        pa.string(),
        True,
        "the reason of `correction_id` (late_click, late_impression, missed_match, duplicate, id_conflict, "
        "not_billable); null when no correction touched the click",
    ),
    (
        "correction_id",
        pa.string(),
        True,
        "click rows: the click's latest correction in the period, null if none; adjustments: the correction",
    ),
    ("corrects_period", pa.string(), False, "the period of the click (the export's own period on click rows)"),
    ("booked_period", pa.string(), False, "the period whose bill counts the row: always the export's period"),
)
"""Name, type, nullable and meaning of each export column, in order."""

EXPORT_SCHEMA = pa.schema(
    [
        pa.field(name, dtype, nullable=nullable, metadata={"description": meaning})
        for name, dtype, nullable, meaning in EXPORT_COLUMNS
    ]
)
"""The finance export's rows; each field carries its meaning as `description` metadata."""

PARQUET_FILE = "billing.parquet"
CSV_FILE = "billing.csv"
MANIFEST_FILE = "manifest.json"
SUMS_FILE = "SHA256SUMS"
"""The SHA-256 of the data files and the manifest, in the format `sha256sum -c SHA256SUMS` checks."""
EXPORT_FILES = (PARQUET_FILE, CSV_FILE)
"""The data files of an export, each listed in the manifest with its size and checksum."""
NOT_CHARGED_FILE = "not_charged.parquet"
"""The period's billable clicks that were not charged, with the reason (`NOT_CHARGED_SCHEMA`): the invalid traffic
rules, `over_budget`, `ad_paused`, `unknown_ad`. Exports from before it have none."""
MANIFEST_VERSION = 2
"""2: `total_micros` is null when the export holds several currencies (1 added them together)."""


class ExportExistsError(FileExistsError):
    """An export of this period (or a copy of one) is already there: exports are written once."""


class ExportCorruptError(ValueError):
    """An export's files do not match its manifest."""


def export_table(rows: Iterable[Mapping[str, Any]]) -> pa.Table:
    """The rows of `billing.export.build_export` as a table of `EXPORT_SCHEMA`, for `write_export`."""
    return pa.Table.from_pylist(list(rows), schema=EXPORT_SCHEMA)


def exported_bills(table: pa.Table) -> pa.Table:
    """The click rows an export bills (billed or added): what finance was given for the period itself."""
    mask = pc.and_(
        pc.equal(table["record_type"], RecordType.CLICK.value),
        pc.not_equal(table["status"], ExportStatus.RETRACTED.value),
    )
    return table.filter(mask)


# --- Manifest -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExportFile:
    """One data file of an export: its size and SHA-256 (hex)."""

    size_bytes: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """What an export holds, written last into its folder (`manifest.json`).

    `total_micros_by_currency` is `sum(net_micros)` per currency; `total_micros` is the export's one total when its
    rows are in one currency (0 for none), and None when they are in several: no figure adds micros of two
    currencies (a version 1 manifest added them). `rows` counts the rows of each data file (CSV without its header).
    """

    period: str
    period_start_ms: int
    period_end_ms: int
    closed_at_ms: int
    rows: int
    total_micros: int | None
    total_micros_by_currency: dict[str, int] = field(default_factory=dict)
    files: dict[str, ExportFile] = field(default_factory=dict)
    version: int = MANIFEST_VERSION
    not_charged: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per reason, the billable clicks of the period not charged: `clicks` and `micros_by_currency` (what they would
    have cost; none for clicks without a price)."""
    judged_with: dict[str, Any] = field(default_factory=dict)
    """What the period's clicks were judged with: `crawler_list_version` (the `crawler-user-agents` package) and the
    invalid traffic rules' thresholds."""

    def to_json(self) -> str:
        """The manifest file's text: keys in a fixed order, files as `{"bytes", "sha256"}`."""
        data = {
            "version": self.version,
            "period": self.period,
            "period_start_ms": self.period_start_ms,
            "period_end_ms": self.period_end_ms,
            "closed_at_ms": self.closed_at_ms,
            "rows": self.rows,
            "total_micros": self.total_micros,
            "total_micros_by_currency": dict(sorted(self.total_micros_by_currency.items())),
            "files": {
                name: {"bytes": entry.size_bytes, "sha256": entry.sha256} for name, entry in sorted(self.files.items())
            },
        }
        if self.not_charged:
            data["not_charged"] = {reason: self.not_charged[reason] for reason in sorted(self.not_charged)}
        if self.judged_with:
            data["judged_with"] = dict(sorted(self.judged_with.items()))
        return json.dumps(data, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """From the manifest file's text; currencies and files in the order of their names, as written."""
        data = json.loads(text)
        return cls(
            period=data["period"],
            period_start_ms=data["period_start_ms"],
            period_end_ms=data["period_end_ms"],
            closed_at_ms=data["closed_at_ms"],
            rows=data["rows"],
            total_micros=data.get("total_micros"),
            total_micros_by_currency=dict(sorted(data.get("total_micros_by_currency", {}).items())),
            files={name: ExportFile(entry["bytes"], entry["sha256"]) for name, entry in sorted(data["files"].items())},
            version=data.get("version", 1),
            not_charged=dict(data.get("not_charged", {})),
            judged_with=dict(data.get("judged_with", {})),
        )


def export_folder(root: str | os.PathLike[str], period: str) -> Path:
    """`ROOT/exports/PERIOD`: where the export of `period` lives (`billing.layout`)."""
    return DataLayout(Path(root)).export(period)


def read_manifest(folder: str | os.PathLike[str]) -> Manifest:
    """The manifest of the export in `folder` (`export_folder(root, period)`, or a copy made by `copy_export`)."""
    path = Path(folder) / MANIFEST_FILE
    try:
        return Manifest.from_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"no export in {folder}: {MANIFEST_FILE} is missing") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ExportCorruptError(f"{path} is not an export manifest: {exc}") from exc


def read_export(folder: str | os.PathLike[str]) -> pa.Table:
    """The rows of the export in `folder`, from its Parquet file."""
    return pq.read_table(Path(folder) / PARQUET_FILE, schema=EXPORT_SCHEMA)


# --- Writing ------------------------------------------------------------------------------------------------


FORMULA_TRIGGERS = "=+-@\t\r"
"""First characters that make a spreadsheet read a CSV cell as a formula (OWASP, CSV injection)."""


def spreadsheet_safe(table: pa.Table) -> pa.Table:
    """`table` for the CSV file: every text cell that starts with a formula trigger (`FORMULA_TRIGGERS`) gets a
    leading single quote, as OWASP's CSV injection guidance says, so that a spreadsheet shows it as text and runs
    nothing; numbers are left as they are. Ids come from producers, so any text cell may be hostile. The Parquet
    file keeps the exact values."""
    pattern = "^[" + "".join("\\" + c if c in "-\\]^" else c for c in FORMULA_TRIGGERS) + "]"
    columns = []
    for column in table.columns:
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            quoted = pc.binary_join_element_wise("'", column, "")
            column = pc.if_else(pc.match_substring_regex(column, pattern), quoted, column)
        columns.append(column)
    return pa.table(columns, schema=table.schema)


def _write_parquet(table: pa.Table, path: Path) -> None:
    """An export's Parquet file in row groups of `ROW_GROUP_ROWS` with a Bloom filter on `click_id`: a click's story
    that reads the exports of a day reads only the row groups that may hold it."""
    pq.write_table(
        table,
        path,
        compression="snappy",
        row_group_size=ROW_GROUP_ROWS,
        write_statistics=True,
        bloom_filter_options={"click_id": {"ndv": ROW_GROUP_ROWS, "fpp": 0.01}},
    )


def write_export(
    root: str | os.PathLike[str],
    period: str,
    table: pa.Table,
    period_start_ms: int,
    period_end_ms: int,
    closed_at_ms: int,
    not_charged: pa.Table | None = None,
    judged_with: Mapping[str, Any] | None = None,
) -> Manifest:
    """Write the export of `period` (`export_table` of `build_export`'s rows) to `ROOT/exports/PERIOD` and return
    its manifest; with `not_charged` (`not_charged_table`), the period's billable clicks not charged as a file of its
    own, summed per reason in the manifest, and `judged_with` what they were judged with.

    The files go to a hidden temporary folder beside it (`.PERIOD.tmp-*`), are flushed to disk, made read-only,
    and the folder is renamed into place: a reader sees the whole export or none. ExportExistsError if the export
    is already there, whatever its content: an export never changes once written.
    """
    if not table.schema.equals(EXPORT_SCHEMA, check_metadata=False):
        raise ValueError(f"an export table has EXPORT_SCHEMA, got:\n{table.schema}")
    for name, _, nullable, _ in EXPORT_COLUMNS:
        if not nullable and table.column(name).null_count:
            raise ValueError(f"export column {name} holds nulls")
    if set(table.column("booked_period").to_pylist()) - {period}:
        raise ValueError(f"every row of the export of {period} is booked in {period}")
    _check_period(period, period_start_ms, period_end_ms)

    target = export_folder(root, period)
    if target.exists():
        raise ExportExistsError(f"the export of {period} already exists in {target}; exports are never rewritten")
    touched = make_folder(target.parent)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{period}.tmp-"))
    try:
        table = table.replace_schema_metadata(None).cast(EXPORT_SCHEMA)
        _write_parquet(table, staging / PARQUET_FILE)
        pa_csv.write_csv(spreadsheet_safe(table), staging / CSV_FILE, pa_csv.WriteOptions(quoting_style="needed"))
        files = list(EXPORT_FILES)
        summary: dict[str, dict[str, Any]] = {}
        if not_charged is not None:
            not_charged = not_charged.select(NOT_CHARGED_SCHEMA.names).cast(NOT_CHARGED_SCHEMA).sort_by("click_id")
            _write_parquet(not_charged, staging / NOT_CHARGED_FILE)
            files.append(NOT_CHARGED_FILE)
            summary = not_charged_summary(not_charged)
        by_currency = Amounts.of_columns(table.column("currency").to_pylist(), table.column("net_micros").to_pylist())
        manifest = Manifest(
            period=period,
            period_start_ms=period_start_ms,
            period_end_ms=period_end_ms,
            closed_at_ms=closed_at_ms,
            rows=table.num_rows,
            total_micros=by_currency.single(),
            total_micros_by_currency=by_currency.as_dict(),
            files={name: _digest(staging / name) for name in files},
            not_charged=summary,
            judged_with=dict(judged_with or {}),
        )
        (staging / MANIFEST_FILE).write_text(manifest.to_json(), encoding="utf-8")
        (staging / SUMS_FILE).write_text(sha256sums(staging), encoding="utf-8")
        _seal(staging)
        try:
            os.rename(staging, target)
        except OSError as exc:  # another writer got there first (the target is a non-empty folder now)
            raise ExportExistsError(f"the export of {period} appeared in {target} while writing it") from exc
        for folder in [target.parent, *touched]:
            fsync_folder(folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest


def sha256sums(folder: Path) -> str:
    """The text of `SHA256SUMS` for the export in `folder`: `HEX  NAME` a line (two blanks: a binary-safe
    comparison, as `sha256sum` writes it), the data files and then the manifest."""
    names = [*EXPORT_FILES, *([NOT_CHARGED_FILE] if (folder / NOT_CHARGED_FILE).exists() else []), MANIFEST_FILE]
    return "".join(f"{_digest(folder / name).sha256}  {name}\n" for name in names)


def _check_period(period: str, start_ms: int, end_ms: int) -> None:
    try:
        matches = Periods(end_ms - start_ms).key(start_ms) == period
    except (TypeError, ValueError):
        matches = False
    if not matches:
        raise ValueError(f"[{start_ms}, {end_ms}) is not the billing period {period}")


def _digest(path: Path) -> ExportFile:
    sha = hashlib.sha256()
    with open(path, "rb") as data:
        for block in iter(lambda: data.read(1 << 20), b""):
            sha.update(block)
    return ExportFile(path.stat().st_size, sha.hexdigest())


def _seal(folder: Path) -> None:
    """Flush every file of `folder` to disk and make it read-only, then flush the folder itself."""
    for path in folder.iterdir():
        fsync_file(path)
        path.chmod(0o444)
    fsync_folder(folder)


# --- Checking and copying -----------------------------------------------------------------------------------


def verify_export(folder: str | os.PathLike[str]) -> list[str]:
    """What is wrong with the export in `folder`; [] when every file matches the manifest.

    Recomputes each file's size and SHA-256, and from the Parquet file the row count and total micros; counts the
    CSV's rows.
    """
    path = Path(folder)
    try:
        manifest = read_manifest(path)
    except (FileNotFoundError, ExportCorruptError) as exc:
        return [str(exc)]
    problems: list[str] = []
    if path.name != manifest.period:
        problems.append(f"the folder {path.name} holds the export of {manifest.period}")
    if sorted(manifest.files) not in (sorted(EXPORT_FILES), sorted((*EXPORT_FILES, NOT_CHARGED_FILE))):
        problems.append(f"the manifest lists {sorted(manifest.files)}, expected {sorted(EXPORT_FILES)}")
    for name, expected in sorted(manifest.files.items()):
        if not (path / name).is_file():
            problems.append(f"{name} is missing")
            continue
        actual = _digest(path / name)
        if actual.size_bytes != expected.size_bytes:
            problems.append(f"{name}: {actual.size_bytes} bytes, the manifest says {expected.size_bytes}")
        if actual.sha256 != expected.sha256:
            problems.append(f"{name}: SHA-256 {actual.sha256}, the manifest says {expected.sha256}")
    if problems:
        return problems
    table = read_export(path)
    by_currency = Amounts.of_columns(table.column("currency").to_pylist(), table.column("net_micros").to_pylist())
    # A version 1 manifest added the currencies together in `total_micros`, and may have no split.
    total = sum(by_currency.values()) if manifest.version < 2 else by_currency.single()
    if table.num_rows != manifest.rows:
        problems.append(f"{PARQUET_FILE} holds {table.num_rows} rows, the manifest says {manifest.rows}")
    if total != manifest.total_micros:
        problems.append(f"{PARQUET_FILE} totals {total} micros, the manifest says {manifest.total_micros}")
    if (manifest.version >= 2 or manifest.total_micros_by_currency) and by_currency != Amounts(
        manifest.total_micros_by_currency
    ):
        problems.append(
            f"{PARQUET_FILE} totals {dict(sorted(by_currency.items()))} micros by currency, the manifest says "
            f"{manifest.total_micros_by_currency}"
        )
    with open(path / CSV_FILE, "rb") as csv_file:
        csv_rows = pa_csv.read_csv(csv_file).num_rows
    if csv_rows != manifest.rows:
        problems.append(f"{CSV_FILE} holds {csv_rows} rows, the manifest says {manifest.rows}")
    sums = path / SUMS_FILE
    if sums.is_file() and sums.read_text(encoding="utf-8") != sha256sums(path):  # exports before it have none
        problems.append(f"{SUMS_FILE} does not match the files")
    return problems


def copy_export(root: str | os.PathLike[str], period: str, dest: str | os.PathLike[str]) -> Path:
    """Copy the export of `period` to `DEST/PERIOD` (for `adbill export --out DEST`) and return that folder.

    The source is verified first (ExportCorruptError), the copy is staged and renamed into place like the export,
    then verified. An identical copy already at the destination is left as it is; a different one raises
    ExportExistsError.
    """
    source = export_folder(root, period)
    problems = verify_export(source)
    if problems:
        raise ExportCorruptError(f"the export of {period} in {source} does not verify: {'; '.join(problems)}")
    target = Path(dest) / period
    if target.exists():
        if not verify_export(target) and read_manifest(target) == read_manifest(source):
            return target
        raise ExportExistsError(f"{target} already holds something other than the export of {period}")
    touched = make_folder(target.parent)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{period}.tmp-"))
    try:
        for name in (*EXPORT_FILES, NOT_CHARGED_FILE, MANIFEST_FILE, SUMS_FILE):
            if name not in (SUMS_FILE, NOT_CHARGED_FILE) or (source / name).is_file():
                shutil.copyfile(source / name, staging / name)
        _seal(staging)
        try:
            os.rename(staging, target)
        except OSError as exc:
            raise ExportExistsError(f"{target} appeared while copying the export of {period}") from exc
        for folder in [target.parent, *touched]:
            fsync_folder(folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    problems = verify_export(target)
    if problems:
        raise ExportCorruptError(f"the copy in {target} does not verify: {'; '.join(problems)}")
    return target


NOT_CHARGED_SCHEMA = schema(NOT_CHARGED_FIELDS)
"""A billable click not charged: the click, its impression, its ad's owners, its price (null when it had none) and
the reason (`ad_paused`, `unknown_ad`, `known_bot`, `excluded_ip`, `click_flood`, `duplicate_click`,
`over_budget`)."""


def not_charged_table(rows: Iterable[Mapping[str, Any]]) -> pa.Table:
    """Rows with the columns of `NOT_CHARGED_SCHEMA` (others ignored) as its table."""
    return pa.Table.from_pylist([{n: row.get(n) for n in NOT_CHARGED_SCHEMA.names} for row in rows], NOT_CHARGED_SCHEMA)


def not_charged_summary(table: pa.Table) -> dict[str, dict[str, Any]]:
    """Per reason: `clicks`, and `micros_by_currency` of those with a price."""
    clicks: Counter[str] = Counter()
    priced: dict[str, list[tuple[str, int]]] = {}
    for row in table.select(["reason", "amount_micros", "currency"]).to_pylist():
        clicks[row["reason"]] += 1
        priced.setdefault(row["reason"], [])
        if row["amount_micros"] is not None and row["currency"]:
            priced[row["reason"]].append((row["currency"], row["amount_micros"]))
    return {
        reason: {"clicks": clicks[reason], "micros_by_currency": Amounts.of(amounts).as_dict()}
        for reason, amounts in priced.items()
    }


def read_not_charged(folder: str | os.PathLike[str]) -> pa.Table:
    """The not-charged clicks of the export in `folder` (an empty table for an export from before them)."""
    path = Path(folder) / NOT_CHARGED_FILE
    if not path.exists():
        return NOT_CHARGED_SCHEMA.empty_table()
    return pq.read_table(path, schema=NOT_CHARGED_SCHEMA)


def exported_not_charged(clicks: pa.Table, export: pa.Table, period_start_ms: int) -> list[NotChargedCount]:
    """A closed period's not-charged figures from its export: its clicks not charged for an invalid traffic rule or
    the budget (`not_charged.parquet`), and the adjustments booked in it with such a reason (a retraction is one
    more click not charged there, an addition one less), per ad and reason."""
    sums: dict[tuple[str, str, str, str], list[int]] = {}
    for row in clicks.to_pylist():
        if row["reason"] in NOT_CHARGED_REASONS and row["campaign_id"] and row["advertiser_id"]:
            key = (row["advertiser_id"], row["campaign_id"], row["ad_id"], row["reason"])
            entry = sums.setdefault(key, [0, 0])
            entry[0] += 1
            entry[1] += row["amount_micros"] or 0
    adjustments = export.filter(pc.equal(export["record_type"], "adjustment"))
    for row in adjustments.select(
        ["advertiser_id", "campaign_id", "ad_id", "reason", "status", "net_micros"]
    ).to_pylist():
        if row["reason"] in NOT_CHARGED_REASONS:
            key = (row["advertiser_id"], row["campaign_id"], row["ad_id"], row["reason"])
            entry = sums.setdefault(key, [0, 0])
            entry[0] += 1 if row["status"] == "retracted" else -1
            entry[1] += -row["net_micros"]
    period = ANY_PERIOD.key(period_start_ms)
    return [
        NotChargedCount(period, period_start_ms, adv, cmp, ad, reason, clicks_, micros)
        for (adv, cmp, ad, reason), (clicks_, micros) in sorted(sums.items())
    ]


@dataclass(frozen=True)
class ExportFolders:
    """The closed periods' finance exports (`billing.export`)."""

    layout: DataLayout

    def exported(self) -> list[str]:
        root = self.layout.exports
        return [
            folder.name
            for folder in (sorted(root.iterdir()) if root.is_dir() else [])
            if not folder.name.startswith(".") and (folder / MANIFEST_FILE).exists()
        ]

    def closed_at_ms(self, period: str) -> int:
        return read_manifest(self.layout.export(period)).closed_at_ms

    def given(self, period: str) -> list[dict[str, Any]]:
        return exported_bills(read_export(self.layout.export(period))).to_pylist()

    def totals(self, period: str) -> dict[tuple[str, str], tuple[int, int, str]]:
        return export_totals(read_export(self.layout.export(period)).to_pylist())

    def write(
        self,
        period: str,
        export: list[dict[str, Any]],
        start_ms: int,
        end_ms: int,
        closed_at_ms: int,
        not_charged: list[dict[str, Any]] | None = None,
        judged_with: Mapping[str, Any] | None = None,
    ) -> None:
        write_export(
            self.layout.root,
            period,
            export_table(export),
            start_ms,
            end_ms,
            closed_at_ms,
            not_charged_table(not_charged or []),
            judged_with,
        )

    def not_charged(self, period: str) -> list[NotChargedCount]:
        folder = self.layout.export(period)
        return exported_not_charged(read_not_charged(folder), read_export(folder), ANY_PERIOD.parse_key(period))
