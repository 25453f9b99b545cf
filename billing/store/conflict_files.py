"""Adapter: the id conflicts reconciliation found, kept and sent on: `CONFLICTS/period=P.parquet` (all of a
period's conflicts, replaced whole) and the quarantine topic, each conflict sent once (`conflicts-sent.json`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from billing.catalog import Catalog
from billing.layout import DataLayout
from billing.reconcile_run import ConflictKey
from billing.store.dead_letters import HEADERS, DeadLetters, DeliveryError
from billing.store.durable import make_folder, replace_files, write_whole

CONFLICTS_SEND_TIMEOUT_S = 30.0
"""How long a run waits for Kafka to take the id conflicts it sends to the quarantine topic."""


@dataclass(frozen=True)
class ConflictFiles:
    """The id conflicts reconciliation found: a Parquet file per period, and the quarantine topic."""

    layout: DataLayout
    catalog: Catalog
    kafka_bootstrap: str
    topic: str

    def keep(self, due: list[str], found: pa.Table) -> list[ConflictKey]:
        """The Parquet file of each due period (all of its conflicts, replaced whole); returns every conflict keyed
        for the totals (each record counted once)."""
        advertiser_of = self.catalog.advertisers_by_ad
        touched = make_folder(self.layout.conflicts)
        for period in due:
            rows = found.filter(pc.equal(found["period"], period))
            if rows.num_rows:
                target = self.layout.conflicts_of(period)
                temporary = target.with_name(f".{target.name}.tmp")
                pq.write_table(
                    rows.sort_by([("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")]),
                    temporary,
                )
                replace_files([(temporary, target)], touched)
        return [
            (_coordinates(r), r["topic"], advertiser_of.get(r["ad_id"] or ""))
            for r in found.select(["topic", "partition", "offset", "ad_id"]).to_pylist()
        ]

    def send(self, progress: Callable[[str], None]) -> tuple[int, int] | None:
        """Send to the quarantine topic each id conflict of the conflicts files that is not there yet, and record
        those Kafka took in the layout's `conflicts_sent_file`: each goes once, whichever run found it and however
        often its period is reconciled again. A run that cannot reach Kafka says so and goes on (closing a period
        does not wait for the dead-letter topic); the next run sends what is missing. A run stopped between Kafka's
        answer and the record sends those rows again: their key, `topic/partition/offset`, tells the repeats."""
        sent_file = self.layout.conflicts_sent_file
        sent = _read_sent(sent_file)
        pending: list[pa.Table] = []
        period_of: dict[str, str] = {}
        folder = self.layout.conflicts
        for path in sorted(folder.glob("period=*.parquet")) if folder.is_dir() else []:
            period = path.name.removeprefix("period=").removesuffix(".parquet")
            rows = _with_value_digest(pq.read_table(path))
            keys = [_coordinates(row) for row in rows.select(["topic", "partition", "offset"]).to_pylist()]
            new = [key not in sent.get(period, ()) for key in keys]
            if any(new):
                pending.append(rows.filter(pa.array(new)).select(["value", *HEADERS]))
                period_of.update((key, period) for key, is_new in zip(keys, new, strict=True) if is_new)
        if not pending:
            return None
        rows = pa.concat_tables(pending)
        try:
            delivered = DeadLetters(self.kafka_bootstrap, self.topic, CONFLICTS_SEND_TIMEOUT_S).send(rows)
        except DeliveryError as exc:
            delivered = exc.delivered
            progress(f"id conflicts not all sent to the quarantine topic; the next run sends the rest: {exc}")
        for key in delivered & period_of.keys():
            sent.setdefault(period_of[key], set()).add(key)
        if delivered:
            _write_sent(sent_file, sent)
        progress(f"{len(delivered)} id conflict(s) sent to the quarantine topic {self.topic}")
        return len(delivered), rows.num_rows - len(delivered)


def _with_value_digest(rows: pa.Table) -> pa.Table:
    """`rows` with `value_size` and `value_sha256`, which a conflicts file of an older version lacks."""
    if "value_sha256" in rows.column_names:
        return rows
    values = rows.column("value").to_pylist()
    sizes = pa.array([None if v is None else len(v) for v in values], pa.int32())
    digests = pa.array([None if v is None else hashlib.sha256(v).hexdigest() for v in values], pa.string())
    return rows.append_column("value_size", sizes).append_column("value_sha256", digests)


def _coordinates(row: Mapping[str, Any]) -> str:
    return f"{row['topic']}/{row['partition']}/{row['offset']}"


def _read_sent(path: Path) -> dict[str, set[str]]:
    if not path.exists():
        return {}
    return {period: set(keys) for period, keys in json.loads(path.read_text()).items()}


def _write_sent(path: Path, sent: Mapping[str, set[str]]) -> None:
    write_whole(path, json.dumps({period: sorted(keys) for period, keys in sorted(sent.items())}, indent=0))
