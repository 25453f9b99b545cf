"""Quarantined records whose schema id the registry learnt later: released to the archive once (no services)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq

from attribution.release import held_records, release_quarantined, without_released
from billing.layout import DataLayout
from billing.periods import Periods
from billing.schemas import schema_text

T0 = 1_767_225_600_000  # 2026-01-01T00:00Z
VERSION_2 = json.loads(schema_text("click"))
VERSION_2["fields"].append({"name": "placement", "type": ["null", "string"], "default": None})


def framed(schema_id: int, record: dict) -> bytes:
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(VERSION_2), record)
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


def test_a_record_is_released_once_its_id_is_known_and_by_one_batch_only(tmp_path: Path) -> None:
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
    assert [(q.reason, q.records) for q in released.quarantined] == [("unknown_schema", -1)]
    assert [(c.ad_id, c.events) for c in released.late] == [("ad-1", 1)]
    assert sorted(str(p.relative_to(tmp_path)) for p in released.files) == [
        "archive/event_type=click/period=20260101T0000Z/batch_id=5/released.parquet",
        "released/batch_id=5/released.parquet",
    ]
    # A replay of batch 5 releases the same record again, into the same files; a later batch does not.
    assert release(layout, 5, {7: json.dumps(VERSION_2)}).count == 1
    assert release(layout, 6, {7: json.dumps(VERSION_2)}).count == 0
    assert held_records(layout, 6).num_rows == 2, "the never-known and the out-of-range records stay held"
    table = pq.read_table(layout.quarantine / "batch_id=3" / "part-00000.parquet")
    assert without_released(layout, table).column("offset").to_pylist() == [11, 12, 13]
