"""Reading the Parquet ledger of billed clicks (written by the streaming job, one folder per period and batch).

Layout: `LEDGER/period=YYYYMMDDTHHMMZ/batch_id=N/part-*.parquet`, one row per billed click with the columns of
`LEDGER_COLUMNS`; a closed period's batches compacted into `batch_id=M/compacted-A-M.parquet` with each row's batch in
`source_batch_id` (`billing.store.compaction`). Readable by pyarrow, pandas, DuckDB and Spark alike (hive
partitioning). A file that does not read stops the reader with its name (`LedgerCorruptError`): reconciliation, the
audit and the totals' rebuild never go on without a batch's bills. A reconciliation run reads it once, up to the
last batch the stream committed (`LedgerTable`, `ledger_up_to`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from billing.rule import BILLABLE_FIELDS
from billing.store.columns import schema
from billing.store.compaction import SOURCE_BATCH, compacted_span, read_listed, superseded

LEDGER_COLUMNS = (
    *BILLABLE_FIELDS,
    "click_received_ms",
    "billed_at_ms",
    "period_start_ms",
    "period",
    "batch_id",
)


class LedgerCorruptError(RuntimeError):
    """A file of the ledger cannot be read: the ledger would be missing bills, so nothing reads on."""

    def __init__(self, ledger_dir: Path, broken: dict[Path, str]) -> None:
        self.broken = broken
        listed = "; ".join(f"{path} ({why.rstrip('.')})" for path, why in sorted(broken.items()))
        super().__init__(
            f"the ledger in {ledger_dir} has {len(broken)} unreadable file(s): {listed}. Nothing was read: a ledger "
            "missing a batch would bill too little. See docs/operations.md: a broken ledger file"
        )


def read_ledger(ledger_dir: str | Path) -> pa.Table:
    """Every billed click of the ledger (empty table with the ledger's columns when there is none yet).

    LedgerCorruptError, naming each file, when a Parquet file of the ledger cannot be read (truncated, emptied,
    overwritten): a reader never skips one. Files whose names begin with a dot (a write in progress) are not part
    of the ledger, nor the batch files a compacted file holds should both be there (`compaction.superseded`); a
    file gone between the listing and the reading (a compaction) makes it list again. A compacted file's rows carry
    its folder's batch, the newest it holds."""
    path = Path(ledger_dir)

    def read(files: list[Path]) -> pa.Table:
        if not files:
            return LEDGER_SCHEMA.empty_table()
        # The schema given, not inferred: a period whose only file is still being written (a dot-file) has none.
        dataset = ds.dataset(
            [str(f) for f in files],
            schema=LEDGER_SCHEMA,
            format="parquet",
            partitioning=ds.partitioning(pa.schema([("period", pa.string()), ("batch_id", pa.int64())]), flavor="hive"),
            partition_base_dir=str(path),
        )
        return dataset.to_table(columns=list(LEDGER_COLUMNS))

    try:
        return read_listed(path, 2, read)
    except (pa.ArrowException, OSError) as exc:
        broken = _unreadable_files(path)
        if not broken:
            raise
        raise LedgerCorruptError(path, broken) from exc


def read_batches(ledger_dir: str | Path, periods: Iterable[str], after_batch: int, through_batch: int) -> pa.Table:
    """The billed clicks of `periods` written by the batches after `after_batch` up to `through_batch`, read from their
    folders only (`period=P/batch_id=N/`), not the whole ledger: what a reconciliation run looks at when the stream
    applied batches after the one it read through. A batch Redis applied has its files whole (they are written
    before the apply). A compacted file gives the rows of those batches it holds, each with its own batch
    (`source_batch_id`). LedgerCorruptError as `read_ledger`."""
    root = Path(ledger_dir)
    listed: list[Path] = []
    for period in sorted(set(periods)):
        folder = root / f"period={period}"
        if not folder.is_dir():
            continue
        for batch in folder.glob("batch_id=*"):
            number = batch.name.removeprefix("batch_id=")
            if number.lstrip("-").isdigit() and after_batch < int(number):
                listed += [f for f in sorted(batch.glob("*.parquet")) if not f.name.startswith(".")]
    gone = superseded(listed)
    files, compacted = [], []
    for file in listed:
        span = compacted_span(file.name)
        if file in gone:
            continue
        if span is None and int(file.parent.name.removeprefix("batch_id=")) <= through_batch:
            files.append(str(file))
        elif span is not None and span[0] <= through_batch:
            compacted.append(file)
    if not files and not compacted:
        return LEDGER_SCHEMA.empty_table()
    try:
        tables = [_source_batches(file, after_batch, through_batch) for file in compacted]
        if files:
            dataset = ds.dataset(
                files,
                schema=LEDGER_SCHEMA,
                format="parquet",
                partitioning=ds.partitioning(
                    pa.schema([("period", pa.string()), ("batch_id", pa.int64())]), flavor="hive"
                ),
                partition_base_dir=str(root),
            )
            tables.append(dataset.to_table(columns=list(LEDGER_COLUMNS)))
        return pa.concat_tables(tables)
    except (pa.ArrowException, OSError) as exc:
        broken = _unreadable_files(root)
        if not broken:
            raise
        raise LedgerCorruptError(root, broken) from exc


def _source_batches(file: Path, after_batch: int, through_batch: int) -> pa.Table:
    """The rows of a compacted ledger file (`billing.store.compaction`) that batches after `after_batch` up to
    `through_batch` wrote, each with that batch (`source_batch_id`) as its `batch_id`."""
    table = pq.read_table(file)
    source = table.column(SOURCE_BATCH)
    table = table.filter(
        pc.and_(pc.greater(source, after_batch), pc.less_equal(source, pa.scalar(through_batch, pa.int64())))
    )
    period = file.parent.parent.name.removeprefix("period=")
    table = table.append_column("period", pa.repeat(pa.scalar(period), table.num_rows))
    table = table.append_column("batch_id", table.column(SOURCE_BATCH))
    return table.select(list(LEDGER_COLUMNS)).cast(LEDGER_SCHEMA)


def _unreadable_files(ledger_dir: Path) -> dict[Path, str]:
    """Each ledger file that does not read whole, with why; for the error only (it reads every file)."""
    broken = {}
    for file in sorted(ledger_dir.glob("period=*/batch_id=*/*.parquet")):
        if file.name.startswith("."):
            continue
        try:
            pq.ParquetFile(file).read()
        except (pa.ArrowException, OSError) as exc:
            broken[file] = str(exc)
    return broken


LEDGER_SCHEMA = schema(LEDGER_COLUMNS)


def ledger_totals(table: pa.Table) -> list[dict[str, object]]:
    """Clicks and micros per (period, advertiser, campaign, ad) of a ledger table."""
    if table.num_rows == 0:
        return []
    keys = ["period", "period_start_ms", "advertiser_id", "campaign_id", "ad_id"]
    grouped = table.group_by(keys).aggregate([("click_id", "count"), ("amount_micros", "sum")])
    return [
        {**{k: row[k] for k in keys}, "clicks": row["click_id_count"], "micros": row["amount_micros_sum"]}
        for row in grouped.to_pylist()
    ]


def ledger_up_to(ledger: pa.Table, through_batch: int | None) -> pa.Table:
    if through_batch is None or not ledger.num_rows:
        return ledger
    return ledger.filter(pc.less_equal(ledger["batch_id"], through_batch))


@dataclass(frozen=True)
class LedgerTable:
    """The stream's ledger, read once per run (up to batch `through`, None: every batch there was), and the bills of
    the batches the stream applied since, read from their own folders in `folder`."""

    table: pa.Table
    folder: Path | None = None
    through: int | None = None

    def of_period(self, period: str) -> list[dict[str, Any]]:
        return self.table.filter(pc.equal(self.table["period"], period)).to_pylist()

    def billed_after_close(self, period: str, given: list[dict[str, Any]]) -> set[str]:
        billed = set(self.table.filter(pc.equal(self.table["period"], period))["click_id"].to_pylist())
        return billed - {r["click_id"] for r in given}

    @property
    def read_through(self) -> int | None:
        if self.folder is None:
            return None
        if self.through is not None:
            return self.through
        newest = pc.max(self.table["batch_id"]).as_py() if self.table.num_rows else None
        return -1 if newest is None else int(newest)

    def newer(self, after_batch: int, through_batch: int, periods: Collection[str]) -> list[dict[str, Any]]:
        if self.folder is None:
            return []
        return read_batches(self.folder, periods, after_batch, through_batch).to_pylist()
