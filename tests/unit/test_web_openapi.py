"""The OpenAPI document and the API's routes describe each other exactly."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ops.settings import Settings
from web.api import OPENAPI_FILE
from web.app import create_app

DOCUMENT = json.loads(OPENAPI_FILE.read_text())


def _api_routes(tmp_path: Path) -> set[tuple[str, str]]:
    app = create_app(Settings.from_env({}, home=tmp_path))  # no request is made: nothing connects
    routes = set()
    for rule in app.url_map.iter_rules():
        if rule.rule.startswith("/api/v1/"):
            path = re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", r"{\1}", rule.rule.removeprefix("/api/v1"))
            routes |= {(path, method.lower()) for method in rule.methods or () if method not in ("HEAD", "OPTIONS")}
    return routes


def test_every_api_route_is_documented_and_every_documented_path_exists(tmp_path: Path) -> None:
    documented = {(path, method) for path, item in DOCUMENT["paths"].items() for method in item}
    assert _api_routes(tmp_path) == documented


def test_the_document_is_openapi_3_and_every_reference_resolves() -> None:
    assert DOCUMENT["openapi"].startswith("3.")
    assert DOCUMENT["servers"] == [{"url": "/api/v1"}]
    text = OPENAPI_FILE.read_text()
    for ref in set(re.findall(r'"\$ref": "#/([^"]+)"', text)):
        node = DOCUMENT
        for part in ref.split("/"):
            assert part in node, f"#/{ref} does not resolve"
            node = node[part]


def test_path_parameters_are_declared(tmp_path: Path) -> None:
    parameters = DOCUMENT["components"]["parameters"]
    for path, item in DOCUMENT["paths"].items():
        declared = {parameters[p["$ref"].rsplit("/", 1)[1]]["name"] for p in item["get"].get("parameters", [])}
        assert set(re.findall(r"{([a-z_]+)}", path)) <= declared, path


def test_only_the_document_itself_is_public() -> None:
    public = [path for path, item in DOCUMENT["paths"].items() if item["get"].get("security") == []]
    assert public == ["/openapi.json"]
    assert all("401" in item["get"]["responses"] for path, item in DOCUMENT["paths"].items() if path not in public)


def test_paths_with_whole_number_arguments_document_the_400_for_bad_ones() -> None:
    parameters = DOCUMENT["components"]["parameters"]
    for path, item in DOCUMENT["paths"].items():
        declared = [parameters[p["$ref"].rsplit("/", 1)[1]] for p in item["get"].get("parameters", [])]
        if any(p["in"] == "query" and p["schema"]["type"] == "integer" for p in declared):
            assert item["get"]["responses"].get("400") == {"$ref": "#/components/responses/BadRequest"}, path


def test_every_amount_of_money_is_documented_as_a_string_of_micros() -> None:
    """Responses carry micros as JSON strings (the proto3 JSON mapping of int64); requests may send either."""

    def money(node: object, path: str) -> list[tuple[str, dict[str, object]]]:
        found: list[tuple[str, dict[str, object]]] = []
        if isinstance(node, dict):
            for key, value in node.items():
                if "micros" in key and isinstance(value, dict) and ("type" in value or "oneOf" in value):
                    found.append((f"{path}/{key}", value))
                found += money(value, f"{path}/{key}")
        elif isinstance(node, list):
            for n, value in enumerate(node):
                found += money(value, f"{path}[{n}]")
        return found

    fields = money(DOCUMENT, "")
    assert len(fields) >= 9
    for path, schema in fields:
        if "/requestBody/" in path:
            assert {"type": "string", "pattern": "^[0-9]{1,19}$"} in schema["oneOf"], path  # type: ignore[operator]
            continue
        value = schema["additionalProperties"] if schema.get("type") == "object" else schema
        assert value["type"] == "string" and value["format"] == "int64", path  # type: ignore[index]
    assert "proto3" in DOCUMENT["info"]["description"]
