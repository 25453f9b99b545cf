"""Reading the Parquet ledger of billed clicks (written by the streaming job, one folder per period and batch).

Layout: `LEDGER/period=YYYYMMDDTHHMMZ/batch_id=N/part-*.parquet`, one row per billed click with the columns of
`LEDGER_COLUMNS`. Readable by pyarrow, pandas, DuckDB and Spark alike (hive partitioning).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds

from billing.rule import BILLABLE_FIELDS

LEDGER_COLUMNS = (
    *BILLABLE_FIELDS,
    "click_received_ms",
    "billed_at_ms",
    "period_start_ms",
    "period",
    "batch_id",
)


def read_ledger(ledger_dir: str | Path) -> pa.Table:
    """Every billed click of the ledger (empty table with the ledger's columns when there is none yet)."""
    path = Path(ledger_dir)
    if not path.exists() or not any(path.glob("period=*")):
        return pa.table({name: pa.array([], type=_TYPES[name]) for name in LEDGER_COLUMNS})
    dataset = ds.dataset(
        path,
        format="parquet",
        partitioning=ds.partitioning(pa.schema([("period", pa.string()), ("batch_id", pa.int64())]), flavor="hive"),
        exclude_invalid_files=True,
    )
    return dataset.to_table(columns=list(LEDGER_COLUMNS))


_TYPES = {
    **{name: pa.string() for name in LEDGER_COLUMNS},
    "click_time": pa.int64(),
    "impression_time": pa.int64(),
    "amount_micros": pa.int64(),
    "click_received_ms": pa.int64(),
    "billed_at_ms": pa.int64(),
    "period_start_ms": pa.int64(),
    "batch_id": pa.int64(),
}


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
