"""Reading recorded captures: good lines become events and raw records, bad lines are reported by number."""

from __future__ import annotations

import base64
import json

import pytest

from billing.events import Click, Impression
from producers.capture import (
    CaptureError,
    SchemaLine,
    capture_line,
    parse_capture_line,
    read_capture,
    read_capture_with_extras,
)
from producers.simulator import write_capture
from producers.wire import RawRecord

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z

CAPTURE = "\n".join(
    [
        # 1: a good impression, exactly as DOMAIN.md writes it
        '{"type": "impression", "impression_id": "i1", "ad_id": "a1", "user_id": "u1", "event_time": 1767225600000}',
        # 2: a good click
        '{"type": "click", "click_id": "c1", "ad_id": "a1", "user_id": "u1", "event_time": 1767225605000}',
        # 3: not JSON
        '{"type": "click", "click_id": "c2", ',
        # 4: a click without its user_id
        '{"type": "click", "click_id": "c3", "ad_id": "a1", "event_time": 1767225605000}',
        # 5: an unknown type
        '{"type": "conversion", "conversion_id": "v1"}',
        # 6: a raw record, with base64 bytes
        '{"type": "raw", "topic": "clicks", "bytes_b64": "AAAAAAE="}',
        # 7: blank: skipped, but line numbers go on counting
        "   ",
        # 8: a good impression after all the bad lines: reading did not stop
        '{"type": "impression", "impression_id": "i2", "ad_id": "a2", "user_id": "u2", "event_time": 1767225601000}',
    ]
)

CLICK_WITH_TIME = '{"type": "click", "click_id": "c1", "ad_id": "a1", "user_id": "u1", "event_time": %s}'


@pytest.fixture
def capture(tmp_path):
    path = tmp_path / "capture.jsonl"
    path.write_text(CAPTURE + "\n", encoding="utf-8")
    return path


def test_reads_good_and_reports_bad_lines_with_numbers(capture):
    items = list(read_capture(capture))
    assert items[0] == Impression("i1", "a1", "u1", T0)
    assert items[1] == Click("c1", "a1", "u1", T0 + 5_000)
    assert isinstance(items[2], CaptureError) and items[2].line_number == 3
    assert "not JSON" in items[2].message
    assert items[2].raw_text == '{"type": "click", "click_id": "c2", '
    assert isinstance(items[3], CaptureError) and items[3].line_number == 4
    assert items[3].message == "missing field 'user_id'"
    assert isinstance(items[4], CaptureError) and items[4].line_number == 5
    assert "unknown type 'conversion'" in items[4].message
    assert items[5] == RawRecord("clicks", None, b"\x00\x00\x00\x00\x01")
    assert items[6] == Impression("i2", "a2", "u2", T0 + 1_000)
    assert len(items) == 7


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("[1, 2]", "a line is a JSON object, got list"),
        ('{"impression_id": "i1"}', "missing field 'type' (impression, click, raw, ad or schema)"),
        ('{"type": null}', "unknown type None"),
        (
            CLICK_WITH_TIME % '"1767225600000"',
            "field 'event_time' must be an integer (epoch ms), got a string",
        ),
        (
            CLICK_WITH_TIME % "1767225600000.5",
            "field 'event_time' must be an integer (epoch ms), got the number 1767225600000.5",
        ),
        (
            CLICK_WITH_TIME % "true",
            "field 'event_time' must be an integer (epoch ms), got a boolean",
        ),
        (
            CLICK_WITH_TIME % "1e30",
            "field 'event_time' must be an integer (epoch ms), got the number 1e+30",
        ),
        (
            CLICK_WITH_TIME % "9223372036854775808",
            "field 'event_time' does not fit an Avro long: 9223372036854775808",
        ),
        (
            '{"type": "impression", "impression_id": 7, "ad_id": "a", "user_id": "u", "event_time": 1}',
            "got the number 7",
        ),
        ('{"type": "raw", "topic": "clicks"}', "missing field 'bytes_b64'"),
        ('{"type": "raw", "topic": "clicks", "bytes_b64": "not base64!"}', "field 'bytes_b64' is not base64"),
        ('{"type": "raw", "topic": "", "bytes_b64": "AA=="}', "field 'topic' must not be empty"),
    ],
)
def test_bad_lines(line, message):
    item = parse_capture_line(line, 12)
    assert isinstance(item, CaptureError)
    assert item.line_number == 12
    assert message in item.message
    assert item.raw_text == line
    assert str(item).startswith("line 12: ")


def test_time_range_and_unknown_ads_are_not_the_readers_business():
    """Such events are valid lines: they are sent, and the pipeline quarantines them."""
    line = '{"type": "click", "click_id": "c1", "ad_id": "nope", "user_id": "u1", "event_time": 0}'
    assert parse_capture_line(line) == Click("c1", "nope", "u1", 0)


def test_extra_fields_are_ignored():
    line = '{"type": "click", "click_id": "c1", "ad_id": "a1", "user_id": "u1", "event_time": 1, "note": "x"}'
    assert parse_capture_line(line) == Click("c1", "a1", "u1", 1)


def test_invalid_utf8_is_reported_and_reading_goes_on(tmp_path):
    path = tmp_path / "capture.jsonl"
    good = b'{"type": "click", "click_id": "c1", "ad_id": "a1", "user_id": "u1", "event_time": 1}\n'
    path.write_bytes(b'{"type": "click", "click_id": "\xff"}\n' + good)
    first, second = read_capture(path)
    assert isinstance(first, CaptureError) and first.line_number == 1 and "not UTF-8" in first.message
    assert second == Click("c1", "a1", "u1", 1)


def test_capture_lines_round_trip(tmp_path):
    items = [
        Impression("i1", "a1", "u1", T0),
        Click("c1", "a1", "u1", T0 + 10_000),
        RawRecord("impressions", None, bytes(range(256))),
        Click("c-ü", "a1", "ü", T0),
    ]
    path = tmp_path / "capture.jsonl"
    assert write_capture(items, path) == 4
    assert list(read_capture(path)) == items
    assert capture_line(items[2]) == (
        '{"type": "raw", "topic": "impressions", "bytes_b64": "' + base64.b64encode(bytes(range(256))).decode() + '"}'
    )
    assert capture_line(items[0]) == (
        '{"type": "impression", "impression_id": "i1", "ad_id": "a1", "user_id": "u1", "event_time": 1767225600000}'
    )


def test_a_schema_line_is_a_schema_version_with_its_line_number(tmp_path):
    schema = {"type": "record", "name": "Click", "fields": [{"name": "click_id", "type": "string"}]}
    path = tmp_path / "capture.jsonl"
    lines = [
        capture_line(Click("c1", "a1", "u1", 1)),
        json.dumps({"type": "schema", "subject": "clicks-value", "schema": schema}),
        json.dumps({**json.loads(capture_line(Click("c2", "a1", "u1", 2))), "placement": "feed"}),
        json.dumps({"type": "schema", "subject": "clicks-value"}),
    ]
    path.write_text("\n".join(lines) + "\n")
    read = list(read_capture_with_extras(path))
    assert read[0] == (Click("c1", "a1", "u1", 1), {})
    assert read[1] == (SchemaLine("clicks-value", json.dumps(schema), 2), {})
    assert read[2] == (Click("c2", "a1", "u1", 2), {"placement": "feed"}), "an event line's added fields come along"
    assert isinstance(read[3][0], CaptureError) and "schema" in read[3][0].message
    assert [item for item, _ in read[:3]] == list(read_capture(path))[:3]
    assert parse_capture_line(capture_line(SchemaLine("clicks-value", json.dumps(schema)))) == SchemaLine(
        "clicks-value", json.dumps(schema), 1
    )
