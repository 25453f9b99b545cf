"""The product's column types: one per name, whichever schema holds it."""

from __future__ import annotations

import pyarrow as pa
import pytest

from attribution.batch_output import FIGURES
from billing.store.archive import ARCHIVE_SCHEMA
from billing.store.columns import TYPES, schema
from billing.store.corrections_arrow import CORRECTION_SCHEMA
from billing.store.export_files import NOT_CHARGED_SCHEMA
from billing.store.parquet_ledger import LEDGER_SCHEMA
from billing.store.price_counts import SCHEMA as COUNTS
from billing.store.released import RELEASED_SCHEMA


def test_a_schema_keeps_the_order_given_and_makes_only_the_required_columns_not_nullable() -> None:
    made = schema(("batch_id", "ad_id", "late"), required={"ad_id"})
    assert made.names == ["batch_id", "ad_id", "late"]
    assert [f.type for f in made] == [pa.int64(), pa.string(), pa.bool_()]
    assert [f.nullable for f in made] == [True, False, True]


def test_a_column_without_a_type_is_refused_by_name() -> None:
    with pytest.raises(KeyError, match="no_such_column"):
        schema(("ad_id", "no_such_column"))


def test_every_schema_gives_a_column_the_same_type() -> None:
    seen: dict[str, pa.DataType] = {}
    for each in (
        FIGURES,
        ARCHIVE_SCHEMA,
        CORRECTION_SCHEMA,
        NOT_CHARGED_SCHEMA,
        LEDGER_SCHEMA,
        COUNTS,
        RELEASED_SCHEMA,
    ):
        for field in each:
            assert seen.setdefault(field.name, field.type) == field.type, field.name
    assert seen == {name: TYPES[name] for name in seen}
    # Money and times are whole numbers; the archive keeps the record's bytes.
    assert {seen[n] for n in ("amount_micros", "micros", "click_time", "event_time", "billed_at_ms")} == {pa.int64()}
    assert seen["value"] == pa.binary() and seen["partition"] == pa.int32()


def test_a_correction_needs_every_field_but_its_impression() -> None:
    assert [f.name for f in CORRECTION_SCHEMA if f.nullable] == ["impression_id"]
