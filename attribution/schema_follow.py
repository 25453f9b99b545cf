"""The job follows the schema registry: a version registered while it runs is decoded from its first record.

With spark-avro's `from_avro` the writer schemas are part of the query's plan (`attribution.decode`), so a new
version means a new plan. The job does it in three steps, with nothing lost or billed twice:

1. **notice**: before a micro-batch writes anything, the sink asks the registry for the ids of the two subjects
   (`WriterSchemaWatch.new_versions`: one small read of the registry a batch). A producer registers a version
   before it writes a record with its id, and Spark plans a batch's offsets before the sink runs, so every
   record of the batch written with a registered id is seen here, whatever its version;
2. **switch**: on an id the query cannot decode, the sink raises `SchemaSwitch` before it writes a file or a
   count: Spark does not commit the batch. `FollowingQuery` (the query the job hands out) starts the query
   again from the same checkpoint with every version of each subject; the checkpoint replays the batch, now
   decoded (`attribution.job.start`);
3. **release**: records held in quarantine as `unknown_schema`, whose id the registry learnt after they arrived,
   are decoded and archived by the first batch of the query started again (`attribution.release`), and billed
   by reconciliation from the archive, once.

`FollowingQuery` stands for the query across its restarts: `processAllAvailable`, `awaitTermination`, `stop`,
`isActive` and `exception` behave as on one query that never stopped, and a switch is not a failure.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming import StreamingQuery

from billing.schemas import subject_of
from billing.store.schema_registry import SchemaRegistry, open_registry

log = logging.getLogger(__name__)

EVENT_TYPES = ("impression", "click")


class SchemaSwitch(RuntimeError):
    """The registry holds versions the running query cannot decode: the batch stops before it writes anything,
    and the query is started again with them (`FollowingQuery`)."""

    def __init__(self, new_ids: Mapping[str, list[int]]) -> None:
        self.new_ids = {event_type: sorted(ids) for event_type, ids in new_ids.items() if ids}
        listed = "; ".join(f"{event_type}: {ids}" for event_type, ids in self.new_ids.items())
        super().__init__(f"new schema versions in the registry ({listed}): starting the query again with them")


def registered_versions(registry: SchemaRegistry, event_type: str) -> dict[int, str]:
    """Schema id -> schema text of every version of `event_type`'s subject, as the registry has them now."""
    return {schema_id: registry.schema_by_id(schema_id) for schema_id in registry.ids(subject_of(event_type))}


@dataclass
class WriterSchemaWatch:
    """Which schema ids of the two subjects the registry holds beyond the ones a query decodes."""

    registry_location: str
    known: Mapping[str, frozenset[int]]
    """Event type -> the schema ids the query was built with."""
    imports: Path | None = None
    """A data folder's registry file of an earlier release, taken into a registry in the database (`open_registry`)."""
    _registry: SchemaRegistry | None = field(default=None, repr=False)

    @property
    def registry(self) -> SchemaRegistry:
        if self._registry is None:
            self._registry = open_registry(self.registry_location, self.imports)
        return self._registry

    def new_versions(self) -> dict[str, list[int]]:
        """Event type -> ids the registry holds for its subject and the query cannot decode (empty: none)."""
        found: dict[str, list[int]] = {}
        for event_type in EVENT_TYPES:
            ids = set(self.registry.ids(subject_of(event_type))) - self.known.get(event_type, frozenset())
            if ids:
                found[event_type] = sorted(ids)
        return found


@dataclass
class _Generation:
    """One run of the query and the sink it writes with."""

    query: StreamingQuery
    sink: Any
    """The query's `BatchSink`; its `switch` says whether the query stopped for new schema versions."""


class FollowingQuery:
    """The billing query across the restarts that new schema versions cause (module doc).

    `restart()` starts the query again (from its checkpoint, with the registry's versions) and returns the new run;
    a thread waits on each run and calls it when a run stopped with `SchemaSwitch`; `finished()` is called once
    the query stopped for good (stopped, failed, or its restart failed)."""

    def __init__(
        self, first: _Generation, restart: Callable[[], _Generation], finished: Callable[[], None] = lambda: None
    ) -> None:
        self._current = first
        self._restart = restart
        self._finished = finished
        self._stopped = False
        self._failure: BaseException | None = None
        self._done = threading.Event()
        self._changed = threading.Condition()
        self.switches = 0
        """How many times the query was started again for new schema versions."""
        self._thread = threading.Thread(target=self._follow, name="billing-schema-follow", daemon=True)
        self._thread.start()

    # What callers use of a StreamingQuery.

    @property
    def query(self) -> StreamingQuery:
        """The run of the query now."""
        return self._current.query

    @property
    def name(self) -> str | None:
        return self.query.name

    @property
    def id(self) -> str:
        return self.query.id

    @property
    def runId(self) -> str:  # noqa: N802 - StreamingQuery's name
        return self.query.runId

    @property
    def isActive(self) -> bool:  # noqa: N802 - StreamingQuery's name
        """True until the follower has seen the query stop for good: a run that stopped for a switch, or failed a
        moment ago (`exception()` is set by then), still counts as active until the follower has decided."""
        return not self._done.is_set()

    @property
    def lastProgress(self) -> Any:  # noqa: N802 - StreamingQuery's name
        return self.query.lastProgress

    @property
    def recentProgress(self) -> Any:  # noqa: N802 - StreamingQuery's name
        return self.query.recentProgress

    @property
    def status(self) -> dict[str, Any]:
        return self.query.status

    @property
    def _jsq(self) -> Any:
        return self.query._jsq  # type: ignore[attr-defined]

    def exception(self) -> Any:
        """The failure that stopped the query for good (None while it runs or after a stop)."""
        if self._failure is None:
            return None
        return self.query.exception() or self._failure

    def processAllAvailable(self) -> None:  # noqa: N802 - StreamingQuery's name
        """Block until the query has processed everything available, across schema switches."""
        while True:
            generation = self._current
            try:
                generation.query.processAllAvailable()
            except StreamingQueryException:
                if not self._wait_for_next(generation):
                    raise
                continue
            if generation is self._current and not self._switching():
                return
            self._wait_for_next(generation)

    def awaitTermination(self, timeout: float | None = None) -> bool | None:  # noqa: N802 - StreamingQuery's name
        """Wait until the query stops for good (a stop, or a failure other than a schema switch, raised here)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._done.wait(0.5):
            if deadline is not None and time.monotonic() >= deadline:
                return False
        if self._failure is not None:
            raise self._failure
        return True if timeout is not None else None

    def stop(self) -> None:
        """Stop the query and stop following it."""
        with self._changed:
            self._stopped = True
        self._current.query.stop()
        self._done.wait(60)
        self._current.query.stop()  # a restart that was under way when stop() came

    # The follower.

    def _switching(self) -> bool:
        return bool(getattr(self._current.sink, "switch", None)) and not self._current.query.isActive

    def _wait_for_next(self, generation: _Generation) -> bool:
        """Wait until the follower replaced `generation` (True) or stopped following (False)."""
        with self._changed:
            while self._current is generation and not self._done.is_set():
                self._changed.wait(0.2)
            return self._current is not generation

    def _follow(self) -> None:
        try:
            while True:
                generation = self._current
                try:
                    generation.query.awaitTermination()
                except StreamingQueryException as exc:
                    if self._stopped or not getattr(generation.sink, "switch", None):
                        self._failure = exc
                        return
                else:
                    return  # stopped
                if self._stopped:
                    return
                log.warning("%s", generation.sink.switch)
                started = time.monotonic()
                following = self._restart()
                with self._changed:
                    self._current = following
                    self.switches += 1
                    self._changed.notify_all()
                log.info(
                    "billing query started again with the new schema versions in %.1f s", time.monotonic() - started
                )
                if self._stopped:
                    following.query.stop()
        except BaseException as exc:  # the restart failed: the job fails, as on any failure of its query
            log.exception("starting the billing query again failed")
            self._failure = exc
        finally:
            try:
                self._finished()
            finally:
                with self._changed:
                    self._done.set()
                    self._changed.notify_all()
