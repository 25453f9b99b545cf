"""Quarantined records whose schema id the registry learnt later: released to the archive once (no services)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq

from attribution.epoch import set_aside_batches_after
from attribution.release import held_records, release_quarantined, settled_quarantine
from billing.compatibility import check_backward_transitive
from billing.layout import DataLayout
from billing.periods import Periods
from billing.schemas import schema_text

T0 = 1_767_225_600_000  # 2026-01-01T00:00Z
VERSION_2 = json.loads(schema_text("click"))
VERSION_2["fields"].append({"name": "placement", "type": ["null", "string"], "default": None})


def framed(schema_id: int, record: dict, schema: dict = VERSION_2) -> bytes:
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(schema), record)
    return b"\x00" + schema_id.to_bytes(4, "big") + body.getvalue()


def quarantine(layout: DataLayout, batch_id: int, rows: list[tuple[str, int, bytes]]) -> None:
    """Quarantine rows (reason, offset, value) of topic `clicks` in batch `batch_id`."""
    folder = layout.quarantine / f"batch_id={batch_id}"
    folder.mkdir(parents=True)
    table = pa.table(
        {
            "reason": [r for r, _, _ in rows],
            "topic": ["clicks"] * len(rows),
            "partition": pa.array([0] * len(rows), pa.int32()),
            "offset": pa.array([o for _, o, _ in rows], pa.int64()),
            "received_ms": pa.array([T0 + 5_000] * len(rows), pa.int64()),
            "value": [v for _, _, v in rows],
        }
    )
    pq.write_table(table, folder / "part-00000.parquet")


def click(click_id: str, event_time: int = T0 + 1_000) -> dict:
    return {"click_id": click_id, "ad_id": "ad-1", "user_id": "u1", "event_time": event_time, "placement": "feed"}


def release(layout: DataLayout, batch_id: int, known: dict[int, str]):
    return release_quarantined(layout, batch_id, {"click": known}, {"clicks": "click"}, Periods(), {"ad-1": "adv-1"})


def test_a_record_is_settled_once_its_id_is_known_and_by_one_batch_only(tmp_path: Path) -> None:
    layout = DataLayout(tmp_path)
    quarantine(
        layout,
        3,
        [
            ("unknown_schema", 10, framed(7, click("c-known-later"))),  # id 7 registered after it arrived
            ("unknown_schema", 11, framed(99, click("c-never"))),  # id 99 never registered
            ("unknown_schema", 12, framed(7, click("c-too-late", T0 + 10 * 3_600_000))),  # decodes, time out of range
            ("undecodable", 13, b"junk"),
        ],
    )
    assert release(layout, 5, {}).count == 0, "nothing decodes while the id is unknown"

    released = release(layout, 5, {7: json.dumps(VERSION_2)})
    assert released.events.column("event_id").to_pylist() == ["c-known-later"]
    assert released.events.column("late").to_pylist() == [True], "the streaming join never saw it"
    # Both records of id 7 leave `unknown_schema`; the one whose time is out of range stays with that reason.
    assert sorted((q.reason, q.records) for q in released.quarantined) == [
        ("time_out_of_range", 1),
        ("unknown_schema", -2),
    ]
    assert [(c.ad_id, c.events) for c in released.late] == [("ad-1", 1)]
    assert sorted(str(p.relative_to(tmp_path)) for p in released.files) == [
        "archive/event_type=click/period=20260101T0000Z/batch_id=5/released.parquet",
        "released/batch_id=5/released.parquet",
    ]
    # A replay of batch 5 releases the same record again, into the same files; a later batch does not.
    assert release(layout, 5, {7: json.dumps(VERSION_2)}).count == 1
    assert release(layout, 6, {7: json.dumps(VERSION_2)}).count == 0
    assert held_records(layout, 6).column("offset").to_pylist() == [11], "the never-known record stays held"
    # The out-of-range one is settled too: its id is known, it stays in quarantine with its own reason.
    table = pq.read_table(layout.quarantine / "batch_id=3" / "part-00000.parquet").append_column(
        "ad_id", pa.array([None] * 4, pa.string())
    )
    assert settled_quarantine(layout, table).select(["offset", "reason", "ad_id"]).to_pylist() == [
        {"offset": 11, "reason": "unknown_schema", "ad_id": None},
        {"offset": 12, "reason": "time_out_of_range", "ad_id": "ad-1"},
        {"offset": 13, "reason": "undecodable", "ad_id": None},
    ]


def renamed(record: str | None = None, user_field: str | None = None) -> dict:
    """Version 2 with the record or `user_id` renamed, the old name kept as its alias: BACKWARD compatible."""
    schema = json.loads(json.dumps(VERSION_2))
    if record is not None:
        schema["name"], schema["aliases"] = record, [schema["name"]]
    for f in schema["fields"]:
        if f["name"] == "user_id" and user_field is not None:
            f["name"], f["aliases"] = user_field, ["user_id"]
    check_backward_transitive(schema, [json.loads(schema_text("click")), VERSION_2])
    return schema


def test_versions_renamed_through_aliases_are_released_and_a_record_that_does_not_decode_settles_alone(
    tmp_path: Path,
) -> None:
    layout = DataLayout(tmp_path)
    # Id 9's writer also lets `ad_id` be null: a record of it may lack a field.
    tap, visitor = renamed(record="Tap"), nullable_ad(renamed(user_field="visitor_id"))
    as_visitor = {k if k != "user_id" else "visitor_id": v for k, v in click("c-visitor").items()}
    quarantine(
        layout,
        3,
        [
            ("unknown_schema", 10, framed(8, click("c-tap"), tap)),
            ("unknown_schema", 11, framed(9, as_visitor, visitor)),
            # Id 8, but a body that is not Avro of it (a string length running past the end).
            ("unknown_schema", 12, b"\x00" + (8).to_bytes(4, "big") + b"\xfe\xff\xff\xff\x07abc"),
            ("unknown_schema", 13, framed(9, {**as_visitor, "click_id": "c-no-ad", "ad_id": None}, visitor)),
        ],
    )
    released = release(layout, 5, {8: json.dumps(tap), 9: json.dumps(visitor)})
    assert released.events.select(["event_id", "user_id"]).to_pylist() == [
        {"event_id": "c-tap", "user_id": "u1"},
        {"event_id": "c-visitor", "user_id": "u1"},
    ]
    settled = released.settled.select(["offset", "event_id", "reason"]).to_pylist()
    assert settled == [
        {"offset": 10, "event_id": "c-tap", "reason": None},
        {"offset": 11, "event_id": "c-visitor", "reason": None},
        {"offset": 12, "event_id": None, "reason": "undecodable"},
        {"offset": 13, "event_id": "c-no-ad", "reason": "missing_field"},
    ]
    assert sorted((q.reason, q.records) for q in released.quarantined) == [
        ("missing_field", 1),
        ("undecodable", 1),
        ("unknown_schema", -4),
    ]
    assert held_records(layout, 6).num_rows == 0, "each record settled once"


def nullable_ad(schema: dict) -> dict:
    """`schema` with a nullable `ad_id` (a writer that may leave it out: the record lacks a field)."""
    out = json.loads(json.dumps(schema))
    for f in out["fields"]:
        if f["name"] == "ad_id":
            f["type"] = ["null", "string"]
    return out


def test_a_new_epoch_sets_a_release_aside_with_its_batch_and_the_next_release_settles_its_records(
    tmp_path: Path,
) -> None:
    """`adbill stream --new-checkpoint` after a crash in batch 5, which had released a record: the batch's files are
    set aside, its release with them, and the new epoch's first batch releases the record again."""
    layout = DataLayout(tmp_path)
    quarantine(layout, 3, [("unknown_schema", 10, framed(7, click("c-released")))])
    assert release(layout, 5, {7: json.dumps(VERSION_2)}).count == 1  # batch 5 crashed after this
    set_aside_batches_after(tmp_path, 4)
    assert not list(layout.archive.rglob("*.parquet")), "the release's archive rows are set aside"
    assert held_records(layout, 6).column("offset").to_pylist() == [10], "held again"
    again = release(layout, 6, {7: json.dumps(VERSION_2)})
    assert again.events.column("event_id").to_pylist() == ["c-released"]
    assert sorted(p.name for p in (layout.uncommitted / "released").iterdir()) == ["batch_id=5"]
