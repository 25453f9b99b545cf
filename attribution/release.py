"""Quarantined records whose schema id the registry learnt after they arrived: decoded and put in the archive, once.

A record whose schema id the registry did not know when its batch ran is quarantined as `unknown_schema`
(`attribution.decode`); it is *held*. Once the registry knows the id, a release settles it, as its batch would have:

- it decodes and passes the checks of the intake: it becomes an archive row (flagged `late`: the streaming join
  never saw it), and reconciliation bills it from the archive like any event the join missed (a `late_click` or
  `late_impression` correction, or an adjustment when its period is closed);
- it does not (a body that does not decode even through the aliases Avro resolution allows, a missing field, a
  time out of range): it stays in quarantine with that reason instead of `unknown_schema`.

What one record does is that record's fate: a record that fastavro cannot read, for whatever reason, settles as
`undecodable`, and the release goes on. A record whose id the registry still does not know stays held.

Two parts release, one at a time (`release_lock`), and a record is settled once, by whichever comes first:

- the stream: the first micro-batch N of every start of its query (the job's start, or a restart for new schema
  versions: `attribution.schema_follow`) releases into batch N, with batch N's files and Redis script: archive rows
  in `ARCHIVE/event_type=T/period=P/batch_id=N/released.parquet`, the settled records in
  `RELEASED/batch_id=N/released.parquet`. A replay of batch N settles the same records into the same files;
- reconciliation (`adbill reconcile`, `ReconciliationRelease`, with `settle` and `write_release`), so that a job
  that is down, or has not started its query again since the registry learnt the id, does not keep known records
  unbilled: into the last batch C the stream committed (`.../batch_id=C/reconciliation-RUN.parquet`), which the run
  reads up to; its Redis figures are applied once per record (`RedisTotals.apply_released`), and `adbill
  restore-redis` counts them the same way (`settled_quarantine` gives the quarantine as the stream's releases left
  it). Which records were settled, and by whom, is listed in `RELEASED/` (`billing.store.released`).

A released record keeps the time Kafka received it, so it may now be the first copy of its id to arrive: a later
copy in another period, billed there by the stream, becomes an id conflict. Each settled record names the periods
that hold another copy of its id (`copy_periods`), and those periods are reconciled again with its own
(`billing.store.data_versions`, `billing.reconcile_plan.mark_changed`).

Pure pyarrow and fastavro, on the driver: the records are few (what arrived before a producer's schema was known),
and a release runs once per start of the query or reconciliation run, not per batch.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from attribution.batch_output import write_batch_files
from attribution.decode import HEADER_SIZE, event_fields, reader_schema, required_fields
from attribution.epoch import CommittedBatch
from attribution.job_lock import FileLock, JobLockedError
from attribution.schema_follow import EVENT_TYPES, registered_versions
from billing.catalog import Catalog
from billing.intake import MAX_FUTURE_MS, MIN_EVENT_TIME_MS, QuarantineReason
from billing.layout import DataLayout
from billing.periods import Periods
from billing.schemas import without_logical_types
from billing.store.archive import ARCHIVE_SCHEMA
from billing.store.compaction import own_batch, read_batch_only, read_listed
from billing.store.redis_totals import LateCount, QuarantineCount, RedisTotals
from billing.store.released import RECONCILIATION, RELEASED_SCHEMA, STREAM, released_table
from billing.store.schema_registry import SchemaRegistryError, open_registry

RELEASE_FILE = "released.parquet"
"""The name of a stream's release files: beside the tasks' `part-NNNNN.parquet` of the same batch, never one of
them."""

RELEASE_LOCK_WAIT_S = 60.0
"""How long a release waits for the other part's release to finish (a few seconds of pyarrow and fastavro)."""

_HELD = QuarantineReason.UNKNOWN_SCHEMA.value
_HELD_COLUMNS = ("topic", "partition", "offset", "received_ms", "value", "batch_id")


def reconciliation_file(run_id: str) -> str:
    """The name of one reconciliation run's release files."""
    return f"reconciliation-{run_id}.parquet"


@dataclass(frozen=True)
class Release:
    """What one release settled: its archive rows, the settled records, and the Redis figures they change."""

    batch_id: int
    events: pa.Table
    """Archive rows (`ARCHIVE_COLUMNS`) of the records that decoded."""
    settled: pa.Table
    """One row per record settled (`RELEASED_SCHEMA`): archived (`reason` null) or quarantined with its reason."""
    periods: frozenset[str] = frozenset()
    """Every period whose bills the release can change: the periods of the archived events, the periods holding
    another copy of their ids, and for an impression the period after each (a click there may be attributed to
    it)."""
    files: list[Path] = field(default_factory=list)
    late: list[LateCount] = field(default_factory=list)
    quarantined: list[QuarantineCount] = field(default_factory=list)
    """Negative counts for the records leaving `unknown_schema`, positive ones for the reasons they now have."""

    @property
    def count(self) -> int:
        """Records archived."""
        return self.events.num_rows

    @property
    def requarantined(self) -> int:
        """Records that stay in quarantine with another reason than `unknown_schema`."""
        return self.settled.num_rows - self.events.num_rows

    @classmethod
    def none(cls, batch_id: int = -1) -> Release:
        return cls(batch_id, ARCHIVE_SCHEMA.empty_table(), RELEASED_SCHEMA.empty_table())


@contextmanager
def release_lock(layout: DataLayout, holder: str, wait_s: float = RELEASE_LOCK_WAIT_S) -> Iterator[None]:
    """Held from reading the held records to writing what was released: the stream and reconciliation never settle
    the same record twice. JobLockedError when the other holds it for longer than `wait_s`."""
    lock = FileLock(layout.release_lock, holder)
    lock.acquire(wait_s=wait_s)
    try:
        yield
    finally:
        lock.release()


def release_quarantined(
    layout: DataLayout,
    batch_id: int,
    writer_schemas: Mapping[str, Mapping[int, str]],
    event_type_of_topic: Mapping[str, str],
    periods: Periods,
    advertiser_of: Mapping[str, str],
) -> Release:
    """The stream's release, as part of batch `batch_id`: every `unknown_schema` record of an earlier batch that
    `writer_schemas` (event type -> schema id -> text) can now decode, and that no other release settled, settled
    and written (module doc). A replay of the batch settles the same records into the same files."""
    with release_lock(layout, f"the streaming job's batch {batch_id}"):
        held = held_records(layout, batch_id, replaying=batch_id)
        release = settle(layout, held, batch_id, writer_schemas, event_type_of_topic, periods, STREAM)
        return write_release(layout, release, RELEASE_FILE, advertiser_of, periods)


def settle(
    layout: DataLayout,
    held: pa.Table,
    batch_id: int,
    writer_schemas: Mapping[str, Mapping[int, str]],
    event_type_of_topic: Mapping[str, str],
    periods: Periods,
    released_by: str,
) -> Release:
    """Decide the fate of each `held` record whose schema id `writer_schemas` holds (module doc), into batch
    `batch_id`; nothing is written. Never raises for a record."""
    decoders = {event_type: _Decoder(event_type, schemas) for event_type, schemas in writer_schemas.items()}
    rows: list[dict[str, Any]] = []
    settled: list[dict[str, Any]] = []
    for record in held.to_pylist():
        event_type = event_type_of_topic.get(record["topic"])
        decoder = decoders.get(event_type or "")
        if decoder is None or event_type is None:
            continue
        fate = decoder.decode(record["value"], record["received_ms"])
        if fate is None:
            continue  # its id is still unknown: held
        reason, event = fate
        event_id = event.get(f"{event_type}_id") if event is not None else None
        period = None
        if reason is None:
            assert event is not None
            period_start = periods.start_of(event["event_time"])
            period = periods.key(period_start)
            rows.append(
                {
                    "event_type": event_type,
                    "event_id": event_id,
                    "ad_id": event["ad_id"],
                    "user_id": event["user_id"],
                    "event_time": event["event_time"],
                    "received_ms": record["received_ms"],
                    "topic": record["topic"],
                    "partition": record["partition"],
                    "offset": record["offset"],
                    "value": record["value"],
                    "user_agent": event.get("user_agent"),
                    "ip": event.get("ip"),
                    "late": True,
                    "period_start_ms": period_start,
                    "period": period,
                    "batch_id": batch_id,
                }
            )
        settled.append(
            {
                "topic": record["topic"],
                "partition": record["partition"],
                "offset": record["offset"],
                "event_type": event_type,
                "event_id": event_id if isinstance(event_id, str) else None,
                "period": period,
                "quarantine_batch_id": record["batch_id"],
                "reason": reason,
                "ad_id": event.get("ad_id") if event is not None and isinstance(event.get("ad_id"), str) else None,
                "copy_periods": [],
                "released_by": released_by,
                "batch_id": batch_id,
            }
        )
    copies = copy_periods(layout, [(r["event_type"], r["event_id"], r["period"]) for r in rows])
    for row in settled:
        if row["reason"] is None:
            row["copy_periods"] = sorted(copies.get((row["event_type"], row["event_id"]), set()) - {row["period"]})
    changed: set[str] = set()
    for row in settled:
        if row["reason"] is None:
            for period in [row["period"], *row["copy_periods"]]:
                changed.add(period)
                if row["event_type"] == "impression":
                    changed.add(periods.key(periods.parse_key(period) + periods.length_ms))
    return Release(
        batch_id,
        pa.Table.from_pylist(rows, schema=ARCHIVE_SCHEMA),
        pa.Table.from_pylist(settled, schema=RELEASED_SCHEMA),
        frozenset(changed),
    )


def write_release(
    layout: DataLayout, release: Release, file_name: str, advertiser_of: Mapping[str, str], periods: Periods
) -> Release:
    """`release` written (archive rows, then the settled records, each file flushed and renamed into place), with
    its files and Redis figures."""
    files: list[Path] = []
    if release.settled.num_rows:
        files += write_batch_files(
            release.events, layout.archive, ("event_type", "period", "batch_id"), file_name, False
        )
        files += write_batch_files(release.settled, layout.released, ("batch_id",), file_name, False)
    late, quarantined = release_counts(release.settled, advertiser_of, periods)
    return Release(release.batch_id, release.events, release.settled, release.periods, files, late, quarantined)


RELEASE_WAIT_S = 10.0
"""How long a reconciliation run waits for the streaming job's release to end before it leaves releasing to its next
run."""


@dataclass
class ReconciliationRelease:
    """A reconciliation run's release (`billing.reconcile_run.ReconcilePorts.release`): the records held in quarantine
    by batches up to the last one the stream committed, whose schema id the registry knows now, released into that
    batch (which the run reads up to), one releaser at a time (`release_lock`). Their counts reach Redis once per
    record; every run applies those an earlier run wrote and did not apply (it stopped in between)."""

    layout: DataLayout
    catalog: Catalog
    through: CommittedBatch
    periods: Periods
    topics: tuple[str, ...]
    """The topics the billing query reads, in the order of `EVENT_TYPES`."""
    registry_location: str | None
    """The schema registry (`billing.store.schema_registry.open_registry`); None: nothing is released."""
    totals: Callable[[], RedisTotals]
    """Redis, where the counts of the records released go."""

    @contextmanager
    def __call__(self, run_id: str, progress: Callable[[str], None]) -> Iterator[_PendingRelease | None]:
        lock = FileLock(self.layout.release_lock, f"reconciliation run {run_id}")
        try:
            lock.acquire(wait_s=RELEASE_WAIT_S)
        except JobLockedError as exc:  # the stream is releasing: the next run releases what is left
            progress(f"release left to the next run: {exc}")
            yield None
            return
        try:
            self.apply_counts()
            yield self.pending(run_id, progress)
        finally:
            lock.release()

    def pending(self, run_id: str, progress: Callable[[str], None]) -> _PendingRelease | None:
        if self.registry_location is None:
            return None
        layout = self.layout
        batch = self.through.batch()
        if batch is None or batch < 0:
            # No batch committed, or no checkpoint (a back-filled data folder, or one being replaced by a new
            # epoch, which may set aside the newest batches yet): nothing of the stream to release into.
            return None
        held = held_records(layout, batch + 1)
        if not held.num_rows:
            return None
        try:
            registry = open_registry(self.registry_location, layout.schemas_file)
            schemas = {event_type: registered_versions(registry, event_type) for event_type in EVENT_TYPES}
        except SchemaRegistryError as exc:
            progress(f"release left to the next run: the schema registry cannot be read: {exc}")
            return None
        topics = dict(zip(self.topics, EVENT_TYPES, strict=True))
        release = settle(layout, held, batch, schemas, topics, self.periods, RECONCILIATION)
        if not release.settled.num_rows:
            return None
        return _PendingRelease(self, release, reconciliation_file(run_id))

    def apply_counts(self) -> int:
        """Apply to Redis the counts of every record a run released (each once); how many were new."""
        table = released_table(self.layout, ds.field("released_by") == RECONCILIATION)
        if not table.num_rows:
            return 0
        advertiser_of = self.catalog.advertisers_by_ad
        columns = (table.column(c).to_pylist() for c in ("topic", "partition", "offset"))
        keys = [f"{t}/{p}/{o}" for t, p, o in zip(*columns, strict=True)]
        return self.totals().apply_released(
            (key, *release_counts(table.slice(i, 1), advertiser_of, self.periods)) for i, key in enumerate(keys)
        )


@dataclass(frozen=True)
class _PendingRelease:
    """What a run is about to release (`billing.reconcile_run.PendingRelease`)."""

    owner: ReconciliationRelease
    release: Release
    file_name: str

    @property
    def batch_id(self) -> int:
        return self.release.batch_id

    @property
    def periods(self) -> frozenset[str]:
        return self.release.periods

    @property
    def count(self) -> int:
        return self.release.count

    def write(self) -> None:
        owner = self.owner
        advertiser_of = {ad.ad_id: ad.advertiser_id for ad in owner.catalog}
        write_release(owner.layout, self.release, self.file_name, advertiser_of, owner.periods)
        self.owner.apply_counts()


def release_counts(
    settled: pa.Table, advertiser_of: Mapping[str, str], periods: Periods
) -> tuple[list[LateCount], list[QuarantineCount]]:
    """The Redis figures of settled records (`RELEASED_SCHEMA` rows): each archived one counts as late in its period,
    each leaves the `unknown_schema` count (it had no readable ad: counted without an advertiser), and each that
    stays in quarantine counts under its reason."""
    late: dict[tuple[str, str, str], int] = {}
    quarantined: dict[tuple[str, str, str | None], int] = {}
    for row in settled.select(["topic", "event_type", "period", "reason", "ad_id"]).to_pylist():
        held: tuple[str, str, str | None] = (_HELD, row["topic"], None)
        quarantined[held] = quarantined.get(held, 0) - 1
        if row["reason"] is None:
            late_key = (row["period"], row["ad_id"], row["event_type"])
            late[late_key] = late.get(late_key, 0) + 1
        else:
            now = (row["reason"], row["topic"], advertiser_of.get(row["ad_id"] or ""))
            quarantined[now] = quarantined.get(now, 0) + 1
    return (
        [
            LateCount(period, periods.parse_key(period), advertiser_of.get(ad, ""), ad, event_type, n)
            for (period, ad, event_type), n in sorted(late.items())
        ],
        [QuarantineCount(reason, topic, adv, n) for (reason, topic, adv), n in quarantined.items() if n],
    )


def held_records(layout: DataLayout, before_batch: int, replaying: int | None = None) -> pa.Table:
    """The `unknown_schema` quarantine rows of batches before `before_batch` that no release settled, but for the
    stream's own release of batch `replaying` (a replay of that batch settles them again)."""
    empty = pa.table({name: [] for name in _HELD_COLUMNS})
    # Each row's own batch (`own_batch`: a compacted quarantine file's `source_batch_id`), which a release keeps as
    # its `quarantine_batch_id`.
    wanted = (ds.field("reason") == _HELD) & (own_batch() < before_batch)
    # The raw bytes only when there is a record to release: a quarantine of junk can be large.
    found = read_batch_only(layout.quarantine, ["offset"], wanted)
    if found is None or not found.num_rows:
        return empty
    held = read_batch_only(layout.quarantine, list(_HELD_COLUMNS), wanted)
    if held is None:
        return empty
    done = settled_keys(layout, replaying)
    if done and held.num_rows:
        held = held.filter(pa.array([key not in done for key in _keys(held)], pa.bool_()))
    return held


def settled_keys(layout: DataLayout, replaying: int | None = None) -> set[str]:
    """`topic/partition/offset` of every record a release settled, but for the stream's release of batch
    `replaying`."""
    table = released_table(layout)
    if replaying is not None and table.num_rows:
        own = pc.and_(
            pc.equal(table.column("batch_id"), replaying),
            pc.equal(pc.fill_null(table.column("released_by"), STREAM), STREAM),
        )
        table = table.filter(pc.invert(own))
    return set(_keys(table))


def settled_quarantine(layout: DataLayout, quarantine: pa.Table, through_batch: int | None = None) -> pa.Table:
    """The rows of `quarantine` (`reason`, `topic`, `partition`, `offset`, `ad_id`) as the stream's releases of
    batches up to `through_batch` (all: None) left them: an archived record is no longer in quarantine, a record
    quarantined again has its new reason and ad. Reconciliation's releases are left out: Redis counts them once per
    record (`RedisTotals.apply_released`)."""
    table = released_table(layout)
    if table.num_rows:
        mine = pc.equal(table.column("released_by"), STREAM)
        if through_batch is not None:
            mine = pc.and_(mine, pc.less_equal(table.column("batch_id"), through_batch))
        table = table.filter(mine)
    if not table.num_rows or not quarantine.num_rows:
        return quarantine
    fate = {key: (r["reason"], r["ad_id"]) for key, r in zip(_keys(table), table.to_pylist(), strict=True)}
    rows = []
    for key, row in zip(_keys(quarantine), quarantine.to_pylist(), strict=True):
        if key not in fate:
            rows.append(row)
        elif fate[key][0] is not None:
            rows.append({**row, "reason": fate[key][0], "ad_id": fate[key][1]})
    return pa.Table.from_pylist(rows, schema=quarantine.schema)


def copy_periods(layout: DataLayout, events: list[tuple[str, str, str | None]]) -> dict[tuple[str, str], set[str]]:
    """(event type, event id) -> the periods of the archive holding a copy of it, for `events` (type, id, period).
    The archive's batch files are listed by `read_listed` (`billing.store.compaction`: the open periods' are
    compacted while the stream runs, no lock here): a file a compaction removes between the listing and the reading
    makes it list again."""
    wanted = {(t, i) for t, i, _ in events if i is not None}
    archive = layout.archive
    if not wanted:
        return {}

    def read(files: list[Path]) -> pa.Table | None:
        if not files:
            return None
        dataset = ds.dataset(
            [str(f) for f in files], format="parquet", partitioning="hive", partition_base_dir=str(archive)
        )
        return dataset.to_table(
            columns=["event_type", "event_id", "period"],
            filter=ds.field("event_id").isin(sorted({i for _, i in wanted})),
        )

    found = read_listed(archive, 3, read)
    if found is None:
        return {}
    out: dict[tuple[str, str], set[str]] = {}
    for row in found.to_pylist():
        key = (str(row["event_type"]), row["event_id"])
        if key in wanted:
            out.setdefault(key, set()).add(str(row["period"]))
    return out


def _keys(table: pa.Table) -> list[str]:
    columns = (table.column(c).to_pylist() for c in ("topic", "partition", "offset"))
    return [f"{t}/{p}/{o}" for t, p, o in zip(*columns, strict=True)]


class _Decoder:
    """One event type's records: the writer schema by the frame's id, resolved against the shipped fields, with the
    aliases that writer declares (`attribution.decode.reader_schema`)."""

    def __init__(self, event_type: str, writer_schemas: Mapping[int, str]) -> None:
        self.event_type = event_type
        self.fields = event_fields(event_type)
        self.required = required_fields(event_type)
        self.texts = dict(writer_schemas)
        self.parsed: dict[int, tuple[Any, Any] | None] = {}

    def schemas(self, schema_id: int) -> tuple[Any, Any] | None:
        """(writer, reader) of a schema id, parsed once; None when fastavro cannot parse them."""
        if schema_id not in self.parsed:
            text = self.texts[schema_id]
            try:
                reader = json.loads(reader_schema(self.event_type, text))
                reader["fields"] = [f for f in reader["fields"] if f["name"] in self.fields]
                self.parsed[schema_id] = (
                    fastavro.parse_schema(without_logical_types(json.loads(text))),
                    fastavro.parse_schema(reader),
                )
            except Exception:  # noqa: BLE001 - a schema fastavro cannot read leaves its records undecodable
                self.parsed[schema_id] = None
        return self.parsed[schema_id]

    def decode(self, value: bytes | None, received_ms: int) -> tuple[str | None, dict[str, Any] | None] | None:
        """(None, the event) when the record decodes and passes the intake's checks; (its quarantine reason, what
        could be read of it) when it does not; None when its schema id is still unknown (or its bytes are gone)."""
        if value is None or len(value) < HEADER_SIZE or value[0] != 0:
            return None
        schema_id = int.from_bytes(value[1:HEADER_SIZE], "big")
        if schema_id not in self.texts:
            return None
        schemas = self.schemas(schema_id)
        if schemas is None:
            return QuarantineReason.UNDECODABLE.value, None
        try:
            record = fastavro.schemaless_reader(io.BytesIO(value[HEADER_SIZE:]), schemas[0], schemas[1])
        except Exception:  # noqa: BLE001 - whatever fastavro raises, it is this record's fate, not the batch's
            return QuarantineReason.UNDECODABLE.value, None
        if not isinstance(record, dict):
            return QuarantineReason.UNDECODABLE.value, None
        if any(record.get(name) is None for name in self.required):
            return QuarantineReason.MISSING_FIELD.value, record
        event_time = record["event_time"]
        if not isinstance(event_time, int) or not MIN_EVENT_TIME_MS <= event_time <= received_ms + MAX_FUTURE_MS:
            return QuarantineReason.TIME_OUT_OF_RANGE.value, record
        return None, record
