"""The schema registry in PostgreSQL (`billing.store.schema_registry.DatabaseSchemaRegistry`), the product's default,
on the real server: the port's rules (global ids from 1, idempotent on canonical JSON, BACKWARD-transitive checks,
one id for one schema), two producers in two processes registering at once, and a data folder's registry file taken
in once with its ids."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import psycopg
import pytest

from billing.compatibility import IncompatibleSchemaError
from billing.schemas import SUBJECTS, schema_text
from billing.store.schema_registry import (
    DatabaseSchemaRegistry,
    FileSchemaRegistry,
    SchemaRegistryError,
    UnknownSchemaError,
    open_registry,
)
from ops.settings import Settings

pytestmark = pytest.mark.integration

CLICKS = SUBJECTS["clicks"]
IMPRESSIONS = SUBJECTS["impressions"]


def click_schema(*extra_fields: dict) -> str:
    schema = json.loads(schema_text("click"))
    schema["fields"] += list(extra_fields)
    return json.dumps(schema)


PLACEMENT_TEXT = click_schema({"name": "placement", "type": ["null", "string"], "default": None})
PLACEMENT_NUMBER = click_schema({"name": "placement", "type": ["null", "int"], "default": None})


def test_the_database_registry_keeps_the_ports_rules(database: str) -> None:
    registry = open_registry(database)
    assert isinstance(registry, DatabaseSchemaRegistry)
    assert registry.latest(CLICKS) is None and registry.ids(CLICKS) == [] and registry.versions(CLICKS) == []
    # Ids start at 1 and are global; the same schema, laid out otherwise or under another subject, keeps its id.
    assert registry.register(CLICKS, schema_text("click")) == 1
    assert registry.register(IMPRESSIONS, schema_text("impression")) == 2
    relaid = json.dumps(json.loads(schema_text("click")), indent=None, sort_keys=False)
    assert registry.register(CLICKS, relaid) == 1 and registry.register("other-value", relaid) == 1
    # A compatible version gets the next id; an incompatible one is refused and nothing is written.
    assert registry.register(CLICKS, PLACEMENT_TEXT) == 3
    with pytest.raises(IncompatibleSchemaError) as caught:
        registry.register(CLICKS, click_schema({"name": "campaign_hint", "type": "string"}))
    assert caught.value.subject == CLICKS and "campaign_hint" in str(caught.value)
    assert registry.ids(CLICKS) == [1, 3]
    assert registry.versions(CLICKS) == [(1, schema_text("click")), (2, PLACEMENT_TEXT)]
    assert registry.latest(CLICKS) == (3, PLACEMENT_TEXT)
    assert registry.subjects() == [CLICKS, IMPRESSIONS, "other-value"]
    with pytest.raises(UnknownSchemaError, match="id 42"):
        registry.schema_by_id(42)
    # Another process's registry sees the same ids (a new instance: nothing cached).
    assert DatabaseSchemaRegistry(database).schema_by_id(3) == PLACEMENT_TEXT
    with psycopg.connect(database) as connection:
        assert connection.execute("SELECT count(*) FROM registered_schemas").fetchone() == (3,)


def _register_in_process(url: str, version_2: str) -> tuple[list[int], str | None]:
    registry = DatabaseSchemaRegistry(url)
    ids = [registry.register(CLICKS, schema_text("click")), registry.register(IMPRESSIONS, schema_text("impression"))]
    try:
        ids.append(registry.register(CLICKS, version_2))
    except IncompatibleSchemaError as exc:
        return ids, str(exc)
    return ids, None


def test_two_producers_on_two_hosts_registering_at_once_get_one_id(database: str) -> None:
    """Two processes register version 1 of both subjects at once, and each a version 2 of clicks that cannot read
    the other's: one id each for version 1, and one version 2 only, checked against the other's."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(2) as pool:
        results = pool.starmap(_register_in_process, [(database, PLACEMENT_TEXT), (database, PLACEMENT_NUMBER)])
    assert sorted(tuple(ids[:2]) for ids, _ in results) == [(1, 2), (1, 2)]
    refused = [error for _, error in results if error is not None]
    assert len(refused) == 1 and "placement" in refused[0]
    registry = DatabaseSchemaRegistry(database)
    assert registry.ids(CLICKS) == [1, 3] and registry.ids(IMPRESSIONS) == [2]
    assert registry.schema_by_id(3) in (PLACEMENT_TEXT, PLACEMENT_NUMBER)


def test_a_data_folders_registry_file_is_taken_in_once_with_its_ids(tmp_path: Path, database: str) -> None:
    settings = Settings.from_env({}, home=tmp_path / "home", database_url=database)
    assert settings.registry_location == database, "the product's default registry is its database"
    # The file as the release before the database wrote it: ids 1 to 3, one schema under two subjects.
    path = settings.layout.schemas_file
    earlier = FileSchemaRegistry(path)
    assert earlier.register(IMPRESSIONS, schema_text("impression")) == 1
    assert earlier.register(CLICKS, schema_text("click")) == 2
    assert earlier.register(CLICKS, PLACEMENT_TEXT) == 3
    assert earlier.register("copy-value", schema_text("click")) == 2
    # Another host's file of the same registry, and one that gives id 1 to another schema.
    same = tmp_path / "other-host" / "schemas.json"
    same.parent.mkdir()
    same.write_text(path.read_text())
    other = FileSchemaRegistry(tmp_path / "elsewhere" / "schemas.json")
    other.register(CLICKS, schema_text("click"))

    registry = settings.schema_registry_store()
    assert registry.ids(IMPRESSIONS) == [1] and registry.ids(CLICKS) == [2, 3] and registry.ids("copy-value") == [2]
    assert [registry.schema_by_id(i) for i in (1, 2, 3)] == [earlier.schema_by_id(i) for i in (1, 2, 3)]
    assert not path.exists() and path.with_name("schemas.json.imported").exists()
    assert registry.register(IMPRESSIONS, schema_text("impression")) == 1
    hint = {"name": "campaign_hint", "type": ["null", "string"], "default": None}
    version_3 = click_schema({"name": "placement", "type": ["null", "string"], "default": None}, hint)
    assert registry.register(CLICKS, version_3) == 4, "the next id after the file's"
    # The other host's file of the same registry adds nothing and is set aside; a file that disagrees is refused.
    assert DatabaseSchemaRegistry(database, same).ids(CLICKS) == [2, 3, 4]
    assert not same.exists()
    with pytest.raises(SchemaRegistryError, match="gives id 1 to a schema"):
        DatabaseSchemaRegistry(database, other.path).ids(CLICKS)
    assert other.path.exists(), "a refused file stays where it is"
