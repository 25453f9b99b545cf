"""Avro schema resolution compatibility, in pure Python on parsed JSON schemas.

`can_read(reader, writer)` answers the question the Avro specification's "Schema Resolution" section answers:
can data written with `writer` be read with `reader`? Our topics evolve BACKWARD-transitively: a new schema
must read the data of every earlier version, which `check_backward_transitive` enforces. The readers of the
stream and the producers are older than the versions they read: `reader_for_writer` gives such a reader the names a
newer writer renamed through aliases.

Like the Confluent checker, record, enum and fixed names are compared unqualified (or through the reader's
aliases), a reader union reads a writer branch when any of its branches can, and logical types are resolved by
their underlying type. Field defaults are not type-checked here.

Why not the Apache Avro project's checker (`avro.compatibility.ReaderWriterCompatibilityChecker`, avro 1.12.1 and
1.12.2, tried against `tests/unit/test_compatibility.py` through an adapter): it passes 25 of the 30 cases, and
- it refuses a renamed record whose reader aliases the writer's name (`"name": "Tap", "aliases": ["Click"]` reading
  `Click`): it ignores a named type's aliases, which Avro's schema resolution (and Java's checker) honours;
- its reasons are JSON-pointer locations and bare names in unordered sets (`/fields/2` and `campaign`), so a
  refusal cannot say "Click.campaign has no default" the way the registry's error names the field and version;
- it raises its own parse errors for an invalid schema (no "unknown type").
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any

Schema = dict[str, Any] | list[Any] | str

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
NAMED = frozenset({"record", "error", "enum", "fixed"})

# (writer, reader) pairs the specification allows besides identical primitives.
PROMOTIONS = frozenset(
    {
        ("int", "long"),
        ("int", "float"),
        ("int", "double"),
        ("long", "float"),
        ("long", "double"),
        ("float", "double"),
        ("string", "bytes"),
        ("bytes", "string"),
    }
)


class InvalidSchemaError(ValueError):
    """The text or structure is not an Avro schema."""


class IncompatibleSchemaError(ValueError):
    """A new schema cannot read data written with an earlier version; `problems` says why, one line each."""

    def __init__(self, problems: Sequence[str], subject: str | None = None) -> None:
        self.problems = list(problems)
        self.subject = subject
        where = f" for subject {subject!r}" if subject else ""
        lines = "\n".join(f"  - {problem}" for problem in self.problems)
        super().__init__(f"schema is not backward-transitive compatible{where}:\n{lines}")


def can_read(reader: Schema, writer: Schema) -> list[str]:
    """The problems reading `writer` data with `reader`, per Avro schema resolution; empty when it can."""
    reader_node, reader_names = parse_schema(reader)
    writer_node, writer_names = parse_schema(writer)
    return _Resolution(reader_names, writer_names).check(reader_node, writer_node, _root_path(reader_node))


def check_backward_transitive(
    new_schema: Schema, previous_schemas: Sequence[Schema], version_numbers: Sequence[int] | None = None
) -> None:
    """Raise IncompatibleSchemaError unless `new_schema` reads data of every previous version (oldest first).

    Versions are numbered from 1 in list order unless `version_numbers` gives their numbers.
    """
    numbers = list(version_numbers) if version_numbers is not None else list(range(1, len(previous_schemas) + 1))
    if len(numbers) != len(previous_schemas):
        raise ValueError("version_numbers must give one number per previous schema")
    problems = [
        f"cannot read data written with version {number}: {problem}"
        for number, previous in zip(numbers, previous_schemas, strict=True)
        for problem in can_read(new_schema, previous)
    ]
    if problems:
        raise IncompatibleSchemaError(problems)


def reader_for_writer(reader: dict[str, Any], writer: dict[str, Any]) -> dict[str, Any]:
    """`reader` (a record schema, as JSON) with the aliases under which `writer` carries its record and fields.

    Schema resolution follows the reader's aliases only. A version that renamed the record or a field and kept the
    old name as its alias (`"name": "Tap", "aliases": ["Click"]`; `visitor_id` aliased `user_id`) reads the older
    data through that alias, so it is BACKWARD compatible; but a reader of the older name does not know the new
    one, and its records would not decode (a record of another name) or would lack the field. The writer's alias
    says the two names are one: the reader returned here knows the writer's name as its alias. A reader field that
    the writer has under its own name, or that more than one writer field claims, is left as it is; a `writer`
    that is not a record changes nothing."""
    out = copy.deepcopy(reader)
    if not isinstance(writer, dict) or writer.get("type") != "record" or not isinstance(writer.get("name"), str):
        return out
    writer_full = _full(writer["name"], writer.get("namespace", "") or "")
    writer_aliases = {_short(str(alias)) for alias in writer.get("aliases", []) if isinstance(alias, str)}
    if _short(writer_full) != _short(out["name"]) and _short(out["name"]) in writer_aliases:
        out["aliases"] = [*out.get("aliases", []), writer_full]
    writer_fields = [f for f in writer.get("fields", []) if isinstance(f, dict) and isinstance(f.get("name"), str)]
    writer_names = {f["name"] for f in writer_fields}
    for reader_field in out.get("fields", []):
        if reader_field["name"] in writer_names:
            continue
        claims = [f["name"] for f in writer_fields if reader_field["name"] in f.get("aliases", [])]
        if len(claims) == 1:
            reader_field["aliases"] = [*reader_field.get("aliases", []), claims[0]]
    return out


def parse_schema(schema: Schema) -> tuple[Any, dict[str, dict[str, Any]]]:
    """Normalize a schema, resolving names; returns (root node, named types by full name).

    A `str` is JSON text, or else a bare type name such as `"long"`. Raises InvalidSchemaError.
    """
    parsed: Any = schema
    if isinstance(schema, str):
        try:
            parsed = json.loads(schema)
        except json.JSONDecodeError:
            if not schema.strip() or any(ch in schema for ch in '{}[]"'):
                raise InvalidSchemaError(f"not an Avro schema: {schema[:80]!r}") from None
            parsed = schema.strip()
    names: dict[str, dict[str, Any]] = {}
    return _Parser(names).parse(parsed, ""), names


class _Parser:
    """Turn a JSON schema into nodes: a primitive name, a named-type reference `("ref", fullname)`, a dict for
    complex types (named types with full names), or a list for a union."""

    def __init__(self, names: dict[str, dict[str, Any]]) -> None:
        self.names = names

    def parse(self, schema: Any, namespace: str) -> Any:
        if isinstance(schema, str):
            return self._reference(schema, namespace)
        if isinstance(schema, list):
            branches = [self.parse(branch, namespace) for branch in schema]
            if any(isinstance(branch, list) for branch in branches):
                raise InvalidSchemaError("a union may not directly contain another union")
            return branches
        if not isinstance(schema, dict):
            raise InvalidSchemaError(f"not an Avro schema: {schema!r}")
        kind = schema.get("type")
        if isinstance(kind, (dict, list)):
            return self.parse(kind, namespace)
        if not isinstance(kind, str):
            raise InvalidSchemaError(f"a schema object needs a string 'type': {schema!r}")
        if kind in PRIMITIVES:
            return kind  # logical types resolve by their underlying type
        if kind in NAMED:
            return self._named(kind, schema, namespace)
        if kind == "array":
            return {"type": "array", "items": self.parse(_required(schema, "items"), namespace)}
        if kind == "map":
            return {"type": "map", "values": self.parse(_required(schema, "values"), namespace)}
        return self._reference(kind, namespace)

    def _named(self, kind: str, schema: dict[str, Any], namespace: str) -> tuple[str, str]:
        name = _required(schema, "name")
        if not isinstance(name, str) or not name:
            raise InvalidSchemaError(f"a {kind} needs a name: {schema!r}")
        if "." in name:
            fullname = name
        else:
            own = schema.get("namespace", namespace) or ""
            fullname = f"{own}.{name}" if own else name
        inner_namespace = fullname.rpartition(".")[0]
        if fullname in self.names:
            raise InvalidSchemaError(f"the type {fullname} is defined twice")
        node: dict[str, Any] = {
            "type": "record" if kind == "error" else kind,
            "name": fullname,
            "aliases": [_full(alias, inner_namespace) for alias in schema.get("aliases", [])],
        }
        # Registered before the fields are parsed, so that a record may refer to itself.
        self.names[fullname] = node
        if kind in ("record", "error"):
            fields = _required(schema, "fields")
            if not isinstance(fields, list):
                raise InvalidSchemaError(f"the fields of {fullname} must be a list")
            node["fields"] = [self._field(field, fullname, inner_namespace) for field in fields]
        elif kind == "enum":
            symbols = _required(schema, "symbols")
            if not isinstance(symbols, list) or not all(isinstance(s, str) for s in symbols):
                raise InvalidSchemaError(f"the symbols of {fullname} must be a list of strings")
            node["symbols"] = symbols
            if "default" in schema:
                node["default"] = schema["default"]
        else:
            size = _required(schema, "size")
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise InvalidSchemaError(f"the size of {fullname} must be a non-negative integer")
            node["size"] = size
        return ("ref", fullname)

    def _field(self, field: Any, record: str, namespace: str) -> dict[str, Any]:
        if not isinstance(field, dict) or not isinstance(field.get("name"), str):
            raise InvalidSchemaError(f"a field of {record} needs a name: {field!r}")
        parsed = {
            "name": field["name"],
            "type": self.parse(_required(field, "type"), namespace),
            "aliases": list(field.get("aliases", [])),
        }
        if "default" in field:
            parsed["default"] = field["default"]
        return parsed

    def _reference(self, name: str, namespace: str) -> Any:
        if name in PRIMITIVES:
            return name
        for candidate in (_full(name, namespace), name):
            if candidate in self.names:
                return ("ref", candidate)
        raise InvalidSchemaError(f"unknown type {name!r}")


def _required(schema: dict[str, Any], key: str) -> Any:
    if key not in schema:
        raise InvalidSchemaError(f"missing {key!r} in {schema!r}")
    return schema[key]


def _full(name: str, namespace: str) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


def _short(fullname: str) -> str:
    return fullname.rpartition(".")[2]


def _root_path(node: Any) -> str:
    return _short(node[1]) if isinstance(node, tuple) else ""


class _Resolution:
    def __init__(self, reader_names: dict[str, dict[str, Any]], writer_names: dict[str, dict[str, Any]]) -> None:
        self.reader_names = reader_names
        self.writer_names = writer_names
        # Pairs of named types already being compared: a recursive record is compatible with itself.
        self.in_progress: set[tuple[str, str]] = set()

    def describe(self, node: Any, names: dict[str, dict[str, Any]]) -> str:
        if isinstance(node, list):
            return "union [" + ", ".join(self.describe(branch, names) for branch in node) + "]"
        if isinstance(node, tuple):
            return f"{names[node[1]]['type']} {node[1]}"
        if isinstance(node, dict):
            return str(node["type"])
        return repr(node)

    def mismatch(self, path: str, reader: Any, writer: Any) -> list[str]:
        return [
            f"{path or '(root)'}: reader type {self.describe(reader, self.reader_names)} cannot read "
            f"writer type {self.describe(writer, self.writer_names)}"
        ]

    def check(self, reader: Any, writer: Any, path: str) -> list[str]:
        if isinstance(writer, list):
            problems = []
            for branch in writer:
                if isinstance(reader, list):
                    if not any(not self.check(option, branch, path) for option in reader):
                        problems += self.mismatch(path, reader, branch)
                else:
                    problems += self.check(reader, branch, path)
            return problems
        if isinstance(reader, list):
            if any(not self.check(option, writer, path) for option in reader):
                return []
            return self.mismatch(path, reader, writer)
        if isinstance(reader, str) or isinstance(writer, str):
            if reader == writer or (writer, reader) in PROMOTIONS:
                return []
            return self.mismatch(path, reader, writer)
        if isinstance(reader, tuple) and isinstance(writer, tuple):
            return self.check_named(self.reader_names[reader[1]], self.writer_names[writer[1]], path)
        if isinstance(reader, dict) and isinstance(writer, dict) and reader["type"] == writer["type"]:
            if reader["type"] == "array":
                return self.check(reader["items"], writer["items"], f"{path}[]")
            return self.check(reader["values"], writer["values"], f"{path}{{}}")
        return self.mismatch(path, reader, writer)

    def check_named(self, reader: dict[str, Any], writer: dict[str, Any], path: str) -> list[str]:
        kind = reader["type"]
        if kind != writer["type"]:
            return self.mismatch(path, ("ref", reader["name"]), ("ref", writer["name"]))
        if not _names_match(reader, writer):
            return [f"{path or '(root)'}: reader {kind} {reader['name']} does not match writer {kind} {writer['name']}"]
        pair = (reader["name"], writer["name"])
        if pair in self.in_progress:
            return []
        if kind == "fixed":
            if reader["size"] != writer["size"]:
                return [f"{path}: fixed {reader['name']} has size {reader['size']}, the writer's {writer['size']}"]
            return []
        if kind == "enum":
            missing = [symbol for symbol in writer["symbols"] if symbol not in reader["symbols"]]
            if missing and "default" not in reader:
                return [f"{path}: enum {reader['name']} lacks the writer's symbols {missing} and has no default"]
            return []
        self.in_progress.add(pair)
        try:
            return self.check_record(reader, writer, path)
        finally:
            self.in_progress.discard(pair)

    def check_record(self, reader: dict[str, Any], writer: dict[str, Any], path: str) -> list[str]:
        writer_fields = {field["name"]: field for field in writer["fields"]}
        problems = []
        for field in reader["fields"]:
            field_path = f"{path}.{field['name']}" if path else field["name"]
            source = next(
                (writer_fields[name] for name in [field["name"], *field["aliases"]] if name in writer_fields),
                None,
            )
            if source is not None:
                problems += self.check(field["type"], source["type"], field_path)
            elif "default" not in field:
                problems.append(
                    f"{field_path}: the reader's field {field['name']!r} is not in the writer's record "
                    f"{writer['name']} and has no default"
                )
        return problems


def _names_match(reader: dict[str, Any], writer: dict[str, Any]) -> bool:
    if _short(reader["name"]) == _short(writer["name"]):
        return True
    return writer["name"] in reader["aliases"] or _short(writer["name"]) in map(_short, reader["aliases"])
