"""Schema ids for the Confluent wire format: a registry of Avro schemas by subject, with global integer ids.

Two implementations of one port: `FileSchemaRegistry` (a JSON file, for a single machine and for tests) and
`HttpSchemaRegistry` (a Confluent-compatible Schema Registry over HTTP). Both refuse a new version that is not
BACKWARD-transitive compatible with every earlier version of its subject, checked here with
`billing.compatibility`, so the rule holds whatever compatibility level a server is configured with.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from billing.compatibility import (
    IncompatibleSchemaError,
    InvalidSchemaError,
    check_backward_transitive,
    parse_schema,
)


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


def open_registry(location: str) -> SchemaRegistry:
    """`http://…`/`https://…` opens a Schema Registry server; anything else (or `file://…`) a JSON file."""
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
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {"schemas": {}, "subjects": {}}
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SchemaRegistryError(f"the schema registry file {self.path} is not JSON: {exc}") from exc
        if not isinstance(data, dict) or not {"schemas", "subjects"} <= data.keys():
            raise SchemaRegistryError(f"the schema registry file {self.path} lacks 'schemas' and 'subjects'")
        return data

    def _write(self, data: dict[str, Any]) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(data, out, indent=1, sort_keys=True)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise


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
