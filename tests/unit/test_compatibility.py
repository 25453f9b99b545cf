"""Avro schema resolution: what a new reader schema can read of data written with an older one."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from billing.compatibility import (
    IncompatibleSchemaError,
    InvalidSchemaError,
    can_read,
    check_backward_transitive,
    reader_for_writer,
)
from billing.schemas import schema_text


def record(*fields: dict[str, Any], name: str = "Click", **extra: Any) -> dict[str, Any]:
    return {"type": "record", "name": name, "namespace": "adbill.events", "fields": list(fields), **extra}


def field(name: str, type_: Any, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": type_, **extra}


V1 = record(field("click_id", "string"), field("event_time", {"type": "long", "logicalType": "timestamp-millis"}))


def test_identical_schemas_are_compatible() -> None:
    assert can_read(V1, V1) == []
    assert can_read(json.dumps(V1), json.dumps(V1)) == []


def test_adding_an_optional_field_with_default_is_backward_compatible() -> None:
    v2 = record(*V1["fields"], field("campaign", ["null", "string"], default=None))
    assert can_read(v2, V1) == []


def test_adding_a_required_field_without_default_is_refused() -> None:
    v2 = record(*V1["fields"], field("campaign", "string"))
    problems = can_read(v2, V1)
    assert len(problems) == 1
    assert "Click.campaign" in problems[0] and "no default" in problems[0]


def test_removing_a_field_is_backward_compatible() -> None:
    v2 = record(V1["fields"][0])
    assert can_read(v2, V1) == []
    # ...but not forward: the old reader needs the removed field.
    assert can_read(V1, v2) != []


def test_changing_string_to_int_is_refused() -> None:
    v2 = record(field("click_id", "int"), V1["fields"][1])
    problems = can_read(v2, V1)
    assert problems == ["Click.click_id: reader type 'int' cannot read writer type 'string'"]


@pytest.mark.parametrize(
    ("writer", "reader"),
    [
        ("int", "long"),
        ("int", "float"),
        ("int", "double"),
        ("long", "float"),
        ("long", "double"),
        ("float", "double"),
        ("string", "bytes"),
        ("bytes", "string"),
    ],
)
def test_promotions(writer: str, reader: str) -> None:
    assert can_read(record(field("n", reader)), record(field("n", writer))) == []


@pytest.mark.parametrize(("writer", "reader"), [("long", "int"), ("double", "float"), ("string", "int")])
def test_no_demotions(writer: str, reader: str) -> None:
    assert can_read(reader, writer) != []


def test_int_to_long_promotion_in_a_record() -> None:
    old = record(field("count", "int"))
    new = record(field("count", "long"))
    assert can_read(new, old) == []
    assert can_read(old, new) == ["Click.count: reader type 'int' cannot read writer type 'long'"]


def test_record_names_must_match_unless_aliased() -> None:
    renamed = record(*V1["fields"], name="Tap")
    assert any("does not match" in p for p in can_read(renamed, V1))
    aliased = record(*V1["fields"], name="Tap", aliases=["Click"])
    assert can_read(aliased, V1) == []


def test_an_older_reader_reads_a_renamed_writer_through_the_writers_aliases() -> None:
    """The inverse of the two cases around: data written with the renamed version, read by the older reader."""
    renamed = record(field("id", "string", aliases=["click_id"]), V1["fields"][1], name="Tap", aliases=["Click"])
    assert can_read(renamed, V1) == [], "BACKWARD compatible"
    assert can_read(V1, renamed) != [], "an older reader alone does not read it"
    reader = reader_for_writer(V1, renamed)
    assert can_read(reader, renamed) == []
    assert reader["aliases"] == ["adbill.events.Tap"] and reader["fields"][0]["aliases"] == ["id"]
    assert V1.get("aliases") is None, "the reader given is left as it was"
    # A field the writer has under its own name, or that two writer fields claim, keeps no alias.
    both = record(field("click_id", "string"), field("id", "string", aliases=["click_id"]), V1["fields"][1])
    assert "aliases" not in reader_for_writer(V1, both)["fields"][0]
    two = record(field("a", "string", aliases=["click_id"]), field("b", "string", aliases=["click_id"]))
    assert "aliases" not in reader_for_writer(V1, two)["fields"][0]
    # A writer that renamed its record without keeping the old name is not taken for it.
    assert "aliases" not in reader_for_writer(V1, record(*V1["fields"], name="Other"))


def test_renamed_field_is_found_through_its_alias() -> None:
    v2 = record(field("id", "string", aliases=["click_id"]), V1["fields"][1])
    assert can_read(v2, V1) == []
    without_alias = record(field("id", "string"), V1["fields"][1])
    assert can_read(without_alias, V1) != []


def test_enums() -> None:
    writer = {"type": "enum", "name": "Device", "symbols": ["WEB", "IOS", "ANDROID"]}
    fewer = {"type": "enum", "name": "Device", "symbols": ["WEB", "IOS"]}
    assert can_read(writer, fewer) == []  # the reader knows every symbol the writer can write
    problems = can_read(fewer, writer)
    assert len(problems) == 1 and "ANDROID" in problems[0]
    assert can_read({**fewer, "default": "WEB"}, writer) == []


def test_arrays_and_maps_by_items_and_values() -> None:
    assert can_read({"type": "array", "items": "long"}, {"type": "array", "items": "int"}) == []
    assert can_read({"type": "array", "items": "int"}, {"type": "array", "items": "long"}) != []
    assert can_read({"type": "map", "values": "double"}, {"type": "map", "values": "float"}) == []
    assert can_read({"type": "map", "values": "string"}, {"type": "map", "values": "int"}) != []
    assert can_read({"type": "map", "values": "int"}, {"type": "array", "items": "int"}) != []


def test_fixed_by_name_and_size() -> None:
    md5 = {"type": "fixed", "name": "MD5", "size": 16}
    assert can_read(md5, md5) == []
    assert any("size" in p for p in can_read({**md5, "size": 32}, md5))
    assert can_read({**md5, "name": "SHA"}, md5) != []


def test_unions() -> None:
    # A union reader reads a non-union writer when one branch can.
    assert can_read(["null", "long"], "int") == []
    assert can_read(["null", "string"], "int") != []
    # Every writer branch must be readable by some reader branch.
    assert can_read(["null", "string", "long"], ["null", "int"]) == []
    assert can_read(["null", "string"], ["null", "int"]) != []
    # A non-union reader must read every writer branch.
    assert can_read("long", ["int", "long"]) == []
    assert can_read("long", ["null", "long"]) != []


def test_named_type_references_and_recursion() -> None:
    node = {
        "type": "record",
        "name": "Node",
        "namespace": "adbill.test",
        "fields": [field("value", "int"), field("next", ["null", "Node"], default=None)],
    }
    wider = copy.deepcopy(node)
    wider["fields"][0]["type"] = "long"
    assert can_read(wider, node) == []
    assert can_read(node, wider) != []
    # A reference by full name to a type defined earlier in the same schema.
    pair = record(
        field("first", {"type": "fixed", "name": "Id", "size": 8}),
        field("second", "adbill.events.Id"),
        name="Pair",
    )
    assert can_read(pair, pair) == []


def test_invalid_schemas_raise() -> None:
    with pytest.raises(InvalidSchemaError, match="unknown type"):
        can_read(record(field("x", "Nope")), V1)
    with pytest.raises(InvalidSchemaError):
        can_read("{not json", V1)
    with pytest.raises(InvalidSchemaError, match="fields"):
        can_read({"type": "record", "name": "R"}, V1)


def test_backward_transitive_refuses_a_schema_that_cannot_read_v1_and_names_it() -> None:
    v1 = record(field("click_id", "string"))
    v2 = record(field("click_id", "string"), field("campaign", "string", default=""))
    # v3 makes campaign required: it reads v2's data, not v1's.
    v3 = record(field("click_id", "string"), field("campaign", "string"))
    assert can_read(v3, v2) == []
    assert can_read(v3, v1) != []
    with pytest.raises(IncompatibleSchemaError) as caught:
        check_backward_transitive(v3, [v1, v2])
    assert "version 1" in str(caught.value)
    assert "version 2" not in str(caught.value)
    assert all("version 1" in p for p in caught.value.problems)
    assert isinstance(caught.value, ValueError)


def test_backward_transitive_accepts_a_compatible_history() -> None:
    v1 = record(field("click_id", "string"))
    v2 = record(field("click_id", "string"), field("campaign", "string", default=""))
    v3 = record(field("click_id", "string"), field("campaign", ["string", "null"], default=""))
    assert check_backward_transitive(v3, [v1, v2]) is None
    assert check_backward_transitive(v1, []) is None


def test_backward_transitive_uses_given_version_numbers() -> None:
    with pytest.raises(IncompatibleSchemaError, match="version 7"):
        check_backward_transitive(record(field("x", "string")), [V1], version_numbers=[7])


@pytest.mark.parametrize("event_type", ["impression", "click"])
def test_the_shipped_schemas_parse_and_read_themselves(event_type: str) -> None:
    text = schema_text(event_type)
    assert can_read(text, text) == []
