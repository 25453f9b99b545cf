"""A second, independent reading of the billing contract, in DuckDB SQL: the oracle the tests hold the code to.

It works on the raw events as received (one row per Kafka record that decoded to an event: `type`, `id`, `ad_id`,
`user_id`, `event_time`, `received_ms`, `partition`, `offset`) and the ad catalog, and says what must be billed.
It is written from DOMAIN.md alone and imports nothing of the production rule (`billing.rule`, `billing.intake`,
`attribution.join`), so a shared mistake would have to be made twice.

The contract, step by step, as the SQL below reads it:
1. An event is quarantined when its event_time is before 2000-01-01 or more than one hour after the moment the
   event was received (an ad the catalog does not know is no reason: the click is simply not billable).
2. Of the valid copies of one (type, id), the first by arrival (`received_ms`, `partition`, `offset`) stands; a
   later copy with the same content is a duplicate, one with other content a conflict (quarantined).
3. A click is billable when an impression of the same ad and user stands with
   `impression.event_time <= click.event_time <= impression.event_time + 10 000` (both ends inclusive); it is
   attributed to the latest such impression, ties to the smallest impression id, and priced at the entry of the
   ad's price history with the greatest `effective_from` at or before the click's time (the later change on a
   tie); a click whose ad is paused then, not yet created, or unknown is not billable.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from typing import Any

import duckdb
import pyarrow as pa

from billing.catalog import Catalog

MIN_EVENT_TIME_MS = 946_684_800_000  # 2000-01-01T00:00:00Z, from DOMAIN.md (not imported: the oracle stands alone)
MAX_AHEAD_OF_RECEIPT_MS = 3_600_000  # one hour
WINDOW_MS = 10_000

RAW_EVENT_SCHEMA = pa.schema(
    [
        ("type", pa.string()),
        ("id", pa.string()),
        ("ad_id", pa.string()),
        ("user_id", pa.string()),
        ("event_time", pa.int64()),
        ("received_ms", pa.int64()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
    ]
)
"""One decoded record as received: `type` is `impression` or `click`."""

BILLABLE_COLUMNS = (
    "click_id",
    "impression_id",
    "ad_id",
    "campaign_id",
    "advertiser_id",
    "user_id",
    "click_time",
    "impression_time",
    "amount_micros",
    "currency",
)

_VALID_AND_RANKED = f"""
WITH checked AS (
    SELECT e.*,
           CASE
               WHEN e.event_time < {MIN_EVENT_TIME_MS}
                 OR e.event_time > e.received_ms + {MAX_AHEAD_OF_RECEIPT_MS} THEN 'time_out_of_range'
           END AS invalid_reason
    FROM events e
),
valid AS (
    SELECT *,
           row_number() OVER copies AS copy_no,
           first_value(ad_id) OVER copies AS first_ad_id,
           first_value(user_id) OVER copies AS first_user_id,
           first_value(event_time) OVER copies AS first_event_time
    FROM checked
    WHERE invalid_reason IS NULL
    WINDOW copies AS (PARTITION BY type, id ORDER BY received_ms, "partition", "offset"
                      ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
),
verdicts AS (
    SELECT type, id, received_ms, "partition", "offset", invalid_reason AS verdict FROM checked
    WHERE invalid_reason IS NOT NULL
    UNION ALL
    SELECT type, id, received_ms, "partition", "offset",
           CASE
               WHEN copy_no = 1 THEN 'accepted'
               WHEN ad_id = first_ad_id AND user_id = first_user_id AND event_time = first_event_time
                   THEN 'duplicate'
               ELSE 'id_conflict'
           END
    FROM valid
),
standing AS (SELECT type, id, ad_id, user_id, event_time FROM valid WHERE copy_no = 1)
"""

_BILLABLE = (
    _VALID_AND_RANKED
    + f""",
matches AS (
    SELECT k.id AS click_id,
           i.id AS impression_id,
           k.ad_id,
           k.user_id,
           k.event_time AS click_time,
           i.event_time AS impression_time,
           row_number() OVER (PARTITION BY k.id ORDER BY i.event_time DESC, i.id ASC) AS preference
    FROM standing k
    JOIN standing i
      ON k.type = 'click' AND i.type = 'impression'
     AND i.ad_id = k.ad_id AND i.user_id = k.user_id
     AND i.event_time <= k.event_time AND k.event_time <= i.event_time + {WINDOW_MS}
),
priced AS (
    SELECT m.*, p.campaign_id, p.advertiser_id, p.cpc_micros, p.currency,
           row_number() OVER (PARTITION BY m.click_id ORDER BY p.effective_from DESC, p.version DESC) AS in_force
    FROM matches m JOIN catalog p ON p.ad_id = m.ad_id AND p.effective_from <= m.click_time
    WHERE m.preference = 1
)
SELECT click_id, impression_id, ad_id, campaign_id, advertiser_id, user_id,
       click_time, impression_time, cpc_micros AS amount_micros, currency
FROM priced
WHERE in_force = 1 AND cpc_micros IS NOT NULL
ORDER BY click_id
"""
)


def _catalog_table(catalog: Catalog) -> pa.Table:
    """One row per entry of each ad's price history (`cpc_micros` null: paused)."""
    entries = [(ad, entry) for ad in catalog for entry in ad.prices]
    return pa.table(
        {
            "ad_id": pa.array([ad.ad_id for ad, _ in entries], pa.string()),
            "campaign_id": pa.array([ad.campaign_id for ad, _ in entries], pa.string()),
            "advertiser_id": pa.array([ad.advertiser_id for ad, _ in entries], pa.string()),
            "currency": pa.array([ad.currency for ad, _ in entries], pa.string()),
            "effective_from": pa.array([e.effective_from for _, e in entries], pa.int64()),
            "version": pa.array([e.version for _, e in entries], pa.int64()),
            "cpc_micros": pa.array([e.cpc_micros for _, e in entries], pa.int64()),
        }
    )


def _connect(events: Iterable[Mapping[str, Any]], catalog: Catalog) -> duckdb.DuckDBPyConnection:
    connection = duckdb.connect()
    connection.register("events", pa.Table.from_pylist(list(events), schema=RAW_EVENT_SCHEMA))
    connection.register("catalog", _catalog_table(catalog))
    return connection


def _query(events: Iterable[Mapping[str, Any]], catalog: Catalog, sql: str) -> list[dict[str, Any]]:
    connection = _connect(events, catalog)
    try:
        result = connection.execute(sql)
        names = [column[0] for column in result.description]
        return [dict(zip(names, row, strict=True)) for row in result.fetchall()]
    finally:
        connection.close()


def billable(events: Iterable[Mapping[str, Any]], catalog: Catalog) -> list[dict[str, Any]]:
    """What the contract bills for these raw events: one dict per billable click (`BILLABLE_COLUMNS`), by click_id."""
    return _query(events, catalog, _BILLABLE)


def verdicts(events: Iterable[Mapping[str, Any]], catalog: Catalog) -> dict[str, int]:
    """How many records were accepted, duplicates, or quarantined per reason (`time_out_of_range`, `id_conflict`)."""
    rows = _query(events, catalog, _VALID_AND_RANKED + "SELECT verdict, count(*) AS n FROM verdicts GROUP BY verdict")
    return {row["verdict"]: row["n"] for row in rows}


def conflicting_ids(events: Iterable[Mapping[str, Any]], catalog: Catalog) -> dict[str, set[str]]:
    """The ids with a quarantined conflicting copy, by type: `{"impression": {...}, "click": {...}}`."""
    sql = _VALID_AND_RANKED + "SELECT DISTINCT type, id FROM verdicts WHERE verdict = 'id_conflict'"
    found: dict[str, set[str]] = {"impression": set(), "click": set()}
    for row in _query(events, catalog, sql):
        found[row["type"]].add(row["id"])
    return found


def received_rows(arrivals: Iterable[Any], partitions: int = 4) -> list[dict[str, Any]]:
    """Raw event rows of simulated arrivals (`producers.simulator.Arrival`), as the archive would hold them.

    `received_ms` is the simulated arrival time; the partition is chosen by ad (both topics are keyed by ad_id)
    and offsets count up per topic and partition in send order. Raw records (bytes that never decode) are left
    out: they never reach the rule.
    """
    offsets: dict[tuple[str, int], int] = {}
    rows = []
    for arrival in arrivals:
        event = arrival.event
        if event is None:
            continue
        partition = zlib.crc32(event.ad_id.encode("utf-8")) % partitions
        offset = offsets.get((event.type, partition), 0)
        offsets[(event.type, partition)] = offset + 1
        rows.append(
            {
                "type": event.type,
                "id": event.event_id,
                "ad_id": event.ad_id,
                "user_id": event.user_id,
                "event_time": event.event_time,
                "received_ms": arrival.arrival_ms,
                "partition": partition,
                "offset": offset,
            }
        )
    return rows
