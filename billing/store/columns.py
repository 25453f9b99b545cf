"""The product's columns: one Arrow type for each column name, whichever table or file holds it (the ledger, the
archive, a batch's figures, the corrections, the not-charged clicks, the price counts, the released records). A
schema is the list of its columns' names (`schema`): a column cannot have one type in one file and another in the
next, and a new column is typed once, here."""

from __future__ import annotations

from collections.abc import Collection, Iterable

import pyarrow as pa

_TEXT = (
    "event_type", "event_id", "click_id", "impression_id", "ad_id", "campaign_id", "advertiser_id", "user_id",
    "user_agent", "ip", "currency", "reason", "kind", "outcome", "period", "booked_period", "corrects_period",
    "folder", "topic", "path", "released_by", "correction_id",
)  # fmt: skip
"""Ids, names, codes and periods."""

_WHOLE = (
    "event_time", "received_ms", "click_time", "impression_time", "click_received_ms", "billed_at_ms",
    "period_start_ms", "created_at_ms", "amount_micros", "micros", "rows", "offset", "batch_id",
    "quarantine_batch_id", "source_batch_id",
)  # fmt: skip
"""Times (epoch ms), money (integer micros), counts, offsets and batch ids."""

TYPES: dict[str, pa.DataType] = {
    **dict.fromkeys(_TEXT, pa.string()),
    **dict.fromkeys(_WHOLE, pa.int64()),
    "partition": pa.int32(),
    "sign": pa.int8(),
    "late": pa.bool_(),
    "value": pa.binary(),
    "copy_periods": pa.list_(pa.string()),
}
"""Each column's type."""


def schema(names: Iterable[str], required: Collection[str] = ()) -> pa.Schema:
    """The schema of the columns `names`, in that order, each of its type in `TYPES`; the `required` ones not
    nullable. A name `TYPES` lacks is a KeyError naming it."""
    return pa.schema([pa.field(name, TYPES[name], nullable=name not in required) for name in names])
