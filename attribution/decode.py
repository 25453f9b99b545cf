"""Kafka records to validated events: Confluent framing, Avro decoding and the intake checks, as columns.

In: a DataFrame with the Kafka source's columns (`value` binary, `topic`, `partition`, `offset`,
`timestamp`), streaming or batch. Out: one row per record with the event's fields, its Kafka coordinates, the
raw bytes and a `quarantine_reason` that is null exactly when the event is valid (`decode_events`), split
into valid events and quarantine rows (`split`).

Everything is a built-in column expression (no Python UDF): this runs on the hot path at tens of thousands of
records a second. Checks, first failing one wins (the order of `billing.intake`):

1. `undecodable`: no value, fewer than 5 bytes, or a first byte other than 0;
2. `unknown_schema`: the 4-byte big-endian schema id is not a key of `writer_schemas`;
3. `undecodable`: the Avro body does not decode with that writer schema;
4. `missing_field`: a required field of the event is absent from the writer schema or null in the record (the
   optional `user_agent` and `ip` of version 2 may be either: a record of version 1 is valid);
5. `time_out_of_range`: `event_time` before 2000-01-01 or more than one hour after the Kafka timestamp.

An ad the catalog does not know is no reason to quarantine (docs/billing-rules.md): the event is valid, archived, and
its click, if matched, is priced by the catalog's history in the sink (`attribution.pricing`), which may know the ad by
then.

How Spark 4.0's `from_avro` behaves, and what we do about it:

- In PERMISSIVE mode a body that fails to decode yields a struct whose fields are all null, not a null
  struct, so it cannot tell "did not decode" from "decoded to nulls". Each body is therefore read with a
  reader schema (`avroSchema` option) made of the event's fields as nullable unions with a null default,
  plus a marker field `adbill_decoded` (boolean, default true) that no writer has: Avro's schema resolution
  fills it with true for every record that decodes, and PERMISSIVE leaves it null for every one that does not.
- One reader schema for every writer id also gives every `when(schema_id == k, from_avro(...))` branch the
  same Catalyst type, and a field that an older writer lacks comes out null (`missing_field`). Per writer, the
  reader also carries the writer's names as aliases where the writer renamed the record or a field and kept the
  old name as its alias (`reader_schema`): schema resolution follows the reader's aliases only, and without them
  every record of such a BACKWARD-compatible version would lack the renamed field. Aliases change no type.
- The reader has no `timestamp-millis` logical type, so `event_time` stays a long of epoch ms: with it, an
  absurd value (say Long.MAX_VALUE) overflows the conversion to microseconds and the whole record would read
  as undecodable instead of `time_out_of_range`.
- The decoder does not check that the body was consumed to its end: trailing bytes after a valid record are
  ignored, as the producers' fastavro deserializer ignores them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import reduce
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro

from billing.compatibility import reader_for_writer
from billing.intake import MAX_FUTURE_MS, MIN_EVENT_TIME_MS, QUARANTINE_VALUE_LIMIT, QuarantineReason
from billing.schemas import schema_text

HEADER_SIZE = 5
"""Magic byte plus the 4-byte schema id of the Confluent wire format."""

DECODED_MARKER = "adbill_decoded"
"""The reader-only field that tells a decoded record from a PERMISSIVE null row."""

QUARANTINE_COLUMNS = (
    "reason",
    "topic",
    "partition",
    "offset",
    "received_ms",
    "value",
    "value_size",
    "value_sha256",
    "event_id",
    "ad_id",
    "event_time",
)
"""The columns of a quarantine row, in order; `event_id`, `ad_id` and `event_time` are null when they could not be
read, `value` when the record had none or was larger than `QUARANTINE_VALUE_LIMIT` (`quarantined_value`)."""

_RECORD = "_record"


def event_fields(event_type: str) -> list[str]:
    """The fields of `impression` or `click`, in the order of the shipped schema; the id comes first, the optional
    fields of version 2 (`user_agent`, `ip`) last."""
    return [field["name"] for field in json.loads(schema_text(event_type))["fields"]]


def required_fields(event_type: str) -> list[str]:
    """The fields a record must have (not null): those of the shipped schema without a null default."""
    return [
        field["name"]
        for field in json.loads(schema_text(event_type))["fields"]
        if not ("default" in field and field["default"] is None)
    ]


def id_column(event_type: str) -> str:
    """`impression_id` or `click_id`."""
    name = f"{event_type}_id"
    if name not in event_fields(event_type):
        raise ValueError(f"the {event_type} schema has no field {name!r}")
    return name


def reader_schema(event_type: str, writer_schema: str | None = None) -> str:
    """The Avro reader schema that the writer schemas of `event_type` are resolved against (module doc); with a
    `writer_schema`, it also knows the names under which that writer carries the record and the fields through the
    writer's aliases (`billing.compatibility.reader_for_writer`: a version that renamed one keeping the old name
    as its alias)."""
    shipped = json.loads(schema_text(event_type))
    fields: list[dict[str, Any]] = [
        {"name": field["name"], "type": _nullable(_without_logical_type(field["type"])), "default": None}
        for field in shipped["fields"]
    ]
    fields.append({"name": DECODED_MARKER, "type": "boolean", "default": True})
    reader = {"type": "record", "name": shipped["name"], "fields": fields}
    if "namespace" in shipped:
        reader["namespace"] = shipped["namespace"]
    if writer_schema is not None:
        try:
            writer = json.loads(writer_schema)
        except ValueError:
            writer = None  # not JSON: no alias to learn; the body does not decode with it either
        reader = reader_for_writer(reader, writer)
    return json.dumps(reader)


def decode_events(kafka_df: DataFrame, event_type: str, writer_schemas: Mapping[int, str]) -> DataFrame:
    """Decode and check the Kafka records of one topic; works on a streaming and a batch DataFrame alike.

    `writer_schemas` maps each schema id that may appear in the frames (the versions of the topic's subject)
    to its schema text.

    Output columns: the event's fields (`impression_id` or `click_id`, `ad_id`, `user_id`, `event_time` long
    ms, `user_agent` and `ip`, null when the record has none), `event_ts` (timestamp of `event_time`, null when
    out of range; put the watermark on it), `topic`, `partition`, `offset`, `received_ms` (the Kafka timestamp as
    long ms), `value` (raw bytes) and `quarantine_reason` (a `QuarantineReason` value, null when the event is valid).
    """
    if not writer_schemas:
        raise ValueError(f"no writer schema is known for {event_type} events: nothing could be decoded")
    id_column(event_type)  # refuses an unknown event type
    fields = event_fields(event_type)
    required = required_fields(event_type)
    value = F.col("value")
    # The header is compared as bytes (magic byte, then each known id as 4 big-endian bytes): no conversion
    # of the id to text or a number per record.
    framed = value.isNotNull() & (F.length(value) >= HEADER_SIZE) & (F.substring(value, 1, 1) == F.lit(b"\x00"))
    schema_id = F.when(framed, F.substring(value, 2, 4))
    id_bytes = {k: F.lit(k.to_bytes(4, "big")) for k in writer_schemas}
    body = value.substr(F.lit(HEADER_SIZE + 1), F.length(value) - F.lit(HEADER_SIZE))
    # One from_avro per writer schema, each with the reader that knows that writer's aliases; CASE WHEN evaluates
    # only the branch of the record's schema id.
    branches = [
        (
            F.col("schema_id") == id_bytes[k],
            from_avro(F.col("_body"), text, {"mode": "PERMISSIVE", "avroSchema": reader_schema(event_type, text)}),
        )
        for k, text in sorted(writer_schemas.items())
    ]
    record = reduce(lambda acc, branch: acc.when(*branch), branches[1:], F.when(*branches[0]))

    framed_df = kafka_df.select(
        F.col("topic"),
        F.col("partition"),
        F.col("offset"),
        F.unix_millis(F.col("timestamp")).alias("received_ms"),
        value.alias("value"),
        framed.alias("framed"),
        schema_id.alias("schema_id"),
        F.when(framed, body).alias("_body"),
    )
    # Decode in a projection of its own and read the fields from the result column, so each body is decoded
    # once, however many fields and checks refer to it. The optimizer would otherwise copy the decoding into
    # every check of a filter above (`split`'s valid rows: a filter is pushed below a projection by inlining
    # its columns, and each `from_avro` in a branch of a CASE WHEN is evaluated on its own): eight decodings
    # of a valid record instead of one. A filter is not pushed below a projection with a nondeterministic
    # column, so the record is guarded by one that always holds (`spark_partition_id` is never negative).
    record = F.when(F.spark_partition_id() >= 0, record)
    carried = [F.col(name) for name in ("topic", "partition", "offset", "received_ms", "value", "framed")]
    decoded = framed_df.select(*carried, F.col("schema_id"), record.alias(_RECORD)).select(
        *[F.col(f"{_RECORD}.{name}").alias(name) for name in fields],
        *carried,
        F.col("schema_id"),
        F.col(f"{_RECORD}.{DECODED_MARKER}").alias(DECODED_MARKER),
    )

    checked = decoded
    event_time = F.col("event_time")
    time_in_range = (event_time >= F.lit(MIN_EVENT_TIME_MS)) & (
        event_time <= F.col("received_ms") + F.lit(MAX_FUTURE_MS)
    )
    any_field_null = reduce(lambda acc, c: acc | c, [F.col(name).isNull() for name in required])
    reason = (
        F.when(~F.col("framed"), F.lit(QuarantineReason.UNDECODABLE.value))
        .when(
            ~F.col("schema_id").isin(*[id_bytes[k] for k in sorted(writer_schemas)]),
            F.lit(QuarantineReason.UNKNOWN_SCHEMA.value),
        )
        .when(F.col(DECODED_MARKER).isNull(), F.lit(QuarantineReason.UNDECODABLE.value))
        .when(any_field_null, F.lit(QuarantineReason.MISSING_FIELD.value))
        .when(~time_in_range, F.lit(QuarantineReason.TIME_OUT_OF_RANGE.value))
    )
    return checked.select(
        *[F.col(name) for name in fields],
        # Guarded: timestamp_millis raises on values whose microseconds overflow a long.
        F.when(time_in_range, F.timestamp_millis(event_time)).alias("event_ts"),
        F.col("topic"),
        F.col("partition"),
        F.col("offset"),
        F.col("received_ms"),
        F.col("value"),
        reason.alias("quarantine_reason"),
    )


def split(decoded: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(valid events without `quarantine_reason`, quarantine rows with `QUARANTINE_COLUMNS`)."""
    valid = decoded.filter(F.col("quarantine_reason").isNull()).drop("quarantine_reason")
    rejected = decoded.filter(F.col("quarantine_reason").isNotNull())
    return valid, to_quarantine(rejected, F.col("quarantine_reason"), _id_column_of(decoded))


def to_quarantine(rows: DataFrame, reason: Column, id_col: str) -> DataFrame:
    """Rows that carry Kafka coordinates and raw bytes, as quarantine rows (`QUARANTINE_COLUMNS`)."""
    return rows.select(
        reason.cast("string").alias("reason"),
        F.col("topic"),
        F.col("partition"),
        F.col("offset"),
        F.col("received_ms"),
        *[column.alias(name) for name, column in quarantined_value(F.col("value")).items()],
        F.col(id_col).alias("event_id"),
        F.col("ad_id"),
        F.col("event_time"),
    )


def quarantined_value(value: Column, quarantined: Column | None = None) -> dict[str, Column]:
    """`value`, `value_size` and `value_sha256` of quarantine rows: the raw bytes up to `QUARANTINE_VALUE_LIMIT`
    (null past it), their length and their SHA-256 in hex. With `quarantined`, only the rows where it holds are
    quarantine rows: the others keep `value` whole and get a null size and digest."""
    size = F.length(value)
    if quarantined is None:
        quarantined = F.lit(True)
    return {
        "value": F.when(quarantined & (size > F.lit(QUARANTINE_VALUE_LIMIT)), F.lit(None)).otherwise(value),
        "value_size": F.when(quarantined, size),
        "value_sha256": F.when(quarantined, F.sha2(value, 256)),
    }


def _id_column_of(decoded: DataFrame) -> str:
    found = [name for name in ("impression_id", "click_id") if name in decoded.columns]
    if len(found) != 1:
        raise ValueError(f"expected decoded events with one id column, got columns {decoded.columns}")
    return found[0]


def _without_logical_type(avro_type: Any) -> Any:
    if isinstance(avro_type, dict):
        stripped = {key: value for key, value in avro_type.items() if key != "logicalType"}
        return stripped["type"] if set(stripped) == {"type"} else stripped
    if isinstance(avro_type, list):
        return [_without_logical_type(branch) for branch in avro_type]
    return avro_type


def _nullable(avro_type: Any) -> list[Any]:
    """A union with "null" first, so that the default may be null."""
    branches = avro_type if isinstance(avro_type, list) else [avro_type]
    return ["null", *[branch for branch in branches if branch != "null"]]
