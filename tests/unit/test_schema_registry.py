"""Schema registries: the JSON-file one for real, the HTTP one only for URLs and errors (no server here); the one in
the database, the product's default: tests/integration/test_schema_registry_database.py."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest

from billing.compatibility import IncompatibleSchemaError, InvalidSchemaError
from billing.schemas import SUBJECTS, schema_text
from billing.store.schema_registry import (
    DatabaseSchemaRegistry,
    FileSchemaRegistry,
    HttpSchemaRegistry,
    SchemaRegistry,
    SchemaRegistryError,
    UnknownSchemaError,
    canonical_schema,
    open_registry,
)

CLICKS = SUBJECTS["clicks"]
IMPRESSIONS = SUBJECTS["impressions"]


def click_schema(*extra_fields: dict) -> str:
    schema = json.loads(schema_text("click"))
    schema["fields"] += list(extra_fields)
    return json.dumps(schema)


@pytest.fixture
def registry(tmp_path: Path) -> FileSchemaRegistry:
    return FileSchemaRegistry(tmp_path / "registry.json")


def test_file_registry_satisfies_the_port(registry: FileSchemaRegistry) -> None:
    port: SchemaRegistry = registry
    assert port.latest(CLICKS) is None
    assert port.versions(CLICKS) == [] and port.ids(CLICKS) == []


def test_ids_start_at_one_and_are_global(registry: FileSchemaRegistry) -> None:
    click_id = registry.register(CLICKS, schema_text("click"))
    impression_id = registry.register(IMPRESSIONS, schema_text("impression"))
    assert (click_id, impression_id) == (1, 2)
    assert registry.schema_by_id(1) == schema_text("click")
    assert registry.latest(IMPRESSIONS) == (2, schema_text("impression"))
    assert registry.subjects() == [CLICKS, IMPRESSIONS]


def test_register_is_idempotent_on_canonical_json(registry: FileSchemaRegistry) -> None:
    first = registry.register(CLICKS, schema_text("click"))
    relaid = json.dumps(json.loads(schema_text("click")), indent=None, sort_keys=False)
    assert relaid != schema_text("click")
    assert registry.register(CLICKS, relaid) == first
    assert registry.register(CLICKS, schema_text("click")) == first
    assert registry.ids(CLICKS) == [first]
    assert len(registry.versions(CLICKS)) == 1


def test_a_compatible_new_version_gets_a_new_id(registry: FileSchemaRegistry) -> None:
    v1 = registry.register(CLICKS, schema_text("click"))
    v2_text = click_schema({"name": "placement", "type": ["null", "string"], "default": None})
    v2 = registry.register(CLICKS, v2_text)
    assert v2 == v1 + 1
    assert registry.ids(CLICKS) == [v1, v2]
    assert registry.versions(CLICKS) == [(1, schema_text("click")), (2, v2_text)]
    assert registry.latest(CLICKS) == (v2, v2_text)


def test_an_incompatible_schema_is_refused_and_nothing_is_written(registry: FileSchemaRegistry) -> None:
    registry.register(CLICKS, schema_text("click"))
    before = registry.path.read_text()
    with pytest.raises(IncompatibleSchemaError) as caught:
        registry.register(CLICKS, click_schema({"name": "placement", "type": "string"}))
    assert caught.value.subject == CLICKS
    assert "version 1" in str(caught.value) and "placement" in str(caught.value)
    assert registry.path.read_text() == before
    assert registry.ids(CLICKS) == [1]


def test_the_same_schema_under_two_subjects_keeps_one_id(registry: FileSchemaRegistry) -> None:
    assert registry.register("a-value", schema_text("click")) == registry.register("b-value", schema_text("click"))


def test_invalid_schema_text_is_refused(registry: FileSchemaRegistry) -> None:
    with pytest.raises(InvalidSchemaError):
        registry.register(CLICKS, "{not json")
    with pytest.raises(InvalidSchemaError):
        registry.register(CLICKS, json.dumps({"type": "record", "name": "X", "fields": [{"name": "a"}]}))
    assert not registry.path.exists()


def test_unknown_id(registry: FileSchemaRegistry) -> None:
    registry.register(CLICKS, schema_text("click"))
    with pytest.raises(UnknownSchemaError, match="id 42"):
        registry.schema_by_id(42)


def test_two_registries_on_one_file_see_each_others_ids(tmp_path: Path) -> None:
    path = tmp_path / "shared" / "registry.json"
    one, two = FileSchemaRegistry(path), FileSchemaRegistry(path)
    click_id = one.register(CLICKS, schema_text("click"))
    assert two.schema_by_id(click_id) == schema_text("click")
    impression_id = two.register(IMPRESSIONS, schema_text("impression"))
    assert impression_id == click_id + 1
    assert one.latest(IMPRESSIONS) == (impression_id, schema_text("impression"))
    assert one.register(IMPRESSIONS, schema_text("impression")) == impression_id


def test_concurrent_writers_get_distinct_ids(tmp_path: Path) -> None:
    path = tmp_path / "registry.json"
    results: dict[int, int] = {}

    def register(n: int) -> None:
        schema = {"type": "record", "name": f"R{n}", "fields": [{"name": "x", "type": "int"}]}
        results[n] = FileSchemaRegistry(path).register(f"s{n}-value", json.dumps(schema))

    threads = [threading.Thread(target=register, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results.values()) == list(range(1, 17))
    assert len(FileSchemaRegistry(path).subjects()) == 16


def test_a_corrupt_file_is_reported_with_its_path(tmp_path: Path) -> None:
    path = tmp_path / "registry.json"
    path.write_text("[1, 2")
    with pytest.raises(SchemaRegistryError, match="registry.json"):
        FileSchemaRegistry(path).ids(CLICKS)


def test_canonical_schema_ignores_layout_and_key_order() -> None:
    assert canonical_schema('{"b": 1,  "a": [1, 2]}') == canonical_schema('{"a":[1,2],"b":1}') == '{"a":[1,2],"b":1}'


def test_open_registry_picks_the_implementation(tmp_path: Path) -> None:
    http = open_registry("http://registry.example:8081/")
    assert isinstance(http, HttpSchemaRegistry) and http.url == "http://registry.example:8081"
    assert isinstance(open_registry("https://registry.example"), HttpSchemaRegistry)
    file = open_registry(str(tmp_path / "r.json"))
    assert isinstance(file, FileSchemaRegistry) and file.path == tmp_path / "r.json"
    from_uri = open_registry(f"file://{tmp_path}/r.json")
    assert isinstance(from_uri, FileSchemaRegistry) and from_uri.path == tmp_path / "r.json"
    in_database = open_registry("postgresql://adbill:secret@db.example:5432/adbill", tmp_path / "schemas.json")
    assert isinstance(in_database, DatabaseSchemaRegistry) and in_database.imports == tmp_path / "schemas.json"
    assert "secret" not in repr(in_database), "nothing is connected to, and the password is not shown"


def test_http_endpoint_percent_encodes_each_part() -> None:
    registry = HttpSchemaRegistry("http://registry.example:8081/")
    assert registry.endpoint("subjects", "clicks-value", "versions") == (
        "http://registry.example:8081/subjects/clicks-value/versions"
    )
    assert registry.endpoint("subjects", "a/b c", "versions", "latest") == (
        "http://registry.example:8081/subjects/a%2Fb%20c/versions/latest"
    )


@pytest.fixture
def closed_port() -> int:
    """A loopback port that nothing listens on: bound, then released."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_http_registry_names_the_url_when_unreachable(closed_port: int) -> None:
    registry = HttpSchemaRegistry(f"http://127.0.0.1:{closed_port}", timeout_s=2)
    with pytest.raises(SchemaRegistryError, match=rf"http://127\.0\.0\.1:{closed_port}/schemas/ids/7"):
        registry.schema_by_id(7)
    with pytest.raises(SchemaRegistryError, match=r"/subjects/clicks-value/versions"):
        registry.register(CLICKS, schema_text("click"))


def test_a_registry_server_is_reached_over_http_or_https_only() -> None:
    for url in ("file:///etc/passwd", "ftp://registry.example/", "registry.example:8081"):
        with pytest.raises(ValueError, match="http:// or https://"):
            HttpSchemaRegistry(url)
