"""Corrections as Arrow tables and Parquet files: the schema, the conversions, and the corrections folder a
reconciliation run reads and writes (`CorrectionFiles`). `billing.corrections` holds the rules, over plain rows."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from billing.corrections import CORRECTION_FIELDS, Correction
from billing.layout import DataLayout
from billing.store.columns import schema
from billing.store.durable import make_folder, replace_files, staged

CORRECTION_SCHEMA = schema(CORRECTION_FIELDS, required=set(CORRECTION_FIELDS) - {"impression_id"})
"""Corrections as Arrow/Parquet: plain strings and int64 (epoch ms), readable by pyarrow, pandas, DuckDB, Spark."""


def corrections_to_arrow(corrections: Iterable[Correction]) -> pa.Table:
    """A table of `CORRECTION_SCHEMA`, one row per correction, in the order given."""
    rows = [correction.to_dict() for correction in corrections]
    return pa.Table.from_pylist(rows, schema=CORRECTION_SCHEMA)


def corrections_from_arrow(table: pa.Table) -> list[Correction]:
    """Corrections from a table holding at least the columns of `CORRECTION_SCHEMA` (extra columns are ignored)."""
    missing = [name for name in CORRECTION_FIELDS if name not in table.column_names]
    if missing:
        raise ValueError(f"not a corrections table: missing columns {missing}")
    return [Correction.from_dict(row) for row in table.select(list(CORRECTION_FIELDS)).to_pylist()]


@dataclass(frozen=True)
class CorrectionFiles:
    """The corrections: one Parquet file per corrected period and run."""

    layout: DataLayout

    def read(self) -> list[Correction]:
        folder = self.layout.corrections
        if not folder.exists() or not any(folder.glob("period=*/*.parquet")):
            return []
        return corrections_from_arrow(ds.dataset(folder, format="parquet", partitioning="hive").to_table())

    def write(self, period: str, run_id: str, corrections: list[Correction]) -> None:
        folder = self.layout.corrections_of(period)
        touched = make_folder(folder)
        with staged(folder / f".run-{run_id}.parquet.tmp") as temporary:
            pq.write_table(corrections_to_arrow(corrections), temporary)
            replace_files([(temporary, folder / f"run-{run_id}.parquet")], touched)
