"""Adapter: the records a release settled out of quarantine (`RELEASED/batch_id=N/*.parquet`, written by
`attribution.release`): their schema, who released each, and the reader. Reconciliation reads them to know which
periods a release changes (`billing.store.data_versions`), `adbill restore-redis` to count them."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from billing.layout import DataLayout
from billing.store.columns import schema
from billing.store.compaction import read_batch_only

STREAM = "stream"
RECONCILIATION = "reconciliation"
"""Who released a record (`released_by`)."""

RELEASED_SCHEMA = schema(
    (
        "topic", "partition", "offset", "event_type", "event_id", "period", "quarantine_batch_id", "reason", "ad_id",
        "copy_periods", "released_by", "batch_id",
    )
)  # fmt: skip
"""One settled record: its coordinates, its id and period when archived (`reason` null) or the reason it stays in
quarantine with, the periods holding another copy of its id, who settled it (`STREAM`, `RECONCILIATION`), and the
batch it was settled into."""


def released_table(layout: DataLayout, where: pc.Expression | None = None) -> pa.Table:
    """Every settled record (`RELEASED_SCHEMA`), read with that schema: a file of an older version lacks the newer
    columns (a record it lists was archived by the stream). Each record's `batch_id` is the batch that settled it,
    also once its folder is compacted (`billing.store.compaction.read_batch_only`); `where` names it
    `compaction.own_batch()`."""
    table = read_batch_only(layout.released, RELEASED_SCHEMA.names, where, RELEASED_SCHEMA)
    if table is None:
        return RELEASED_SCHEMA.empty_table()
    return table.set_column(
        table.schema.get_field_index("released_by"),
        "released_by",
        pc.fill_null(table.column("released_by"), STREAM),
    )
