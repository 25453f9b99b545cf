"""The Spark side of the rule, on real local Spark without Kafka: decode, quarantine, dedupe and attribute.

Kafka-shaped DataFrames are built by hand (the value is a Confluent frame of a fastavro-encoded record). Every
case gets its own user ids and event ids, so all cases run through Spark together once, and each case checks
its own rows. The batch result is held to the plain-Python rule (`billing.intake` + `billing.rule`), and the same
functions as a stream over Parquet files, several micro-batches, to the batch result: a unit of the join, not a
test of the streaming job (Kafka, the watermark at work, the sinks), which `test_stream_job.py` covers.
"""

from __future__ import annotations

import io
import json
import os
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)
from pyspark.testing import assertDataFrameEqual

from attribution.decode import QUARANTINE_COLUMNS, decode_events, split
from attribution.join import MATCH_COLUMNS, conflicts, dedupe, match_clicks, watermarked
from attribution.pricing import price_matches
from billing.catalog import Ad, Catalog
from billing.events import Click, Event, Impression
from billing.intake import MAX_FUTURE_MS, MIN_EVENT_TIME_MS, billable_from_arrivals
from billing.rule import BILLABLE_FIELDS
from billing.schemas import schema_text

pytestmark = pytest.mark.integration

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
S = 1_000  # one second in ms
MINUTE = 60 * S
RECEIVED = T0 + 60 * S  # records arrive from here on, one millisecond apart, in the order of the table

IMPRESSION_SCHEMA_ID = 10
CLICK_SCHEMA_ID = 11
CLICK_NULLABLE_USER_SCHEMA_ID = 12  # an evolved click writer whose user_id may be null
IMPRESSION_ADDED_FIELD_SCHEMA_ID = 13  # a newer impression writer with an optional field the job does not read
CLICK_ADDED_FIELD_SCHEMA_ID = 14  # the same for clicks (as a producer deploys it, `test_schema_evolution.py`)
CLICK_WITHOUT_USER_SCHEMA_ID = 15  # a click writer that lacks user_id altogether
CLICK_RENAMED_RECORD_SCHEMA_ID = 16  # a click writer whose record is `Tap`, aliased `Click`
CLICK_RENAMED_FIELD_SCHEMA_ID = 17  # a click writer whose `user_id` is `visitor_id`, aliased `user_id`
IMPRESSION_RENAMED_SCHEMA_ID = 18  # an impression writer with both: `View` aliased `Impression`, and `visitor_id`
UNKNOWN_SCHEMA_ID = 99
ADDED_FIELD = "placement"

CATALOG = Catalog(
    [
        Ad("ad-1", "cmp-1", "adv-1", 250_000, "EUR"),
        Ad("ad-2", "cmp-2", "adv-2", 1_000_000, "USD"),
    ]
)

KAFKA_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
)


def _nullable_user_click_schema() -> str:
    schema = json.loads(schema_text("click"))
    for f in schema["fields"]:
        if f["name"] == "user_id":
            f["type"] = ["null", "string"]
    return json.dumps(schema)


def _added_field_schema(event_type: str) -> str:
    """The shipped schema plus an optional string with a null default: a BACKWARD compatible new version."""
    schema = json.loads(schema_text(event_type))
    schema["fields"].append({"name": ADDED_FIELD, "type": ["null", "string"], "default": None})
    return json.dumps(schema)


def _click_schema_without(field_name: str) -> str:
    schema = json.loads(schema_text("click"))
    schema["fields"] = [f for f in schema["fields"] if f["name"] != field_name]
    return json.dumps(schema)


def _renamed_schema(event_type: str, record: str | None = None, user_field: str | None = None) -> str:
    """The shipped schema with its record and/or `user_id` renamed, each keeping the old name as its alias: BACKWARD
    compatible (the new version reads the old data through the aliases), as `check_backward_transitive` says."""
    schema = json.loads(schema_text(event_type))
    if record is not None:
        schema["aliases"] = [schema["name"]]
        schema["name"] = record
    if user_field is not None:
        for f in schema["fields"]:
            if f["name"] == "user_id":
                f["name"], f["aliases"] = user_field, ["user_id"]
    return json.dumps(schema)


RENAMED_FIELDS = {CLICK_RENAMED_FIELD_SCHEMA_ID: "visitor_id", IMPRESSION_RENAMED_SCHEMA_ID: "visitor_id"}
"""The name a writer schema gives `user_id`, where it renamed it."""


# Every shape of writer schema the job decodes: the shipped `billing/schemas` of each event type, and the evolved
# ones (a field added, a field made nullable, a field missing), all through spark-avro's `from_avro`.
WRITER_SCHEMAS: dict[str, dict[int, str]] = {
    "impression": {
        IMPRESSION_SCHEMA_ID: schema_text("impression"),
        IMPRESSION_ADDED_FIELD_SCHEMA_ID: _added_field_schema("impression"),
    },
    "click": {
        CLICK_SCHEMA_ID: schema_text("click"),
        CLICK_NULLABLE_USER_SCHEMA_ID: _nullable_user_click_schema(),
        CLICK_ADDED_FIELD_SCHEMA_ID: _added_field_schema("click"),
        CLICK_WITHOUT_USER_SCHEMA_ID: _click_schema_without("user_id"),
        CLICK_RENAMED_RECORD_SCHEMA_ID: _renamed_schema("click", record="Tap"),
        CLICK_RENAMED_FIELD_SCHEMA_ID: _renamed_schema("click", user_field="visitor_id"),
    },
}
WRITER_SCHEMAS["impression"][IMPRESSION_RENAMED_SCHEMA_ID] = _renamed_schema(
    "impression", record="View", user_field="visitor_id"
)
_PARSED = {
    schema_id: fastavro.parse_schema(json.loads(text)) for w in WRITER_SCHEMAS.values() for schema_id, text in w.items()
}


def encode(schema_id: int, record: dict[str, Any], frame_id: int | None = None, magic: int = 0) -> bytes:
    """A Confluent frame (magic, big-endian schema id, Avro body) of `record` written with `schema_id`."""
    if schema_id in RENAMED_FIELDS and "user_id" in record:
        record = {RENAMED_FIELDS[schema_id] if k == "user_id" else k: v for k, v in record.items()}
    body = io.BytesIO()
    fastavro.schemaless_writer(body, _PARSED[schema_id], record)
    header = bytes([magic]) + (schema_id if frame_id is None else frame_id).to_bytes(4, "big")
    return header + body.getvalue()


# ----------------------------------------------------------------------------------------------------
# The table. Ids and users are local to a case; `Case.scoped` makes them unique across cases.


@dataclass(frozen=True)
class Sent:
    """One Kafka record of a case: an event (framed Avro) or raw bytes on a topic."""

    event: Event | None = None
    raw: bytes | None = None
    topic: str = "clicks"
    received_ms: int | None = None  # the Kafka timestamp; default: RECEIVED + the place in the table
    schema_id: int | None = None  # the writer schema of an event; default: the shipped one of its type
    extra: tuple[tuple[str, Any], ...] = ()  # fields of a newer writer schema that the event does not have


def imp(
    impression_id: str,
    at: int,
    ad: str = "ad-1",
    user: str = "u1",
    schema_id: int | None = None,
    extra: tuple[tuple[str, Any], ...] = (),
) -> Sent:
    return Sent(Impression(impression_id, ad, user, at), topic="impressions", schema_id=schema_id, extra=extra)


def click(
    click_id: str,
    at: int,
    ad: str = "ad-1",
    user: str = "u1",
    received_ms: int | None = None,
    schema_id: int | None = None,
    extra: tuple[tuple[str, Any], ...] = (),
) -> Sent:
    return Sent(Click(click_id, ad, user, at), received_ms=received_ms, schema_id=schema_id, extra=extra)


def raw(value: bytes, topic: str = "clicks") -> Sent:
    return Sent(raw=value, topic=topic)


@dataclass(frozen=True)
class Case:
    name: str
    sent: list[Sent]
    billed: dict[str, str]  # click id -> impression id
    quarantined: list[tuple[str, str | None]] = field(default_factory=list)  # (reason, event id or None)
    stream_exact: bool = True  # the stream's first match is the latest match
    stream_bills: bool = True  # False: the stream leaves the case's clicks to reconciliation

    def scope(self, local_id: str) -> str:
        return f"{self.name}/{local_id}"

    def scoped(self) -> list[Sent]:
        """The case's records with ids and users prefixed by the case name."""
        out = []
        for sent in self.sent:
            if sent.event is None:
                out.append(sent)
                continue
            event = sent.event
            id_field = "impression_id" if isinstance(event, Impression) else "click_id"
            scoped_event = replace(
                event, **{id_field: self.scope(event.event_id), "user_id": self.scope(event.user_id)}
            )
            out.append(replace(sent, event=scoped_event))
        return out


CLICK_OK = {"click_id": "c1", "ad_id": "ad-1", "user_id": "u1", "event_time": T0}

CASES = [
    # The upper edge of the window is inclusive: a click exactly 10 s after its impression is billed.
    Case("exactly-10s", [imp("i1", T0), click("c1", T0 + 10 * S)], {"c1": "i1"}),
    # One millisecond past the window is not billed.
    Case("10s-plus-1ms", [imp("i1", T0), click("c1", T0 + 10 * S + 1)], {}),
    # The lower edge is inclusive too: a click in the impression's millisecond is billed.
    Case("same-millisecond", [imp("i1", T0), click("c1", T0)], {"c1": "i1"}),
    # A click one millisecond before its impression is not billed.
    Case("click-before-impression", [imp("i1", T0), click("c1", T0 - 1)], {}),
    # Two qualifying impressions: billed once, to the latest (the stream may bill the first match it sees).
    Case(
        "latest-of-two",
        [imp("i1", T0), imp("i2", T0 + 3 * S), click("c1", T0 + 5 * S)],
        {"c1": "i2"},
        stream_exact=False,
    ),
    # An impression after the click does not qualify, even when it is the latest one.
    Case(
        "later-impression-ignored",
        [imp("i1", T0), imp("i2", T0 + 6 * S), click("c1", T0 + 5 * S)],
        {"c1": "i1"},
    ),
    # Qualifying impressions in the same millisecond: the smallest impression id wins.
    Case(
        "tie-smallest-id",
        [imp("i9", T0 + 2 * S), imp("i3", T0 + 2 * S), imp("i5", T0 + 2 * S), click("c1", T0 + 4 * S)],
        {"c1": "i3"},
        stream_exact=False,
    ),
    # The same user saw another ad: no impression of the clicked ad, not billed.
    Case("same-user-other-ad", [imp("i1", T0, ad="ad-2"), click("c1", T0 + S, ad="ad-1")], {}),
    # Another user saw the ad: not billed.
    Case("other-user", [imp("i1", T0, user="u2"), click("c1", T0 + S, user="u1")], {}),
    # The same click received twice with the same content: a duplicate, billed once, not quarantined.
    Case("duplicate-click", [imp("i1", T0), click("c1", T0 + S), click("c1", T0 + S)], {"c1": "i1"}),
    # A duplicated impression does not bill its click twice.
    Case("duplicate-impression", [imp("i1", T0), imp("i1", T0), click("c1", T0 + S)], {"c1": "i1"}),
    # The same click id with other content: the first copy stands and is billed, the later one is a conflict.
    Case(
        "conflicting-click",
        [imp("i1", T0), click("c1", T0 + S), click("c1", T0 + 2 * S, user="u2")],
        {"c1": "i1"},
        [("id_conflict", "c1")],
    ),
    # A conflicting copy that arrives first stands: the later, matching copy is the conflict; nothing bills.
    Case(
        "conflict-first-copy-stands",
        [imp("i1", T0), click("c1", T0 - 5 * S), click("c1", T0 + S)],
        {},
        [("id_conflict", "c1")],
    ),
    # Two clicks on two ads, each priced from its own ad (ad-2 is in USD).
    Case(
        "two-ads",
        [
            imp("i1", T0, ad="ad-2"),
            imp("i2", T0, ad="ad-1"),
            click("c1", T0 + S, ad="ad-2"),
            click("c2", T0 + S),
        ],
        {"c1": "i1", "c2": "i2"},
    ),
    # A click written with the older writer schema (nullable user_id) decodes and bills like any other.
    Case(
        "older-writer-schema",
        [imp("i1", T0), click("c1", T0 + S, schema_id=CLICK_NULLABLE_USER_SCHEMA_ID)],
        {"c1": "i1"},
    ),
    # Both events written with a newer version that adds an optional field, given and left null: the job skips the
    # field and bills the pair.
    Case(
        "added-field-writers",
        [
            imp("i1", T0, schema_id=IMPRESSION_ADDED_FIELD_SCHEMA_ID, extra=((ADDED_FIELD, "feed"),)),
            click("c1", T0 + S, schema_id=CLICK_ADDED_FIELD_SCHEMA_ID, extra=((ADDED_FIELD, "feed"),)),
            imp("i2", T0, ad="ad-2", schema_id=IMPRESSION_ADDED_FIELD_SCHEMA_ID),
            click("c2", T0 + S, ad="ad-2", schema_id=CLICK_ADDED_FIELD_SCHEMA_ID),
        ],
        {"c1": "i1", "c2": "i2"},
    ),
    # Versions that renamed the record or `user_id` and kept the old name as its alias (BACKWARD compatible, as the
    # registry checks): their records decode through the aliases and bill like any other.
    Case(
        "renamed-with-aliases",
        [
            imp("i1", T0, schema_id=IMPRESSION_RENAMED_SCHEMA_ID),
            click("c1", T0 + S, schema_id=CLICK_RENAMED_RECORD_SCHEMA_ID),
            imp("i2", T0, ad="ad-2"),
            click("c2", T0 + S, ad="ad-2", schema_id=CLICK_RENAMED_FIELD_SCHEMA_ID),
        ],
        {"c1": "i1", "c2": "i2"},
    ),
    # A phone whose clock is 50 minutes ahead: valid (less than an hour ahead of Kafka's timestamp) and billed on
    # its own times; the stream bills it too, as Kafka received the click after the impression.
    Case("clock-ahead", [imp("i1", T0 + 50 * MINUTE), click("c1", T0 + 50 * MINUTE + S)], {"c1": "i1"}),
    # The same, but Kafka received the click first: billed by the rule; the stream's join compares such events'
    # receipt times (its watermark follows them), so it leaves this click to reconciliation.
    Case(
        "clock-ahead-click-received-first",
        [click("c1", T0 + 50 * MINUTE + S), imp("i1", T0 + 50 * MINUTE)],
        {"c1": "i1"},
        stream_bills=False,
    ),
    # A click on an ad the catalog does not know is matched but not billed: no bad input, nothing quarantined (the
    # catalog may learn the ad later; pricing decides, `attribution.pricing`).
    Case("unknown-ad", [imp("i1", T0, ad="ad-x"), click("c1", T0 + S, ad="ad-x")], {}),
    # event_time before 2000-01-01 is out of range; exactly 2000-01-01 is not.
    Case(
        "before-2000",
        [click("c1", MIN_EVENT_TIME_MS - 1), click("c2", MIN_EVENT_TIME_MS)],
        {},
        [("time_out_of_range", "c1")],
    ),
    # More than one hour after the Kafka timestamp is out of range; exactly one hour after is not.
    Case(
        "too-far-in-future",
        [
            click("c1", T0 + MAX_FUTURE_MS + 1, received_ms=T0),
            click("c2", T0 + MAX_FUTURE_MS, received_ms=T0),
        ],
        {},
        [("time_out_of_range", "c1")],
    ),
    # Bytes that are not a frame: too short, empty, or a wrong magic byte.
    Case(
        "not-framed",
        [raw(b"\x00\x00"), raw(b""), raw(encode(CLICK_SCHEMA_ID, CLICK_OK, magic=1), topic="impressions")],
        {},
        [("undecodable", None)] * 3,
    ),
    # A frame naming a schema id that the registry does not know.
    Case(
        "unknown-schema-id",
        [raw(encode(CLICK_SCHEMA_ID, CLICK_OK, frame_id=UNKNOWN_SCHEMA_ID))],
        {},
        [("unknown_schema", None)],
    ),
    # A known schema id with a body that is not Avro of it (a string length running past the end).
    Case(
        "garbage-body",
        [raw(bytes([0]) + CLICK_SCHEMA_ID.to_bytes(4, "big") + b"\xfe\xff\xff\xff\x07abc")],
        {},
        [("undecodable", None)],
    ),
    # A record whose writer schema allows a null user_id, with a null user_id: missing field. (Raw bytes, so
    # the id is scoped by hand; the plain-Python intake never sees it as an event.)
    Case(
        "null-field",
        [raw(encode(CLICK_NULLABLE_USER_SCHEMA_ID, {**CLICK_OK, "click_id": "null-field/c1", "user_id": None}))],
        {},
        [("missing_field", "c1")],
    ),
    # A writer schema without user_id at all: the record decodes, the field is missing. (Raw bytes, as above.)
    Case(
        "writer-without-a-field",
        [
            raw(
                encode(
                    CLICK_WITHOUT_USER_SCHEMA_ID,
                    {k: v for k, v in CLICK_OK.items() if k != "user_id"} | {"click_id": "writer-without-a-field/c1"},
                )
            )
        ],
        {},
        [("missing_field", "c1")],
    ),
]


@dataclass(frozen=True)
class Record:
    """One Kafka record of the whole table, with the case it belongs to."""

    case: Case
    sent: Sent
    topic: str
    offset: int
    received_ms: int

    @property
    def value(self) -> bytes:
        if self.sent.event is None:
            assert self.sent.raw is not None
            return self.sent.raw
        schema_id = self.sent.schema_id
        if schema_id is None:
            schema_id = IMPRESSION_SCHEMA_ID if isinstance(self.sent.event, Impression) else CLICK_SCHEMA_ID
        return encode(schema_id, {**self.sent.event.to_record(), **dict(self.sent.extra)})

    def row(self) -> tuple[Any, ...]:
        received = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=self.received_ms)
        return (None, self.value, self.topic, 0, self.offset, received, 0)


def _records() -> list[Record]:
    records: list[Record] = []
    offsets: Counter[str] = Counter()
    for case in CASES:
        for sent in case.scoped():
            received_ms = RECEIVED + len(records) if sent.received_ms is None else sent.received_ms
            records.append(Record(case, sent, sent.topic, offsets[sent.topic], received_ms))
            offsets[sent.topic] += 1
    return records


RECORDS = _records()
CASE_OF = {(r.topic, r.offset): r.case.name for r in RECORDS}


@dataclass
class PipelineOutput:
    matched: list[Row]
    quarantined: list[Row]
    billed: list[dict[str, object]]
    """The matches priced by the catalog (`attribution.pricing`)."""


def kafka_frame(spark: SparkSession, topic: str) -> DataFrame:
    """The table's records of one topic as the Kafka source would give them, in a batch DataFrame."""
    return spark.createDataFrame([r.row() for r in RECORDS if r.topic == topic], KAFKA_SCHEMA)


def pipeline(spark: SparkSession, impressions: DataFrame, clicks: DataFrame) -> tuple[DataFrame, DataFrame]:
    """decode -> split -> (watermark on a stream) -> dedupe -> attribute; plus the quarantine of both topics.

    On a batch, id conflicts are found with `conflicts()`; a stream cannot see them (see the streaming test).
    """
    valid_imps, bad_imps = split(decode_events(impressions, "impression", WRITER_SCHEMAS["impression"]))
    valid_clicks, bad_clicks = split(decode_events(clicks, "click", WRITER_SCHEMAS["click"]))
    quarantined = bad_imps.unionByName(bad_clicks)
    if impressions.isStreaming:
        # A watermark far behind the table's times: nothing here is late, so the stream sees what the batch sees.
        valid_imps = watermarked(valid_imps, 3_600_000)
        valid_clicks = watermarked(valid_clicks, 3_600_000)
    else:
        quarantined = quarantined.unionByName(conflicts(valid_imps, "impression_id")).unionByName(
            conflicts(valid_clicks, "click_id")
        )
    matched = match_clicks(dedupe(valid_imps, "impression_id"), dedupe(valid_clicks, "click_id"))
    return matched, quarantined


# ----------------------------------------------------------------------------------------------------
# Spark


@pytest.fixture(scope="module")
def batch(spark: SparkSession) -> PipelineOutput:
    matched, quarantined = pipeline(spark, kafka_frame(spark, "impressions"), kafka_frame(spark, "clicks"))
    assert tuple(matched.columns) == MATCH_COLUMNS
    assert tuple(quarantined.columns) == QUARANTINE_COLUMNS
    billed = price_matches(matched.toArrow(), CATALOG).bills
    return PipelineOutput(matched.collect(), quarantined.collect(), billed.to_pylist())


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in CASES])
def test_batch_case(case: Case, batch: PipelineOutput) -> None:
    billed = {
        row["click_id"]: row["impression_id"]
        for row in batch.billed
        if str(row["click_id"]).startswith(f"{case.name}/")
    }
    assert billed == {case.scope(c): case.scope(i) for c, i in case.billed.items()}
    quarantined = Counter(
        (row.reason, row.event_id) for row in batch.quarantined if CASE_OF[(row.topic, row.offset)] == case.name
    )
    expected = Counter((reason, None if eid is None else case.scope(eid)) for reason, eid in case.quarantined)
    assert quarantined == expected


def test_batch_rows_equal_the_plain_python_rule(spark: SparkSession, batch: PipelineOutput) -> None:
    """The same records through `billing.intake` and `billing.rule`: the same rows, to the micro."""
    arrivals = [(r.sent.event, r.received_ms) for r in RECORDS if r.sent.event is not None]
    reference, intake = billable_from_arrivals(arrivals, CATALOG)
    actual = sorted(
        ({name: row[name] for name in BILLABLE_FIELDS} for row in batch.billed), key=lambda r: r["click_id"]
    )
    assert actual == [b.to_dict() for b in reference]
    # The intake sees decoded events only: it decides the event-level reasons, the same way.
    event_reasons = ("time_out_of_range", "id_conflict")
    spark_counts = Counter(row.reason for row in batch.quarantined if row.reason in event_reasons)
    assert spark_counts == Counter({reason: intake.counts[reason] for reason in event_reasons})
    assert intake.quarantined == sum(spark_counts.values())


def test_billed_rows_have_the_contract_types(batch: PipelineOutput) -> None:
    priced = next(r for r in batch.billed if r["click_id"] == "two-ads/c1")
    assert priced["amount_micros"] == 1_000_000 and isinstance(priced["amount_micros"], int)
    assert (priced["campaign_id"], priced["advertiser_id"], priced["currency"]) == ("cmp-2", "adv-2", "USD")
    row = next(r for r in batch.matched if r.click_id == "two-ads/c1")
    assert row.click_time == T0 + S and row.impression_time == T0
    assert row.click_ts == datetime(2026, 1, 1, 0, 0, 1)  # naive UTC: the session time zone is UTC


def test_quarantine_rows_keep_the_raw_bytes_and_coordinates(batch: PipelineOutput) -> None:
    by_offset = {(r.topic, r.offset): r for r in RECORDS}
    for row in batch.quarantined:
        record = by_offset[(row.topic, row.offset)]
        assert bytes(row.value) == record.value
        assert row.received_ms == record.received_ms


def test_the_avro_connector_is_the_spark_runtime_s_own_version(spark: SparkSession) -> None:
    """The cases above ran through the spark-avro jar the job loads (`ops.deps`): the one of the running Spark."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    avro = jvm.java.lang.Class.forName("org.apache.spark.sql.avro.AvroDataToCatalyst", False, loader)
    jar = str(avro.getProtectionDomain().getCodeSource().getLocation().getPath())
    assert Path(jar).name == f"spark-avro_2.13-{spark.version}.jar"


def test_each_record_is_decoded_once_however_many_checks_read_it(spark: SparkSession) -> None:
    """The filter of valid events (`split`) is not pushed below the decoding, where the optimizer would copy
    `from_avro` into each of its checks: the plan of the valid events, and of the quarantine rows, decodes with
    one `from_avro` per writer schema, in one CASE WHEN."""
    for topic, event_type in (("impressions", "impression"), ("clicks", "click")):
        valid, rejected = split(decode_events(kafka_frame(spark, topic), event_type, WRITER_SCHEMAS[event_type]))
        for frame in (valid, rejected):
            plan = frame._jdf.queryExecution().optimizedPlan().toString()
            assert plan.count("from_avro(") == len(WRITER_SCHEMAS[event_type]), plan


def test_the_shipped_schemas_decode_with_their_logical_type(spark: SparkSession) -> None:
    """The benchmark's textbook baseline (`ops.bench.baseline`) reads with the shipped schemas as they are:
    `event_time` through `timestamp-millis`, a timestamp."""
    for topic, event_type, id_field in (
        ("impressions", "impression", "impression_id"),
        ("clicks", "click", "click_id"),
    ):
        expected = {
            r.sent.event.event_id: r.sent.event.event_time
            for r in RECORDS
            if r.topic == topic and r.case.name == "two-ads" and r.sent.event is not None
        }
        body = F.expr("substring(value, 6)")
        rows = (
            kafka_frame(spark, topic)
            .select(from_avro(body, schema_text(event_type), {"mode": "PERMISSIVE"}).alias("event"))
            .select("event.*")
            .filter(F.col(id_field).startswith("two-ads/"))
            .collect()
        )
        epoch = datetime(1970, 1, 1)  # naive UTC: the session time zone is UTC
        assert {row[id_field]: (row.event_time - epoch) // timedelta(milliseconds=1) for row in rows} == expected


# ----------------------------------------------------------------------------------------------------
# Streaming: the same records, as Parquet files read a few at a time, through the same functions.


def _write_parquet_files(folder: Path, records: list[Record], files: int) -> None:
    folder.mkdir(parents=True)
    schema = pa.schema(
        [
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("timestamp", pa.timestamp("ms", tz="UTC")),
            ("timestampType", pa.int32()),
        ]
    )
    size = -(-len(records) // files)
    for n in range(files):
        chunk = records[n * size : (n + 1) * size]
        table = pa.Table.from_pylist(
            [
                {
                    "key": None,
                    "value": r.value,
                    "topic": r.topic,
                    "partition": 0,
                    "offset": r.offset,
                    "timestamp": r.received_ms,
                    "timestampType": 0,
                }
                for r in chunk
            ],
            schema=schema,
        )
        path = folder / f"part-{n:03d}.parquet"
        pq.write_table(table, path)
        # The file source takes files in modification-time order: make it the order of arrival.
        stamp = 1_700_000_000 + n
        os.utime(path, (stamp, stamp))


def test_the_join_over_micro_batches_of_files_bills_what_the_batch_bills(
    spark: SparkSession, batch: PipelineOutput, tmp_path: Path
) -> None:
    """A unit of the join's streaming form (a Parquet file source, a memory sink, a watermark nothing crosses):
    not the stream's test. The streaming job itself, over Kafka and into its real sinks, is held to the oracle in
    `test_stream_job.py` and, with the web UI, in `tests/e2e/test_full_path.py`."""
    streams = {}
    for topic in ("impressions", "clicks"):
        folder = tmp_path / topic
        _write_parquet_files(folder, [r for r in RECORDS if r.topic == topic], files=3)
        streams[topic] = spark.readStream.schema(KAFKA_SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(folder))
    billed, quarantined = pipeline(spark, streams["impressions"], streams["clicks"])
    assert billed.isStreaming

    queries = [
        billed.writeStream.format("memory")
        .queryName("test_billed")
        .outputMode("append")
        .option("checkpointLocation", str(tmp_path / "checkpoints" / "billed"))
        .start(),
        quarantined.writeStream.format("memory")
        .queryName("test_quarantined")
        .outputMode("append")
        .option("checkpointLocation", str(tmp_path / "checkpoints" / "quarantined"))
        .start(),
    ]
    try:
        for query in queries:
            query.processAllAvailable()
        assert queries[0].lastProgress is not None and queries[0].lastProgress["batchId"] >= 2
        stream_billed = spark.table("test_billed").collect()
        stream_quarantined = spark.table("test_quarantined").collect()
    finally:
        for query in queries:
            query.stop()

    # Every click matched once (its price is the catalog's at its time, whichever impression it is matched to).
    left_out = {c.name for c in CASES if not c.stream_bills}
    assert sorted(r.click_id for r in stream_billed) == sorted(
        r.click_id for r in batch.matched if r.click_id.split("/")[0] not in left_out
    )
    exact = {c.name for c in CASES if c.stream_exact and c.stream_bills}
    assertDataFrameEqual(
        spark.createDataFrame([r for r in stream_billed if r.click_id.split("/")[0] in exact]),
        [r for r in batch.matched if r.click_id.split("/")[0] in exact],
    )
    # The stream quarantines what the batch does, except id conflicts: dropDuplicatesWithinWatermark keeps the
    # first copy and drops the later ones, conflicting or not, and reconciliation quarantines the conflicts.
    assert sorted(tuple(r) for r in stream_quarantined) == sorted(
        tuple(r) for r in batch.quarantined if r.reason != "id_conflict"
    )
