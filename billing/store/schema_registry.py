"""Schema ids for the Confluent wire format: a registry of Avro schemas by subject, with global integer ids.

Three implementations of one port, chosen by the location (`open_registry`):
- `DatabaseSchemaRegistry` (`postgresql://...`): the product's registry, in its database (the default,
  `ADBILL_DATABASE_URL`), shared by the producers, the streaming job's driver and reconciliation on any host;
- `HttpSchemaRegistry` (`http(s)://...`): a Confluent-compatible Schema Registry server;
- `FileSchemaRegistry` (a path or `file://...`): a JSON file under an flock, for one machine without a database
  (the benchmarks and the tests that run without one); never the product's default.
All refuse a new version that is not BACKWARD-transitive compatible with every earlier version of its subject,
checked here with `billing.compatibility`, so the rule holds whatever compatibility level a server is configured
with.

**In the database.** Tables `schemas` (a global id, from 1, and the schema's text, one row per canonical schema:
the same schema under two subjects keeps one id, as with Confluent) and `schema_versions` (a subject's versions,
numbered from 1, each naming a schema id). A registration is one transaction under the registry's advisory lock
(`pg_advisory_xact_lock`): it reads the subject's versions, checks the new one against all of them, and writes the
schema with the next id (one more than the highest) and the version, or finds them written; two producers on two
hosts registering the same schema wait for one another and get one id, and two that register versions of one
subject at once have each checked against the other's. An id is never taken by a registration that did not commit,
so ids follow one another as in the file. A schema's text never changes: readers keep what they read by id.

**The file of a data folder written before the database** (`HOME/schemas.json`) is taken in the first time the
database registry opens with it (`imports`): its ids are kept (events in Kafka carry them), each schema and each
subject's versions as they were, and the file is renamed `schemas.json.imported` once they committed
(`billing.store.database.Tables`). A database that already holds some of them must hold them under the same ids and
versions (another host's file of the same registry): what it lacks is added; one that disagrees is refused, naming
the id, and nothing is taken in.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from billing.compatibility import (
    IncompatibleSchemaError,
    InvalidSchemaError,
    check_backward_transitive,
    parse_schema,
)
from billing.store import database, durable
from billing.store.database_lock import lock_key

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

DATABASE_SCHEMES = ("postgresql://", "postgres://")
"""The locations `open_registry` opens as a registry in a database."""


class SchemaRegistryError(RuntimeError):
    """The registry could not be reached or answered something unexpected."""


class UnknownSchemaError(LookupError):
    """No schema has this id (or the subject has no such version)."""


class SchemaRegistry(Protocol):
    """Where schema ids come from and where a consumer looks them up."""

    def register(self, subject: str, schema_text: str) -> int:
        """The id of `schema_text` under `subject`, registering it as a new version if it is new there."""
        ...

    def schema_by_id(self, schema_id: int) -> str:
        """The schema text with this id; raises UnknownSchemaError."""
        ...

    def versions(self, subject: str) -> list[tuple[int, str]]:
        """(version number, schema text) of every version of `subject`, oldest first."""
        ...

    def latest(self, subject: str) -> tuple[int, str] | None:
        """(schema id, schema text) of the newest version of `subject`, or None when it has none."""
        ...

    def ids(self, subject: str) -> list[int]:
        """The schema ids of the versions of `subject`, oldest first."""
        ...


def canonical_schema(schema_text: str) -> str:
    """The schema's JSON re-dumped with sorted keys and no spaces: equal for texts that differ in layout."""
    try:
        parsed = json.loads(schema_text)
    except (TypeError, json.JSONDecodeError) as exc:
        raise InvalidSchemaError(f"a schema is JSON text: {exc}") from exc
    return json.dumps(parsed, sort_keys=True, separators=(",", ":"))


def open_registry(location: str, imports: str | os.PathLike[str] | None = None) -> SchemaRegistry:
    """`postgresql://…` opens the registry in that database (taking in the registry file `imports` of a data folder
    written before it), `http://…`/`https://…` a Schema Registry server, anything else (or `file://…`) a JSON
    file."""
    if location.startswith(DATABASE_SCHEMES):
        return DatabaseSchemaRegistry(location, imports)
    if location.startswith(("http://", "https://")):
        return HttpSchemaRegistry(location)
    if location.startswith("file://"):
        location = urllib.parse.unquote(urllib.parse.urlparse(location).path)
    return FileSchemaRegistry(location)


class FileSchemaRegistry:
    """A registry in one JSON file; writers on one machine serialize on an flock, readers see whole files.

    The file holds `{"schemas": {"<id>": text}, "subjects": {subject: [id, ...]}}`; ids are global, start
    at 1, and the same schema registered under two subjects keeps one id, as with Confluent.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self._cache: dict[int, str] = {}

    def __repr__(self) -> str:
        return f"FileSchemaRegistry({str(self.path)!r})"

    def register(self, subject: str, schema_text: str) -> int:
        """The id of `schema_text` in `subject`, added as a new version if needed and compatible."""
        canonical = canonical_schema(schema_text)
        parse_schema(schema_text)
        with self._locked():
            data = self._read()
            schemas: dict[str, str] = data["schemas"]
            subject_ids: list[int] = data["subjects"].get(subject, [])
            for schema_id in subject_ids:
                if canonical_schema(schemas[str(schema_id)]) == canonical:
                    return schema_id
            previous = [schemas[str(schema_id)] for schema_id in subject_ids]
            try:
                check_backward_transitive(schema_text, previous)
            except IncompatibleSchemaError as exc:
                raise IncompatibleSchemaError(exc.problems, subject) from None
            known = next((int(i) for i, text in schemas.items() if canonical_schema(text) == canonical), None)
            if known is None:
                schema_id = max((int(i) for i in schemas), default=0) + 1
                schemas[str(schema_id)] = schema_text
            else:
                schema_id = known
            data["subjects"][subject] = [*subject_ids, schema_id]
            self._write(data)
        self._cache[schema_id] = schemas[str(schema_id)]
        return schema_id

    def schema_by_id(self, schema_id: int) -> str:
        """The schema text with this id; UnknownSchemaError if there is none."""
        if schema_id not in self._cache:
            text = self._read()["schemas"].get(str(schema_id))
            if text is None:
                raise UnknownSchemaError(f"no schema with id {schema_id} in {self.path}")
            self._cache[schema_id] = text
        return self._cache[schema_id]

    def versions(self, subject: str) -> list[tuple[int, str]]:
        """(version number, schema text) of every version of `subject`, oldest first."""
        data = self._read()
        return [
            (version, data["schemas"][str(schema_id)])
            for version, schema_id in enumerate(data["subjects"].get(subject, []), start=1)
        ]

    def latest(self, subject: str) -> tuple[int, str] | None:
        """(schema id, schema text) of the newest version of `subject`, or None."""
        data = self._read()
        subject_ids = data["subjects"].get(subject, [])
        if not subject_ids:
            return None
        return subject_ids[-1], data["schemas"][str(subject_ids[-1])]

    def ids(self, subject: str) -> list[int]:
        """The schema ids of the versions of `subject`, oldest first."""
        return list(self._read()["subjects"].get(subject, []))

    def subjects(self) -> list[str]:
        """Every subject with at least one version, sorted."""
        return sorted(self._read()["subjects"])

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> dict[str, Any]:
        return read_registry_file(self.path)

    def _write(self, data: dict[str, Any]) -> None:
        """The file whole (`billing.store.durable.write_whole`: staged, flushed, renamed, its folder flushed)."""
        durable.write_whole(self.path, lambda out: json.dump(data, out, indent=1, sort_keys=True))


def read_registry_file(path: Path) -> dict[str, Any]:
    """A registry file's `{"schemas": {"<id>": text}, "subjects": {subject: [id, ...]}}` (empty when there is no
    file); SchemaRegistryError, naming the file, when it is not one."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {"schemas": {}, "subjects": {}}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SchemaRegistryError(f"the schema registry file {path} is not JSON: {exc}") from exc
    if not isinstance(data, dict) or not {"schemas", "subjects"} <= data.keys():
        raise SchemaRegistryError(f"the schema registry file {path} lacks 'schemas' and 'subjects'")
    return data


DATABASE_SCHEMA = """
CREATE TABLE IF NOT EXISTS registered_schemas (
    id integer PRIMARY KEY CHECK (id > 0),
    fingerprint char(64) NOT NULL UNIQUE,
    schema text NOT NULL
);
CREATE TABLE IF NOT EXISTS schema_versions (
    subject text NOT NULL CHECK (subject <> ''),
    version integer NOT NULL CHECK (version > 0),
    schema_id integer NOT NULL REFERENCES registered_schemas,
    PRIMARY KEY (subject, version),
    UNIQUE (subject, schema_id)
);
"""
"""The registry's tables (made when missing, `billing.store.database.make_tables`)."""

REGISTRY_LOCK = lock_key("schema registry")
"""The advisory lock a registration holds, on any host, for the time of its transaction."""


def fingerprint(schema_text: str) -> str:
    """The SHA-256 of the schema's canonical JSON, in hex: equal for texts that differ in layout only."""
    return hashlib.sha256(canonical_schema(schema_text).encode("utf-8")).hexdigest()


class RegistryDatabaseUnavailable(database.DatabaseUnavailable, SchemaRegistryError):
    """The registry's database cannot be reached: the message names it (without its password)."""


class DatabaseSchemaRegistry(database.Store):
    """The registry in the database at `url` (module doc); `imports`: the registry file of a data folder written
    before the database, taken in once."""

    TABLES = database.StoreTables(
        "schema registry", DATABASE_SCHEMA, "schema registry's database", RegistryDatabaseUnavailable
    )

    def __init__(self, url: str, imports: str | os.PathLike[str] | None = None) -> None:
        super().__init__(url, imports)
        self._cache: dict[int, str] = {}

    def register(self, subject: str, schema_text: str) -> int:
        """The id of `schema_text` in `subject`, added as a new version if needed and compatible, in one
        transaction under the registry's lock."""
        parse_schema(schema_text)
        mine = fingerprint(schema_text)
        with self._connection() as connection:
            try:
                with connection.transaction():
                    connection.execute("SELECT pg_advisory_xact_lock(%s)", (REGISTRY_LOCK,))
                    held = self._versions(connection, subject)
                    found = next((schema_id for _, schema_id, _, fp in held if fp == mine), None)
                    if found is not None:
                        return found
                    try:
                        check_backward_transitive(schema_text, [v[2] for v in held], [v[0] for v in held])
                    except IncompatibleSchemaError as exc:
                        raise IncompatibleSchemaError(exc.problems, subject) from None
                    known = connection.execute(
                        "SELECT id FROM registered_schemas WHERE fingerprint = %s", (mine,)
                    ).fetchone()
                    if known is not None:
                        schema_id = int(known[0])
                    else:
                        added = connection.execute(
                            "INSERT INTO registered_schemas (id, fingerprint, schema) "
                            "SELECT coalesce(max(id), 0) + 1, %s, %s FROM registered_schemas RETURNING id",
                            (mine, schema_text),
                        ).fetchone()
                        assert added is not None
                        schema_id = int(added[0])
                    connection.execute(
                        "INSERT INTO schema_versions (subject, version, schema_id) VALUES (%s, %s, %s)",
                        (subject, max((v[0] for v in held), default=0) + 1, schema_id),
                    )
            except database.integrity_errors() as exc:
                refused = database.constraint_message(exc)
                raise SchemaRegistryError(
                    f"the schema registry in {self.where} refused {subject}'s schema: {refused}"
                ) from None
        return schema_id

    def schema_by_id(self, schema_id: int) -> str:
        """The schema text with this id; UnknownSchemaError if there is none."""
        if schema_id not in self._cache:
            with self._connection(database.READ_TIMEOUT_S) as connection:
                row = connection.execute("SELECT schema FROM registered_schemas WHERE id = %s", (schema_id,)).fetchone()
            if row is None:
                raise UnknownSchemaError(f"no schema with id {schema_id} in {self.where}")
            self._cache[schema_id] = row[0]
        return self._cache[schema_id]

    def versions(self, subject: str) -> list[tuple[int, str]]:
        """(version number, schema text) of every version of `subject`, oldest first."""
        with self._connection(database.READ_TIMEOUT_S) as connection:
            return [(version, text) for version, _, text, _ in self._versions(connection, subject)]

    def latest(self, subject: str) -> tuple[int, str] | None:
        """(schema id, schema text) of the newest version of `subject`, or None."""
        with self._connection(database.READ_TIMEOUT_S) as connection:
            held = self._versions(connection, subject)
        return (held[-1][1], held[-1][2]) if held else None

    def ids(self, subject: str) -> list[int]:
        """The schema ids of the versions of `subject`, oldest first (one small read: the job asks every batch)."""
        with self._connection(database.READ_TIMEOUT_S) as connection:
            rows = connection.execute(
                "SELECT schema_id FROM schema_versions WHERE subject = %s ORDER BY version", (subject,)
            ).fetchall()
        return [int(row[0]) for row in rows]

    def subjects(self) -> list[str]:
        """Every subject with at least one version, sorted."""
        with self._connection(database.READ_TIMEOUT_S) as connection:
            rows = connection.execute("SELECT DISTINCT subject FROM schema_versions ORDER BY subject").fetchall()
        return [row[0] for row in rows]

    @staticmethod
    def _versions(connection: psycopg.Connection[Any], subject: str) -> list[tuple[int, int, str, str]]:
        """(version, schema id, text, fingerprint) of each version of `subject`, oldest first."""
        rows = connection.execute(
            "SELECT v.version, s.id, s.schema, s.fingerprint FROM schema_versions v "
            "JOIN registered_schemas s ON s.id = v.schema_id WHERE v.subject = %s ORDER BY v.version",
            (subject,),
        ).fetchall()
        return [(int(version), int(schema_id), text, fp) for version, schema_id, text, fp in rows]

    def _take_in(self, connection: psycopg.Connection[Any]) -> list[Path]:
        """Take in the registry file of a data folder written before the database (once, under the lock of
        `database.make_tables`, which sets the file aside once this commits), its ids kept; refused, nothing taken
        in, when the database holds other schemas under its ids."""
        if self.imports is None or not self.imports.exists():
            return []
        source = self.imports
        data = read_registry_file(source)
        added = 0
        for key, text in sorted(data["schemas"].items(), key=lambda item: int(item[0])):
            schema_id, mine = int(key), fingerprint(text)
            held = connection.execute(
                "SELECT id, fingerprint FROM registered_schemas WHERE id = %s OR fingerprint = %s", (schema_id, mine)
            ).fetchall()
            if not held:
                connection.execute(
                    "INSERT INTO registered_schemas (id, fingerprint, schema) VALUES (%s, %s, %s)",
                    (schema_id, mine, text),
                )
                added += 1
            elif [(int(i), fp) for i, fp in held] != [(schema_id, mine)]:
                raise SchemaRegistryError(
                    f"the schema registry file {source} gives id {schema_id} to a schema that {self.where} holds "
                    "under another id, or another schema that id: events in Kafka carry the file's ids, so nothing "
                    "is taken in; give the product a database whose registry agrees with the file"
                )
        for subject, ids in sorted(data["subjects"].items()):
            ids = [int(i) for i in ids]
            held_ids = [v[1] for v in self._versions(connection, subject)]
            if held_ids[: len(ids)] == ids:
                continue
            if ids[: len(held_ids)] != held_ids:
                raise SchemaRegistryError(
                    f"the schema registry file {source} lists the versions of {subject} as ids {ids}, {self.where} "
                    f"as {held_ids}: nothing is taken in"
                )
            for version, schema_id in enumerate(ids[len(held_ids) :], start=len(held_ids) + 1):
                connection.execute(
                    "INSERT INTO schema_versions (subject, version, schema_id) VALUES (%s, %s, %s)",
                    (subject, version, schema_id),
                )
        log.warning(
            "took the schema registry file %s (%d schemas, ids kept; %d new here) into %s; the file is set aside as "
            "%s%s",
            source,
            len(data["schemas"]),
            added,
            self.where,
            self.imports.name,
            database.IMPORTED,
        )
        return [source]


_CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class HttpSchemaRegistry:
    """A Confluent-compatible Schema Registry over HTTP (urllib, no client library); caches schemas by id."""

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"a schema registry server's URL is http:// or https://, not {url!r}")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._cache: dict[int, str] = {}
        self._entries: dict[tuple[str, int], dict[str, Any]] = {}
        """A subject's versions by number: a version's id and schema never change, so each is fetched once (the
        streaming job asks for the ids of its subjects every batch)."""

    def __repr__(self) -> str:
        return f"HttpSchemaRegistry({self.url!r})"

    def register(self, subject: str, schema_text: str) -> int:
        """The id of `schema_text` in `subject`, added as a new version if needed and compatible."""
        canonical = canonical_schema(schema_text)
        parse_schema(schema_text)
        versions = self._version_entries(subject)
        if not any(canonical_schema(entry["schema"]) == canonical for entry in versions):
            try:
                check_backward_transitive(
                    schema_text,
                    [entry["schema"] for entry in versions],
                    [entry["version"] for entry in versions],
                )
            except IncompatibleSchemaError as exc:
                raise IncompatibleSchemaError(exc.problems, subject) from None
        # Registering an existing schema is idempotent on the server: it answers with the existing id.
        answer = self._request("POST", ["subjects", subject, "versions"], {"schema": schema_text})
        schema_id = _int_field(answer, "id", self.url)
        self._cache[schema_id] = schema_text
        return schema_id

    def schema_by_id(self, schema_id: int) -> str:
        """The schema text with this id; UnknownSchemaError if the server has none."""
        if schema_id not in self._cache:
            answer = self._request("GET", ["schemas", "ids", str(int(schema_id))])
            if answer is None:
                raise UnknownSchemaError(f"no schema with id {schema_id} at {self.url}")
            self._cache[schema_id] = _str_field(answer, "schema", self.url)
        return self._cache[schema_id]

    def versions(self, subject: str) -> list[tuple[int, str]]:
        """(version number, schema text) of every version of `subject`, oldest first."""
        return [(entry["version"], entry["schema"]) for entry in self._version_entries(subject)]

    def latest(self, subject: str) -> tuple[int, str] | None:
        """(schema id, schema text) of the newest version of `subject`, or None."""
        answer = self._request("GET", ["subjects", subject, "versions", "latest"])
        if answer is None:
            return None
        schema_id = _int_field(answer, "id", self.url)
        text = _str_field(answer, "schema", self.url)
        self._cache[schema_id] = text
        return schema_id, text

    def ids(self, subject: str) -> list[int]:
        """The schema ids of the versions of `subject`, oldest first."""
        return [entry["id"] for entry in self._version_entries(subject)]

    def endpoint(self, *parts: str) -> str:
        """The URL of a registry resource; each part is percent-encoded (subjects may hold `/`)."""
        return "/".join([self.url, *(urllib.parse.quote(part, safe="") for part in parts)])

    def _version_entries(self, subject: str) -> list[dict[str, Any]]:
        numbers = self._request("GET", ["subjects", subject, "versions"])
        if numbers is None:
            return []
        if not isinstance(numbers, list):
            raise SchemaRegistryError(f"{self.endpoint('subjects', subject, 'versions')} did not answer a list")
        entries = []
        for number in sorted(numbers):
            known = self._entries.get((subject, number))
            if known is not None:
                entries.append(known)
                continue
            answer = self._request("GET", ["subjects", subject, "versions", str(number)])
            if answer is None:
                continue  # deleted between the two requests
            schema_id = _int_field(answer, "id", self.url)
            text = _str_field(answer, "schema", self.url)
            self._cache[schema_id] = text
            entry = {"version": _int_field(answer, "version", self.url), "id": schema_id, "schema": text}
            self._entries[(subject, number)] = entry
            entries.append(entry)
        return entries

    def _request(self, method: str, parts: list[str], body: Any = None) -> Any:
        """The decoded JSON answer, or None when the registry says "not found"; errors name the URL."""
        url = self.endpoint(*parts)
        data = None if body is None else json.dumps(body).encode("utf-8")
        request = urllib.request.Request(url, data=data, method=method, headers={"Accept": _CONTENT_TYPE})
        if data is not None:
            request.add_header("Content-Type", _CONTENT_TYPE)
        try:
            # The URL is the registry's own, http(s) only (checked when it was built).
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # nosec B310
                return json.loads(response.read().decode("utf-8"))
        except urllib.error.HTTPError as exc:
            detail, error_code = _error_detail(exc)
            # Only the registry's own "not found" (error codes 404xx) means absent; other 404s: a wrong URL.
            if exc.code == 404 and method == "GET" and error_code is not None and error_code // 100 == 404:
                return None
            if exc.code == 409:
                raise IncompatibleSchemaError([f"the registry at {url} refused the schema: {detail}"]) from exc
            if exc.code == 422:
                raise InvalidSchemaError(f"the registry at {url} refused the schema as invalid: {detail}") from exc
            raise SchemaRegistryError(f"{method} {url} failed with HTTP {exc.code}: {detail}") from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise SchemaRegistryError(f"cannot reach the schema registry at {url}: {reason}") from exc
        except json.JSONDecodeError as exc:
            raise SchemaRegistryError(f"{method} {url} did not answer JSON: {exc}") from exc


def _error_detail(exc: urllib.error.HTTPError) -> tuple[str, int | None]:
    """The registry's error message and error code (such as 40401), from the JSON body of an error answer."""
    try:
        body = exc.read().decode("utf-8", "replace")
    except OSError:
        return str(exc.reason), None
    try:
        answer = json.loads(body)
    except json.JSONDecodeError:
        return body[:300] or str(exc.reason), None
    if isinstance(answer, dict) and "message" in answer:
        code = answer.get("error_code")
        code = code if isinstance(code, int) and not isinstance(code, bool) else None
        return f"{answer['message']} (error code {code})", code
    return body[:300], None


def _int_field(answer: Any, name: str, url: str) -> int:
    value = answer.get(name) if isinstance(answer, dict) else None
    if isinstance(value, bool) or not isinstance(value, int):
        raise SchemaRegistryError(f"the schema registry at {url} answered without an integer {name!r}: {answer!r}")
    return value


def _str_field(answer: Any, name: str, url: str) -> str:
    value = answer.get(name) if isinstance(answer, dict) else None
    if not isinstance(value, str):
        raise SchemaRegistryError(f"the schema registry at {url} answered without a string {name!r}: {answer!r}")
    return value
