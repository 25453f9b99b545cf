"""A second, independent reading of the billing contract, in DuckDB SQL: the oracle the tests hold the code to.

It works on the raw events as received (one row per Kafka record that decoded to an event: `type`, `id`, `ad_id`,
`user_id`, `event_time`, `received_ms`, `partition`, `offset`) and the ad catalog, and says what must be billed.
It is written from the rules (docs/billing-rules.md) alone and imports nothing of the production rule
(`billing.rule`, `billing.intake`, `attribution.join`), so a shared mistake would have to be made twice.

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
4. Invalid traffic, judged on every standing click: `known_bot` (the crawler package's own `is_crawler`),
   `excluded_ip` (Python's `ipaddress` against the exclusion history at the click's time), `click_flood` (a window
   of at most 60 000 ms holding 21 or more of the user's clicks: SQL range frames), `duplicate_click` (the previous
   click of the user on the ad by time, then id, at most 30 000 ms before: SQL `lag`), the first in that order.
5. Budgets: per campaign and UTC day, the remaining clicks in (event_time, click_id) order, each charged when the
   day's charged total plus its price is at most the budget in force at its time (a loop in Python).

`outcomes` gives every billable click's outcome: `charged`, or the reason it is not.
"""

from __future__ import annotations

import ipaddress
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

import crawleruseragents
import duckdb
import pyarrow as pa

from billing.catalog import Catalog

MIN_EVENT_TIME_MS = 946_684_800_000  # 2000-01-01T00:00:00Z, the rules' floor (not imported: the oracle stands alone)
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
        ("user_agent", pa.string()),
        ("ip", pa.string()),
    ]
)
"""One decoded record as received: `type` is `impression` or `click`; `user_agent` and `ip` may be null."""

FLOOD_CLICKS = 20
FLOOD_WINDOW_MS = 60_000
DUPLICATE_WINDOW_MS = 30_000
DAY_MS = 86_400_000

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
standing AS (SELECT type, id, ad_id, user_id, event_time, user_agent, ip FROM valid WHERE copy_no = 1)
"""

_MATCHED = (
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
    FROM matches m LEFT JOIN catalog p ON p.ad_id = m.ad_id AND p.effective_from <= m.click_time
    WHERE m.preference = 1
),
clicks AS (SELECT id, ad_id, user_id, event_time, user_agent, ip FROM standing WHERE type = 'click'),
flood_starts AS (
    SELECT *, count(*) OVER (PARTITION BY user_id ORDER BY event_time
                             RANGE BETWEEN CURRENT ROW AND {{flood_window}} FOLLOWING)
              > {{flood_clicks}} AS starts_flood
    FROM clicks
),
judged AS (
    SELECT *,
           bool_or(starts_flood) OVER (PARTITION BY user_id ORDER BY event_time
                                       RANGE BETWEEN {{flood_window}} PRECEDING AND CURRENT ROW) AS flood,
           coalesce(event_time - lag(event_time) OVER (PARTITION BY user_id, ad_id ORDER BY event_time, id)
                    <= {{duplicate_window}}, false) AS duplicate
    FROM flood_starts
)
SELECT p.click_id, p.impression_id, p.ad_id,
       CASE WHEN p.in_force = 1 THEN p.campaign_id END AS campaign_id,
       CASE WHEN p.in_force = 1 THEN p.advertiser_id END AS advertiser_id,
       p.user_id, p.click_time, p.impression_time,
       CASE WHEN p.in_force = 1 THEN p.cpc_micros END AS amount_micros,
       CASE WHEN p.in_force = 1 THEN p.currency END AS currency,
       CASE WHEN p.campaign_id IS NULL THEN 'unknown_ad'
            WHEN p.cpc_micros IS NULL THEN 'ad_paused' END AS unpriced,
       j.user_agent, j.ip, j.flood, j.duplicate
FROM priced p JOIN judged j ON j.id = p.click_id
WHERE p.in_force = 1 OR p.campaign_id IS NULL
ORDER BY p.click_id
"""
)


def _as_compared(network: Any) -> Any:
    """A range of IPv4-mapped IPv6 addresses is the IPv4 range its addresses map to."""
    mapped_prefix = ipaddress.ip_network("::ffff:0:0/96")
    if network.version == 6 and network.prefixlen >= 96 and network.subnet_of(mapped_prefix):
        return ipaddress.ip_network(f"{network.network_address.ipv4_mapped}/{network.prefixlen - 96}")
    return network


def _excluded(ip: str | None, at_ms: int, ranges: list[tuple[Any, list[tuple[int, int, bool]]]]) -> bool:
    """Whether `ip` lies in a range excluded at `at_ms` (entries (effective_from, version, excluded))."""
    if ip is None:
        return False
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # the contract: an IPv4-mapped IPv6 address is its IPv4 address
    for network, entries in ranges:
        if address.version != network.version or address not in network:
            continue
        in_force = [e for e in entries if e[0] <= at_ms]
        if in_force and max(in_force)[2]:
            return True
    return False


def outcomes(
    events: Iterable[Mapping[str, Any]],
    catalog: Catalog,
    *,
    flood_clicks: int = FLOOD_CLICKS,
    flood_window_ms: int = FLOOD_WINDOW_MS,
    duplicate_window_ms: int = DUPLICATE_WINDOW_MS,
) -> list[dict[str, Any]]:
    """Every billable click (by the attribution rule) with `outcome`: `charged`, or why it is not (`unknown_ad`,
    `ad_paused`, `known_bot`, `excluded_ip`, `click_flood`, `duplicate_click`, `over_budget`), by click_id."""
    sql = _MATCHED.format(flood_window=flood_window_ms, flood_clicks=flood_clicks, duplicate_window=duplicate_window_ms)
    rows = _query(events, catalog, sql)
    ranges: dict[str, list[tuple[int, int, bool]]] = {}
    for change in catalog.exclusions.changes:
        ranges.setdefault(change.cidr, []).append((change.effective_from, change.version, change.excluded))
    networks = [(_as_compared(ipaddress.ip_network(cidr)), entries) for cidr, entries in ranges.items()]
    for row in rows:
        if row["unpriced"]:
            row["outcome"] = row["unpriced"]
        elif row["user_agent"] is not None and crawleruseragents.is_crawler(row["user_agent"]):
            row["outcome"] = "known_bot"
        elif _excluded(row["ip"], row["click_time"], networks):
            row["outcome"] = "excluded_ip"
        elif row["flood"]:
            row["outcome"] = "click_flood"
        elif row["duplicate"]:
            row["outcome"] = "duplicate_click"
        else:
            row["outcome"] = None
    spent: dict[tuple[str, int], int] = {}
    for row in sorted((r for r in rows if r["outcome"] is None), key=lambda r: (r["click_time"], r["click_id"])):
        day = (row["campaign_id"], row["click_time"] // DAY_MS)
        budgets = [b for b in catalog.budgets.get(row["campaign_id"], ()) if b.effective_from <= row["click_time"]]
        budget = max(budgets, key=lambda b: (b.effective_from, b.version)).daily_budget_micros if budgets else None
        if budget is not None and spent.get(day, 0) + row["amount_micros"] > budget:
            row["outcome"] = "over_budget"
        else:
            spent[day] = spent.get(day, 0) + row["amount_micros"]
            row["outcome"] = "charged"
    for row in rows:
        for name in ("unpriced", "user_agent", "ip", "flood", "duplicate"):
            del row[name]
    return rows


def billable(events: Iterable[Mapping[str, Any]], catalog: Catalog, **rules: int) -> list[dict[str, Any]]:
    """What the contract charges for these raw events: one dict per charged click (`BILLABLE_COLUMNS`), by click_id."""
    return [
        {name: row[name] for name in BILLABLE_COLUMNS}
        for row in outcomes(events, catalog, **rules)
        if row["outcome"] == "charged"
    ]


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
    rows = [{"user_agent": None, "ip": None, **event} for event in events]
    connection.register("events", pa.Table.from_pylist(rows, schema=RAW_EVENT_SCHEMA))
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
    """Raw event rows of simulated arrivals (`producers.arrivals.Arrival`), as the archive would hold them.

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
                "user_agent": getattr(event, "user_agent", None),
                "ip": getattr(event, "ip", None),
            }
        )
    return rows
