"""Reading recorded captures: good lines become events, raw records, schema versions and changes of the catalog
(prices, budgets, the IP exclusion list); bad lines are reported by number. Such a change made in the catalog's
database is tests/integration/test_capture_in_database.py."""

from __future__ import annotations

import base64
import json
from collections import Counter
from dataclasses import replace

import pytest

from billing.catalog import AdChange
from billing.events import Click, Impression
from producers.capture import (
    BudgetLine,
    CaptureError,
    CatalogLine,
    ExclusionLine,
    SchemaLine,
    apply_line,
    capture_line,
    parse_capture_line,
    read_capture,
    read_capture_with_extras,
)
from producers.simulator import SimulationConfig, Simulator, write_capture
from producers.wire import RawRecord

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z

CAPTURE = "\n".join(
    [
        # 1: a good impression, exactly as docs/billing-rules.md writes it
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
        (
            '{"impression_id": "i1"}',
            "missing field 'type' (impression, click, raw, ad, budget, ip_exclusion or schema)",
        ),
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
        (
            '{"type": "click", "click_id": "c1", "ad_id": "a", "user_id": "u", "event_time": 1, "ip": 7}',
            "field 'ip' must be a string or null, got the number 7",
        ),
        ('{"type": "budget", "effective_from": 1, "daily_budget_micros": 5}', "missing field 'campaign_id'"),
        ('{"type": "budget", "campaign_id": "c1", "effective_from": 1}', "missing field 'daily_budget_micros'"),
        (
            '{"type": "budget", "campaign_id": "c1", "effective_from": 1, "daily_budget_micros": -5}',
            "a daily budget must not be negative",
        ),
        (
            '{"type": "budget", "campaign_id": "c1", "effective_from": 1, "daily_budget_micros": 2.5}',
            "a daily budget is a whole number of micros",
        ),
        (
            '{"type": "budget", "campaign_id": "c1", "effective_from": -1, "daily_budget_micros": 5}',
            "field 'effective_from' must not be negative",
        ),
        ('{"type": "budget", "campaign_id": "c1", "daily_budget_micros": 5}', "missing field 'effective_from'"),
        (
            '{"type": "ip_exclusion", "cidr": "203.0.113.7/24", "effective_from": 1, "excluded": true}',
            "has host bits set: the range is 203.0.113.0/24",
        ),
        (
            '{"type": "ip_exclusion", "cidr": "not an address", "effective_from": 1, "excluded": true}',
            "is not an IP range",
        ),
        (
            '{"type": "ip_exclusion", "cidr": "2001:db8::/32", "effective_from": 1}',
            "field 'excluded' must be true or false, got null",
        ),
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


def test_events_carry_their_user_agent_and_ip_when_they_have_them():
    line = (
        '{"type": "click", "click_id": "c1", "ad_id": "a1", "user_id": "u1", "event_time": 1, '
        '"user_agent": "Googlebot/2.1", "ip": "2001:db8::1"}'
    )
    assert parse_capture_line(line) == Click("c1", "a1", "u1", 1, "Googlebot/2.1", "2001:db8::1")
    assert capture_line(parse_capture_line(line)) == line
    # Null is none, as absent is; an `ip` that is no address is the pipeline's business (judged as none).
    assert parse_capture_line(line.replace('"Googlebot/2.1"', "null")) == Click(
        "c1", "a1", "u1", 1, None, "2001:db8::1"
    )
    assert parse_capture_line(line.replace('"2001:db8::1"', '"nope"')).ip == "nope"
    # A version 1 event's line is as it always was.
    assert "user_agent" not in capture_line(Click("c1", "a1", "u1", 1))


def test_catalog_lines_round_trip(tmp_path):
    items = [
        CatalogLine(AdChange("a9", T0, 250_000, "c1", "adv1", "EUR")),
        CatalogLine(AdChange("a9", T0 + 1, None)),
        BudgetLine("c1", T0, 50_000_000),
        BudgetLine("c1", T0 + 3_600_000, None),
        ExclusionLine("203.0.113.0/24", T0, True),
        ExclusionLine("2001:db8::/32", T0 + 1, False),
        Impression("i1", "a9", "u1", T0, "Mozilla/5.0", "198.51.100.7"),
    ]
    path = tmp_path / "capture.jsonl"
    assert write_capture(items, path) == len(items)
    read = list(read_capture(path))
    numbered = [replace(item, line_number=n) for n, item in enumerate(items[:-1], start=1)]
    assert read == [*numbered, items[-1]]
    # As docs/billing-rules.md writes them.
    assert json.loads(capture_line(items[2])) == {
        "type": "budget",
        "campaign_id": "c1",
        "effective_from": T0,
        "daily_budget_micros": 50_000_000,
    }
    assert json.loads(capture_line(items[4])) == {
        "type": "ip_exclusion",
        "cidr": "203.0.113.0/24",
        "effective_from": T0,
        "excluded": True,
    }
    assert json.loads(capture_line(items[0])) == {
        "type": "ad",
        "ad_id": "a9",
        "campaign_id": "c1",
        "advertiser_id": "adv1",
        "currency": "EUR",
        "effective_from": T0,
        "cpc_micros": 250_000,
    }


def test_a_recorded_run_replays_into_its_catalog_history(tmp_path):
    """A capture of a run with its changes of prices, budgets and exclusions among its events: applied to the catalog
    the run started with, its lines give the history the run is billed by; its events are the run's."""
    config = SimulationConfig(
        events=3_000,
        seed=5,
        start_ms=T0,
        catalog_change_every_s=2.0,
        new_ads=1,
        excluded_ip_fraction=0.05,
        crawler_fraction=0.05,
        budget_campaigns=2,
        bad_fraction=0.0,  # raw records lose their key in a capture
    )
    simulator = Simulator(config)
    path = tmp_path / "capture.jsonl"
    write_capture(simulator.recording(), path)
    catalog, events = config.catalog(), []
    kinds = Counter()
    for item in read_capture(path):
        kinds[type(item).__name__] += 1
        if isinstance(item, CatalogLine | BudgetLine | ExclusionLine):
            catalog = apply_line(catalog, item, T0)
        else:
            events.append(item)
    assert catalog == simulator.catalog
    assert events == [a.item for a in simulator.arrivals()]
    assert kinds["BudgetLine"] == 4 and kinds["ExclusionLine"] == 3 and kinds["CatalogLine"] > 3
    # Each change comes before the events of its time (with the publisher's lead).
    read = list(read_capture(path))
    for position, item in enumerate(read):
        if isinstance(item, BudgetLine | ExclusionLine | CatalogLine):
            assert all(e.event_time < item.effective_from for e in read[:position] if isinstance(e, Click | Impression))
