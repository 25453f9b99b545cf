"""Reading a recorded capture: JSON Lines, one event a line, in arrival order (docs/billing-rules.md "Recorded
traffic").

    {"type": "impression", "impression_id": "i1", "ad_id": "a1", "user_id": "u1", "event_time": 1767225600000}
    {"type": "click", "click_id": "c1", "ad_id": "a1", "user_id": "u1", "event_time": 1767225605000}
    {"type": "raw", "topic": "clicks", "bytes_b64": "AAAAAAE="}
    {"type": "ad", "ad_id": "a9", "campaign_id": "c1", "advertiser_id": "adv1", "currency": "EUR",
     "effective_from": 1767225600000, "cpc_micros": 250000}
    {"type": "schema", "subject": "clicks-value", "schema": {"type": "record", "name": "Click", ...}}
    {"type": "budget", "campaign_id": "c1", "effective_from": 1767225600000, "daily_budget_micros": 50000000}
    {"type": "ip_exclusion", "cidr": "203.0.113.0/24", "effective_from": 1767225600000, "excluded": true}

Event lines may carry `user_agent` and `ip` (strings; absent or null: the event has none), which the invalid
traffic rules read; a line is written with them only when the event has them.

A `schema` line is a schema version a producer deployed at that point: the replay registers it and writes the
events of its subject after it with that version, taking the fields it adds from the event lines
(`read_capture_with_extras`) or their defaults.

An `ad` line is a change to the catalog (a new ad, a new price, `cpc_micros` null: a pause), applied by the replay
through the catalog's store with its own effective time (a back-fill of recorded history). `budget` lines (a
campaign's daily budget from that time on, `daily_budget_micros` null: unlimited) and `ip_exclusion` lines (an IP
range excluded from that time on, `excluded` false: no longer) are back-filled the same way.

A line that is none of these is reported as a `CaptureError` with its line number, and reading goes on: no line is
dropped silently. Blank lines carry nothing and are skipped. Fields beyond the required ones are
ignored, so a capture may carry annotations. Whether an event is valid for billing (time range, known ad, id
conflicts) is not decided here: such events are sent, and the pipeline quarantines them.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from billing.budgets import BudgetError, check_budget
from billing.catalog import AdChange, BudgetSetting, Catalog, CatalogChange, CatalogError, ExclusionSetting
from billing.catalog_changes import ad_line_change
from billing.events import Click, Event, Impression
from billing.invalid import ExclusionError, parse_cidr
from producers.wire import RawRecord

_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_ID_FIELD = {"impression": "impression_id", "click": "click_id"}
_RAW_TEXT_LIMIT = 2_000


@dataclass(frozen=True, slots=True)
class CaptureError:
    """A capture line that is not a valid line: where it is, what is wrong, and (the start of) its text."""

    line_number: int
    message: str
    raw_text: str

    def __str__(self) -> str:
        return f"line {self.line_number}: {self.message}"


@dataclass(frozen=True, slots=True)
class CatalogLine:
    """A change to the ad catalog where it happened in the capture (`{"type": "ad", ...}`, docs/billing-rules.md
    "Recorded traffic"): applied, with its own `effective_from`, before the lines after it are sent."""

    change: AdChange
    line_number: int = 0

    @property
    def effective_from(self) -> int:
        return self.change.effective_from


@dataclass(frozen=True, slots=True)
class BudgetLine:
    """A campaign's daily budget from `effective_from` on (`{"type": "budget", ...}`; `daily_budget_micros` None:
    unlimited), applied like an `ad` line."""

    campaign_id: str
    effective_from: int
    daily_budget_micros: int | None
    line_number: int = 0


@dataclass(frozen=True, slots=True)
class ExclusionLine:
    """The IP range `cidr` excluded from `effective_from` on (`{"type": "ip_exclusion", ...}`; `excluded` False:
    no longer excluded from then on), applied like an `ad` line."""

    cidr: str
    effective_from: int
    excluded: bool
    line_number: int = 0


CatalogEdit = CatalogLine | BudgetLine | ExclusionLine
"""A line that changes the catalog (prices, budgets or the IP exclusion list) where it stands in the capture."""


@dataclass(frozen=True, slots=True)
class SchemaLine:
    """A schema version deployed by a producer: the registry subject and the schema as JSON text."""

    subject: str
    schema_text: str
    line_number: int = 0


def catalog_change_of(line: CatalogEdit) -> CatalogChange:
    """The change of the catalog a capture's line asks for (an ad's price, a campaign's budget, the IP list)."""
    if isinstance(line, CatalogLine):
        return line.change
    if isinstance(line, BudgetLine):
        return BudgetSetting(line.campaign_id, line.effective_from, line.daily_budget_micros)
    return ExclusionSetting(line.cidr, line.effective_from, line.excluded)


def apply_line(catalog: Catalog, line: CatalogEdit, now_ms: int) -> Catalog:
    """The catalog with a capture's change made as a back-fill (its own `effective_from`, even in the past of
    `now_ms`); CatalogError when the catalog refuses it."""
    return catalog.apply(catalog_change_of(line), now_ms, backfill=True)


_EDIT_LINE_FIELDS: dict[type, tuple[str, tuple[str, ...]]] = {
    BudgetLine: ("budget", ("campaign_id", "effective_from", "daily_budget_micros")),
    ExclusionLine: ("ip_exclusion", ("cidr", "effective_from", "excluded")),
}
"""The `type` of a budget's and an IP exclusion's capture line, and its fields in order (those of the line's class,
but `line_number`)."""

CaptureLine = Event | RawRecord | CatalogLine | BudgetLine | ExclusionLine | SchemaLine | CaptureError
"""What reading one non-blank line gives."""

_TYPES = "impression, click, raw, ad, budget, ip_exclusion or schema"


def capture_line(item: Event | RawRecord | SchemaLine | CatalogEdit) -> str:
    """One line of a capture for an event, a raw record, a schema version or a change of the catalog, without the
    newline.

    The format has no key: a raw record read back from a capture has none, and is sent without one.
    """
    if isinstance(item, RawRecord):
        record: dict[str, Any] = {"type": "raw", "topic": item.topic, "bytes_b64": _b64(item.value)}
    elif isinstance(item, SchemaLine):
        record = {"type": "schema", "subject": item.subject, "schema": json.loads(item.schema_text)}
    elif isinstance(item, CatalogLine):
        change = item.change
        owners = {name: getattr(change, name) for name in ("campaign_id", "advertiser_id", "currency")}
        record = {
            "type": "ad",
            "ad_id": change.ad_id,
            **{name: value for name, value in owners.items() if value is not None},
            "effective_from": change.effective_from,
            "cpc_micros": change.cpc_micros,
        }
    elif isinstance(item, BudgetLine | ExclusionLine):
        kind, names = _EDIT_LINE_FIELDS[type(item)]
        record = {"type": kind, **{name: getattr(item, name) for name in names}}
    else:
        # The optional fields only when the event has them: a version 1 event's line is as it always was.
        record = {"type": item.type, **{k: v for k, v in item.to_record().items() if v is not None}}
    return json.dumps(record, ensure_ascii=False)


def read_capture(path: str | os.PathLike[str]) -> Iterator[CaptureLine]:
    """The capture's lines in order (line numbers from 1); bad lines come out as `CaptureError`."""
    for item, _ in read_capture_with_extras(path):
        yield item


def read_capture_with_extras(path: str | os.PathLike[str]) -> Iterator[tuple[CaptureLine, dict[str, Any]]]:
    """The capture's lines in order, each with the fields of an event line beyond the event's own (empty for
    other lines): the values of fields that a schema version in use adds."""
    with open(path, "rb") as source:
        for line_number, data in enumerate(source, start=1):
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                error = CaptureError(line_number, f"not UTF-8: {exc}", _excerpt(data.decode("utf-8", "replace")))
                yield error, {}
                continue
            if not text.strip():
                continue
            yield _parse(text, line_number)


def parse_capture_line(text: str, line_number: int = 1) -> CaptureLine:
    """One line of a capture (with or without its newline) as an event, a raw record, a schema version, a change of
    the catalog or a CaptureError."""
    return _parse(text, line_number)[0]


def _parse(text: str, line_number: int) -> tuple[CaptureLine, dict[str, Any]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return CaptureError(line_number, f"not JSON: {exc.msg} at column {exc.colno}", _excerpt(text)), {}
    if not isinstance(data, dict):
        return CaptureError(line_number, f"a line is a JSON object, got {type(data).__name__}", _excerpt(text)), {}
    try:
        item = _item(data)
    except _LineProblem as problem:
        return CaptureError(line_number, str(problem), _excerpt(text)), {}
    if isinstance(item, CatalogLine | BudgetLine | ExclusionLine | SchemaLine):
        return replace(item, line_number=line_number), {}
    if isinstance(item, Impression | Click) and len(data) > 5:
        own = {"type", *item.to_record()}
        return item, {name: value for name, value in data.items() if name not in own}
    return item, {}


class _LineProblem(Exception):
    pass


def _item(data: dict[str, Any]) -> Event | RawRecord | CatalogEdit | SchemaLine:
    kind = data.get("type")
    if kind == "ad":
        try:
            return CatalogLine(ad_line_change(data))
        except CatalogError as exc:
            raise _LineProblem(str(exc)) from None
    if kind == "budget":
        campaign_id = _string(data, "campaign_id")
        if not campaign_id:
            raise _LineProblem("field 'campaign_id' must not be empty")
        if "daily_budget_micros" not in data:
            raise _LineProblem("missing field 'daily_budget_micros' (null: unlimited)")
        budget = data["daily_budget_micros"]
        try:
            check_budget(budget)
        except BudgetError as exc:
            raise _LineProblem(f"field 'daily_budget_micros': {exc}") from None
        return BudgetLine(campaign_id, _effective_from(data), budget)
    if kind == "ip_exclusion":
        cidr = _string(data, "cidr")
        try:
            parse_cidr(cidr)
        except ExclusionError as exc:
            raise _LineProblem(f"field 'cidr': {exc}") from None
        excluded = data.get("excluded")
        if not isinstance(excluded, bool):
            raise _LineProblem(f"field 'excluded' must be true or false, got {_json_type(excluded)}")
        return ExclusionLine(cidr, _effective_from(data), excluded)
    if kind == "schema":
        subject = _string(data, "subject")
        schema = data.get("schema")
        if not isinstance(schema, dict | list | str) or not schema:
            raise _LineProblem("field 'schema' must be an Avro schema (a JSON object, array or type name)")
        return SchemaLine(subject, json.dumps(schema))
    if kind == "raw":
        topic = _string(data, "topic")
        if not topic:
            raise _LineProblem("field 'topic' must not be empty")
        encoded = _string(data, "bytes_b64")
        try:
            value = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise _LineProblem(f"field 'bytes_b64' is not base64: {exc}") from None
        return RawRecord(topic, None, value)
    if kind in _ID_FIELD:
        event_id = _string(data, _ID_FIELD[kind])
        ad_id, user_id = _string(data, "ad_id"), _string(data, "user_id")
        event_time = _long(data, "event_time")
        user_agent, ip = _optional_string(data, "user_agent"), _optional_string(data, "ip")
        if kind == "impression":
            return Impression(event_id, ad_id, user_id, event_time, user_agent, ip)
        return Click(event_id, ad_id, user_id, event_time, user_agent, ip)
    if "type" not in data:
        raise _LineProblem(f"missing field 'type' ({_TYPES})")
    raise _LineProblem(f"unknown type {kind!r}: expected {_TYPES}")


def _optional_string(data: dict[str, Any], name: str) -> str | None:
    value = data.get(name)
    if value is not None and not isinstance(value, str):
        raise _LineProblem(f"field {name!r} must be a string or null, got {_json_type(value)}")
    return value


def _effective_from(data: dict[str, Any]) -> int:
    value = _long(data, "effective_from")
    if value < 0:
        raise _LineProblem(f"field 'effective_from' must not be negative (epoch ms), got {value}")
    return value


def _required(data: dict[str, Any], name: str) -> Any:
    """The value of a field the line must have, null or not; a `_LineProblem` when it is missing."""
    if name not in data:
        raise _LineProblem(f"missing field {name!r}")
    return data[name]


def _string(data: dict[str, Any], name: str) -> str:
    value = _required(data, name)
    if not isinstance(value, str):
        raise _LineProblem(f"field {name!r} must be a string, got {_json_type(value)}")
    return value


def _long(data: dict[str, Any], name: str) -> int:
    value = _required(data, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _LineProblem(f"field {name!r} must be an integer (epoch ms), got {_json_type(value)}")
    if not _LONG_MIN <= value <= _LONG_MAX:
        raise _LineProblem(f"field {name!r} does not fit an Avro long: {value}")
    return value


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def _excerpt(text: str) -> str:
    text = text.rstrip("\r\n")
    return text if len(text) <= _RAW_TEXT_LIMIT else text[:_RAW_TEXT_LIMIT] + "…"
